"""The pytorch backend served through NVIDIA Dynamo (`serve --api dynamo`): one Dynamo frontend
(OpenAI HTTP, the router) in front of `parallel.replicas` TensorRT-LLM workers, each one model copy
(`python3 -m dynamo.trtllm --extra-engine-args DEPLOY/dynamo/engine_args.yaml`, deploy/dynamo.py).

Where it runs:
- one node (--launcher single_node, mpirun): a shell script of the frontend and the workers, file
  discovery (`--discovery-backend file`: one host, no etcd or NATS), each worker on GPUs of its own
  (CUDA_VISIBLE_DEVICES) with its Prometheus endpoint on DYN_SYSTEM_PORT; a worker at tp x pp > 1
  is one process whose LLM spawns its ranks (single_node) or an mpirun of tp x pp ranks under
  trtllm-llmapi-launch (mpirun), the two ways TensorRT-LLM runs a world on one node;
- Slurm (--launcher srun): launch/dynamo_slurm.py; Kubernetes (--launcher k8s): a
  DynamoGraphDeployment, launch/dynamo_k8s.py.

The flags are the pinned Dynamo release's (recipe/dynamo.py checks every one). Aggregated serving
only: disaggregated prefill/decode is refused (`disaggregation_problem`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe, dynamo, images
from trtllm_dflash.recipe.plan.placement import Placement, placement
from trtllm_dflash.recipe.support import backend as backend_spec

IMAGE_FAMILY = "dynamo-trtllm-runtime"  # recipe/catalog/images.yaml
AGGREGATED = "agg"
# Why disaggregated prefill/decode is refused for DFlash (TensorRT-LLM issue #17264): a decode
# worker's requests arrive with the prefill's KV cache but no draft snapshot, so DFlash has no
# drafter context to draft from; no DFlash run under TensorRT-LLM's disaggregated serving is known.
DISAGG_WHY = ("TensorRT-LLM #17264: requests handed to a disaggregated decode worker carry no draft snapshot, so "
              "DFlash loses the drafter's context, and DFlash under TensorRT-LLM's disaggregated serving is "
              "unconfirmed; serve aggregated (agg): replicas behind the one frontend scale out")


def disaggregation_problem(mode: str | None) -> str | None:
    """Why `mode` (Dynamo's --disaggregation-mode) cannot serve DFlash, None for aggregated."""
    if mode in (None, AGGREGATED):
        return None
    return f"--disaggregation-mode {mode}: refused for DFlash: {DISAGG_WHY}"


@dataclass(frozen=True)
class DynamoLaunch:
    """What deploy wrote for Dynamo (DEPLOY/dynamo/launch.json) and where it runs."""

    recipe: str
    frontend: list[str]  # python3 -m dynamo.frontend arguments
    worker: list[str]  # python3 -m dynamo.trtllm arguments
    router: str
    router_why: str
    world: int  # tp x pp ranks of one worker
    where: Placement

    @property
    def engine_args(self) -> Path:
        return Path(self.worker[self.worker.index("--extra-engine-args") + 1])


def read_launch(recipe: Recipe, deploy_dir: Path) -> DynamoLaunch:
    """DEPLOY/dynamo/launch.json (a one-line UserError when deploy did not write it)."""
    from trtllm_dflash.deploy.dynamo import DYNAMO_DIR, LAUNCH

    path = Path(deploy_dir) / DYNAMO_DIR / LAUNCH
    if not path.is_file():
        raise UserError(f"{deploy_dir}: no {DYNAMO_DIR}/{LAUNCH}; deploy again with this version of trtllm-dflash")
    d = json.loads(path.read_text())
    if d.get("dynamo") != dynamo.version():
        raise UserError(f"{path}: written for Dynamo {d.get('dynamo')}; this trtllm-dflash writes for Dynamo "
                        f"{dynamo.version()}: deploy again")
    return DynamoLaunch(recipe.name, d["frontend"], d["worker"], d["router_mode"], d["router_why"],
                        recipe.world_size, placement(recipe))


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag value` set (replaced where it is, appended otherwise)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def trtllm_version(recipe: Recipe) -> str:
    return recipe.backend.trtllm_version or backend_spec(recipe.backend.name).default_trtllm_version


def carried(recipe: Recipe, flag: str) -> list:
    """NVIDIA's tensorrtllm-runtime images of the pinned Dynamo release that carry the recipe's
    TensorRT-LLM (recipe/catalog/images.yaml). None: refused, naming `flag` as the way out. The
    worker hands our engine arguments to that TensorRT-LLM's strict LLM arguments, so a recipe's
    field of a newer release stops it at start-up (the 1.4 recipe's context_recompute_tail under
    Dynamo 1.6.1's 1.3.0rc29)."""
    version = trtllm_version(recipe)
    found = [im for im in images.carrying(IMAGE_FAMILY, version) if im.dynamo == dynamo.version()]
    if not found:
        raise UserError(f"backend.trtllm_version {version}: no NVIDIA Dynamo {dynamo.version()} tensorrtllm-runtime "
                        f"image carries it (recipe/catalog/images.yaml; Dynamo {dynamo.version()} pins TensorRT-LLM "
                        f"{dynamo.trtllm_version()}): set backend.trtllm_version={dynamo.trtllm_version()}, or pass "
                        f"{flag}, a Dynamo image carrying {version}")
    return found


def image(recipe: Recipe, given: str | None, registry: str) -> str:
    """The container: --image as given, else NVIDIA's tensorrtllm-runtime image of the pinned
    Dynamo release carrying the recipe's TensorRT-LLM, on `registry`."""
    if given:
        return given
    found = carried(recipe, "--image")
    if not registry.strip("/"):
        raise UserError(f"--registry: empty; {found[-1].ref} is on NVIDIA's registry: leave --registry out (nvcr.io), "
                        "name a mirror of it, or pass --image IMAGE")
    return f"{registry.rstrip('/')}/{found[-1].name}"


def one_node_check(launch: DynamoLaunch) -> None:
    w = launch.where
    if w.nodes > 1 or w.replicas * launch.world > w.node_gpus:
        raise UserError(f"parallel.replicas {w.replicas} x tp*pp {launch.world} GPUs do not fit one node of "
                        f"{w.node_gpus}: --launcher srun (Slurm) or k8s (a DynamoGraphDeployment) spans nodes")


def worker_command(launch: DynamoLaunch, mpirun: bool, discovery: str) -> list[str]:
    """One worker process (a world of tp x pp ranks): plain, or under mpirun + trtllm-llmapi-launch."""
    cmd = dynamo.command("worker", with_flag(launch.worker, "--discovery-backend", discovery))
    if not mpirun or launch.world == 1:
        return cmd
    return ["mpirun", "--allow-run-as-root", "-n", str(launch.world), "-x", "CUDA_VISIBLE_DEVICES", "-x",
            "DYN_SYSTEM_PORT", "trtllm-llmapi-launch", *cmd]


def one_node_script(launch: DynamoLaunch, host: str, http_port: int, metrics_port: int, mpirun: bool) -> str:
    """The shell script that runs the frontend and every worker on this node and stops them all
    when any of them ends."""
    one_node_check(launch)
    frontend = dynamo.command("frontend", with_flag(with_flag(with_flag(
        launch.frontend, "--http-host", host), "--http-port", str(http_port)), "--discovery-backend", "file"))
    w = launch.where
    lines = [f"# NVIDIA Dynamo {dynamo.version()} on one node: the frontend on http://{host}:{http_port}/v1, "
             f"{w.replicas} worker(s) of tp*pp {launch.world}; router {launch.router_why}",
             f"# each worker's Prometheus metrics (TensorRT-LLM's, DFlash acceptance included) on DYN_SYSTEM_PORT "
             f"{metrics_port}..{metrics_port + w.replicas - 1}",
             "trap 'kill $(jobs -p) 2>/dev/null' EXIT",
             shlex.join(frontend) + " &"]
    for i in range(w.replicas):
        gpus = ",".join(str(g) for g in range(i * launch.world, (i + 1) * launch.world))
        env = ["env", f"CUDA_VISIBLE_DEVICES={gpus}", f"DYN_SYSTEM_PORT={metrics_port + i}"]
        lines.append(shlex.join([*env, *worker_command(launch, mpirun, "file")]) + " &")
    lines.append("wait -n")
    return "\n".join(lines) + "\n"


def write_file(path: Path, text: str) -> None:
    """Write a launcher file atomically (a directory given as --out is one line)."""
    import os

    path = Path(path)
    if path.is_dir():
        raise UserError(f"--out {path}: is a directory; give a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
