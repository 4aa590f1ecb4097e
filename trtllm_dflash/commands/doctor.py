"""`trtllm-dflash doctor RECIPE --from DEPLOY_DIR`: on the box, before serving, whether this
machine (container, GPUs, files) can serve the deployment: one line per check, exit 0 only when
every check passes (launch/doctor.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="on the GPU box: can this container serve the deployment (versions, GPUs, "
                       "plugins, MPI / NCCL, peer access, files)?",
                       description="Check, before serving, that this machine can serve a deploy output: TensorRT-LLM "
                       "and TensorRT versions, GPU count / type / free memory against the memory plan, the plugins, "
                       "MPI and NCCL, peer access between the ranks' GPUs, the deployed files against their manifests. "
                       "Exit 0 only when every check passes.")
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, required=True, metavar="DIR",
                   help="the deploy output of this recipe")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.launch.doctor import doctor, ready
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    checks = doctor(recipe, args.from_dir)
    for c in checks:
        print(c.line())
    if ready(checks):
        print(f"ready: this machine can serve {args.from_dir} ({recipe.name})")
        return 0
    bad = [c for c in checks if c.status not in ("ok", "n/a")]
    print(f"not ready: {len(bad)} check(s) did not pass ({', '.join(sorted({c.name for c in bad}))})")
    return 1
