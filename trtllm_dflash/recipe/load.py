"""`load_recipe`: parse a recipe (reader.py) and check its rules (rules.py)."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.recipe.reader import parse_recipe
from trtllm_dflash.recipe.rules import check
from trtllm_dflash.recipe.schema import Recipe, RecipeError


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None, check_rules: bool = True,
                planning: bool = False) -> Recipe:
    """Load, schema-check and rule-check a recipe. `path=None` loads the embedded default.
    Raises on the first schema error, and on all rule errors at once (one line each, naming where
    the field was written). `planning` (check, plan, project): the facts of the models the recipe
    names, not a stand-in's (reader.py)."""
    recipe = parse_recipe(path, overrides, planning)
    if check_rules:
        problems = [i for i in check(recipe) if i.level == "error"]
        if problems:
            raise error_lines(recipe, problems)
    return recipe


def error_lines(recipe: Recipe, issues) -> RecipeError:
    """Rule errors as one RecipeError, a line each starting with where its field was written."""
    return RecipeError("\n".join(f"{recipe.field_at(i.field)}: {i.message}" for i in issues))
