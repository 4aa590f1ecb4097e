"""`trtllm-dflash serve RECIPE --from DEPLOY_DIR`: serve a deploy output behind a real Triton server.

reference backend: starts tritonserver on loopback over the deployed repository (which
serves the checkpoint deploy recorded, and nothing else), prints one `ready:` line and
serves until SIGTERM / SIGINT, then stops the server and removes its workspace.
engine / pytorch backends (GPU): prints the launch command for NVIDIA's container
(mpirun with world size tp*pp when > 1); --run executes it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the recipe behind a real Triton Inference Server")
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, required=True, metavar="DIR",
                   help="the deploy output of this recipe to serve")
    p.add_argument("--host", default=None, help="bind address (default: the recipe's serve.host)")
    p.add_argument("--http-port", type=int, default=None)
    p.add_argument("--grpc-port", type=int, default=None)
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--run", action="store_true", help="GPU backends: run the printed launch command")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import shlex
    import signal
    import subprocess
    import threading

    from trtllm_dflash.artifacts import verify_input
    from trtllm_dflash.deploy.repository import REPOSITORY
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.serve.launch import Endpoints, TritonServer, launch_command

    recipe = load_recipe(args.recipe, args.overrides)
    s = recipe.serve
    endpoints = Endpoints(args.host or s.host, args.http_port or s.http_port, args.grpc_port or s.grpc_port,
                          args.metrics_port or s.metrics_port)
    verify_input(args.from_dir, ("deploy",), recipe)
    repository = (args.from_dir / REPOSITORY).resolve()
    if recipe.backend.name != "reference":
        cmd = launch_command(repository, endpoints, recipe.world_size, s.model_name, llmapi=recipe.backend.name == "pytorch")
        print(shlex.join(cmd))
        if args.run:
            return subprocess.call(cmd)
        return 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with TritonServer(repository, endpoints) as server:
        print(
            f"ready: model {s.model_name!r} on http://{endpoints.http_url} grpc {endpoints.grpc_url} "
            f"metrics http://{endpoints.host}:{endpoints.metrics_port}/metrics",
            flush=True,
        )
        while not stop.wait(0.5):
            if server.proc.poll() is not None:
                raise UserError(f"tritonserver exited with code {server.proc.returncode}: {server.failure_reason()}")
    print("stopped", flush=True)
    return 0
