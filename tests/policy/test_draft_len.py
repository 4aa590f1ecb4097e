"""Per-round draft lengths (trtllm_dflash/policy/, Decoder.step(drafts)) are lossless:

- greedy: any schedule of draft lengths, 0 (speculation off) included, gives the target's
  greedy tokens (the AR mode's), with the drafter's context carried over rounds without a draft;
- sampling: a random schedule keeps the target's distribution (chi-square, as test_sampling.py);
- AutoDraftLength: its acceptance estimates follow what rounds accepted, and it picks long
  drafts when they pay for their verify cost and no drafts when they are rejected.
"""

import random

import pytest

from reference_helpers import make_drafter, make_target
from sampling_stats import PROMPT, chi_square_p, exact_joint
from trtllm_dflash.policy.auto import AutoDraftLength
from trtllm_dflash.policy.bands import Bands
from trtllm_dflash.policy.cost import VerifyCost
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.reference import SamplingParams, generate, load_pair, rounds
from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.reference.records import StepRecord


def as_drafts(choice, decoder: Decoder) -> Drafts:
    """A schedule's choice (a length for all, one per running row, or None) as the decision."""
    if isinstance(choice, list):
        return Drafts.rows(decoder.st.rows, choice)
    return Drafts.of(choice)


def decode(decoder: Decoder, prompts, limit, schedule):
    rec = decoder.admit(list(range(len(prompts))), prompts, [limit] * len(prompts), [[]] * len(prompts))
    out = [list(t) for t in rec.tokens]
    drafted = []
    while decoder.running:
        rec = decoder.step(as_drafts(schedule(), decoder))
        drafted += rec.drafted
        for r, t in zip(rec.seq_ids, rec.tokens):
            out[r] += t
    return out, drafted


@pytest.mark.parametrize("seed", range(3))
def test_any_draft_length_schedule_gives_the_greedy_tokens(qwen3_pair, seed):
    target, drafter = load_pair(*qwen3_pair)
    rng = random.Random(seed)
    prompts = [[rng.randrange(255) for _ in range(rng.randint(3, 12))] for _ in range(3)]
    ar = [g.tokens for g in generate(target, None, prompts, 30, mode="ar", stop_token_ids=[])]
    got, drafted = decode(Decoder(target, drafter, max_len=64), prompts, 30,
                          lambda: rng.choice([0, 0, 1, 3, 7, None]))
    assert got == ar
    assert 0 in drafted and max(drafted) == drafter.block_size - 1  # both kinds of rounds ran


