"""The routing layer's cost: NVIDIA Dynamo's frontend against our own OpenAI server, on the same
deployment, side by side in one run: throughput, time to first token and time per output token.

    python perf/bench_dynamo.py [RECIPE] [--set KEY=VALUE ...] [--work DIR] [--levels 1,8]
        [--requests 4] [--repeats 2] [--json]

The recipe (default: the embedded CPU one) is deployed as `run --until deploy` does (into
--work, default runs/<recipe name>; current stages are skipped). Then, in a loopback-only
network namespace (the script runs itself again under `unshare -n`: Dynamo 1.6.1's event plane
binds every interface), two servers over that deployment: `serve --api openai` (ours) and one
`serve --api dynamo` worker behind `python -m dynamo.frontend` (launch/dynamo_local.py). At each
concurrency level the sweep's load generator (sweep/loadgen.py, the deployment's own mode, greedy,
the sweep's prompts and output length) sends --requests streamed /v1/completions to each, --repeats
times, the two interleaved (the order alternating) so the drift of a shared machine falls on both
alike. Per server and level: output tokens/s of the level (throughput), and the median request's
TTFT and TPOT (sweep/metrics.py); a level reports the median over its repeats of each, and of the
per-repeat ratio dynamo / ours (throughput: below 1.0 the frontend costs; TTFT and TPOT: above
1.0 it does; the frontend tokenizes, detokenizes and streams what the worker sends, one more
process hop). --set overrides go to the deploy and to both servers alike (e.g.
speculative.draft_len=[] skips the auto policy's start-up timing on a busy machine).

With --json the last stdout line is one JSON object: {"recipe", "mode", "levels": [{"concurrency",
METRIC: {"ours", "dynamo", "dynamo_over_ours"} for METRIC in METRICS}], ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INSIDE = "TRTLLM_DFLASH_BENCH_NETNS"  # set in the namespace's run of this script
SERVERS = ("ours", "dynamo")
METRICS = {"tok_s": "throughput, tok/s", "ttft_ms": "TTFT p50, ms", "tpot_ms": "TPOT p50, ms"}


def _median(xs):
    xs = [x for x in xs if x]
    return statistics.median(xs) if xs else None


def metric_row(repeats: list[dict[str, float | None]]) -> dict:
    """One metric at one level: each server's median over the repeats, and the median ratio."""
    ratios = [r["dynamo"] / r["ours"] for r in repeats if r.get("dynamo") and r.get("ours")]
    return {**{s: _median([r.get(s) for r in repeats]) for s in SERVERS}, "dynamo_over_ours": _median(ratios)}


def level_row(concurrency: int, repeats: list[dict[str, dict[str, float | None]]]) -> dict:
    """One level from its repeats ({server: {metric: value}}): metric_row of every metric."""
    return {"concurrency": concurrency, **{m: metric_row([{s: (r.get(s) or {}).get(m) for s in SERVERS}
                                                           for r in repeats]) for m in METRICS}}


def _measure(url: str, model: str, dynamo: bool, prompts: list[str], concurrency: int, requests: int, max_tokens: int,
             seed: int, mode: str) -> dict[str, float | None]:
    from trtllm_dflash.sweep.loadgen import Variant, run_level
    from trtllm_dflash.sweep.metrics import summarize_level
    from trtllm_dflash.sweep.protocols import ModelIO

    recs = asyncio.run(run_level(url, model, prompts, concurrency, requests, 1, max_tokens, seed, 0.0,
                                 protocol="openai", variant=Variant(mode), io=ModelIO(dynamo=dynamo)))
    failed = [r.error for r in recs if not r.ok]
    if failed:
        raise RuntimeError(f"{'dynamo' if dynamo else 'ours'}: {len(failed)} requests failed: {failed[0]}")
    row = summarize_level(recs, concurrency, 1)
    return {"tok_s": row.output_tok_s, "ttft_ms": row.ttft_s.p50 * 1e3 if row.ttft_s else None,
            "tpot_ms": row.tpot_s.p50 * 1e3 if row.tpot_s else None}


def _start_ours(recipe: list[str], deploy: Path, work: Path) -> tuple[subprocess.Popen, str]:
    """`serve --api openai`, started (it loads while the Dynamo worker does); _ready waits for it."""
    from trtllm_dflash.launch.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trtllm_dflash", "serve", *recipe, "--from", str(deploy), "--api",
                             "openai", "--http-port", str(port)], stdout=subprocess.PIPE,
                            stderr=(work / "ours.log").open("w"), text=True, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _ready(proc: subprocess.Popen, work: Path) -> None:
    if not proc.stdout.readline().startswith("ready:"):
        raise RuntimeError(f"our OpenAI server did not start: {(work / 'ours.log').read_text()[-2000:]}")


