"""The recipe: schema (typed sections), the reader, rules (cross-field checks),
catalogs (hardware, models), the memory plan (plan/), and the fields each pipeline stage
depends on (stages.py)."""

from trtllm_dflash.recipe.load import load_recipe
from trtllm_dflash.recipe.reader import DEFAULT_RECIPE, default_recipe_path, list_recipes, parse_recipe, recipes_root
from trtllm_dflash.recipe.rules import BACKEND_FAMILIES, DEFAULT_TRTLLM_VERSION, Issue, check
from trtllm_dflash.recipe.schema import BUILTIN_PREFIX, ModelSource, Recipe, RecipeError, recipe_reference_markdown

__all__ = [
    "BACKEND_FAMILIES", "BUILTIN_PREFIX", "DEFAULT_RECIPE", "DEFAULT_TRTLLM_VERSION", "Issue", "ModelSource", "Recipe",
    "RecipeError", "check", "default_recipe_path", "list_recipes", "load_recipe", "parse_recipe",
    "recipe_reference_markdown", "recipes_root",
]
