"""`trtllm-dflash project RECIPE [--acceptance FILE|TASK [--category NAME]] [--json] [--out DIR] [--measured DIR]`:
what a recipe will deliver on its hardware before booking it: tokens/s/GPU against tokens/s/user for
AR, DFlash at each draft length, the recipe's draft-length bands and the best draft length per
concurrency, from the step-time model (trtllm_dflash/project/stepmodel.py) and an acceptance
profile (measured: `bench acceptance --json` or `profile` on your prompts, or published:
recipe/catalog/acceptance.yaml)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument, make_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("project",
                       help="projected throughput vs interactivity curves (AR vs DFlash) on the recipe's GPUs",
                       description=__doc__.split("\n\n")[0])
    add_recipe_argument(p)
    p.add_argument("--acceptance", default=None, metavar="FILE|TASK",
                   help="acceptance profile: a JSON file from `bench acceptance --json` or `profile` (profile.json), a "
                        "YAML/JSON with tau and draft_len, or a published task of the drafter (default: the catalog's "
                        "default task)")
    p.add_argument("--category", default=None, metavar="NAME",
                   help="with --acceptance PROFILE.json from `profile`: use this category's profile (default: overall)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for projection.json/.csv/.png (default runs/<recipe name>/project)")
    p.add_argument("--measured", type=Path, default=None, metavar="DIR",
                   help="a sweep output directory (summary.json) to overlay and compare")
    p.add_argument("--levels", default=None, help="comma-separated concurrency levels (default: the recipe's sweep)")
    p.add_argument("--assume", action="append", default=[], metavar="KEY=VALUE",
                   help="replace a model assumption, e.g. --assume tensor_efficiency=0.6 (repeatable)")
    p.add_argument("--attention-bench", type=Path, default=None, metavar="FILE",
                   help="output of perf/bench_kv_inject.py on the recipe's GPU: its median hbm_fraction replaces "
                        "the assumed attention efficiency")
    p.add_argument("--calibrate", action="store_true",
                   help="cpu recipes: measure this machine's rates and overheads first (a few seconds)")
    p.add_argument("--json", action="store_true", help="print the projection as JSON")
    p.set_defaults(run=run)


def parse_assumptions(items: list[str]):
    import math
    from dataclasses import fields

    from trtllm_dflash.errors import UserError
    from trtllm_dflash.project.rates import Assumptions

    known = {f.name for f in fields(Assumptions)}
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise UserError(f"--assume {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        try:
            values[key] = float(value)
        except ValueError:
            raise UserError(f"--assume {key}: {value!r} is not a number") from None
        if not math.isfinite(values[key]):
            raise UserError(f"--assume {key}: {value!r} is not a finite number")
        if values[key] < 0 or (key.endswith("efficiency") and not 0 < values[key] <= 1):
            raise UserError(f"--assume {key}: {value} is out of range (efficiencies in (0, 1], costs >= 0)")
    return Assumptions(**values)


def run(args: argparse.Namespace) -> int:
    import json
    from dataclasses import replace

    from trtllm_dflash.commands.sweep import parse_levels
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.project import acceptance, report
    from trtllm_dflash.project.projection import project
    from trtllm_dflash.project.stepmodel import Deployment, StepModel
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides, check_rules=False, planning=True)
    assumptions = parse_assumptions(args.assume)
    levels = parse_levels(args.levels, recipe.sweep.concurrency)
    profile = acceptance.resolve(recipe, args.acceptance, args.category)
    dep = Deployment.from_recipe(recipe)
    out = args.out or Path("runs") / recipe.name / "project"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory")
    console = make_console(stderr=args.json)
    calibration = None
    if args.calibrate:
        if not recipe.gpu.is_cpu:
            raise UserError(f"--calibrate: measures this machine; recipe {recipe.name!r} runs on {recipe.hardware.gpu}")
        from trtllm_dflash.project.calibrate import calibrate

        console.print("calibrating this machine ...")
        calibration = calibrate(recipe)
        dep = replace(dep, gpu=recipe.gpu.model_copy(update={"measured": calibration.measured}))
    if args.attention_bench is not None:
        from trtllm_dflash.project.rates import attention_fraction_from_bench
        from trtllm_dflash.recipe.hardware import Measured

        fraction = attention_fraction_from_bench(args.attention_bench, recipe.hardware.gpu)
        base = dep.gpu.measured or Measured(source=f"attention kernel: {args.attention_bench}")
        dep = replace(dep, gpu=dep.gpu.model_copy(update={"measured": base.model_copy(
            update={"attention_fraction": fraction})}))
    proj = project(recipe, profile, assumptions, levels, model=StepModel(dep, assumptions))
    measured = report.read_measured(args.measured) if args.measured else None
    comparison = report.compare_measured(proj, recipe, measured) if measured else None
    paths = report.write_files(proj, out, measured, comparison, f"measured ({args.measured})" if measured
                               else "measured")
    if calibration is not None:
        (out / "calibration.json").write_text(json.dumps(calibration.to_json(), indent=2))
    if args.json:
        data = json.loads(paths["json"].read_text())
        print(json.dumps(data, indent=2))
        return 0
    print_projection(console, proj, recipe, comparison)
    console.print(f"wrote {paths['json']}, {paths['csv']}, {paths['png']}")
    return 0


def print_projection(console, proj, recipe, comparison) -> None:
    """The tables, then where the acceptance and rates came from, the verify cost and the layout."""
    from trtllm_dflash.project import report

    console.print(report.levels_table(proj))
    console.print(report.headline_table(proj))
    if comparison is not None:
        t = report.comparison_table(comparison)
        t.caption = (f"{report.served_curve(recipe)[1]}; tokens/s/user pooled over a level's requests (1 / mean TPOT), "
                     "the sweep's median request beside it")
        console.print(t)
    console.print(f"acceptance: {proj.acceptance.source}")
    console.print(f"rates: {proj.rates_source}")
    console.print(proj.verify)
    if proj.layout:
        console.print(proj.layout)
    if proj.router:
        console.print(proj.router)
