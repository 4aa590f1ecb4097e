"""`run`: a recipe through every stage into DIR/<stage>/, make-like.

    recipe -> convert -> quantize -> build -> deploy -> serve -> sweep

The stages a recipe runs come from recipe/stages.py (quantize when it quantizes, build on the
engine backend). Each stage reads the output of the one before it (`--from`) and is skipped
when its output is current: a finished output (manifest.json) made from the same recipe
fields, from the current output of its input stage (manifest checksum), from unchanged source
files (convert) and with unchanged files. The first stale stage and everything after it
re-run; `--force STAGE` makes STAGE stale. Every write is atomic, convert and quantize keep
finished shards, so a killed run resumes where it stopped.

serve writes no directory: on the reference backend `run` starts the deployed model behind
tritonserver on free loopback ports, sweeps it and stops it (skipped both when the sweep is
current). build runs where TensorRT-LLM 1.2.x is installed; elsewhere it writes its dry-run
plan (plan.json, a build_config.json per engine, the trtllm-build commands) as its output and
the run goes on to deploy. Serving a GPU backend stops the run with one line saying which
command to run where.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trtllm_dflash.artifacts import MANIFEST, Manifest, changed_source, check_files, fields_diff, manifest_sha256
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.placement import placement
from trtllm_dflash.recipe.stages import STAGES, input_stage, stage_fields, stages_for
from trtllm_dflash.recipe.support import backend as backend_spec

# Exit code of a run that stopped at a stage belonging to another machine (not an error).
STOPPED = 3


@dataclass
class StageRun:
    stage: str
    status: str  # "ran" | "skipped" | "stopped"
    why: str  # why it ran (what was stale), why it was skipped, or where to run it
    seconds: float = 0.0


class StopHere(Exception):
    """This stage runs elsewhere; the message says which command to run where."""


def staleness(stage: str, out: Path, recipe: Recipe, input_dir: Path | None, extra: dict | None = None) -> str | None:
    """Why the output in `out` is not current for `recipe` (None when it is). `extra`: settings
    outside the recipe that the output must also have been made with (sweep: the levels)."""
    if not (out / MANIFEST).is_file():
        return "no finished output"
    try:
        m = Manifest.read(out)
    except UserError as e:
        return str(e)
    if m.stage != stage:
        return f"holds a {m.stage} output"
    diff = fields_diff(m.recipe_fields, stage_fields(recipe, stage))
    if diff:
        return "recipe changed: " + ", ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
    if input_dir is not None:
        if m.input is None or m.input_dir(out) != input_dir.resolve() or not (input_dir / MANIFEST).is_file() \
                or m.input.get("manifest_sha256") != manifest_sha256(input_dir):
            return f"its input {input_dir} changed"
    for key, value in (extra or {}).items():
        if m.extra.get(key) != value:
            return f"{key} changed: {m.extra.get(key)} -> {value}"
    if m.extra.get("failed"):
        return f"the last {stage} had {m.extra['failed']} failed requests"
    problem = changed_source(m)
    if problem:
        return problem
    try:
        check_files(out, m)
    except UserError as e:
        return str(e).removeprefix(f"{out}: ")
    return None


def _where(recipe: Recipe, stage: str, out: Path, recipe_arg: str) -> str:
    """One line: the command that runs `stage` of this pipeline, and on which machine."""
    spec = backend_spec(recipe.backend.name)
    container = spec.container
    # The pytorch backend is swept through trtllm-serve's OpenAI endpoint (sweep --api openai).
    api, port = (" --api openai", recipe.serve.http_port) if spec.serving_api == "openai" else ("", recipe.serve.grpc_port)
    sweep = f"`trtllm-dflash sweep {recipe_arg}{api} --url HOST:{port} --from {out / 'deploy'} --out {out / 'sweep'}`"
    where = placement(recipe)
    nodes = where.nodes
    if nodes > 1 or where.replicas > 1:  # a scheduler starts it: the launcher is a file to submit
        copies = f"{where.replicas} copies (parallel.replicas), each " if where.replicas > 1 else ""
        span = f"on {nodes} nodes of {where.gpus_per_node}x" if nodes > 1 else f"on {where.gpus_per_node}x"
        return (f"serve: the {recipe.backend.name} backend serves {copies}{span} {recipe.gpu.name}: write its Slurm "
                f"batch script or Kubernetes manifest with `trtllm-dflash serve "
                f"{recipe_arg} --from {out / 'deploy'}{api} --launcher srun` (or `--launcher k8s`), submit it, then "
                f"{sweep}")
    return (f"serve: the {recipe.backend.name} backend serves on {recipe.world_size}x {recipe.gpu.name}: there, inside "
            f"NVIDIA's {container} container, run `trtllm-dflash serve {recipe_arg} --from {out / 'deploy'} --run{api}`, "
            f"then {sweep}")


def run(recipe: Recipe, out: Path, *, until: str | None = None, force: str | None = None,
        recipe_arg: str = "RECIPE", levels: list[int] | None = None, progress: bool = True,
        say: Callable[[str], None] = print) -> list[StageRun]:
    """Take `recipe` through its stages into out/<stage>/; returns what happened to each stage.
    Raises StopHere (after the stages before it) when a stage must run on another machine."""
    out = Path(out)
    order = stages_for(recipe)
    for flag, value in (("--until", until), ("--force", force)):
        if value is not None and value not in order:
            raise UserError(f"{flag} {value}: recipe {recipe.name!r} runs the stages {', '.join(order)}"
                            + ("" if value in STAGES else f"; stages: {', '.join(STAGES)}"))
    last = order.index(until) if until else len(order) - 1
    done: list[StageRun] = []
    for stage in order[: last + 1]:
        if stage == "serve":
            continue  # runs inside the sweep step below (or stops there on a GPU backend)
        if stage == "sweep" and serving_runners(recipe) is None:
            raise StopHere(_where(recipe, "serve", out, recipe_arg))
        inp = input_stage(recipe, stage)
        input_dir = out / inp if inp else None
        extra = None
        if stage == "sweep":  # a sweep is current for the same levels, runners and curves
            from trtllm_dflash.sweep.stage import sweep_variants

            extra = {"levels": levels or recipe.sweep.concurrency, "runners": serving_runners(recipe),
                     "curves": [v.name for v in sweep_variants(recipe)]}
        if stage == "deploy":  # a deployment of an older request interface is redeployed
            from trtllm_dflash.deploy.repository import model_inputs

            extra = {"inputs": model_inputs(recipe)}
        if stage == "build":  # a dry-run plan is current only where no engines can be built
            from trtllm_dflash.build.stage import cannot_build_here

            extra = {"dry_run": cannot_build_here() is not None}
        why = "forced (--force)" if stage == force else staleness(stage, out / stage, recipe, input_dir, extra)
        if why is None:
            done.append(StageRun(stage, "skipped", f"up to date: {out / stage}"))
            say(f"{stage}: skipped (up to date: {out / stage})")
            continue
        say(f"{stage}: running ({why})")
        t0 = time.perf_counter()
        _run_stage(stage, recipe, input_dir, out / stage, progress, levels, say)
        done.append(StageRun(stage, "ran", why, time.perf_counter() - t0))
        say(f"{stage}: done in {done[-1].seconds:.1f} s -> {out / stage}")
    return done


def serving_runners(recipe: Recipe) -> str | None:
    """What serves the deployment when `run` sweeps it on this machine: the reference runners for
    the reference backend; for an engine recipe on cpu hardware, the engine runners emulated on
    CPU (FakeExecutor for TensorRT-LLM's Executor, the torch drafter network); None when the
    deployment serves only on GPUs (the run stops there)."""
    spec = backend_spec(recipe.backend.name)
    return spec.cpu_runners if recipe.gpu.is_cpu or not spec.needs_gpu else None


def acceptance_measure(recipe: Recipe):
    """The quantize guardrail's decoder (serve/acceptance.checkpoint_tau: the servers' reference
    decoder over the checkpoint), where this machine can decode the recipe's checkpoints: a cpu
    recipe, or any with a CUDA GPU here; None elsewhere (the manifest records that it did not run)."""
    import torch

    if not (recipe.gpu.is_cpu or torch.cuda.is_available()):
        return None
    from trtllm_dflash.serve.acceptance import checkpoint_tau

    return checkpoint_tau


def _run_stage(stage: str, recipe: Recipe, input_dir: Path | None, out: Path, progress: bool,
               levels: list[int] | None, say: Callable[[str], None]) -> None:
    if stage == "convert":
        from trtllm_dflash.convert.convert import convert

        convert(recipe, out, overwrite=True, resume=True, progress=progress)
    elif stage == "quantize":
        from trtllm_dflash.quantize.stage import quantize

        quantize(recipe, input_dir, out, overwrite=True, resume=True, progress=progress, measure=acceptance_measure(recipe))
    elif stage == "build":
        from trtllm_dflash.build.stage import build, cannot_build_here

        why_not = cannot_build_here()
        if why_not:
            say(f"build: {why_not}: writing the dry-run plan (plan.json, build_config.json per engine), no engines")
        build(recipe, input_dir, out, dry_run=why_not is not None, overwrite=True, say=say)
    elif stage == "deploy":
        from trtllm_dflash.deploy.repository import deploy

        # A dry-run build (no TensorRT-LLM here) is deployed as a plan: the CPU runners serve it
        # here, and `serve` says what to build where before the GPU runners would.
        plan_only = bool(Manifest.read(input_dir).extra.get("dry_run"))
        deploy(recipe, input_dir, out, overwrite=True, plan_only=plan_only)
    elif stage == "sweep":
        import tempfile

        from trtllm_dflash.deploy.repository import REPOSITORY
        from trtllm_dflash.launch.overlay import with_runners
        from trtllm_dflash.launch.server import Endpoints, TritonServer
        from trtllm_dflash.sweep.stage import sweep

        runners = serving_runners(recipe)
        endpoints = Endpoints.free()
        with tempfile.TemporaryDirectory(prefix="trtllm-dflash-runners-") as work:
            repository = input_dir / REPOSITORY
            if runners != backend_spec(recipe.backend.name).default_runners:  # serve a copy naming these runners
                repository = with_runners(repository, recipe.serve.model_name, runners, Path(work))
            with TritonServer(repository, endpoints):
                say(f"serve: tritonserver ready on grpc {endpoints.grpc_url}, http {endpoints.http_url} ({input_dir}, "
                    f"{runners} runners)")
                result = sweep(recipe, endpoints.grpc_url, out, levels=levels, from_dir=input_dir,
                               note={"runners": runners},
                               metrics_url=f"http://{endpoints.host}:{endpoints.metrics_port}/metrics")
        say("serve: stopped")
        failed = sum(s.failed for s in result.levels)
        if failed:
            raise UserError(f"sweep: {failed} requests failed; see {out / 'results.jsonl'}")
    else:  # pragma: no cover - stages_for never yields another
        raise AssertionError(stage)
