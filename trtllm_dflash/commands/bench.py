"""`trtllm-dflash bench decode [RECIPE] [--json]`: decode speed of a recipe's pair on CPU or any
torch device, with the reference backend. (`bench serve`: the served model against in-process
decoding, perf/bench_serve.py; `bench policy`: the draft-length policy served, perf/bench_served_policy.py;
`bench acceptance`: per-slot acceptance; `bench loop`: the round loop's host cost with zero-cost
runners, perf/bench_loop.py.)

AR, DFlash and DDTree side by side in one run (interleaved, median of --repeats), greedy, on
prompts from the corpus's held-out files; tau in the decode loop; speed-ups against AR; and,
unless --no-baselines, the HF transformers baselines on the same target and prompts
(assisted generation with the AR draft model found next to the drafter, prompt lookup),
each against HF's own AR. Every mode's output is checked against the target's greedy output.
With --json the last stdout line is one JSON object with at least tau, ar_tok_s,
dflash_tok_s and speedup (see perf/bench_decode.py for all fields); --dflash2-drafter DIR adds
a DFlash2 drafter of the same target as a fourth mode (dflash2_tau, dflash2_tok_s, dflash2_speedup).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument, make_console
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.support import backend as backend_spec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks of the reference backend (bench decode RECIPE --json)")
    kinds = p.add_subparsers(dest="bench_kind", metavar="KIND", required=True)
    for add in (_add_decode, _add_serve, _add_policy, _add_acceptance, _add_loop):
        add(kinds)


def _add_decode(kinds) -> None:
    d = kinds.add_parser("decode", help="AR vs DFlash vs DDTree tokens/s and tau, plus HF baselines",
                         description=__doc__.split("\n\n")[0])
    add_recipe_argument(d)
    d.add_argument("--prompts", type=int, default=8, help="held-out prompts (default 8)")
    d.add_argument("--prompt-len", type=int, default=64)
    d.add_argument("--max-new-tokens", type=int, default=128)
    d.add_argument("--repeats", type=int, default=5,
                   help="interleaved runs per mode; the median is reported (default 5: single runs vary by ~20%% on a "
                        "shared 2-core CPU)")
    d.add_argument("--block-size", type=int, default=None, help="default: the recipe's speculative.block_size")
    d.add_argument("--ddtree-budget", type=int, default=None, help="default: the recipe's speculative.ddtree_budget")
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    d.add_argument("--no-baselines", dest="baselines", action="store_false", help="skip the HF baselines")
    d.add_argument("--ar-draft", type=Path, default=None, help="HF AR draft model (default: DRAFTER/../ar-draft)")
    d.add_argument("--dflash2-drafter", type=Path, default=None,
                   help="a DFlash2 drafter of the recipe's target: reported as a fourth mode, dflash2 "
                   "(default: DRAFTER/../drafter-dflash2 when it exists, as in the shipped pair)")
    d.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    d.set_defaults(run=run)


def _add_serve(kinds) -> None:
    s = kinds.add_parser("serve", help="tokens/s/user of the served model at concurrency 1 against in-process "
                         "decoding of the same deployment, and where the time of a round goes",
                         description="Deploys RECIPE (into --work, current stages skipped), serves it behind "
                         "tritonserver and decodes the sweep's prompts one at a time three ways, interleaved: served "
                         "(gRPC streaming), the serving engine in this process, and the bare Decoder loop "
                         "(perf/bench_serve.py). Prints served_over_inprocess (goal >= 0.9) and the per-round split.")
    add_recipe_argument(s)
    s.add_argument("--prompts", type=int, default=8, help="prompts per pass (default 8)")
    s.add_argument("--max-new-tokens", type=int, default=None, help="default: the recipe's sweep.output_len")
    s.add_argument("--torch-threads", type=int, default=None,
                   help="serve (and decode in process) with this many torch threads (default: the deployment's)")
    _add_served_run(s, repeats=5, work="runs/<recipe name>")
    s.set_defaults(run=run_serve)


def _add_policy(kinds) -> None:
    from trtllm_dflash.perf import bench_served_policy

    doc = bench_served_policy.__doc__
    q = kinds.add_parser("policy", help=doc.split("\n\n")[0].splitlines()[0], description=doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_argument(q)
    q.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels (default 1,2,4,8,16)")
    q.add_argument("--fixed", default="1,3,7,15", help="fixed draft lengths to compare (default 1,3,7,15)")
    _add_served_run(q, repeats=3, work="a temporary one")
    q.set_defaults(run=run_policy)


def _add_served_run(p, repeats: int, work: str) -> None:
    """What the benches that deploy and serve a recipe share: repeats, the pipeline directory, --json."""
    p.add_argument("--repeats", type=int, default=repeats,
                   help=f"interleaved repeats; medians are reported (default {repeats})")
    p.add_argument("--work", type=Path, default=None, help=f"pipeline directory (default: {work})")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _add_acceptance(kinds) -> None:
    a = kinds.add_parser("acceptance", help="tau and the conditional acceptance of every draft slot, measured by "
                         "the reference backend on held-out prompts (for `project --acceptance`)",
                         description="Greedy DFlash decoding of held-out prompts with the reference backend; every "
                         "verify round tells which draft slots it reached and which it accepted.")
    add_recipe_argument(a)
    a.add_argument("--prompts", type=int, default=16, help="held-out prompts (default 16)")
    a.add_argument("--prompt-len", type=int, default=64)
    a.add_argument("--max-new-tokens", type=int, default=128)
    a.add_argument("--block-size", type=int, default=None, help="default: the recipe's speculative.block_size")
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a.set_defaults(run=run_acceptance)


def _add_loop(kinds) -> None:
    from trtllm_dflash.perf import bench_loop

    doc = bench_loop.__doc__
    q = kinds.add_parser("loop", help="the round loop's host µs per round and per request with zero-cost runners, "
                         "beside the recipe's projected GPU round", description=doc,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_loop.add_arguments(q)
    q.set_defaults(run=run_loop)


def run_loop(args) -> int:
    import torch

    from trtllm_dflash.perf import bench_loop
    from trtllm_dflash.project.acceptance import resolve
    from trtllm_dflash.project.rates import Assumptions
    from trtllm_dflash.project.rounds import ProjectedRounds
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.recipe.reader import recipes_root

    for name in ("rounds", "warm", "repeats", "output_len", "prompt_len", "engine_rounds"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} is {getattr(args, name)}, expected >= 1")
    levels = _int_list("--levels", args.levels, 1, 4096)
    drafts = [d for d in args.drafts.split(",") if d == "auto" or _int_list("--drafts", d, 0, 31)]
    recipe = load_recipe(args.recipe or recipes_root() / bench_loop.DEFAULT_RECIPE, check_rules=False)
    profile = resolve(recipe, None)
    gpu = ProjectedRounds(recipe, profile, Assumptions(loop_overhead_us=0.0, loop_request_us=0.0))  # the GPU's part
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the host's work: one thread, the engine thread's
    try:
        res = bench_loop.bench(recipe, profile, gpu, levels=levels, drafts=drafts,
                               rounds=args.rounds, warm=args.warm, repeats=args.repeats, output_len=args.output_len,
                               prompt_len=args.prompt_len, engine_rounds=args.engine_rounds,
                               say=lambda s: print(s, file=sys.stderr))
    finally:
        torch.set_num_threads(before)
    res["loop_cost"] = bench_loop.loop_cost(res) if any(d != "auto" for d in drafts) else None
    bench_loop.table(res, file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        bench_loop.plot(res, args.plot)
    if args.record and res["loop_cost"] is not None:
        Path(args.record).write_text(json.dumps(res["loop_cost"], indent=2) + "\n")
    if args.json:
        print(json.dumps(res))
    return 0


def run(args) -> int:
    import torch

    from trtllm_dflash.perf.bench_decode import bench, print_report, sibling_dflash2
    from trtllm_dflash.recipe import load_recipe

    # Deployment rules (memory, build limits) do not apply to a CPU decode benchmark; the
    # checkpoints themselves are validated when they are loaded.
    recipe = load_recipe(args.recipe, args.overrides, check_rules=False)
    where = args.recipe or "the default recipe"
    for name, src in (("target", recipe.target), ("drafter", recipe.drafter)):
        if src.path is None or not (src.path / "config.json").is_file():
            raise UserError(f"{where}: {name}.source {src.source!r} is not a local checkpoint directory "
                            "(bench decode runs the reference backend on local checkpoints)")
    for name in ("prompts", "prompt_len", "max_new_tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} is {getattr(args, name)}, expected >= 1")
    torch.set_num_threads(args.threads)
    spec = recipe.speculative
    ar_draft = args.ar_draft or recipe.drafter.path.parent / "ar-draft"
    if args.baselines and args.ar_draft is not None and not (args.ar_draft / "config.json").is_file():
        raise UserError(f"--ar-draft {args.ar_draft}: no config.json (an HF causal LM directory is expected)")
    res = bench(recipe.target.path, recipe.drafter.path, prompts=args.prompts, prompt_len=args.prompt_len,
                max_new_tokens=args.max_new_tokens, block_size=args.block_size or spec.block_size,
                ddtree_budget=args.ddtree_budget or spec.ddtree_budget, repeats=args.repeats, dtype=args.dtype,
                baselines=args.baselines, ar_draft=ar_draft,
                dflash2_dir=args.dflash2_drafter or sibling_dflash2(recipe.drafter.path))
    res["recipe"] = recipe.name
    print_report(res, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res))
    return 0


def run_acceptance(args) -> int:
    from rich.table import Table

    from trtllm_dflash.project.acceptance import measure
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides, check_rules=False)
    for name in ("prompts", "prompt_len", "max_new_tokens", "threads"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} is {getattr(args, name)}, expected >= 1")
    if args.block_size is not None and args.block_size < 2:
        raise UserError(f"--block-size is {args.block_size}, expected >= 2")
    prof = measure(recipe, prompts=args.prompts, prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                   block_size=args.block_size, threads=args.threads)
    res = {"recipe": recipe.name, **prof.to_json()}
    t = Table(title=f"{recipe.name}: acceptance per draft slot (tau {res['tau']:.2f})")
    for col in ("slot", "reached", "accepted", "conditional acceptance", "tau at this draft length"):
        t.add_column(col, justify="right")
    for j, a in enumerate(prof.conditional, start=1):
        t.add_row(str(j), str(prof.reached[j - 1]), str(prof.accepted[j - 1]), f"{a:.3f}", f"{prof.tau(j):.2f}")
    t.caption = prof.source
    make_console(stderr=args.json).print(t)
    if args.json:
        print(json.dumps(res))
    return 0


def _int_list(flag: str, text: str, lo: int, hi: int) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated integers") from None
    bad = [v for v in values if not lo <= v <= hi]
    if bad:
        raise UserError(f"{flag}: {bad[0]} is outside {lo}..{hi}")
    return values


def run_policy(args) -> int:
    import tempfile

    from trtllm_dflash.perf.bench_served_policy import bench as bench_policy
    from trtllm_dflash.perf.bench_served_policy import table
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    if backend_spec(recipe.backend.name).needs_gpu:
        raise UserError(f"{args.recipe or 'the default recipe'}: backend.name is {recipe.backend.name}: bench policy "
                        "measures the reference backend's server on this machine")
    if args.repeats < 1:
        raise UserError(f"--repeats is {args.repeats}, expected >= 1")
    levels = _int_list("--levels", args.levels, 1, recipe.build.max_batch_size)
    fixed = _int_list("--fixed", args.fixed, 0, recipe.speculative.block_size - 1)
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp:
        res = bench_policy(recipe, args.work or Path(tmp), levels, args.repeats, fixed, say=say)
    table(res)
    if args.json:
        print(json.dumps(res))
    return 0


def run_serve(args) -> int:
    from trtllm_dflash.perf.bench_serve import bench, print_report
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    for name in ("prompts", "repeats", "max_new_tokens", "torch_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} is {value}, expected >= 1")
    if backend_spec(recipe.backend.name).needs_gpu:
        raise UserError(f"{args.recipe or 'the default recipe'}: backend.name is {recipe.backend.name}: bench serve "
                        "measures the reference backend's server on this machine")
    sw, limit = recipe.sweep, recipe.build.max_seq_len
    if args.max_new_tokens is not None and sw.input_len + args.max_new_tokens > limit:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: the sweep's {sw.input_len}-token prompts + "
                        f"{args.max_new_tokens} > build.max_seq_len {limit}")
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    res = bench(recipe, args.work or Path("runs") / recipe.name, prompts=args.prompts, max_tokens=args.max_new_tokens,
                repeats=args.repeats, torch_threads=args.torch_threads, say=say)
    print_report(res, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res))
    return 0
