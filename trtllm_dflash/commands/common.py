"""Helpers shared by the CLI subcommands."""

from __future__ import annotations

import argparse


def add_recipe_argument(p: argparse.ArgumentParser, required: bool = False) -> None:
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


def gib(x: float) -> str:
    return f"{x / 2**30:,.2f}"
