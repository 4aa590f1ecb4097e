"""`trtllm-dflash serve RECIPE --from DEPLOY_DIR [--api triton|openai]`: serve a deploy output.

reference backend
  --api triton (default)  a real tritonserver on loopback over the deployed repository
  --api openai            an OpenAI-compatible server (serve/openai.py) on --host:--http-port
  --api dynamo            an NVIDIA Dynamo worker (serve/dynamo.py) behind Dynamo's own frontend
                          (`python -m dynamo.frontend`), found by --namespace and
                          --discovery-backend
  Each serves the checkpoint deploy recorded, and nothing else, prints one `ready:` line and
  serves until SIGTERM / SIGINT, then stops cleanly.
engine / pytorch backends (GPU): print the launch command for NVIDIA's container; --run
  executes it (--container IMAGE: inside `docker run` of that image).
  --api triton   tritonserver over the repository (pytorch: TensorRT-LLM's LLM-API model)
  --api openai   pytorch only: trtllm-serve with the deployed extra_llm_api_options.yaml, the
                 command deploy wrote to trtllm_serve/launch.json
  --api dynamo   pytorch only: NVIDIA Dynamo's frontend and TensorRT-LLM workers over the deployed
                 dynamo/engine_args.yaml (commands/serve_dynamo.py: one node, Slurm, or a
                 DynamoGraphDeployment with --launcher k8s)
  --launcher     single_node (default) or mpirun: the command on one node (mpirun: every rank
                 under trtllm-llmapi-launch); srun: write a Slurm batch script (Pyxis containers)
                 and print `sbatch PATH`; k8s: write a LeaderWorkerSet manifest and print
                 `kubectl apply -f PATH` (launch/cluster.py), over the nodes the recipe spans
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from trtllm_dflash.commands import serve_dynamo
from trtllm_dflash.commands.common import add_recipe_argument

LAUNCHERS = ("single_node", "mpirun", "srun", "k8s")
CLUSTER = ("srun", "k8s")  # the launchers that write a file for a scheduler
DISCOVERY_BACKENDS = ("kubernetes", "etcd", "file", "mem")  # Dynamo 1.6.1's --discovery-backend choices


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a deploy output: Triton Inference Server or an OpenAI-compatible endpoint")
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, required=True, metavar="DIR",
                   help="the deploy output of this recipe to serve")
    p.add_argument("--api", choices=("triton", "openai", "dynamo"), default="triton",
                   help="triton (default): Triton Inference Server; openai: /v1/completions and /v1/chat/completions "
                   "(reference backend: our server; pytorch backend: trtllm-serve); dynamo: NVIDIA Dynamo's frontend "
                   "(OpenAI, with its router) over workers (reference backend: our worker, one per `serve`; pytorch "
                   "backend: Dynamo's TensorRT-LLM workers; docs/guides/dynamo.md)")
    p.add_argument("--host", default=None, help="bind address (default: the recipe's serve.host)")
    p.add_argument("--http-port", type=int, default=None, help="HTTP port (Triton HTTP, or the OpenAI server's)")
    p.add_argument("--grpc-port", type=int, default=None)
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--run", dest="execute", action="store_true",
                   help="GPU backends: run the printed launch command (srun / k8s: the printed sbatch / kubectl apply)")
    p.add_argument("--runners", choices=("reference", "emulated", "tensorrt"), default=None,
                   help="what decodes the dflash model (default: what deploy chose: reference, or tensorrt on the "
                   "engine backend); reference / emulated serve an engine deployment's checkpoint on this machine "
                   "(emulated: the engine runners over a CPU stand-in of TensorRT-LLM's Executor)")
    p.add_argument("--launcher", choices=LAUNCHERS, default="single_node",
                   help="GPU backends: single_node (default) or mpirun (tp*pp ranks) print the command for one node; "
                   "srun writes a Slurm batch script (Pyxis/enroot containers) and k8s a Kubernetes LeaderWorkerSet "
                   "manifest for the nodes the recipe spans. The manifest is written here, not by deploy: like the "
                   "batch script it fixes how the deployment is launched on a cluster (image, registry, volume, "
                   "ports), which deploy's output does not depend on")
    p.add_argument("--container", metavar="IMAGE", default=None,
                   help="GPU backends: run inside `docker run IMAGE` (NVIDIA's TensorRT-LLM container of the "
                   "recipe's version) with every directory the deployment opens mounted; engine backend: the "
                   "command first installs this source checkout into it (pip, offline: --no-index --no-deps)")
    p.add_argument("--llmapi-model", type=Path, default=None, metavar="DIR",
                   help="pytorch backend, --api triton: TensorRT-LLM's LLM-API model directory (triton_backend/"
                   "all_models/llmapi/tensorrt_llm of the image's TensorRT-LLM, holding 1/model.py and 1/helpers.py); "
                   "the launch copies them into the deployed repository (default: $TRTLLM_LLMAPI_MODEL_DIR in the "
                   "container, set by docs/docker/triton-trtllm-llmapi.Dockerfile)")
    _cluster_arguments(p)
    _dynamo_worker_arguments(p)
    serve_dynamo.add_arguments(p)
    p.set_defaults(run=run)


def _dynamo_worker_arguments(p: argparse.ArgumentParser) -> None:
    """Dynamo 1.6.1's runtime flags of a worker, their defaults and environment variables
    (dynamo/common/configuration/groups/runtime_args.py DynamoRuntimeArgGroup: --namespace :216,
    --discovery-backend :238)."""
    import os

    g = p.add_argument_group("--api dynamo (reference backend)")
    g.add_argument("--namespace", default=os.environ.get("DYN_NAMESPACE", "dynamo"),
                   help="Dynamo namespace the worker registers in (default: $DYN_NAMESPACE or dynamo)")
    g.add_argument("--discovery-backend", choices=DISCOVERY_BACKENDS,
                   default=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                   help="how the frontend finds the worker (default: $DYN_DISCOVERY_BACKEND or etcd, Dynamo's); "
                   "file: one machine, no etcd, the directory $DYN_FILE_KV, as the frontend's")


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    from trtllm_dflash.recipe.containers import NVIDIA_REGISTRY

    g = p.add_argument_group("--launcher srun / k8s")
    g.add_argument("--out", type=Path, default=None, metavar="PATH",
                   help="where to write the batch script or manifest (default: DEPLOY_DIR/launch/NAME.sbatch or "
                   "NAME-lws.yaml)")
    g.add_argument("--image", default=None,
                   help="the container image (default: the backend's NVIDIA image, recipe/containers.py, on "
                   "--registry); engine backend: an image with trtllm_dflash installed (without it the job "
                   "installs this source checkout into NVIDIA's image, offline: pip --no-index --no-deps)")
    g.add_argument("--registry", default=NVIDIA_REGISTRY, metavar="HOST",
                   help=f"the registry of NVIDIA's images (default: {NVIDIA_REGISTRY}; a mirror of it, e.g. "
                   "a site's pull-through cache)")
    g.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's)")
    g.add_argument("--account", default=None, help="Slurm account (default: the user's)")
    g.add_argument("--time", default=None, help="Slurm time limit, e.g. 04:00:00 (default: the partition's)")
    g.add_argument("--cpus-per-gpu", type=_positive, default=None, metavar="N",
                   help="Slurm, a copy that shares its node: N CPUs (as Slurm counts them: hyperthreads where "
                   "it counts those) for every GPU a task drives, as --cpus-per-task on the job and its steps "
                   "(default: the cluster's, often one a task; a copy on whole nodes has all of theirs)")
    g.add_argument("--pvc", default=None, metavar="CLAIM",
                   help="k8s: the PersistentVolumeClaim holding the deploy output and what it serves at the same "
                   "paths (default: NAME-runs)")
    g.add_argument("--ssh-secret", default=None, metavar="SECRET",
                   help="k8s, several nodes: the Secret with the ssh key pair mpirun uses (default: NAME-mpi-ssh)")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return n


def _override(cmd: list[str], flag: str, value) -> list[str]:
    if value is None:
        return cmd
    out = list(cmd)
    out[out.index(flag) + 1] = str(value)
    return out


def _deployed_trtllm_serve(args, recipe, launcher: str) -> list[str]:
    """The trtllm-serve command deploy wrote to launch.json for `launcher`."""
    import json

    from trtllm_dflash.deploy.repository import LAUNCH, TRTLLM_SERVE
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.recipe.support import backend as backend_spec

    backend = recipe.backend.name
    if backend_spec(backend).serving_api != "openai":
        raise UserError(f"--api openai: the {backend} backend serves Triton only (the OpenAI endpoint is the reference "
                        "backend's server, or trtllm-serve for the pytorch backend)")
    launch = args.from_dir / TRTLLM_SERVE / LAUNCH
    if not launch.is_file():
        raise UserError(f"{args.from_dir}: no {TRTLLM_SERVE}/{LAUNCH}; deploy again with this version of trtllm-dflash")
    return json.loads(launch.read_text())[launcher]


def _llmapi_model(args, recipe, repository: Path, multi_rank: bool):
    """Where TensorRT-LLM's model.py comes from and goes (launch/llmapi_model.py): the pytorch
    backend behind Triton only; --llmapi-model DIR is checked here."""
    from trtllm_dflash.launch.llmapi_model import LLMAPIModel
    from trtllm_dflash.recipe.support import backend as backend_spec

    if args.api != "triton" or backend_spec(recipe.backend.name).triton_model != "llmapi":
        return None
    source = args.llmapi_model.resolve() if args.llmapi_model is not None else None
    model = LLMAPIModel(repository / recipe.serve.model_name / "1", source)
    model.check_here(multi_rank)
    return model


def _gpu_command(args, recipe, repository: Path, endpoints) -> tuple[list[str], list[str]]:
    """(the launch command on one node, the server command it ends in)."""
    from trtllm_dflash.launch.node_command import launch_command

    if args.api == "triton":
        multi_rank = args.launcher == "mpirun" and recipe.world_size > 1
        llmapi = _llmapi_model(args, recipe, repository, multi_rank)
        cmd = launch_command(repository, endpoints, recipe.world_size, recipe.serve.model_name,
                             llmapi=llmapi is not None, launcher=args.launcher)
        return (llmapi.wrapped(cmd, multi_rank) if llmapi else cmd), cmd
    cmd = _deployed_trtllm_serve(args, recipe, args.launcher)
    cmd = _override(_override(cmd, "--host", args.host), "--port", args.http_port)
    return cmd, cmd


def _one_node(args, recipe, repository: Path, endpoints) -> int:
    """GPU backends on one node: print the launch command (in `docker run` with --container), and
    with --run run it here."""
    import shlex
    import shutil
    import subprocess

    from trtllm_dflash.errors import UserError
    from trtllm_dflash.launch.cluster_job import checkout_to_install
    from trtllm_dflash.launch.node_command import in_container, served_paths

    cmd, server = _gpu_command(args, recipe, repository, endpoints)
    if args.container:
        llmapi = [args.llmapi_model.resolve()] if args.llmapi_model is not None else []
        cmd = in_container(cmd, args.container, served_paths(args.from_dir) + llmapi,
                           source=checkout_to_install(recipe.backend.name))
    print(shlex.join(cmd))
    if not args.execute:
        return 0
    tool = cmd[0] if args.container else server[0]
    if shutil.which(tool) is None:
        raise UserError(f"{tool}: not found on PATH; run this inside NVIDIA's TensorRT-LLM container of version "
                        f"{recipe.backend.trtllm_version or 'the recipe names'}, or pass --container IMAGE")
    return subprocess.call(cmd)


def _cluster_launcher(args, recipe, repository: Path, endpoints) -> int:
    """srun / k8s: write the batch script or manifest around the one-node server command (bound
    to every interface unless --host says otherwise: clients reach it from other machines)."""
    import dataclasses
    import shlex
    import shutil
    import subprocess

    from trtllm_dflash.errors import UserError
    from trtllm_dflash.launch.cluster import write_launcher
    from trtllm_dflash.launch.cluster_job import ClusterOptions, make_job, storage_note
    from trtllm_dflash.launch.node_command import served_paths, server_command

    if args.container:
        raise UserError(f"--container: docker run is for one node; --launcher {args.launcher} runs --image")
    endpoints = dataclasses.replace(endpoints, host=args.host or "0.0.0.0")
    if args.api == "triton":
        server = server_command(repository, endpoints)
    else:
        server = _override(_override(_deployed_trtllm_serve(args, recipe, "single_node"), "--host", endpoints.host),
                           "--port", endpoints.http_port)
    llmapi = _llmapi_model(args, recipe, repository, multi_rank=recipe.world_size > 1)
    paths = served_paths(args.from_dir) + ([llmapi.source] if llmapi and llmapi.source else [])
    job = make_job(recipe, args.api, server, endpoints, paths, llmapi)
    opts = ClusterOptions(image=args.image, registry=args.registry, partition=args.partition, account=args.account,
                          time=args.time, cpus_per_gpu=args.cpus_per_gpu, pvc=args.pvc, ssh_secret=args.ssh_secret)
    path, submit = write_launcher(args.launcher, job, opts, args.out, args.from_dir)
    print(f"wrote {path}")
    print(f"submit: {submit}")
    print(f"shared storage: {storage_note(args.launcher, job, opts)}")
    if not args.execute:
        return 0
    tool = shlex.split(submit)[0]
    if shutil.which(tool) is None:
        raise UserError(f"{tool}: not found on PATH; run `{submit}` where the cluster's tools are")
    return subprocess.call(shlex.split(submit))


def run(args: argparse.Namespace) -> int:
    import signal
    import tempfile
    import threading

    from trtllm_dflash.artifacts import verify_input
    from trtllm_dflash.deploy.repository import plan_only_problem
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.launch.overlay import with_runners
    from trtllm_dflash.launch.server import Endpoints
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.recipe.support import backend as backend_spec
    from trtllm_dflash.runtime import CPU_RUNNERS

    recipe = load_recipe(args.recipe, args.overrides)
    s = recipe.serve
    endpoints = Endpoints(args.host or s.host, args.http_port or s.http_port, args.grpc_port or s.grpc_port,
                          args.metrics_port or s.metrics_port)
    verify_input(args.from_dir, ("deploy",), recipe)
    if args.llmapi_model is not None and (args.api, backend_spec(recipe.backend.name).triton_model) != ("triton",
                                                                                                     "llmapi"):
        raise UserError("--llmapi-model: only the pytorch backend served by Triton (--api triton) runs TensorRT-LLM's "
                        "LLM-API model")
    if args.api == "dynamo" and backend_spec(recipe.backend.name).triton_model == "llmapi":
        return serve_dynamo.run(args, recipe, endpoints)
    repository = (args.from_dir / REPOSITORY).resolve()
    local = not backend_spec(recipe.backend.name).needs_gpu or args.runners in CPU_RUNNERS
    if args.api == "dynamo":
        _check_local_dynamo(args, recipe.backend.name, local)
    if not local or args.launcher in CLUSTER:
        problem = plan_only_problem(recipe, args.from_dir)
        if problem:
            raise UserError(problem)
    if args.launcher in CLUSTER:
        if args.runners in CPU_RUNNERS:
            raise UserError(f"--runners {args.runners}: serves on this machine; --launcher {args.launcher} launches "
                            "the deployment's GPU runners on a cluster")
        return _cluster_launcher(args, recipe, repository, endpoints)
    if not local:
        return _one_node(args, recipe, repository, endpoints)

    if args.api == "openai":
        return _serve_openai(args, recipe, endpoints)
    if args.api == "dynamo":
        return _serve_dynamo(args, recipe, endpoints.host)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="trtllm-dflash-runners-") as work:
        if args.runners:  # the deploy output stays as it is: a copy names the runners
            repository = with_runners(repository, s.model_name, args.runners, Path(work))
        _serve_triton(repository, endpoints, s.model_name, stop)
    print("stopped", flush=True)
    return 0


def _serve_triton(repository: Path, endpoints, model_name: str, stop) -> None:
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.launch.server import TritonServer

    with TritonServer(repository, endpoints) as server:
        beside = sorted(p.name for p in Path(repository).iterdir() if p.is_dir() and p.name != model_name)
        print(
            f"ready: model {model_name!r} on http://{endpoints.http_url} grpc {endpoints.grpc_url} "
            f"metrics http://{endpoints.host}:{endpoints.metrics_port}/metrics"
            + (f" (also {', '.join(beside)}: docs/migrate-from-tensorrtllm-backend.md)" if beside else ""),
            flush=True,
        )
        while not stop.wait(0.5):
            if server.proc.poll() is not None:
                raise UserError(f"tritonserver exited with code {server.proc.returncode}: {server.failure_reason()}")


def _serve_openai(args, recipe, endpoints) -> int:
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.launch.server import port_in_use
    from trtllm_dflash.serve.deployed import open_deployed, repository_model

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401  (its /metrics)
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("--api openai needs fastapi, uvicorn and prometheus_client: pip install "
                        "'trtllm_dflash[serve]'") from None
    host, port = endpoints.host, endpoints.http_port
    if port_in_use(host, port):
        raise UserError(f"serve.http_port: {host}:{port} is already in use")
    from trtllm_dflash.serve.openai import run_server

    name = recipe.serve.model_name
    version_dir, settings = repository_model(args.from_dir, name)
    if args.runners:
        settings = replace(settings, runners=args.runners)
    deployed = open_deployed(version_dir, settings)
    try:
        run_server(deployed, name, host, port, on_ready=lambda: print(
            f"ready: openai model {name!r} on http://{host}:{port}/v1", flush=True))
    finally:
        deployed.close()
    print("stopped", flush=True)
    return 0


def _check_local_dynamo(args, backend: str, local: bool) -> None:
    """--api dynamo off the pytorch backend: our worker, on this machine, aggregated."""
    from trtllm_dflash.errors import UserError

    if args.disaggregation_mode not in (None, "agg"):
        raise UserError(f"--disaggregation-mode {args.disaggregation_mode}: the reference backend's Dynamo worker is "
                        "aggregated (prefill and decode in one worker)")
    if not local or args.launcher != "single_node":
        raise UserError(f"--api dynamo: serves the reference backend's worker on this machine (the {backend} "
                        f"backend, --launcher {args.launcher}); GPU deployments run Dynamo's TensorRT-LLM worker "
                        "(docs/guides/dynamo.md)")


def _serve_dynamo(args, recipe, host: str) -> int:
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.serve.deployed import repository_model

    try:
        from trtllm_dflash.serve.dynamo import run_worker
    except ImportError:
        raise UserError("--api dynamo needs NVIDIA Dynamo 1.6.1: pip install 'trtllm_dflash[dynamo]' && "
                        "pip install --no-deps ai-dynamo==1.6.1 (docs/compat.md)") from None
    name = recipe.serve.model_name
    version_dir, settings = repository_model(args.from_dir, name)
    if args.runners:
        settings = replace(settings, runners=args.runners)
    run_worker(version_dir, settings, name, args.namespace, args.discovery_backend, host)
    print("stopped", flush=True)
    return 0
