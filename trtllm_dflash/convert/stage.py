"""The convert stage's door (the contract: recipe/stages.py): source checkpoints -> the layout
the recipe's backend loads, resuming from finished shards (convert.py does the work).

Stale when: the recipe fields convert depends on, or the source checkpoints (the manifest
lists their checksums) changed; nothing outside the recipe besides.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.convert.convert import convert
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.stages import StageOptions

NAME = "convert"
WRITES_OUTPUT = True


def fingerprint(recipe: Recipe, options: StageOptions) -> dict:
    return {}


def run(recipe: Recipe, input_dir: Path | None, out: Path, options: StageOptions) -> Path:
    """Write the checkpoint directory `out` (convert reads no earlier stage: `input_dir` is None)."""
    return convert(recipe, out, overwrite=True, resume=True, progress=options.progress)
