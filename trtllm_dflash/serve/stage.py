"""The serve stage's door (the contract: recipe/stages.py). serve writes no directory: in a
pipeline run the deployed model is served only while the sweep measures it (`served_here`,
which the sweep stage's door opens), and only where this machine can serve it: the reference
runners for the reference backend, the engine runners emulated on CPU for an engine recipe on
cpu hardware. A deployment that serves only on GPUs stops the run with one line saying which
command to run where (`StopHere`).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from trtllm_dflash.deploy.settings import REPOSITORY
from trtllm_dflash.errors import StopHere
from trtllm_dflash.launch.overlay import with_runners
from trtllm_dflash.launch.server import Endpoints, TritonServer
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.placement import placement
from trtllm_dflash.recipe.stages import StageOptions
from trtllm_dflash.recipe.support import backend as backend_spec

NAME = "serve"
WRITES_OUTPUT = False


def fingerprint(recipe: Recipe, options: StageOptions) -> dict:
    return {}


def run(recipe: Recipe, input_dir: Path | None, out: Path, options: StageOptions) -> None:
    """Check that this machine can serve the deployment in `input_dir`; raises StopHere naming the
    commands to run where it cannot (`out`: the pipeline's serve/, beside its deploy/ and sweep/)."""
    if serving_runners(recipe) is None:
        raise StopHere(where(recipe, Path(out).parent, options.recipe_arg))


def serving_runners(recipe: Recipe) -> str | None:
    """What serves the deployment when `run` sweeps it on this machine: the reference runners for
    the reference backend; for an engine recipe on cpu hardware, the engine runners emulated on
    CPU (FakeExecutor for TensorRT-LLM's Executor, the torch drafter network); None when the
    deployment serves only on GPUs (the run stops there)."""
    spec = backend_spec(recipe.backend.name)
    return spec.cpu_runners if recipe.gpu.is_cpu or not spec.needs_gpu else None


@contextmanager
def served_here(recipe: Recipe, deploy_dir: Path, say: Callable[[str], None]) -> Iterator[Endpoints]:
    """tritonserver on free loopback ports serving `deploy_dir` with `serving_runners(recipe)`,
    stopped on exit."""
    runners = serving_runners(recipe)
    endpoints = Endpoints.free()
    with tempfile.TemporaryDirectory(prefix="trtllm-dflash-runners-") as work:
        repository = deploy_dir / REPOSITORY
        if runners != backend_spec(recipe.backend.name).default_runners:  # serve a copy naming these runners
            repository = with_runners(repository, recipe.serve.model_name, runners, Path(work))
        with TritonServer(repository, endpoints):
            say(f"serve: tritonserver ready on grpc {endpoints.grpc_url}, http {endpoints.http_url} ({deploy_dir}, "
                f"{runners} runners)")
            yield endpoints
    say("serve: stopped")


def where(recipe: Recipe, out: Path, recipe_arg: str) -> str:
    """One line: the commands that serve and sweep the pipeline in `out`, and on which machine."""
    spec = backend_spec(recipe.backend.name)
    container = spec.container
    # The pytorch backend is swept through trtllm-serve's OpenAI endpoint (sweep --api openai).
    openai = spec.serving_api == "openai"
    api, port = (" --api openai", recipe.serve.http_port) if openai else ("", recipe.serve.grpc_port)
    sweep = f"`trtllm-dflash sweep {recipe_arg}{api} --url HOST:{port} --from {out / 'deploy'} --out {out / 'sweep'}`"
    at = placement(recipe)
    nodes = at.nodes
    if nodes > 1 or at.replicas > 1:  # a scheduler starts it: the launcher is a file to submit
        copies = f"{at.replicas} copies (parallel.replicas), each " if at.replicas > 1 else ""
        span = f"on {nodes} nodes of {at.gpus_per_node}x" if nodes > 1 else f"on {at.gpus_per_node}x"
        return (f"serve: the {recipe.backend.name} backend serves {copies}{span} {recipe.gpu.name}: write its Slurm "
                f"batch script or Kubernetes manifest with `trtllm-dflash serve "
                f"{recipe_arg} --from {out / 'deploy'}{api} --launcher srun` (or `--launcher k8s`), submit it, then "
                f"{sweep}")
    return (f"serve: the {recipe.backend.name} backend serves on {recipe.world_size}x {recipe.gpu.name}: there, inside "
            f"NVIDIA's {container} container, run `trtllm-dflash serve {recipe_arg} --from {out / 'deploy'} "
            f"--run{api}`, then {sweep}")
