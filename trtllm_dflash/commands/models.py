"""`trtllm-dflash models RECIPE`: where each of the recipe's checkpoints is (under the models root,
in the Hugging Face cache, a stand-in) or the `hf download` line that fetches it; `--stand-ins
[--out DIR]` writes tiny random stand-ins of them instead (default DIR: the models root), so every
stage runs on a laptop up to the GPU."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="the recipe's checkpoints: where each is, the download line, or stand-ins")
    add_recipe_argument(p)
    p.add_argument("--stand-ins", action="store_true",
                   help="write tiny random checkpoints of the recipe's architectures under DIR/ORG/NAME, marked as "
                   "stand-ins in their config.json (recipe/stand_ins.py)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="the models root the stand-ins go to (default: --models, then $TRTLLM_DFLASH_MODELS)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.recipe.models_root import MODELS_ROOT_ENV, models_root

    if not args.stand_ins:
        if args.out is not None:
            raise UserError("--out: only with --stand-ins (where to write them)")
        return _where(load_recipe(args.recipe, args.overrides, check_rules=False, planning=True), models_root())
    from trtllm_dflash.recipe.stand_ins import write_stand_ins

    root = args.out if args.out is not None else os.environ.get(MODELS_ROOT_ENV) or None
    if root is None:
        raise UserError("--stand-ins: name the models root to write them to: --out DIR (or --models DIR, "
                        f"${MODELS_ROOT_ENV})")
    root = Path(root).expanduser()
    root.mkdir(parents=True, exist_ok=True)  # the root a guide has just exported may not exist yet
    recipe = load_recipe(args.recipe, args.overrides, check_rules=False, planning=True)
    written = write_stand_ins(recipe, root)
    if not written:
        print(f"{recipe.name}: its target and drafter are local directories (or shipped with the package); no "
              "stand-ins needed")
    for w in written:
        print(f"{w.role}: {w.path}: stand-in for {w.repo_id} ({'already there' if w.what == 'current' else 'written'})")
    return 0


def _where(recipe, root) -> int:
    """One line per checkpoint; exit 1 when one is found nowhere."""
    from trtllm_dflash.recipe.models_root import stand_in_of

    missing = 0
    for role in ("target", "drafter"):
        src = getattr(recipe, role)
        path = src.path
        if path is not None and path.exists():
            kind = f"stand-in for {stand_in_of(path)}" if stand_in_of(path) else "checkpoint"
            print(f"{role}: {src.source}: {path} ({kind})")
            continue
        missing += 1
        into = f"{root}/{src.source}" if root is not None else f"MODELS/{src.source}"
        print(f"{role}: {src.source}: not downloaded: hf download {src.source} --local-dir {into}")
    return 1 if missing else 0
