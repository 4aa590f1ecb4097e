"""`trtllm-dflash sweep RECIPE --url HOST:PORT [--api triton|openai]`: concurrency vs interactivity
against a running server: Triton's dflash model (gRPC streaming, or HTTP with --http), or any
OpenAI-compatible endpoint (--api openai: our reference server, trtllm-serve, vLLM, SGLang), with
the same load generator and metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="sweep concurrency against a running server (Triton or OpenAI-compatible)")
    add_recipe_argument(p)
    p.add_argument("--url", required=True, help="HOST:PORT: Triton's gRPC port (HTTP port with --http), or the "
                   "OpenAI server's (--api openai; http://HOST:PORT[/v1] also accepted)")
    p.add_argument("--api", choices=("triton", "openai"), default="triton",
                   help="triton (default): the dflash model; openai: POST /v1/completions, streamed")
    p.add_argument("--http", action="store_true", help="--api triton: HTTP generate_stream (server-sent events) instead of gRPC")
    p.add_argument("--model", default=None, help="--api openai: model id (default: the recipe's serve.model_name when "
                   "the server lists it, else the server's only model)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/<recipe name>/sweep)")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="the deploy output the server serves (recorded as the sweep's input)")
    p.add_argument("--levels", default=None, help="comma-separated concurrency levels (default: the recipe's)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default greedy)")
    p.add_argument("--json", action="store_true", help="print the level summaries as JSON")
    p.set_defaults(run=run)


def parse_levels(text: str | None, default: list[int]) -> list[int]:
    from trtllm_dflash.errors import UserError

    if text is None:
        return default
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--levels: expected comma-separated integers, got {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise UserError(f"--levels: expected positive integers, got {text!r}")
    return levels


def run(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from rich.console import Console

    from trtllm_dflash.artifacts import verify_input
    from trtllm_dflash.errors import UserError
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.sweep.report import summary_table
    from trtllm_dflash.sweep.stage import sweep

    recipe = load_recipe(args.recipe, args.overrides)
    if recipe.backend.name == "pytorch" and args.api == "triton":
        raise UserError(
            "--api triton speaks the dflash model interface (reference and engine backends); for the pytorch "
            "backend sweep trtllm-serve with --api openai (serve --api openai prints its launch command)"
        )
    if args.http and args.api != "triton":
        raise UserError("--http: only with --api triton (the OpenAI API is HTTP already)")
    if args.from_dir is not None:
        verify_input(args.from_dir, ("deploy",), recipe, check_contents=False)
    out = args.out or Path("runs") / recipe.name / "sweep"
    result = sweep(recipe, args.url, out, levels=parse_levels(args.levels, recipe.sweep.concurrency),
                   protocol="openai" if args.api == "openai" else "http" if args.http else "grpc",
                   temperature=args.temperature, from_dir=args.from_dir, model=args.model)
    if args.json:
        print(json.dumps([asdict(s) for s in result.levels], indent=2))
    else:
        Console().print(summary_table(result.levels, f"{recipe.name}: sweep"))
        print(f"wrote {out}/results.jsonl, summary.csv, summary.json, sweep.png")
    failed = sum(s.failed for s in result.levels)
    return 1 if failed else 0
