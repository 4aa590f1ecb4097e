"""Draft-length policies side by side on the shipped pair, in process: is DFlash ever slower than
plain decoding, and does a length per request beat one length per batch?

    python -m trtllm_dflash.perf.bench_draft_policy [--levels 1,2,4,8,16] [--max-new-tokens 64]
        [--prompt-len 64] [--repeats 3] [--threads 2] [--json]

At each concurrency c, c held-out prompts decode together in one Decoder (greedy, the shipped
pair, block 16) under each policy, interleaved policy by policy --repeats times after a warm-up;
a repeat's tokens/s/user is the mean over requests of (tokens - 1) / (seconds after the prefill
until the request finished), and the median repeat is reported. Policies:

  ar            plain decoding (mode ar)
  K=1,3,7,15    a fixed draft length every round
  auto-batch    `draft_len: auto` choosing one length per round for the whole batch, on the
                cost model of uniform rounds (what it did before per-request lengths)
  auto          `draft_len: auto` as served on the reference backend: a length per request
                per round, 0 included, on the packed cost model, drafted rounds of up to
                trim_batch requests trimmed from the drafter's confidences
                (trtllm_dflash/policy/)

Both auto policies get their VerifyCost from `measure_cost` once, before the repeats. Every
policy's tokens must equal ar's (an error otherwise). The goals of the draft-length issue,
printed as ratios: auto >= 0.97x max(ar, best fixed K) at every level, >= 1.0x ar at c >= 8,
>= 1.5x ar at c = 1; plus the share of requests' rounds auto ran with 0 drafts, and the
histogram of its lengths. With --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections import Counter

import torch

from trtllm_dflash.policy.auto import AutoDraftLength
from trtllm_dflash.policy.cost import measure_cost
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.reference import load_pair
from trtllm_dflash.reference.generate import Decoder

FIXED = (1, 3, 7, 15)


def decode(target, drafter, prompts, n, policy, ids) -> tuple[list[list[int]], float, Counter]:
    """(tokens per request, mean tokens/s/user, histogram of the draft lengths requests ran).
    ids: the requests' ids, new to `policy` (as a server's are)."""
    mode = "ar" if policy == "ar" else "dflash"
    decoder = Decoder(target, drafter if mode != "ar" else None, mode=mode, max_len=len(prompts[0]) + n + 1)
    rec = decoder.admit(ids, prompts, [n] * len(prompts), [[]] * len(prompts))
    tokens, lengths = dict(zip(ids, (list(t) for t in rec.tokens))), Counter()
    t0, done = time.perf_counter(), {}
    while decoder.running:
        alive = [r for r in ids if r not in done]
        drafts = policy.decide(alive, decoder.running, mode) if isinstance(policy, AutoDraftLength) else \
            Drafts(None if policy == "ar" else policy)
        t_step = time.perf_counter()
        rec = decoder.step(drafts)
        now = time.perf_counter()
        if isinstance(policy, AutoDraftLength):  # as serve/batcher.py
            policy.learn(rec, now - t_step)
        for r, toks, fin, drafted in zip(rec.seq_ids, rec.tokens, rec.finished, rec.drafted):
            tokens[r] += toks
            lengths[drafted] += 1
            if fin:
                done[r] = now
                if isinstance(policy, AutoDraftLength):
                    policy.forget(r)
    rate = statistics.mean((len(tokens[r]) - 1) / (done[r] - t0) for r in ids)
    return [tokens[r] for r in ids], rate, lengths


class _Unpacked:
    """A decoder that does not say it is packed: measure_cost fits it the uniform-round model that
    one-length-per-batch `auto` used."""

    def __init__(self, decoder):
        self.admit, self.step = decoder.admit, decoder.step


def bench(levels=(1, 2, 4, 8, 16), max_new_tokens=64, prompt_len=64, repeats=3, threads=2, fit_repeats=5) -> dict:
    from trtllm_dflash.perf.bench_quant import shipped_pair
    from trtllm_dflash.prompts.sources import heldout_token_prompts

    torch.set_num_threads(threads)
    target_dir, drafter_dir = shipped_pair()
    target, drafter = load_pair(target_dir, drafter_dir, torch.float32)
    all_prompts = heldout_token_prompts(target_dir, max(levels), prompt_len)
    block, vocab = drafter.block_size, target.cfg.vocab_size
    factory = lambda max_len: Decoder(target, drafter, max_len=max_len)  # noqa: E731
    with torch.inference_mode():
        # fit_repeats: timed rounds per shape of each fit (5, as a server's start-up fit times them)
        packed = measure_cost(factory, block, vocab, repeats=fit_repeats)
        uniform = measure_cost(lambda n: _Unpacked(factory(n)), block, vocab, repeats=fit_repeats)
    policies = ["ar", *FIXED, "auto-batch", "auto"]
    # One instance of each auto policy for the whole run, as a server keeps one: a new request
    # starts from the acceptance of every request before it (the warm-up pass teaches them first).
    autos = {"auto-batch": AutoDraftLength(block, uniform, trim_batch=0), "auto": AutoDraftLength(block, packed)}
    request_ids = itertools.count()
    rows = []
    for c in levels:
        prompts = all_prompts[:c]
        rates = {p: [] for p in policies}
        hist: Counter = Counter()
        for rep in range(repeats + 1):  # the first pass warms up
            ar_tokens = None
            for p in policies:
                policy = autos.get(p, p)
                with torch.inference_mode():
                    ids = [next(request_ids) for _ in prompts]
                    tokens, rate, lengths = decode(target, drafter, prompts, max_new_tokens, policy, ids)
                if p == "ar":
                    ar_tokens = tokens
                elif tokens != ar_tokens:
                    raise AssertionError(f"c={c}: policy {p} changed the greedy tokens")
                if rep:
                    rates[p].append(rate)
                    if p == "auto":
                        hist += lengths
        med = {str(p): statistics.median(v) for p, v in rates.items()}
        best_k = max(FIXED, key=lambda k: med[str(k)])
        bar = max(med["ar"], med[str(best_k)])
        rows.append({"concurrency": c, "tok_s_user": med, "best_fixed": best_k,
                     "auto_over_ar": med["auto"] / med["ar"], "auto_over_best": med["auto"] / bar,
                     "auto_batch_over_ar": med["auto-batch"] / med["ar"],
                     "auto_zero_share": hist[0] / max(1, sum(hist.values())),
                     "auto_lengths": {str(k): v for k, v in sorted(hist.items())}})
    return {"levels": rows, "cost_packed": vars(packed), "cost_uniform": vars(uniform),
            "settings": {"max_new_tokens": max_new_tokens, "prompt_len": prompt_len, "repeats": repeats,
                         "threads": threads, "block_size": block}}


def table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="tokens/s/user, in process, shipped pair (median of repeats)")
    for col in ("c", "AR", "best K", "auto-batch", "auto", "auto/AR", "auto/max(AR,K)", "0-draft share"):
        t.add_column(col, justify="right")
    for r in result["levels"]:
        m = r["tok_s_user"]
        t.add_row(str(r["concurrency"]), f"{m['ar']:.1f}", f"{m[str(r['best_fixed'])]:.1f} (K={r['best_fixed']})",
                  f"{m['auto-batch']:.1f}", f"{m['auto']:.1f}", f"{r['auto_over_ar']:.2f}x",
                  f"{r['auto_over_best']:.3f}", f"{r['auto_zero_share']:.0%}")
    Console().print(t)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    result = bench(tuple(int(x) for x in a.levels.split(",")), a.max_new_tokens, a.prompt_len, a.repeats, a.threads)
    table(result)
    if a.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