@pytest.mark.parametrize("seed", range(3))
def test_a_draft_length_per_request_gives_the_greedy_tokens(qwen3_pair, seed):
    """Each request drafts its own length each round (0 included: plain decoding for it), in one
    packed verify: still the target's greedy tokens, and the record says what each drafted."""
    target, drafter = load_pair(*qwen3_pair)
    rng = random.Random(10 + seed)
    prompts = [[rng.randrange(255) for _ in range(rng.randint(3, 12))] for _ in range(4)]
    ar = [g.tokens for g in generate(target, None, prompts, 30, mode="ar", stop_token_ids=[])]
    decoder, longest = Decoder(target, drafter, max_len=64), drafter.block_size - 1
    choices = [0, 1, longest // 2, longest]
    got, drafted = decode(decoder, prompts, 30, lambda: [rng.choice(choices) for _ in range(decoder.running)])
    assert got == ar
    assert 0 in drafted and longest in drafted


def test_a_packed_verify_gives_each_rows_logits_of_a_padded_one(qwen3_pair):
    """The reference target's packed verify (rows of different lengths, only their own tokens run)
    equals the padded verify on every valid token (fp32: 1e-5)."""
    import torch

    from trtllm_dflash.reference.runners import ReferenceTarget

    target, drafter = load_pair(*qwen3_pair)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 255, (n,), generator=g).tolist() for n in (5, 9, 3)]
    tokens = torch.randint(0, 255, (3, 6), generator=g)
    lengths = torch.tensor([0, 5, 2])
    out = []
    for packed in (False, True):
        runner = ReferenceTarget(target, drafter.target_layer_ids, 64)
        runner.prefill(prompts)
        out.append(runner.verify(tokens, torch.tensor([5, 9, 3]), lengths if packed else None))
    for b, n in enumerate(lengths.tolist()):
        for padded, packed in zip(out[0], out[1]):
            torch.testing.assert_close(packed[b, : n + 1], padded[b, : n + 1], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny8(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny8-dl")
    t = make_target(root / "t8", "qwen3", seed=4, vocab=8, layers=2, std=0.25)
    return t, make_drafter(root / "d8", t, seed=5, block_size=4, target_layer_ids=(0, 1), std=0.25)


@pytest.mark.slow  # the per-request case below draws lengths per row as well
def test_random_draft_lengths_keep_the_sampling_distribution(tiny8):
    target, drafter = load_pair(*tiny8)
    s = SamplingParams(temperature=1.0, seed=21)
    rng = random.Random(3)
    n = 12000
    got, _ = decode(Decoder(target, drafter, sampling=s, max_len=16), [PROMPT] * n, 4, lambda: rng.choice([0, 1, 2, 3]))
    p = chi_square_p([tuple(t[:3]) for t in got], exact_joint(tiny8[0], s))
    assert p > 1e-3, f"chi-square rejects the target distribution under random draft lengths: p = {p:.2e}"


def test_random_draft_lengths_per_request_keep_the_sampling_distribution(tiny8):
    """Rejection sampling over each request's own first L drafts (verify.py `lengths`) is exact:
    chi-square as above, every request drawing its own length every round."""
    target, drafter = load_pair(*tiny8)
    s = SamplingParams(temperature=1.0, seed=22)
    gen = random.Random(4)
    decoder = Decoder(target, drafter, sampling=s, max_len=16)
    got, drafted = decode(decoder, [PROMPT] * 12000, 4,
                          lambda: [gen.choice([0, 1, 2, 3]) for _ in range(decoder.running)])
    assert {0, 1, 2} <= set(drafted)
    p = chi_square_p([tuple(t[:3]) for t in got], exact_joint(tiny8[0], s))
    assert p > 1e-3, f"chi-square rejects the target distribution under per-request draft lengths: p = {p:.2e}"


@pytest.mark.parametrize("seed", range(2))
def test_trimmed_rounds_give_the_greedy_tokens_and_verify_only_what_was_kept(qwen3_pair, monkeypatch, seed):
    """Decoder.step's trim: the round drafts the chosen lengths' block, shows trim each slot's
    drafter confidence (the top of the softmax of its logits), then verifies only the prefix trim
    keeps: the target runs max(kept) + 1 tokens, the record says what was kept and drafted, and
    the tokens are still the target's greedy ones."""
    import torch

    target, drafter = load_pair(*qwen3_pair)
    rng = random.Random(20 + seed)
    prompts = [[rng.randrange(255) for _ in range(rng.randint(3, 12))] for _ in range(3)]
    ar = [g.tokens for g in generate(target, None, prompts, 30, mode="ar", stop_token_ids=[])]
    decoder, longest = Decoder(target, drafter, max_len=64), drafter.block_size - 1
    drafted_logits, widths, shown, kept = [], [], [], []
    real_logits, real_verify = rounds._draft_logits, decoder.target.verify
    monkeypatch.setattr(rounds, "_draft_logits", lambda *a: drafted_logits.append(real_logits(*a))
                        or drafted_logits[-1])
    decoder.target.verify = lambda ids, *a: widths.append(ids.shape[1]) or real_verify(ids, *a)

    def trim(rows, lengths, confidence):
        assert rows == list(decoder.st.rows) and confidence.shape == (len(rows), max(lengths))
        shown.append((lengths, confidence))
        kept.append([rng.randint(0, L) for L in lengths])
        return kept[-1]

    rec = decoder.admit([0, 1, 2], prompts, [30] * 3, [[]] * 3)
    got, records = [list(t) for t in rec.tokens], []
    widths.clear()
    while decoder.running:
        rec = decoder.step(Drafts.rows(decoder.st.rows, [rng.choice([1, longest // 2, longest])
                                                          for _ in range(decoder.running)], trim=trim))
        records.append(rec)
        for r, t in zip(rec.seq_ids, rec.tokens):
            got[r] += t
    assert got == ar
    trimmed = [r for r in records if r.block]
    assert len(trimmed) == len(shown) == len(drafted_logits) > 3
    for r, (lengths, conf), dl, keep in zip(trimmed, shown, drafted_logits, kept):
        torch.testing.assert_close(conf, dl.float().softmax(-1).max(-1).values)  # [B, T - 1]
        assert r.block == max(lengths) + 1 and r.drafted == keep
        # every slot a row could verify (its length before the trim), verified or not
        assert r.confidence == [conf[b, :L].tolist() for b, L in enumerate(lengths)]
    assert widths == [max(r.drafted) + 1 for r in records]  # only what trim kept is verified
    assert any(max(r.drafted) + 1 < r.block for r in trimmed)  # some rounds verified a shorter block


@pytest.mark.slow
def test_confidence_trims_keep_the_sampling_distribution(tiny8):
    """Sampling: each round verifies the drafts up to the first slot whose distribution's top
    probability is below a threshold drawn per round. The trim sees the distributions, not the
    drawn tokens (generate.Trim), so rejection sampling stays exact (chi-square as above). Shown
    the drawn token's probability instead, the same trims skew it (p ~ 1e-123, tried by hand)."""
    target, drafter = load_pair(*tiny8)
    s = SamplingParams(temperature=1.0, seed=24)
    rng = random.Random(5)
    decoder = Decoder(target, drafter, sampling=s, max_len=16)
    cuts = []

    def trim(rows, lengths, confidence):
        t = rng.choice([0.3, 0.4, 0.5])
        keep = [next((j for j, c in enumerate(row[:L].tolist()) if c < t), L) for row, L in zip(confidence, lengths)]
        cuts.extend(k < L for k, L in zip(keep, lengths))
        return keep

    prompts = [PROMPT] * 12000
    rec = decoder.admit(list(range(len(prompts))), prompts, [4] * len(prompts), [[]] * len(prompts))
    got = [list(t) for t in rec.tokens]
    while decoder.running:
        rec = decoder.step(Drafts(3, trim=trim))
        for r, t in zip(rec.seq_ids, rec.tokens):
            got[r] += t
    assert 0.1 < sum(cuts) / len(cuts) < 0.9, "the trims should cut some rounds and keep others"
    p = chi_square_p([tuple(t[:3]) for t in got], exact_joint(tiny8[0], s))
    assert p > 1e-3, f"chi-square rejects the target distribution under confidence trims: p = {p:.2e}"


def test_the_drafters_time_is_what_start_up_timed_or_a_line_through_it():
    """VerifyCost.draft_s: a timed shape as timed; another on the line through the timed ones in
    the block's tokens (a trimmed round at 16 requests pays its whole block); nothing for T = 1."""
    line = lambda B, T: 1e-3 + 4e-5 * B * T  # noqa: E731
    cost = VerifyCost(fixed=1e-3, per_token=1e-4, draft=5e-4,
                      timed_draft={(B, T): line(B, T) + (1e-4 if (B, T) == (4, 8) else 0.0)
                                   for B in (1, 4) for T in range(2, 17)})
    assert cost.draft_s(4, 8) == line(4, 8) + 1e-4 and cost.draft_s(16, 1) == 0.0
    assert cost.draft_s(16, 16) == pytest.approx(line(16, 16), rel=0.01)
    assert VerifyCost(1e-3, 1e-4, 5e-4).draft_s(16, 16) == 5e-4  # nothing timed: the fit's constant


def test_trim_keeps_the_drafts_the_drafter_is_sure_of_and_learns_how_far_to_trust_it():
    """AutoDraftLength.trim on a packed runner: a request whose drafter is sure of every slot
    verifies all its drafts, one whose confidence collapses after slot 2 verifies 2 (a verified
    token costs a tenth of a round's fixed part); a request's cap (its length) is never passed.
    Rounds in which the drafter's sure slots are rejected teach the model to trust it less."""
    import torch

    cost = VerifyCost(fixed=1e-3, per_token=1e-4, draft=2e-4, packed=True)
    auto = AutoDraftLength(block_size=16, cost=cost)
    conf = torch.full((3, 15), 0.99)
    conf[1, 2:] = 0.05
    assert auto.trim([0, 1, 2], [15, 15, 6], conf) == [15, 2, 6]
    for _ in range(300):  # request 0's slot 1 at 0.99 confidence is rejected every time
        auto.learn(StepRecord(1, [0], [[7]], [None], [3], block=4, confidence=[[0.99, 0.99, 0.99]]))
    after = auto.trim([0, 1, 2], [15, 15, 6], conf)
    assert after[0] == 0  # its own shift too
    assert after[1] == 2 and after[2] < 6  # sure slots of every request are trusted less
    # the serving loop trims rounds of up to trim_batch requests only
    assert [auto.trimmer(B) for B in (1, 2, 3)] == [auto.trim, auto.trim, None]
    assert AutoDraftLength(block_size=16, cost=cost, trim_batch=0).trimmer(1) is None


def _trimmed_rounds(auto: AutoDraftLength, rounds: int, seed: int = 0) -> None:
    """`rounds` rounds of 4 requests (each lives 5 rounds) whose drafter is calibrated: slot j,
    drafted at confidence c_j ~ U(0.05, 0.95), is accepted (given the ones before) with
    probability c_j, so every slot's acceptance is 0.5. The policy chooses, trims and learns."""
    import torch

    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    live = list(range(4))
    for n in range(rounds):
        choice = auto.choose(live, 4)
        lengths = [choice[r] for r in live]
        if max(lengths) == 0:
            lengths = [1] * len(live)  # a drafted round, so that the test observes one every time
        conf = 0.05 + 0.9 * torch.rand(len(live), max(lengths), generator=g)  # [B, longest]
        kept = auto.trim(live, lengths, conf)
        tokens = []
        for b, L in enumerate(kept):
            a = 0
            while a < L and rng.random() < float(conf[b, a]):
                a += 1
            tokens.append([0] * (a + 1))
        auto.learn(StepRecord(1, list(live), tokens, [None] * len(live), kept, block=max(lengths) + 1,
                              confidence=[conf[b, :L].tolist() for b, L in enumerate(lengths)]))
        if n % 5 == 4:
            for r in live:
                auto.forget(r)
            live = [r + 4 for r in live]


def test_slots_a_trim_left_unverified_keep_the_drafts_estimates_true():
    """A trim verifies the slots the drafter is sure of; the target's verdict on the others is
    never seen. Learning the acceptance `choose` uses from the verified slots alone would learn
    the sure slots' acceptance (here 0.5 is the truth for every slot; learnt from the verified
    ones, slots 1-3 come out at 0.56, 0.65 and 0.50); with the unverified slots taken at trim's
    estimate (AutoDraftLength.observe_unverified) the population's estimate stays within 0.08 of
    the truth (600 rounds of 4 requests, seeded)."""

    def auto():
        cost = VerifyCost(fixed=1e-3, per_token=5e-5, draft=2e-4, packed=True)
        return AutoDraftLength(block_size=8, cost=cost, prior=0.5, probe_every=0)

    fair = auto()
    _trimmed_rounds(fair, 600)
    assert all(abs(a - 0.5) < 0.08 for a in fair.slots.population[:3]), fair.slots.population

    class VerifiedOnly(AutoDraftLength):  # the same policy, blind to what the trim left out
        def observe_unverified(self, *args):
            pass

    biased = VerifiedOnly(block_size=8, cost=fair.cost, prior=0.5, probe_every=0)
    _trimmed_rounds(biased, 600)
    assert max(biased.slots.population[:3]) > 0.6, biased.slots.population  # 0.56, 0.65, 0.50 (0.5 the truth)


def test_a_shape_not_run_yet_is_corrected_as_its_neighbours_are():
    """The fit misses a whole batch size alike, so a shape neither timed nor run takes its
    neighbours' correction (the line between them in T, then in batch size; the nearest past an
    end), not the fit's 1.0: otherwise every shape not run yet looks cheaper than those that
    ran, and `auto` spends rounds finding out that it is not."""
    cost = VerifyCost(fixed=1e-3, per_token=1e-4, draft=0.0, packed=True)
    auto = AutoDraftLength(block_size=16, cost=cost, probe_every=0)
    assert auto.rounds.verify_scale(16, 4) == 1.0  # nothing ran: the fit

    def ran(B, T, scale):  # a round of B requests verifying T - 1 drafts took `scale` x the fit
        auto.rounds.observe_round([T - 1] * B, scale * cost.verify_s([T - 1] * B) + 1e-4, drafting=1e-4)

    ran(16, 2, 1.3)
    ran(16, 6, 1.1)
    assert auto.rounds.verify_scale(16, 2) == pytest.approx(1.3)  # as run
    assert auto.rounds.verify_scale(16, 4) == pytest.approx(1.2)  # halfway in T
    assert auto.rounds.verify_scale(16, 9) == pytest.approx(1.1)  # past the longest: the nearest
    assert auto.rounds.verify_scale(12, 4) == pytest.approx(1.2)  # a batch size below every one seen: the nearest
    ran(8, 4, 1.0)
    assert auto.rounds.verify_scale(12, 4) == pytest.approx(1.1)  # halfway between batch sizes 8 and 16
    assert auto.round_s([3] * 12) == pytest.approx(1.1 * cost.verify_s([3] * 12))


def test_auto_does_not_choose_a_block_for_not_having_run_it():
    """Every block that ran took 1.3x the fit; the longer ones have not run. Corrected as their
    neighbours (1.3x), they are not chosen for looking 1.3x cheaper than they will be."""
    cost = VerifyCost(fixed=1e-3, per_token=1e-4, draft=0.0, packed=True)
    auto = AutoDraftLength(block_size=16, cost=cost, prior=0.8, probe_every=0)
    requests = list(range(16))
    rate = {L: sum(auto.expected_tokens(r, L) for r in requests) / cost.verify_s([L] * 16) for L in range(16)}
    best = max(rate, key=rate.get)  # the truth: every shape at 1.3x the fit
    # the fit's 1.0 would pick an unseen one
    assert 0 < best < 10 and max(rate[L] for L in range(best + 3, 16)) > rate[best] / 1.3
    for L in range(best + 3):
        drafting = 1e-4 if L else 0.0
        auto.rounds.observe_round([L] * 16, 1.3 * cost.verify_s([L] * 16) + drafting, drafting=drafting)
    assert auto.best(requests) == best


def test_the_drafters_measured_time_corrects_the_drafter_not_the_target():
    """A round's time has two parts that drift apart under load: the drafter's pass (the
    record's t_draft, over the block it drafted) and the rest. Rounds whose drafter takes twice
    what start-up timed, the rest as modelled, double the modelled drafter pass of that shape
    (and, at that batch size, of blocks not seen yet) and leave the target's part alone."""
    cost = VerifyCost(fixed=1e-3, per_token=1e-4, draft=5e-4, packed=True)
    auto = AutoDraftLength(block_size=8, cost=cost, probe_every=0)
    for _ in range(60):  # 4 requests verify 2 of a block of 6: the drafter paid for 6
        drafting = 2 * cost.draft_s(4, 6)
        seconds = cost.verify_s([2] * 4) + drafting
        auto.learn(StepRecord(1, [0, 1, 2, 3], [[0]] * 4, [None] * 4, [2] * 4, t_draft=drafting, block=6), seconds)
    assert auto.rounds.drafter_s(4, 6) == pytest.approx(2 * cost.draft_s(4, 6), rel=1e-3)
    assert auto.rounds.drafter_s(4, 8) == pytest.approx(2 * cost.draft_s(4, 8), rel=1e-3)  # the batch size's mean
    assert auto.rounds.drafter_s(2, 6) == cost.draft_s(2, 6)  # another batch size: as start-up timed
    assert auto.round_s([2] * 4) == pytest.approx(cost.verify_s([2] * 4) + auto.rounds.drafter_s(4, 3), rel=1e-3)
    assert auto.round_s([2] * 4, block=6) == pytest.approx(cost.verify_s([2] * 4) + drafting, rel=1e-3)
    # a fit that models no drafter (draft 0, nothing timed) takes a measured pass without failing
    free = AutoDraftLength(block_size=8, cost=VerifyCost(fixed=1e-3, per_token=1e-4, draft=0.0, packed=True))
    free.rounds.observe_round([2] * 4, 3e-3, drafting=1e-3, block=6)
    assert free.rounds.correction[(4, 3)] == pytest.approx(2e-3 / free.cost.verify_s([2] * 4))


def test_the_first_drafting_round_after_a_join_teaches_no_drafter_time():
    """The first round that drafts after a request joined also projects that request's prompt in
    the drafter's pass: a cost of its arrival, whatever the round drafts. That pass is not learnt
    from (the rest of the round is); a round without a drafter pass leaves the prompt pending,
    so it is the next drafting round that skips."""
    cost = VerifyCost(fixed=1e-3, per_token=1e-4, draft=5e-4, packed=True)
    auto = AutoDraftLength(block_size=8, cost=cost, probe_every=0)

    def round_of(ids, L=2, rest=3.0, drafter=3.0):  # every request verified L drafts and accepted them
        drafting = drafter * cost.draft_s(len(ids), L + 1) if L else 0.0
        rec = StepRecord(1, ids, [[5] * (L + 1)] * len(ids), [None] * len(ids), [L] * len(ids), t_draft=drafting)
        auto.learn(rec, rest * cost.verify_s([L] * len(ids)) + drafting)

    round_of([0, 1], drafter=9.0)  # both joined: the drafter also projected their prompts
    assert auto.rounds.draft_correction == {}
    assert auto.rounds.correction[(2, 3)] == pytest.approx(3.0) and set(auto.slots.shifts) == {0, 1}
    round_of([0, 1])
    assert auto.rounds.draft_correction[(2, 3)] == pytest.approx(3.0)
    round_of([0, 1, 2], drafter=9.0)  # request 2 joined
    assert (3, 3) not in auto.rounds.draft_correction and auto.rounds.correction[(3, 3)] == pytest.approx(3.0)
    auto.forget(0)
    round_of([1, 2, 0], L=0, rest=2.0)  # 0 again (a new request): no drafter pass, its prompt stays pending
    assert auto.rounds.correction[(3, 1)] == pytest.approx(2.0)
    round_of([1, 2, 0], drafter=9.0)
    assert auto.rounds.draft_correction.get((3, 3)) is None
    round_of([1, 2, 0])
    assert auto.rounds.draft_correction[(3, 3)] == pytest.approx(3.0)


def test_auto_draft_length_follows_acceptance_and_cost():
    cost = VerifyCost(fixed=1e-3, per_token=1e-5, draft=2e-4)  # verifying is cheap next to the fixed step
    auto = AutoDraftLength(block_size=16, cost=cost, prior=0.6)
    for _ in range(30):  # request 1 always accepts everything, request 2 nothing
        auto.slots.observe(1, 15, 15)
        auto.slots.observe(2, 15, 0)
    assert min(auto.slots.of(1)) > 0.98 and auto.slots.of(2)[0] < 0.15
    assert auto.expected_tokens(1, 15) > 14 and auto.expected_tokens(2, 15) < 1.3
    assert auto.choose([1], concurrency=1) == 15
    assert auto.choose([2], concurrency=1) == 0  # drafts that are always rejected only cost time
    # when every extra verify token costs as much as a whole step, long drafts stop paying
    expensive = AutoDraftLength(block_size=16, cost=VerifyCost(fixed=1e-3, per_token=1e-3, draft=1e-3), prior=0.6)
    assert expensive.choose(list(range(8)), concurrency=8) < 4
    auto.forget(1)
    assert 1 not in auto.slots.shifts


def _three_kinds_of_request(**kw) -> tuple[AutoDraftLength, VerifyCost]:
    """Request 1 accepts everything, 2 nothing, 3 three drafts a round."""
    cost = VerifyCost(fixed=1e-3, per_token=2e-5, draft=2e-4, per_slot=1e-6, packed=True)
    auto = AutoDraftLength(block_size=16, cost=cost, prior=0.6, probe_every=0, **kw)
    for _ in range(30):
        auto.slots.observe(1, 15, 15)
        auto.slots.observe(2, 15, 0)
        auto.slots.observe(3, 15, 3)
    return auto, cost


def test_on_a_packed_runner_a_request_drafts_the_rounds_length_or_nothing():
    """The default (`mixed` off): one block length per round, and the requests for which plain
    decoding makes the batch faster draft nothing. (A round costs what its longest row costs:
    perf/bench_engine_policy measures this rule and any length per request side by side.)"""
    auto, cost = _three_kinds_of_request()
    got = auto.choose([1, 2, 3], concurrency=3)
    assert got[1] > 0 and got[2] == 0 and got[3] in (0, got[1])  # one block length, or nothing
    rate = lambda lengths: sum(auto.expected_tokens(r, L) for r, L in zip([1, 2, 3], lengths)) / cost.lengths_s(lengths)  # noqa: E731
    assert all(rate([got[1], got[2], got[3]]) > rate([L] * 3) for L in range(16))
    dear = AutoDraftLength(block_size=16, cost=VerifyCost(1e-3, 1e-2, 1e-3, 0.0, True), prior=0.6, probe_every=0)
    assert set(dear.choose(list(range(8)), 8).values()) == {0}  # a verified token as dear as a step: nobody drafts


def test_mixed_gives_each_request_its_own_length_zero_included():
    """`mixed`: a request that accepts everything drafts the most, one that accepts nothing drafts
    none, in the same round; and the joint choice beats every single length (the modelled rate)."""
    auto, cost = _three_kinds_of_request(mixed=True)
    got = auto.choose([1, 2, 3], concurrency=3)
    assert got[1] == 15 and got[2] == 0 and 3 <= got[3] < 15
    rate = lambda lengths: sum(auto.expected_tokens(r, L) for r, L in zip([1, 2, 3], lengths)) / cost.lengths_s(lengths)  # noqa: E731
    joint = rate([got[1], got[2], got[3]])
    assert all(joint > rate([L] * 3) for L in range(16))
    dear = AutoDraftLength(block_size=16, cost=VerifyCost(1e-3, 1e-2, 1e-3, 0.0, True), prior=0.6, probe_every=0,
                           mixed=True)
    assert set(dear.choose(list(range(8)), 8).values()) == {0}
    # not packed: one length for the batch, as before
    assert isinstance(AutoDraftLength(block_size=16, cost=VerifyCost(1e-3, 2e-5, 2e-4)).choose([1, 2], 2), int)


def test_a_request_that_stopped_drafting_drifts_back_to_every_requests_estimate():
    """A request at 0 drafts observes nothing: without the drift its low estimate would keep it
    at 0 for good while the others show that drafting pays."""
    cost = VerifyCost(fixed=1e-3, per_token=2e-5, draft=2e-4, per_slot=1e-6, packed=True)
    auto = AutoDraftLength(block_size=8, cost=cost, prior=0.9, probe_every=0)
    for _ in range(20):
        auto.slots.observe(1, 7, 0)  # request 1 rejects everything
        auto.slots.observe(2, 7, 7)  # request 2 accepts everything
    assert auto.choose([1, 2], 2)[1] == 0
    rounds = 0
    while auto.choose([1, 2], 2)[1] == 0 and rounds < 50:
        auto.slots.observe(1, 0, 0)
        auto.slots.observe(2, 7, 7)
        rounds += 1
    assert 0 < rounds < 50 and auto.choose([1, 2], 2)[1] > 0


def test_rounds_that_cost_more_than_modelled_correct_the_choice():
    """The start-up fit is corrected by what rounds of each shape took: when drafting rounds
    turn out three times dearer than modelled and plain ones as modelled, a batch whose drafts pay
    only a little under the model stops drafting; rounds as cheap as modelled leave the choice
    alone. (Plain rounds must have run: a shape not run yet is corrected as its neighbours.)"""
    cost = VerifyCost(fixed=1e-3, per_token=2e-5, draft=5e-4, per_slot=2e-5, packed=True)
    auto = AutoDraftLength(block_size=8, cost=cost, prior=0.9, probe_every=0)
    for r in range(8):
        for _ in range(20):
            auto.slots.observe(r, 7, 1)  # one draft accepted in two: drafting pays a little
    first = auto.choose(list(range(8)), 8)
    assert max(first.values()) > 0
    for _ in range(30):
        auto.rounds.observe_round(list(first.values()), 1.0 * cost.lengths_s(list(first.values())))
    assert auto.choose(list(range(8)), 8) == first
    for _ in range(30):
        for L in range(1, 8):  # every drafting shape of 8 requests: three times its model
            auto.rounds.observe_round([L] * 8, 3.0 * cost.lengths_s([L] * 8))
    assert set(auto.choose(list(range(8)), 8).values()) != {0}  # plain rounds: as dear, by their neighbours
    auto.rounds.observe_round([0] * 8, cost.lengths_s([0] * 8))
    assert set(auto.choose(list(range(8)), 8).values()) == {0}


def test_bands_follow_concurrency():
    bands = Bands([(1, 15), (8, 4), (64, 0)], block_size=16)
    assert [bands.choose([], c) for c in (1, 2, 8, 9, 64, 100)] == [15, 4, 4, 0, 0, 0]
    assert Bands([], block_size=8).choose([], 5) == 7


def test_auto_starts_new_requests_from_every_requests_acceptance_and_probes_longer_drafts():
    cost = VerifyCost(fixed=1e-3, per_token=2e-5, draft=2e-4)
    auto = AutoDraftLength(block_size=16, cost=cost, prior=0.3, probe_every=4)
    first = auto.best([7])
    assert first < 8  # a pessimistic prior: short drafts
    for r in range(150):  # earlier requests accepted everything they drafted
        auto.slots.observe(r, 15, 15)
        auto.forget(r)
    assert min(auto.slots.population) > 0.65 and auto.best([99]) >= 8  # a new request starts from their profile
    rejecting = AutoDraftLength(block_size=16, cost=cost, prior=0.9, probe_every=4)
    for _ in range(30):
        rejecting.slots.observe(1, 15, 1)  # slot 1 accepted, slot 2 never
    choices = [rejecting.choose([1], 1) for _ in range(8)]
    L = choices[0]
    assert L < 15 and choices == [L, L, L, 2 * L + 1] * 2  # every 4th choice probes 2L + 1


def test_a_slot_observed_a_few_times_moves_the_curve_more_than_its_tracking_rate():
    """Slots past the usual length are observed only now and then: their first observations step
    the curve as a running mean against the prior would (1 / (prior_weight + n)), not at the small
    rate that tracks a well-observed slot."""
    auto = AutoDraftLength(block_size=16, cost=VerifyCost(1e-3, 2e-5, 2e-4), prior=0.9, probe_every=0)
    slow = AutoDraftLength(block_size=16, cost=VerifyCost(1e-3, 2e-5, 2e-4), prior=0.9, probe_every=0, prior_weight=1e9)
    for r in range(10):  # ten requests each got to slot 8 once and were rejected there
        auto.slots.observe(r, 15, 7)
        slow.slots.observe(r, 15, 7)
    assert auto.slots.population[7] < 0.7 < 0.85 < slow.slots.population[7]
    # accepted slots; one never observed
    assert auto.slots.population[6] > 0.9 and auto.slots.population[8] == pytest.approx(0.9)


def test_a_requests_shift_carries_its_early_slots_to_its_late_ones():
    """One shift per request: a request that keeps failing at slot 2 is modelled as hard at the
    slots it never reached, while the curve keeps what easy requests showed there."""
    auto = AutoDraftLength(block_size=16, cost=VerifyCost(1e-3, 2e-5, 2e-4), probe_every=0)
    for r in range(40):  # easy requests: twelve drafts accepted a round
        auto.slots.observe(r, 15, 12)
    for _ in range(10):
        auto.slots.observe(100, 15, 1)
    hard, new = auto.slots.of(100), auto.slots.of(101)
    assert all(h < n - 0.2 for h, n in zip(hard[4:12], new[4:12]))  # slots 5-12: never reached by 100
    assert auto.expected_tokens(100, 15) < 4 < 8 < auto.expected_tokens(101, 15)


def decode_with_policy(decoder: Decoder, policy, prompts, limit, decoys: int = 0):
    """The serving engine's use of a policy (serve/batcher.py): choose per round over the running
    requests, observe what each round accepted, forget finished requests. Half the prompts start,
    the rest join after one round; `decoys` extra requests join with them and are cancelled a
    round later. Returns every real request's tokens and the draft lengths chosen."""
    n, half = len(prompts), len(prompts) // 2
    out, alive, chosen = {i: [] for i in range(n)}, set(), []

    def take(rec):
        for k, (r, toks, done) in enumerate(zip(rec.seq_ids, rec.tokens, rec.finished)):
            if r < n:
                out[r] += toks
            if rec.round > 0:
                policy.slots.observe(r, rec.drafted[k], len(toks) - 1)
            alive.add(r)
            if done is not None:
                alive.discard(r)
                policy.forget(r)

    def step():
        L = policy.choose(sorted(alive), decoder.running)
        chosen.append(L if isinstance(L, int) else tuple(sorted(L.values())))
        take(decoder.step(Drafts.of(L)))

    take(decoder.admit(list(range(half)), prompts[:half], [limit] * half, [[]] * half))
    step()
    ids = list(range(half, n)) + list(range(n, n + decoys))
    take(decoder.admit(ids, prompts[half:] + [prompts[0]] * decoys, [limit] * len(ids), [[]] * len(ids)))
    step()
    decoder.cancel(list(range(n, n + decoys)))
    for r in range(n, n + decoys):
        alive.discard(r)
        policy.forget(r)
    while decoder.running:
        step()
    return [out[i] for i in range(n)], chosen


def test_auto_draft_length_in_the_loop_gives_the_greedy_tokens(qwen3_pair):
    """The policy drives the rounds (its choices depend on what earlier rounds accepted), with a
    join and a cancel: every request still gets the target's greedy tokens."""
    target, drafter = load_pair(*qwen3_pair)
    rng = random.Random(7)
    prompts = [[rng.randrange(255) for _ in range(rng.randint(3, 12))] for _ in range(4)]
    ar = [g.tokens for g in generate(target, None, prompts, 30, mode="ar", stop_token_ids=[])]
    policy = AutoDraftLength(block_size=drafter.block_size, cost=VerifyCost(fixed=1e-3, per_token=1e-4, draft=2e-4),
                             prior=0.5, probe_every=3)
    got, chosen = decode_with_policy(Decoder(target, drafter, max_len=64), policy, prompts, 30, decoys=2)
    assert got == ar
    assert len(set(chosen)) > 1, f"the policy never changed its draft length: {chosen}"


def test_per_request_auto_draft_lengths_in_the_loop_give_the_greedy_tokens(qwen3_pair):
    """As above with a packed cost model: every round hands the decoder {request: length}."""
    target, drafter = load_pair(*qwen3_pair)
    rng = random.Random(8)
    prompts = [[rng.randrange(255) for _ in range(rng.randint(3, 12))] for _ in range(4)]
    ar = [g.tokens for g in generate(target, None, prompts, 30, mode="ar", stop_token_ids=[])]
    cost = VerifyCost(fixed=1e-3, per_token=1e-5, draft=1e-5, per_slot=1e-6, packed=True)  # drafting pays a little
    policy = AutoDraftLength(block_size=drafter.block_size, cost=cost, prior=0.5, probe_every=3)
    for _ in range(20):  # request 0 starts out believed to accept everything: the rounds mix lengths
        policy.slots.observe(0, drafter.block_size - 1, drafter.block_size - 1)
    got, chosen = decode_with_policy(Decoder(target, drafter, max_len=64), policy, prompts, 30, decoys=2)
    assert got == ar
    assert any(len(set(c)) > 1 for c in chosen), f"every round gave every request one length: {chosen}"


@pytest.mark.parametrize("packed", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["one-length", "per-request"])
def test_auto_draft_length_in_the_loop_keeps_the_sampling_distribution(tiny8, packed):
    """Rejection sampling stays exact when the draft length is chosen from past acceptance
    (chi-square as test_sampling.py, alpha 1e-3), with half the rows joining a round later and
    cancelled decoys."""
    target, drafter = load_pair(*tiny8)
    s = SamplingParams(temperature=1.0, seed=23)
    policy = AutoDraftLength(block_size=drafter.block_size, prior=0.9, probe_every=0,  # every length is the policy's
                             cost=VerifyCost(fixed=1e-3, per_token=2e-8, draft=2e-4, packed=packed))
    got, chosen = decode_with_policy(Decoder(target, drafter, sampling=s, max_len=16), policy, [PROMPT] * 12000, 4,
                                     decoys=8)
    assert len(set(chosen)) > 1, f"the policy never changed its draft length: {chosen}"
    p = chi_square_p([tuple(t[:3]) for t in got], exact_joint(tiny8[0], s))
    assert p > 1e-3, f"chi-square rejects the target distribution under the auto draft length: p = {p:.2e}"


def test_start_up_times_every_uniform_shape_and_the_policy_starts_from_them(monkeypatch):
    """measure_cost keeps each uniform shape's time (VerifyCost.timed) next to the linear fit, and
    AutoDraftLength starts its per-shape correction from them: a round's time is not linear in its
    tokens (kernel tiles), so a shape the fit gets wrong is right from the first round."""
    import trtllm_dflash.policy.cost as dp

    clock = [0.0]
    monkeypatch.setattr(dp.time, "perf_counter", lambda: clock[0])

    def seconds(shape):  # linear, except 8-token rounds are cheap
        T = max(shape) + 1
        return 1e-3 + 1e-4 * len(shape) * T + (2e-4 if T > 1 else 0.0) - (5e-4 if T == 8 else 0.0)

    class Clocked:
        packed = False

        def __init__(self, _max_len):
            pass

        def admit(self, *args):
            pass

        def step(self, drafts):
            shape = list(drafts.per_request.values())  # Drafts.rows: one length per request, in order
            clock[0] += seconds(shape)
            return StepRecord(1, [], [], [], list(shape), t_draft=2e-4 if max(shape) else 0.0)

    cost = dp.measure_cost(Clocked, block_size=16, vocab_size=100, batches=(1, 4))
    assert set(cost.timed) == {(B, T) for B in (1, 4) for T in range(1, 17)}
    assert cost.timed[(4, 8)] == pytest.approx(seconds([7] * 4))
    assert cost.timed_draft[(4, 8)] == 2e-4 and cost.timed_draft[(1, 1)] == 0.0  # the drafter's share
    auto = AutoDraftLength(block_size=16, cost=cost, probe_every=0)
    for L in (3, 7, 9):  # every shape as timed, the cheap one included
        assert auto.round_s([L] * 4) == pytest.approx(seconds([L] * 4))
    # untimed (2 requests): the fit corrected between batch sizes 1 and 4, so the cheap shape is
    # cheap there too (within 5%, where the fit alone is 22% off), the drafter's pass on the line
    # through what start-up timed
    between = (2 * cost.timed_verify_scale(1, 8) + cost.timed_verify_scale(4, 8)) / 3
    assert auto.round_s([7] * 2) == pytest.approx(cost.verify_s([7] * 2) * between + cost.draft_s(2, 8))
    assert auto.round_s([7] * 2) == pytest.approx(seconds([7] * 2), rel=0.05)
    assert cost.verify_s([7] * 2) + cost.draft_s(2, 8) > 1.15 * seconds([7] * 2)
    assert cost.draft_s(2, 8) == pytest.approx(2e-4)
