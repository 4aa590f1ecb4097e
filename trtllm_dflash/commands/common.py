"""Helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


class _ModelsRoot(argparse.Action):
    """--models DIR: where HF-id sources were downloaded (recipe/models_root.py), for this process
    and the stages it starts. A DIR that does not exist is the line $TRTLLM_DFLASH_MODELS gets."""

    def __call__(self, parser, namespace, value, option_string=None):
        from trtllm_dflash.recipe.models_root import MODELS_ROOT_ENV, checked_root

        os.environ[MODELS_ROOT_ENV] = str(checked_root(value, "--models"))
        setattr(namespace, self.dest, value)


def add_recipe_argument(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument(
        "--models", action=_ModelsRoot, metavar="DIR", default=None,
        help="where the recipe's Hugging Face ids were downloaded (DIR/ORG/NAME, as `hf download ORG/NAME "
        "--local-dir DIR/ORG/NAME` writes them; default $TRTLLM_DFLASH_MODELS, then the local Hugging Face cache)")
    p.add_argument(
        "recipe",
        nargs=None if required else "?",
        default=None,
        help="recipe YAML (default: the embedded CPU recipe, recipes/cpu/tiny-pystd.yaml)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set parallel.tp=2 (repeatable)",
    )


def add_stage_output_arguments(p: argparse.ArgumentParser, stage: str) -> None:
    """--out, --resume, --overwrite, --no-progress of a stage that writes a checkpoint directory."""
    p.add_argument("--out", type=Path, required=True, help="output directory (written atomically)")
    p.add_argument("--resume", action="store_true",
                   help="keep the shards an interrupted run of the same inputs finished")
    p.add_argument("--overwrite", action="store_true", help=f"replace an earlier {stage} output of the same recipe")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def gib(x: float) -> str:
    return f"{x / 2**30:,.2f}"


LOG_COLUMNS = 100  # the tables (sweep, headline, projection) are laid out for a 100-column terminal


def make_console(**kwargs):
    """A rich Console. Output that is not a terminal (a log file, a pipe, CI) gets LOG_COLUMNS
    columns instead of rich's 80, so the tables keep every digit; COLUMNS still wins when set."""
    from rich.console import Console

    c = Console(**kwargs)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c.width = LOG_COLUMNS
    return c
