"""`load_recipe`: parse a recipe (reader.py) and check its rules (rules.py)."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.recipe.reader import DEFAULT_RECIPE, parse_recipe
from trtllm_dflash.recipe.rules import check
from trtllm_dflash.recipe.schema import Recipe, RecipeError


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None, check_rules: bool = True) -> Recipe:
    """Load, schema-check and rule-check a recipe. `path=None` loads the embedded default.
    Raises on the first schema error, and on all rule errors at once (one line each)."""
    recipe = parse_recipe(path, overrides)
    if check_rules:
        file = str(path) if path is not None else f"(default) {DEFAULT_RECIPE}"
        problems = [i for i in check(recipe) if i.level == "error"]
        if problems:
            raise RecipeError("\n".join(f"{file}: {i.field}: {i.message}" for i in problems))
    return recipe
