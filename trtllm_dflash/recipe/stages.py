"""The pipeline's stages and the recipe fields each one depends on (one definition).

    recipe -> convert -> quantize -> build -> deploy -> serve -> sweep

A stage's output records `stage_fields(recipe, stage)`: the recipe fields it was made from,
flattened to dotted names, cumulative over the stages before it (a quantize output depends
on what convert depended on, too). Two recipes that agree on those fields produce the same
output, so the fields decide whether a stage output is current for a recipe, and a stage
refuses an input directory whose fields differ from the recipe it runs (naming the field).

Which stages a recipe runs (`stages_for`): quantize only when it quantizes something, build
only for the engine backend.

Every stage has the same door, `trtllm_dflash/<package>/stage.py` (`door_module`: the package is
the stage's name, except build's, `engines/`: ignore templates and tools take a `build/` folder
for build output), which the pipeline (trtllm_dflash/pipeline.py) walks in `STAGES` order:

    NAME                                    the stage's name in STAGES
    WRITES_OUTPUT                           False for serve: it writes no directory
    fingerprint(recipe, options) -> dict    settings outside the recipe that its output must
                                            have been made with (recorded in manifest extra)
    run(recipe, input_dir, out, options)    make the output in `out` from the output of its
                                            input stage in `input_dir` (None for convert)

An output is stale when its recipe fields (`stage_fields`), its input, its fingerprint, its
source files or its own files changed (pipeline.staleness).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trtllm_dflash.recipe.schema import BUILTIN_PREFIX, ModelSource, Recipe
from trtllm_dflash.recipe.support import backend as backend_spec

STAGES = ("convert", "quantize", "build", "deploy", "serve", "sweep")
# The package folder of a stage whose folder is not its name (trtllm_dflash/<folder>/).
PACKAGE = {"build": "engines"}


def door_module(stage: str) -> str:
    """The dotted module of a stage's door, e.g. "trtllm_dflash.engines.stage" for build."""
    return f"trtllm_dflash.{PACKAGE.get(stage, stage)}.stage"

# The fields each stage adds to what the stages before it depend on (dotted prefixes).
OWN_FIELDS: dict[str, tuple[str, ...]] = {
    "convert": ("target.source", "drafter.source", "backend.name", "parallel.tp", "parallel.drafter",
                "checkpoint_dtype"),
    "quantize": ("quantization",),
    "build": ("hardware", "build", "speculative", "backend", "parallel"),
    "deploy": ("name", "target.arch", "drafter.arch", "serve"),
    "serve": (),
    "sweep": ("sweep",),
}


@dataclass(frozen=True)
class StageOptions:
    """What a run hands every stage's door besides the recipe and the directories."""

    progress: bool = True  # progress bars
    say: Callable[[str], None] = print  # one line per event
    levels: list[int] | None = None  # sweep: the concurrency levels (None: the recipe's)
    recipe_arg: str = "RECIPE"  # how the user named the recipe, for commands to run elsewhere
    # quantize: recipe -> the acceptance guardrail's decoder (quantize/guard.Measure) or None.
    # Handed in: whether this machine can decode the recipe's checkpoints is the caller's to say.
    measure: Callable[[Any], Any] | None = None


def build_command(recipe: Recipe, from_dir: Path | str | None, out: Path | str) -> str:
    """The command that builds engines into `out` (a dry-run build's directory: --overwrite) from
    the convert / quantize output `from_dir`; what every "build them inside the container" says."""
    return f"trtllm-dflash build {recipe.file or 'RECIPE'} --from {from_dir or 'FROM_DIR'} --out {out} --overwrite"


def source_ref(src: ModelSource) -> str:
    """A model source as a stage output records it: builtin or HF id unchanged, local paths absolute."""
    if src.source.startswith(BUILTIN_PREFIX) or src.path is None:
        return src.source
    return str(src.path)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def stage_fields(recipe: Recipe, stage: str) -> dict[str, Any]:
    """The recipe fields an output of `stage` depends on, as {dotted name: value}."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    raw = recipe.model_dump(mode="json")
    raw["target"]["source"], raw["drafter"]["source"] = source_ref(recipe.target), source_ref(recipe.drafter)
    raw["checkpoint_dtype"] = {r: recipe.quantization.checkpoint_dtype(r) for r in ("target", "drafter")}
    flat = _flatten(raw)
    prefixes = [p for s in STAGES[: STAGES.index(stage) + 1] for p in OWN_FIELDS[s]]
    return {k: v for k, v in sorted(flat.items()) if any(k == p or k.startswith(p + ".") for p in prefixes)}


def fields_sha256(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def stages_for(recipe: Recipe) -> list[str]:
    """The stages `recipe` runs, in order."""
    skip = set()
    if not recipe.quantization.quantizes:
        skip.add("quantize")
    if not backend_spec(recipe.backend.name).builds_engines:
        skip.add("build")
    return [s for s in STAGES if s not in skip]


def input_stage(recipe: Recipe, stage: str) -> str | None:
    """The stage whose output directory `stage` reads (`--from`), or None for convert. serve
    writes no directory: sweep measures what deploy wrote."""
    before = [s for s in stages_for(recipe) if STAGES.index(s) < STAGES.index(stage) and s != "serve"]
    return before[-1] if before else None
