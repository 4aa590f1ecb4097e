"""The deploy stage's door (the contract: recipe/stages.py): the output of the stage before it
-> a Triton model repository serving it (repository.py does the work).

Stale when: the recipe fields deploy depends on, its input, or the served model's request
inputs changed (a deployment written before an input was added is redeployed).
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.artifacts import Manifest
from trtllm_dflash.deploy.repository import deploy, model_inputs
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.stages import StageOptions

NAME = "deploy"
WRITES_OUTPUT = True


def fingerprint(recipe: Recipe, options: StageOptions) -> dict:
    return {"inputs": model_inputs(recipe)}


def run(recipe: Recipe, input_dir: Path | None, out: Path, options: StageOptions) -> Path:
    """Deploy `input_dir` into `out`. A dry-run build (no TensorRT-LLM where it ran) is deployed as
    a plan: the CPU runners serve it here, and `serve` says what to build where before the GPU
    runners would."""
    plan_only = bool(Manifest.read(input_dir).extra.get("dry_run"))
    return deploy(recipe, input_dir, out, overwrite=True, plan_only=plan_only)
