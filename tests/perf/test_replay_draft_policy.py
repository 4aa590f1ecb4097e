"""perf/replay_draft_policy.py: a replayed round commits exactly what Decoder.step commits (greedy,
the shipped pair, per-request lengths mixed in one round), and the replay's clock is the recorded
round times."""

import itertools
import random

import pytest
import torch

from trtllm_dflash.perf import replay_draft_policy as rp
from trtllm_dflash.perf.bench_quant import shipped_pair
from trtllm_dflash.policy.cost import VerifyCost
from trtllm_dflash.policy.decision import Drafts


class Scripted:
    """A DraftPolicy that draws each request's length per round from a seeded generator and keeps
    what every round committed per request; with `trims`, it also trims each drafted round to
    lengths it draws, keeping the confidences it was shown."""

    def __init__(self, seed, K, trims=False):
        self.rng, self.K, self.rounds, self.shown = random.Random(seed), K, [], []
        self.trims = trims

    def decide(self, requests, concurrency, mode):
        return Drafts.of({r: self.rng.randint(0, self.K) for r in requests}, None, self.trim if self.trims else None)

    def trim(self, requests, lengths, confidence):
        self.shown.append(confidence.float().clone())
        return [self.rng.randint(0, L) for L in lengths]

    def learn(self, rec, seconds=None):
        self.rounds.append({r: len(t) for r, t in zip(rec.seq_ids, rec.tokens)})

    def forget(self, request):
        pass


@pytest.mark.skipif(shipped_pair() is None, reason="the shipped pair is not installed")
def test_replayed_rounds_commit_what_the_decoder_commits():
    """Random per-request lengths, and random trims of the drafted rounds (Decoder.step's `trim`):
    round by round the replay commits what the decoder does, and shows the policy the drafter's
    confidences the decoder shows it (the recording keeps them in float16: 1e-3)."""
    from trtllm_dflash.prompts.sources import heldout_token_prompts
    from trtllm_dflash.reference import load_pair
    from trtllm_dflash.reference.generate import Decoder

    target_dir, drafter_dir = shipped_pair()
    target, drafter = load_pair(target_dir, drafter_dir, torch.float32)
    prompts, lens = heldout_token_prompts(target_dir, 3, 16), [20, 14, 25]
    K = drafter.block_size - 1
    with torch.inference_mode():
        accepted, confidence = rp.record(target, drafter, prompts, lens)
    assert [a.shape for a in accepted] == [(m - 1, K) for m in lens]
    assert [c.shape for c in confidence] == [(m - 1, K, K) for m in lens]
    rec = rp.Recording(lens, accepted, confidence, VerifyCost(1e-3, 1e-4, 1e-3, packed=True), prefill_s=0.0)
    for seed, trims in ((3, False), (4, True)):
        replayed = Scripted(seed=seed, K=K, trims=trims)
        rp.replay(rec, replayed, c=3, requests=range(3), ids=itertools.count())

        # the same choices, round by round, on the decoder itself
        script, decoded = Scripted(seed=seed, K=K, trims=trims), []
        dec = Decoder(target, drafter, max_len=max(map(len, prompts)) + max(lens) + 1)
        with torch.inference_mode():
            dec.admit([0, 1, 2], prompts, lens, [[]] * 3)
            while dec.running:
                step = dec.step(script.decide(list(dec.st.rows), 3, "dflash"))
                decoded.append({r: len(t) for r, t in zip(step.seq_ids, step.tokens)})
        assert replayed.rounds == decoded
        assert sum(len(r) for r in decoded) > 3 * 2  # several rounds, not a trivial script
        assert len(replayed.shown) == len(script.shown) and bool(script.shown) == trims
        for got, want in zip(replayed.shown, script.shown):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=0)


def test_the_clock_is_the_recorded_round_times():
    # every draft accepted: a request of m tokens at L drafts runs ceil((m - 1) / (L + 1)) rounds,
    # the last one shorter (drafts never pass the tokens left)
    cost = VerifyCost(fixed=2e-3, per_token=1e-4, draft=1e-3, per_slot=5e-5, packed=True, timed={(1, 4): 9e-3},
                      timed_draft={(1, 4): 1e-3})
    m, K = 11, 15
    rec = rp.Recording([m], [torch.full((m - 1, K), K, dtype=torch.int8)], [torch.ones(m - 1, K, K)], cost,
                       prefill_s=5e-3)
    got = rp.replay(rec, 3, c=1, requests=[0], ids=itertools.count(), clock=lambda: 0.0)
    # rounds of 3, 3, then 1 draft (one token left after 8 + the first): 4 + 4 + 2 = 10 tokens
    seconds = 9e-3 + 9e-3 + cost.lengths_s([1])  # (1, 4) is a timed shape; (1, 2) is the model's
    assert got.rates[0] == pytest.approx((m - 1) / seconds, rel=1e-9)
    assert got.lengths == {3: 2, 1: 1}

    # the policy's own time is the server's: a choice that takes 1 ms adds 1 ms to every round
    now = [0.0]

    class Slow(rp.Bands):
        def choose(self, requests, concurrency):
            now[0] += 1e-3
            return super().choose(requests, concurrency)

    got = rp.replay(rec, Slow([(1, 3)], K + 1), c=1, requests=[0], ids=itertools.count(), clock=lambda: now[0])
    assert got.rates[0] == pytest.approx((m - 1) / (seconds + 3e-3), rel=1e-9)


def test_bench_ratios_are_against_the_best_fixed_length():
    # half the positions accept everything, half nothing: drafting pays at c = 1
    cost = VerifyCost(fixed=2e-3, per_token=1e-4, draft=1e-3, per_slot=5e-5, packed=True)
    lens, K = [30] * 10, 15
    acc = [torch.tensor([[K if (p // 4) % 2 else 0] * K for p in range(m - 1)], dtype=torch.int8) for m in lens]
    conf = [torch.ones(m - 1, K, K) for m in lens]
    out = rp.bench(rp.Recording(lens, acc, conf, cost, prefill_s=1e-3), levels=(1,), served_min=6)
    (row,) = out["levels"]
    for s in (row["served"], row["all"]):
        assert s["auto_over_best"] == pytest.approx(s["auto"] / max(s["ar"], s["best"]))
        assert s["best"] == max(v for L, v in s["fixed"].items() if L != "0")
    assert row["served"]["requests"] == 6 and row["all"]["requests"] == 8
    head, body = rp.rows(out)
    assert len(body) == 2 and len(head) == len(body[0])
    assert rp.markdown(out).count("\n") == 4  # header, rule, one row per sample


def test_a_kept_recording_is_reused_only_for_the_same_requests_and_seed(tmp_path, monkeypatch):
    import trtllm_dflash.perf.bench_quant as bq

    cost = VerifyCost(fixed=2e-3, per_token=1e-4, draft=1e-3, packed=True, timed={(1, 2): 3e-3})
    path = tmp_path / "rec.pt"
    torch.save({"lens": [3], "accepted": [torch.ones(2, 15, dtype=torch.int8)], "confidence": [torch.ones(2, 15, 15)],
                "cost": vars(cost), "prefill_s": 1e-3, "settings": {"requests": 1, "seed": 0, "recording": 2}}, path)
    got = rp.load_or_record(1, 0, path)
    assert got.cost == cost and got.lens == [3] and got.block_size == 16

    class Records(Exception):
        pass

    def recording(*_):
        raise Records

    monkeypatch.setattr(bq, "shipped_pair", recording)  # the first thing recording does
    with pytest.raises(Records):
        rp.load_or_record(1, 1, path)  # another seed: that file is not its recording
