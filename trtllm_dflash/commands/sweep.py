"""`trtllm-dflash sweep RECIPE --url HOST:PORT [--api triton|openai]`: concurrency vs interactivity
against a running server: Triton's dflash model (gRPC streaming, or HTTP with --http), or any
OpenAI-compatible endpoint (--api openai: our reference server, trtllm-serve, vLLM, SGLang), with
the same load generator and metrics. AR beside DFlash (and DDTree) from the same server and
prompts (--modes), with the headline ratios; --tune: the best draft length per level as bands."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument, make_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="sweep concurrency against a running server (Triton or OpenAI-compatible)")
    add_recipe_argument(p)
    p.add_argument("--url", required=True, help="HOST:PORT: Triton's gRPC port (HTTP port with --http), or the "
                   "OpenAI server's (--api openai; http://HOST:PORT[/v1] also accepted)")
    p.add_argument("--api", choices=("triton", "openai"), default="triton",
                   help="triton (default): the dflash model; openai: POST /v1/completions, streamed")
    p.add_argument("--metrics-url", default=None, metavar="URL",
                   help="the server's Prometheus /metrics, read for its own tau per level (default: Triton's "
                   "serve.metrics_port on --url's host; the OpenAI server's /metrics)")
    p.add_argument("--http", action="store_true",
                   help="--api triton: HTTP generate_stream (server-sent events) instead of gRPC")
    p.add_argument("--model", default=None, help="--api openai: model id (default: the recipe's serve.model_name when "
                   "the server lists it, else the server's only model)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/<recipe name>/sweep)")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="the deploy output the server serves (recorded as the sweep's input)")
    p.add_argument("--levels", default=None, help="comma-separated concurrency levels (default: the recipe's)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default greedy)")
    p.add_argument("--modes", default=None,
                   help="comma-separated curves, each request decoded as named (the dflash model's per-request mode): "
                   "ar, dflash, ddtree (default: ar,dflash, plus ddtree when the recipe has speculative.ddtree_budget; "
                   "--api openai: the server's own mode, others through our server's `dflash` request extension)")
    p.add_argument("--tune", action="store_true",
                   help="measure every level at fixed draft lengths (per-request draft_len) beside the server's own "
                   "policy; write the best as speculative.draft_len bands (OUT/draft_len.yaml)")
    p.add_argument("--tune-draft-lens", default=None,
                   help="--tune: comma-separated draft lengths (default 0,1,3,7,11 and block_size-1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="measure each level of each curve this many times, interleaved; report the median (default 1)")
    p.add_argument("--json", action="store_true", help="print the level summaries as JSON")
    p.set_defaults(run=run)


def parse_ints(text: str, flag: str) -> list[int]:
    from trtllm_dflash.errors import UserError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values:
        raise UserError(f"{flag}: expected comma-separated integers, got {text!r}")
    return values


def parse_levels(text: str | None, default: list[int]) -> list[int]:
    from trtllm_dflash.errors import UserError

    if text is None:
        return default
    levels = parse_ints(text, "--levels")
    if any(c < 1 for c in levels):
        raise UserError(f"--levels: expected positive integers, got {text!r}")
    return levels


def run(args: argparse.Namespace) -> int:
    import json

    from trtllm_dflash.artifacts import verify_input
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.recipe.support import backend as backend_spec
    from trtllm_dflash.sweep.stage import sweep

    recipe = load_recipe(args.recipe, args.overrides)
    spec = backend_spec(recipe.backend.name)
    if spec.triton_model == "llmapi" and args.api == "triton":
        raise UserError(
            "--api triton speaks the dflash model interface (reference and engine backends); for the pytorch "
            "backend sweep trtllm-serve with --api openai (serve --api openai prints its launch command)"
        )
    if args.http and args.api != "triton":
        raise UserError("--http: only with --api triton (the OpenAI API is HTTP already)")
    if args.from_dir is not None:
        verify_input(args.from_dir, ("deploy",), recipe, check_contents=False)
    if args.tune and not spec.round_loop:
        raise UserError("--tune: fixed draft lengths are per-request settings of trtllm-dflash's own servers "
                        "(reference and engine backends); trtllm-serve takes one static draft_len_schedule per "
                        "deployment: `trtllm-dflash project RECIPE` suggests bands for it")
    if args.tune and args.modes:
        raise UserError("--modes: not with --tune (it measures the server's own mode at fixed draft lengths)")
    if args.tune_draft_lens and not args.tune:
        raise UserError("--tune-draft-lens: only with --tune")
    block = recipe.speculative.block_size
    tune = None
    if args.tune:
        tune = parse_ints(args.tune_draft_lens, "--tune-draft-lens") if args.tune_draft_lens else \
            sorted({n for n in (0, 1, 3, 7, 11) if n < block} | {block - 1})
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else None
    if args.modes is not None and not modes:
        raise UserError(f"--modes: expected comma-separated modes (ar, dflash, ddtree), got {args.modes!r}")
    out = args.out or Path("runs") / recipe.name / "sweep"
    result = sweep(recipe, args.url, out, levels=parse_levels(args.levels, recipe.sweep.concurrency),
                   protocol="openai" if args.api == "openai" else "http" if args.http else "grpc",
                   temperature=args.temperature, from_dir=args.from_dir, model=args.model, modes=modes, tune=tune,
                   repeats=args.repeats, metrics_url=args.metrics_url)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print_summary(make_console(highlight=False), result.summary, result.levels, f"{recipe.name}: sweep")
        print(f"wrote {out}/results.jsonl, summary.csv, summary.json, sweep.png"
              + (", draft_len.yaml" if tune is not None else ""))
    return 1 if result.failed else 0


def print_summary(console, summary: dict, levels, title: str) -> None:
    """The level table, the headline ratios and (--tune) the tuning table, as `sweep` and `demo` show them."""
    from trtllm_dflash.sweep.report import headline_table, summary_table, tune_table

    console.print(summary_table(levels, title))
    if summary.get("headline"):
        console.print(headline_table(summary["headline"], "headline ratios (on the Pareto fronts)"))
    if summary.get("tune"):
        console.print(tune_table(summary["tune"]))
