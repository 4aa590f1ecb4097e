"""`run`: a recipe through every stage into DIR/<stage>/, make-like.

    recipe -> convert -> quantize -> build -> deploy -> serve -> sweep

The stages a recipe runs come from recipe/stages.py (quantize when it quantizes, build on the
engine backend). Each stage reads the output of the one before it (`--from`) and is skipped
when its output is current: a finished output (manifest.json) made from the same recipe
fields, from the current output of its input stage (manifest checksum), from unchanged source
files (convert) and with unchanged files. The first stale stage and everything after it
re-run; `--force STAGE` makes STAGE stale. Every write is atomic, convert and quantize keep
finished shards, so a killed run resumes where it stopped.

Every stage has the same door, `trtllm_dflash/<stage>/stage.py` (the contract:
recipe/stages.py), and `DOORS` is the one table the run walks, with no branch for any one stage.

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

from trtllm_dflash.artifacts import (
    MANIFEST,
    Manifest,
    changed_source,
    check_files,
    edited_files,
    fields_diff,
    manifest_sha256,
)
from trtllm_dflash.convert import stage as convert_door
from trtllm_dflash.deploy import stage as deploy_door
from trtllm_dflash.engines import stage as build_door
from trtllm_dflash.errors import StopHere, UserError
from trtllm_dflash.quantize import stage as quantize_door
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.stages import STAGES, StageOptions, input_stage, stage_fields, stages_for
from trtllm_dflash.serve import stage as serve_door
from trtllm_dflash.sweep import stage as sweep_door

__all__ = ["DOORS", "STOPPED", "StageRun", "StopHere", "acceptance_measure", "run", "staleness"]

# Exit code of a run that stopped at a stage belonging to another machine (not an error).
STOPPED = 3

# Every stage's door, by name (STAGES order).
DOORS = {door.NAME: door for door in (convert_door, quantize_door, build_door, deploy_door, serve_door, sweep_door)}


@dataclass
class StageRun:
    stage: str
    status: str  # "ran" | "skipped" | "stopped"
    why: str  # why it ran (what was stale), why it was skipped, or where to run it
    seconds: float = 0.0


def staleness(stage: str, out: Path, recipe: Recipe, input_dir: Path | None, extra: dict | None = None) -> str | None:
    """Why the output in `out` is not current for `recipe` (None when it is). `extra`: settings
    outside the recipe that the output must also have been made with (the door's fingerprint)."""
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
    options = StageOptions(progress=progress, say=say, levels=levels, recipe_arg=recipe_arg, measure=acceptance_measure)
    done: list[StageRun] = []
    for stage in order[: last + 1]:
        ran = _step(DOORS[stage], recipe, out, options, forced=stage == force)
        if ran is not None:
            done.append(ran)
    return done


def _step(door, recipe: Recipe, out: Path, options: StageOptions, forced: bool) -> StageRun | None:
    """One stage of the run: skipped when its output is current, else run through its door. A
    stage that writes no output (serve) only runs its door and is not reported."""
    inp = input_stage(recipe, door.NAME)
    input_dir, stage_out, say = out / inp if inp else None, out / door.NAME, options.say
    if not door.WRITES_OUTPUT:
        door.run(recipe, input_dir, stage_out, options)
        return None
    why = "forced (--force)" if forced else staleness(door.NAME, stage_out, recipe, input_dir,
                                                      door.fingerprint(recipe, options))
    if why is None:
        say(f"{door.NAME}: skipped (up to date: {stage_out})")
        return StageRun(door.NAME, "skipped", f"up to date: {stage_out}")
    say(f"{door.NAME}: running ({why})")
    edits = _edits(stage_out)
    t0 = time.perf_counter()
    door.run(recipe, input_dir, stage_out, options)
    done = StageRun(door.NAME, "ran", why, time.perf_counter() - t0)
    say(f"{door.NAME}: done in {done.seconds:.1f} s -> {stage_out}")
    for name, text in edits.items():  # the new output is the recipe's: the user's edits are kept beside it
        kept = stage_out / f"{name}.edited"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_bytes(text)
        say(f"{door.NAME}: {name} had been edited; the new one is written from the recipe, your edit is kept as "
            f"{kept} (apply it again)")
    return done


def _edits(out: Path) -> dict[str, bytes]:
    """The editable files of the output in `out` that were edited since it was written (their
    contents), before a rerun replaces them."""
    try:
        return {name: (out / name).read_bytes() for name in edited_files(out, Manifest.read(out))}
    except (UserError, OSError):  # no finished output: nothing edited to keep
        return {}


def acceptance_measure(recipe: Recipe):
    """The quantize guardrail's decoder (runtime/acceptance.checkpoint_tau: the servers' reference
    decoder over the checkpoint), where this machine can decode the recipe's checkpoints: a cpu
    recipe, or any with a CUDA GPU here; None elsewhere (the manifest records that it did not run)."""
    import torch

    if not (recipe.gpu.is_cpu or torch.cuda.is_available()):
        return None
    from trtllm_dflash.runtime.acceptance import checkpoint_tau

    return checkpoint_tau
