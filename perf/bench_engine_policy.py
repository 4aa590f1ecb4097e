"""`auto`'s way of choosing on the serving engine, in one process: one draft length per round (the
default) against any length per request (`AutoConfig.mixed`) and fixed lengths.

    python -m trtllm_dflash.perf.bench_engine_policy [--levels 2,4,8,16] [--fixed 3,7] [--repeats 3]
        [--requests 24] [--work DIR]

Deploys the embedded CPU recipe with `speculative.draft_len: auto` and its sweep workload
(prompts, output lengths 64 +- 50%), opens the deployment's ServingEngine in this process (no
Triton, no gRPC: less noise than `bench policy`, which measures the served path) and, per level
and repeat, runs every curve with `c` closed-loop clients over at least `--requests` requests:
`fixed n` (each request's own draft_len), `auto` and `auto mixed` (the same policy object, its
`mixed` switched for that curve; both learn from every round). Prints tok/s/user p50 per curve
(median over repeats) and each `auto` over the best fixed length, side by side; then, per level,
`auto`'s deciles of the requests' rates (each request's rate its median over the repeats; the
same requests run in every curve) over that fixed length's deciles, quantile against quantile,
and the same of their means: where in the distribution a policy gains or loses (docs/design/
draft-length-history.md, "What the p50 measures").
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path


def closed_loop(engine, prompts, lens, c: int, draft_len: int | None) -> dict[int, float]:
    """Tokens per second of each request (first token excluded; by index into `prompts`) of `c`
    clients taking the requests in turn, DFlash chains (the deployment's DDTree aside)."""
    from trtllm_dflash.serve.record import Request

    todo, lock, rates = list(range(len(prompts))), threading.Lock(), {}

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            done, times = threading.Event(), []

            def emit(update):
                times.append(time.perf_counter())
                if update.finish_reason is not None:
                    done.set()

            engine.submit(Request(prompt_ids=prompts[i], max_tokens=lens[i], emit=emit, stop_token_ids=[],
                              draft_len=draft_len, mode="dflash"))
            done.wait()
            if lens[i] > 1 and times[-1] > times[0]:
                rates[i] = (lens[i] - 1) / (times[-1] - times[0])

    threads = [threading.Thread(target=client) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rates


DECILES = tuple(range(10, 100, 10))


def deciles(runs: list[dict[int, float]]) -> tuple[list[float], float]:
    """The deciles (10..90%) and the mean of the requests' rates, each request's rate its median
    over the repeats in `runs`."""
    from trtllm_dflash.sweep.metrics import percentile

    per_request = sorted(statistics.median(run[i] for run in runs if i in run) for i in set().union(*runs))
    return [percentile(per_request, q) for q in DECILES], statistics.mean(per_request)


def bench(work: Path, levels, fixed, repeats: int, requests: int) -> list[dict]:
    from transformers import AutoTokenizer

    from trtllm_dflash import pipeline
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.serve.deployed import open_deployed, repository_model

    recipe = load_recipe(None, ["speculative.draft_len=auto", "sweep.output_len_range=0.5"])
    pipeline.run(recipe, work, until="deploy", progress=False, say=lambda _: None)
    sw = recipe.sweep
    tok = AutoTokenizer.from_pretrained(recipe.target.path)
    deployed = open_deployed(*repository_model(work / "deploy", recipe.serve.model_name))
    engine, policy = deployed.engine, deployed.engine.policy
    rows = []
    try:
        warm = [tok(p)["input_ids"] for p in load_prompts(sw.dataset, 8, sw.input_len, sw.seed + 1)]
        closed_loop(engine, warm, [sw.output_len] * 8, 2, None)  # first rounds of a fresh process: not measured
        for c in levels:
            n = max(requests, 5 * c)
            prompts = [tok(p)["input_ids"] for p in load_prompts(sw.dataset, n, sw.input_len, sw.seed)]
            lens = sw.output_lens(n)
            runs: dict[str, list[dict[int, float]]] = {}
            for _ in range(repeats):
                for L in fixed:
                    runs.setdefault(f"fixed {L}", []).append(closed_loop(engine, prompts, lens, c, L))
                for name, mixed in (("auto", False), ("auto mixed", True)):
                    policy.config = dataclasses.replace(policy.config, mixed=mixed)
                    runs.setdefault(name, []).append(closed_loop(engine, prompts, lens, c, None))
                policy.config = dataclasses.replace(policy.config, mixed=False)
            p50 = {name: statistics.median(statistics.median(run.values()) for run in v) for name, v in runs.items()}
            best = max((f"fixed {L}" for L in fixed), key=p50.get)
            (auto_d, auto_mean), (best_d, best_mean) = deciles(runs["auto"]), deciles(runs[best])
            rows.append({"concurrency": c, "tok_s_user_p50": p50, "auto_over_best_fixed": p50["auto"] / p50[best],
                         "mixed_over_best_fixed": p50["auto mixed"] / p50[best], "best_fixed": best,
                         "auto_over_best_deciles": [a / b for a, b in zip(auto_d, best_d)],
                         "auto_over_best_mean": auto_mean / best_mean})
    finally:
        engine.stop()
    return rows


def main(argv=None) -> int:
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", type=ints, default=[2, 4, 8, 16])
    p.add_argument("--fixed", type=ints, default=[3, 7])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=24, help="requests per curve and level, at least (5 per client)")
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.requests < 1:
        p.error(f"--repeats {args.repeats} and --requests {args.requests}: both must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(args.work or Path(tmp), args.levels, args.fixed, args.repeats, args.requests)
    names = list(rows[0]["tok_s_user_p50"])
    print("c  " + "".join(f"{n:>12}" for n in names) + "   auto/best fixed   mixed/best fixed")
    for r in rows:
        print(f"{r['concurrency']:<3}" + "".join(f"{r['tok_s_user_p50'][n]:12.1f}" for n in names)
              + f"   {r['auto_over_best_fixed']:15.3f}   {r['mixed_over_best_fixed']:16.3f}")
    print("\nauto over the best fixed length (by p50) at each decile of the requests' rates, and on their mean")
    print("c  best fixed " + "".join(f"{q:>7}%" for q in DECILES) + "     mean")
    for r in rows:
        print(f"{r['concurrency']:<3}{r['best_fixed']:>10} " + "".join(f"{x:8.3f}" for x in r["auto_over_best_deciles"])
              + f"{r['auto_over_best_mean']:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