def inside(recipe_path: str | None, overrides: list[str], deploy: Path, levels: list[int], requests: int, repeats: int,
           say=lambda m: print(m, file=sys.stderr, flush=True)) -> dict:
    """The measurement, run in the namespace."""
    from trtllm_dflash.launch.dynamo_local import LocalDynamo, stop_group
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.recipe import load_recipe

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    recipe = load_recipe(recipe_path, overrides)
    recipe_arg = ([recipe_path] if recipe_path else []) + [x for o in overrides for x in ("--set", o)]
    sw, mode = recipe.speculative, "ddtree" if recipe.speculative.ddtree_budget else "dflash"
    prompts = load_prompts(recipe.sweep.dataset, requests * max(levels) + 1, recipe.sweep.input_len, recipe.sweep.seed)
    with tempfile.TemporaryDirectory(prefix="bench-dynamo-") as tmp:
        work = Path(tmp)
        ours, ours_url = _start_ours(recipe_arg, deploy, work)
        try:
            with LocalDynamo(deploy, work / "dynamo", recipe_arg, model=recipe.serve.model_name) as dyn:
                dyn.add_worker()
                dyn.wait_for_workers(1)
                _ready(ours, work)
                urls = {"ours": ours_url, "dynamo": dyn.url}
                rows = []
                for c in levels:
                    per = []
                    for r in range(repeats):
                        got = {}
                        for s in (SERVERS if r % 2 == 0 else SERVERS[::-1]):
                            got[s] = _measure(urls[s], recipe.serve.model_name, s == "dynamo", prompts, c, requests * c,
                                              recipe.sweep.output_len, recipe.sweep.seed + 1000 * r, mode)
                        per.append(got)
                        say(f"  c={c} repeat {r + 1}: " + ", ".join(
                            f"{m} ours {got['ours'][m] or 0:.1f} dynamo {got['dynamo'][m] or 0:.1f}" for m in METRICS))
                    rows.append(level_row(c, per))
        finally:
            stop_group([ours])
    return {"recipe": recipe.name, "mode": mode, "block_size": sw.block_size, "levels": rows, "requests": requests,
            "repeats": repeats, "max_tokens": recipe.sweep.output_len, "cpus": os.cpu_count(),
            "load_average": os.getloadavg()}


def print_report(res: dict, file=sys.stdout) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res['recipe']} ({res['mode']}): ours vs through Dynamo's frontend (median of {res['repeats']})")
    for col in ("concurrency", "metric", "ours", "dynamo", "dynamo / ours"):
        t.add_column(col, justify="right")
    for row in res["levels"]:
        for m, label in METRICS.items():
            cell = row[m]
            t.add_row(str(row["concurrency"]), label, *[f"{cell[s]:.1f}" if cell[s] else "-" for s in SERVERS],
                      f"{cell['dynamo_over_ours']:.3f}" if cell["dynamo_over_ours"] else "-")
    Console(file=file, highlight=False, width=100).print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="perf/bench_dynamo.py", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", nargs="?", default=None)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe overrides, for the deploy and both servers")
    p.add_argument("--work", type=Path, default=None, help="where the recipe is deployed (default runs/<recipe name>)")
    p.add_argument("--levels", default="1,8")
    p.add_argument("--requests", type=int, default=4, help="requests per level, times its concurrency")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", action="store_true")
    # the namespace's run: the deploy output
    p.add_argument("--deploy", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    levels = [int(x) for x in a.levels.split(",")]
    recipe_arg = ([a.recipe] if a.recipe else []) + [x for o in a.overrides for x in ("--set", o)]
    if os.environ.get(INSIDE):
        res = inside(a.recipe, a.overrides, a.deploy, levels, a.requests, a.repeats)
        print(json.dumps(res), flush=True)
        return 0
    from trtllm_dflash import pipeline
    from trtllm_dflash.recipe import load_recipe

    recipe = load_recipe(a.recipe, a.overrides)
    work = a.work or Path("runs") / recipe.name
    pipeline.run(recipe, work, until="deploy", progress=False, say=print)
    t0 = time.monotonic()
    r = subprocess.run(["unshare", "-n", sys.executable, str(Path(__file__).resolve()), *recipe_arg, "--deploy",
                        str((work / "deploy").resolve()), "--levels", a.levels, "--requests", str(a.requests),
                        "--repeats", str(a.repeats)], env={**os.environ, INSIDE: "1"}, stdout=subprocess.PIPE,
                       text=True)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        print(r.stdout, file=sys.stderr)
        return r.returncode or 1
    print("\n".join(lines[:-1]))
    res = {**json.loads(lines[-1]), "wall_s": round(time.monotonic() - t0, 1)}
    print_report(res)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
