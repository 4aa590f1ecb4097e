"""Draft-length policies replayed on recorded acceptance: the served sweep's workload, no timing noise.

    python -m trtllm_dflash.perf.replay_draft_policy [--requests 400] [--levels 1,2,4,8,16]
        [--seed 0] [--recording PATH] [--markdown] [--json]

Records once, on the shipped pair and the embedded CPU recipe's sweep workload (its prompts and
output lengths 64 +- 50%, greedy), how many drafts the target accepts at every position of every
request's output for every drafter block length (a drafter pass over the exact context; the
target's greedy tokens are known from one plain decode), and times rounds as the server does at
start-up (`measure_cost`). Then it replays the sweep's closed-loop clients at each concurrency:
each round, every running request commits min(its drafts, what its position accepts from the
round's block) + 1 tokens, and the round takes what the start-up timings say (`round_s`: the
target's part of its shape, the drafter's pass for the block drafted, on the line through
start-up's drafter times where start-up did not time the shape) plus what the policy's own calls
took on this machine (it chooses and trims inside the server's rounds and learns between them).
Policies: every fixed draft length 0..15 and `auto` (the AutoDraftLength the server runs, one
instance for the whole run, learning from every replayed round). Figures per level: tokens/s/user
p50 (first token excluded, as the sweep's), over the served bench's requests (`bench policy
--set sweep.min_requests=N`, --served-min N, 64 as docs/design/draft-length-history.md's: the first max(N, 5c) after the
two warm-ups) and over all --requests. `auto` trims the drafted rounds the server trims
(AutoDraftLength.trim, from the drafter's confidences the recording keeps), paying the drafter
for the block it drafted.

Greedy decoding is deterministic, so a replayed round commits exactly the tokens the decoder would
(tests/perf/test_replay_draft_policy.py checks it against Decoder.step) and a recording replays to
the same figures every time, the policy's own time aside: what differs between policies is the
policies and the request sample, not the machine. Rounds are timed with the CPU server's torch threads (every core but
one). Left out: serving overhead, the sweep's load on round times (rounds under load take 10-25%
longer than at start-up, the drafter's pass up to 1.5x), DDTree. --recording PATH keeps the recording (about 1.5 s a
request on 2 cores) and reuses it when it was made for the same requests and seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch

from trtllm_dflash.perf.report import markdown_table, print_table
from trtllm_dflash.policy.auto import AutoDraftLength
from trtllm_dflash.policy.bands import Bands
from trtllm_dflash.policy.cost import VerifyCost
from trtllm_dflash.policy.decision import Drafts

FIXED = tuple(range(16))


@dataclass
class Recording:
    """accepted[i][p, T - 2]: drafts of a block of T (anchor + T - 1 masks) the target accepts when
    request i's anchor is its output token p (p = 0..lens[i] - 2, T = 2..block_size);
    confidence[i][p, T - 2, j]: the drafter's probability of its draft in slot j + 1 of that block
    (its softmax's largest: greedy drafts are the argmax; 0 past slot T - 1)."""

    lens: list[int]
    accepted: list[torch.Tensor]
    confidence: list[torch.Tensor]
    cost: VerifyCost
    prefill_s: float  # one request's prefill (a closed-loop arrival pauses the batch this long)
    settings: dict = field(default_factory=dict)

    @property
    def block_size(self) -> int:
        return self.accepted[0].shape[1] + 1

    def round_s(self, lengths: Sequence[int], block: int | None = None) -> float:
        """A round that verifies these draft lengths, its drafter drafting a block of `block`
        (default max(lengths) + 1): the target's part as start-up timed its (requests, longest + 1)
        shape, less the drafter's share, scaled as the cost model scales mixed rows (the fit where
        start-up did not time the shape), and the drafter's pass as start-up timed it (on the
        line through those times where it did not: VerifyCost.draft_s). What `auto` starts from
        before any round has run."""
        B, T = len(lengths), max(lengths) + 1
        scale = self.cost.timed_verify_scale(B, T)
        return self.cost.verify_s(lengths) * (1.0 if scale is None else scale) + self.cost.draft_s(B, block or T)


def record(target, drafter, prompts: Sequence[Sequence[int]], lens: Sequence[int],
           progress=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Recording.accepted and Recording.confidence for `prompts` (token ids) decoding lens[i]
    tokens greedily."""
    from trtllm_dflash.reference.generate import Decoder
    from trtllm_dflash.reference.runners import PAD, ReferenceDrafter, ReferenceTarget

    n, K = len(prompts), drafter.block_size - 1
    ar = Decoder(target, None, mode="ar", max_len=max(map(len, prompts)) + max(lens) + 1)
    rec = ar.admit(list(range(n)), prompts, list(lens), [[]] * n)
    out = {r: list(t) for r, t in zip(rec.seq_ids, rec.tokens)}
    while ar.running:
        rec = ar.step(Drafts(0))
        for r, t in zip(rec.seq_ids, rec.tokens):
            out[r] += t
    accepted, confidence = [], []
    for i, (prompt, m) in enumerate(zip(prompts, lens)):
        full, P, rows = list(prompt) + out[i][:m], len(prompt), m - 1
        if rows < 1:
            accepted.append(torch.zeros(0, K, dtype=torch.int8))
            confidence.append(torch.zeros(0, K, K, dtype=torch.float16))
            continue
        runner = ReferenceTarget(target, drafter.target_layer_ids, len(full) + K + 1)
        _, feats = runner.prefill([full])  # [1, P + m, F]: causal, so row q is what any prefix gives it
        start = torch.arange(rows) + P  # [rows] the anchors' positions
        anchor = torch.tensor(out[i][:rows])
        pos = torch.arange(P + rows - 1)[None, :].expand(rows, -1)
        ctx_pos = torch.where(pos < start[:, None], pos, PAD)  # [rows, W] row p sees positions < P + p
        ctx = feats[0, : P + rows - 1][None] * (ctx_pos != PAD)[..., None]  # [rows, W, F]
        truth = torch.tensor(out[i][:m] + [-1] * (K + 1))
        want = torch.stack([truth[p + 1 : p + 1 + K] for p in range(rows)])  # [rows, K] the target's next tokens
        acc = torch.zeros(rows, K, dtype=torch.int8)
        conf = torch.zeros(rows, K, K, dtype=torch.float16)
        for T in range(2, K + 2):
            runner_d = ReferenceDrafter(drafter, target, len(full) + K + 1)
            runner_d.join(rows)
            top = runner_d.draft(anchor, start, ctx, ctx_pos, T).float().softmax(-1).max(-1)  # [rows, T - 1]
            acc[:, T - 2] = (top.indices == want[:, : T - 1]).long().cumprod(1).sum(1).to(torch.int8)
            conf[:, T - 2, : T - 1] = top.values.half()
        accepted.append(acc)
        confidence.append(conf)
        if progress:
            progress(i)
    return accepted, confidence


@dataclass
class Replayed:
    rates: dict[int, float]  # request -> tokens/s/user (first token excluded)
    lengths: Counter  # request-rounds by the draft length they ran


def replay(rec: Recording, policy, c: int, requests: Sequence[int], ids: Iterator[int],
           clock=time.perf_counter) -> Replayed:
    """Closed-loop clients: `c` requests run at once, the next of `requests` joins when one ends.
    policy: a fixed draft length, or a DraftPolicy (decide / learn / forget, as serve/batcher.py).
    The policy's own calls take the time `clock` (seconds) says they took."""
    from trtllm_dflash.reference.records import StepRecord

    K = rec.block_size - 1
    if isinstance(policy, int):  # a fixed length: one band for every concurrency
        policy = Bands([(c, policy)], rec.block_size)
    queue, running, now = list(requests), {}, 0.0  # running: id -> [request, tokens so far, first-token time]
    rates, lengths = {}, Counter()
    while queue or running:
        joined = 0
        while queue and len(running) < c:
            running[next(ids)] = [queue.pop(0), 1, None]
            joined += 1
        now += joined * rec.prefill_s
        for state in running.values():
            state[2] = now if state[2] is None else state[2]
        alive = [r for r, (i, g, _) in running.items() if g < rec.lens[i]]
        for r in [r for r in running if r not in alive]:  # asked for one token: done at prefill
            running.pop(r)
        if not alive:
            continue
        # the policy's own time is the server's too: it chooses and trims inside the round it times
        # (serve/batcher.py, Decoder.step) and learns between rounds, and every request waits
        t0 = clock()
        decision = policy.decide(alive, c, "dflash")
        spent = clock() - t0
        want = decision.wanted(alive, K)
        drafts = [max(0, min(w, K, rec.lens[running[r][0]] - running[r][1] - 1)) for w, r in zip(want, alive)]
        block = max(drafts) + 1  # the drafter's
        conf, trimming = None, 0.0
        trimmer = decision.trim
        if trimmer is not None and block > 1:  # Decoder.step's trim
            top = torch.stack([rec.confidence[running[r][0]][running[r][1] - 1, block - 2, : block - 1] for r in alive])
            t0 = clock()
            conf = [top[b, :L].float().tolist() for b, L in enumerate(drafts)]
            drafts = [int(L) for L in trimmer(alive, drafts, top.float())]
            trimming = clock() - t0
            spent += trimming
        tokens, finished = [], []
        for r, L in zip(alive, drafts):
            i, g, _ = running[r]
            a = min(L, int(rec.accepted[i][g - 1, block - 2])) if block > 1 else 0
            running[r][1] = g + a + 1
            tokens.append([0] * (a + 1))  # the ids do not matter to a policy: only how many
            finished.append("length" if running[r][1] >= rec.lens[i] else None)
            lengths[L] += 1
        B = len(alive)
        seconds = rec.round_s(drafts, block) + spent
        t0 = clock()
        drafting = rec.cost.draft_s(B, block) + trimming  # Decoder.step's t_draft holds the trim, not the choice
        policy.learn(StepRecord(0, alive, tokens, finished, drafts, t_draft=drafting, block=block if conf else 0,
                                confidence=conf), seconds)
        now += seconds + clock() - t0
        for r, done in zip(alive, finished):
            if done:
                i, _, t0 = running.pop(r)
                rates[i] = (rec.lens[i] - 1) / (now - t0)
                policy.forget(r)
    return Replayed(rates, lengths)


def load_or_record(n: int, seed: int, path: Path | None, say=print) -> Recording:
    """The recording of the embedded CPU recipe's first `n` sweep requests (seed `seed`)."""
    from transformers import AutoTokenizer

    from trtllm_dflash.perf.bench_quant import shipped_pair
    from trtllm_dflash.policy.cost import measure_cost
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.reference import load_pair
    from trtllm_dflash.reference.generate import Decoder

    settings = {"requests": n, "seed": seed, "recording": 2}  # 2: with the drafter's confidences
    if path is not None and path.is_file():
        saved = torch.load(path, weights_only=False)  # a file this function wrote (plain dict, tensors)
        if saved.get("settings") == settings:
            cost = VerifyCost(**saved["cost"])
            return Recording(saved["lens"], saved["accepted"], saved["confidence"], cost, saved["prefill_s"], settings)
    sw = load_recipe(None, ["sweep.output_len_range=0.5", f"sweep.seed={seed}"]).sweep
    target_dir, drafter_dir = shipped_pair()
    target, drafter = load_pair(target_dir, drafter_dir, torch.float32)
    tok = AutoTokenizer.from_pretrained(target_dir)
    prompts = [tok(p)["input_ids"] for p in load_prompts(sw.dataset, n, sw.input_len, sw.seed)]
    lens = sw.output_lens(n)
    block, vocab = drafter.block_size, target.cfg.vocab_size
    with torch.inference_mode():
        cost = measure_cost(lambda max_len: Decoder(target, drafter, max_len=max_len), block, vocab)
        took = []
        for p in prompts[:8]:
            d = Decoder(target, drafter, max_len=len(p) + 2)
            t0 = time.perf_counter()
            d.admit([0], [p], [1], [[]])
            took.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        accepted, confidence = record(target, drafter, prompts, lens,
                          progress=lambda i: say(f"recorded {i + 1}/{n} ({time.perf_counter() - t0:.0f} s)")
                          if (i + 1) % 50 == 0 else None)
    rec = Recording(lens, accepted, confidence, cost, statistics.median(took), settings)
    if path is not None:
        torch.save({"lens": lens, "accepted": accepted, "confidence": confidence, "cost": dataclasses.asdict(cost),
                    "prefill_s": rec.prefill_s, "settings": settings}, path)
    return rec


def bench(rec: Recording, levels=(1, 2, 4, 8, 16), warmup: int = 2, served_min: int = 64) -> dict:
    ids = itertools.count()
    auto = AutoDraftLength(rec.block_size, rec.cost)
    replay(rec, auto, 2, range(warmup), ids)  # the sweep's warm-up requests teach it first
    rows = []
    for c in levels:
        row = {"concurrency": c}
        samples = {"served": range(warmup, min(len(rec.lens), warmup + max(served_min, 5 * c))),
                   "all": range(warmup, len(rec.lens))}
        for name, requests in samples.items():
            p50 = {L: statistics.median(replay(rec, L, c, requests, ids).rates.values()) for L in FIXED}
            got = replay(rec, auto, c, requests, ids)
            best = max(FIXED[1:], key=p50.get)
            a = statistics.median(got.rates.values())
            row[name] = {"requests": len(requests), "ar": p50[0], "best_fixed": best, "best": p50[best], "auto": a,
                         "auto_over_best": a / max(p50[0], p50[best]), "auto_over_ar": a / p50[0],
                         "auto_zero_share": got.lengths[0] / max(1, sum(got.lengths.values())),
                         "fixed": {str(L): v for L, v in p50.items()}}
        rows.append(row)
    return {"levels": rows, "settings": rec.settings, "prefill_s": rec.prefill_s}


def rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The result as (header, rows of cells): what `table` prints and `markdown` writes."""
    head = ["c", "requests", "AR", "best fixed", "auto", "auto/AR", "auto/max(AR,fixed)", "no-draft share"]
    out = []
    for r in result["levels"]:
        for name in ("served", "all"):
            s = r[name]
            out.append([str(r["concurrency"]), f"{s['requests']} ({name})", f"{s['ar']:.1f}",
                        f"{s['best']:.1f} (L={s['best_fixed']})", f"{s['auto']:.1f}", f"{s['auto_over_ar']:.2f}x",
                        f"{s['auto_over_best']:.3f}", f"{s['auto_zero_share']:.0%}"])
    return head, out


def markdown(result: dict) -> str:
    """The result as a Markdown table (the replay block of docs/design/draft-length-history.md)."""
    return markdown_table(*rows(result))


def table(result: dict) -> None:
    s = result["settings"]
    print_table(f"replayed tokens/s/user p50 (shipped pair, sweep workload seed {s['seed']}, start-up round times)",
                *rows(result))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=400, help="sweep requests recorded (the first two warm up)")
    ap.add_argument("--seed", type=int, default=0, help="the sweep's seed (prompts, output lengths)")
    ap.add_argument("--served-min", type=int, default=64, help="the served bench's sweep.min_requests")
    ap.add_argument("--recording", type=Path, help="keep the recording here; reuse it when it matches")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads while timing rounds (default: the CPU server's, "
                         "recipe/hardware.py cpu_torch_threads)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the table as Markdown (as docs/design/draft-length-history.md shows it)")
    a = ap.parse_args(argv)
    from trtllm_dflash.recipe.hardware import cpu_torch_threads

    torch.set_num_threads(a.threads or cpu_torch_threads(1))
    rec = load_or_record(a.requests, a.seed, a.recording)
    result = bench(rec, tuple(int(x) for x in a.levels.split(",")), served_min=a.served_min)
    table(result)
    if a.markdown:
        print(markdown(result))
    if a.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
