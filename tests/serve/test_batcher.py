"""In-flight batching: requests that join and leave a running batch get exactly their solo output."""

import threading
import time

import pytest
import torch

from serve_helpers import make_pair
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.reference import generate, load_pair
from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.runtime.local_model import LocalModel
from trtllm_dflash.serve.batcher import ServingEngine
from trtllm_dflash.serve.record import Request


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_pair")
    target_dir, drafter_dir = make_pair(root)
    target, drafter = load_pair(target_dir, drafter_dir)
    from transformers import AutoTokenizer

    return target, drafter, AutoTokenizer.from_pretrained(target_dir)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PROMPTS = [[5, 17, 33, 90, 12], [7, 7, 8], [100, 200, 150, 30, 31, 32, 33], [44]]
LIMITS = [20, 12, 25, 16]


def solo(target, drafter, prompt, n, mode="dflash"):
    return generate(target, drafter, [prompt], n, mode=mode)[0].tokens


@pytest.mark.parametrize("mode", ["dflash", "ddtree", "ar"])
def test_requests_admitted_mid_flight_match_solo(pair, mode):
    target, drafter, _ = pair
    dec = Decoder(target, drafter, mode=mode, max_len=64)
    out = {i: [] for i in range(4)}

    def take(rec):
        for r, toks in zip(rec.seq_ids, rec.tokens):
            out[r].extend(toks)

    take(dec.admit([0], PROMPTS[:1], LIMITS[:1], [[0]]))
    for _ in range(2):
        take(dec.step())
    take(dec.admit([1, 2], PROMPTS[1:3], LIMITS[1:3], [[0], [0]]))  # join a running batch
    take(dec.step())
    take(dec.admit([3], PROMPTS[3:], LIMITS[3:], [[0]]))
    assert dec.running >= 2
    while dec.running:
        take(dec.step())
    for i in range(4):
        assert out[i] == solo(target, drafter, PROMPTS[i], LIMITS[i], mode), f"request {i} ({mode})"


def test_cancel_frees_the_slot_and_others_continue(pair):
    target, drafter, _ = pair
    dec = Decoder(target, drafter, max_len=64)
    out = {0: [], 1: []}
    for rec in [dec.admit([0, 1], PROMPTS[:2], [30, 12], [[0], [0]]), dec.step()]:
        for r, toks in zip(rec.seq_ids, rec.tokens):
            out[r].extend(toks)
    dec.cancel([0])
    assert dec.running == 1 and dec.target.cache.batch == 1 and dec.drafter.cache.batch == 1
    rec = dec.step()
    assert rec.seq_ids == [1]
    out[1].extend(rec.tokens[0])
    dec.admit([2], PROMPTS[2:3], [5], [[0]])  # takes the entry request 0 left: the pool does not grow
    assert dec.target.cache.k.shape[1] == 2 and dec.drafter.cache.k.shape[1] == 2
    dec.cancel([2])
    while dec.running:
        rec = dec.step()
        assert rec.seq_ids == [1]
        out[1].extend(rec.tokens[0])
    assert out[1] == solo(target, drafter, PROMPTS[1], 12)


def test_engine_serves_concurrent_jobs_with_solo_outputs(pair):
    target, drafter, tokenizer = pair
    engine = ServingEngine(LocalModel(target, drafter), tokenizer, max_seq_len=64, max_batch_size=3)
    results, done = {}, threading.Event()

    def emitter(i):
        updates = results.setdefault(i, [])

        def emit(u):
            updates.append(u)
            if u.finish_reason and all(results.get(k) and results[k][-1].finish_reason for k in range(4)):
                done.set()
        return emit

    # Per-request modes and draft lengths (AR / DDTree / DFlash at 2 drafts beside the engine's own
    # DFlash): separate decoder groups, one server; greedy output is the target's in every one.
    settings = [{}, {"mode": "ar"}, {"mode": "ddtree"}, {"mode": "dflash", "draft_len": 2}]
    try:
        for i in range(4):  # more jobs than max_batch_size: the last one waits for a free slot
            engine.submit(Request(PROMPTS[i], LIMITS[i], emitter(i), **settings[i]))
        assert done.wait(60), "engine did not finish the jobs"
    finally:
        engine.stop()
    for i in range(4):
        updates = results[i]
        expected = solo(target, drafter, PROMPTS[i], LIMITS[i])
        assert sum(u.tokens for u in updates) == len(expected) == updates[-1].total_tokens
        assert "".join(u.text for u in updates) == tokenizer.decode(expected)
        assert updates[-1].finish_reason in ("length", "stop")
        spec = updates[-1].spec
        assert spec.rounds >= 1 and 0 <= spec.accepted <= spec.drafted
        # the per-request histogram: passes by drafts accepted, summing to the request's totals
        assert sum(spec.histogram) == spec.rounds and sum(j * n for j, n in enumerate(spec.histogram)) == spec.accepted
        assert spec.acceptance_rate == pytest.approx(spec.accepted / max(1, spec.drafted))
    ar, two = results[1][-1].spec, results[3][-1].spec
    assert ar.drafted == 0 and ar.rounds == LIMITS[1] - 1  # AR: one token per pass
    assert ar.histogram[0] == ar.rounds and ar.acceptance_rate == 0.0
    assert two.drafted <= 2 * two.rounds and not any(two.histogram[3:])


def finish_reasons(engine: ServingEngine, requests: list[tuple[list[int], int, str | None]]) -> dict[int, str]:
    """Submit (prompt, max_tokens, mode or None) requests together; {index: finish reason}; the engine stopped."""
    ends, done = {}, threading.Event()

    def emit(i):
        def f(u):
            if u.finish_reason:
                ends[i] = u.finish_reason
                if len(ends) == len(requests):
                    done.set()
        return f

    try:
        for i, (prompt, n, mode) in enumerate(requests):
            engine.submit(Request(prompt, n, emit(i), **({} if mode is None else {"mode": mode})))
        assert done.wait(30)
    finally:
        engine.stop()
    return ends


def test_a_mode_the_runners_cannot_decode_fails_only_its_requests(pair):
    target, drafter, tokenizer = pair

    class NoTrees(LocalModel):
        def decoder(self, **kwargs):
            if kwargs["mode"] == "ddtree":
                raise ValueError("these runners verify no trees")
            return super().decoder(**kwargs)

    ends = finish_reasons(ServingEngine(NoTrees(target, drafter), tokenizer, max_seq_len=64),
                          [(PROMPTS[0], 8, "ddtree"), (PROMPTS[1], 8, None)])
    assert ends == {0: "error: ValueError: these runners verify no trees", 1: "length"}


def test_a_round_that_raises_fails_only_its_group(pair):
    """A decoder step that raises (a runner's error) ends the requests of its group with it; a
    request of another group (here AR beside DFlash), running at the same time, ends as usual."""
    target, drafter, tokenizer = pair

    class Flaky(LocalModel):
        def decoder(self, **kwargs):
            dec = super().decoder(**kwargs)
            if kwargs["mode"] == "dflash":
                steps, step = [0], dec.step

                def failing(drafts):
                    steps[0] += 1
                    if steps[0] == 2:
                        raise RuntimeError("verify failed (injected)")
                    return step(drafts)
                dec.step = failing
            return dec

    ends = finish_reasons(ServingEngine(Flaky(target, drafter), tokenizer, max_seq_len=64),
                          [(PROMPTS[0], 12, "ar"), (PROMPTS[1], 12, None), (PROMPTS[2], 12, None)])
    assert ends == {0: "length", 1: "error: RuntimeError: verify failed (injected)",
                    2: "error: RuntimeError: verify failed (injected)"}


def test_engine_stop_words_end_the_request(pair):
    target, drafter, tokenizer = pair
    full = tokenizer.decode(solo(target, drafter, PROMPTS[2], 25))
    word = full[len(full) // 2 : len(full) // 2 + 3]
    engine = ServingEngine(LocalModel(target, drafter), tokenizer, max_seq_len=64)
    updates, done = [], threading.Event()
    try:
        engine.submit(Request(PROMPTS[2], 25, lambda u: (updates.append(u), u.finish_reason and done.set()),
                          stop_words=[word]))
        assert done.wait(30)
    finally:
        engine.stop()
    text = "".join(u.text for u in updates)
    assert updates[-1].finish_reason == "stop" and word not in text and full.startswith(text)
    assert text == full[: full.find(word)]


@pytest.mark.parametrize("trees", [(), (32, 16, 8)], ids=["no-tree-budgets", "tree-budgets"])
def test_auto_policy_serves_ddtree_and_dflash_requests_together(pair, trees):
    """DDTree and DFlash groups under one `auto`: without tree budgets DDTree keeps the deployment's
    trees at full depth; with them every DDTree round is a tree of one of those budgets, a chain or
    plain decoding (here verified tokens cost so much that trees lose to chains). Every request
    still gets its solo output."""
    from trtllm_dflash.policy.auto import AutoDraftLength
    from trtllm_dflash.policy.cost import VerifyCost

    target, drafter, tokenizer = pair
    cost = VerifyCost(fixed=1e-3, per_token=1e-5 if not trees else 1e-2, draft=2e-4)
    policy = AutoDraftLength(block_size=drafter.block_size, cost=cost, tree_budgets=trees)
    calls = []  # (mode, draft_len, tree_budget) of every round

    class Recording(LocalModel):
        def decoder(self, **kwargs):
            d = super().decoder(**kwargs)
            step = d.step
            d.step = lambda drafts: calls.append((kwargs["mode"], drafts.per_request or drafts.length,
                                                  drafts.tree_budget)) or step(drafts)
            return d

    engine = ServingEngine(Recording(target, drafter), tokenizer, max_seq_len=64, ddtree_budget=32, policy=policy)
    ends, done = {}, threading.Event()

    def emitter(i):
        def emit(u):
            ends.setdefault(i, []).append(u)
            if u.finish_reason and len([k for k in ends if ends[k][-1].finish_reason]) == 4:
                done.set()
        return emit

    modes = ["ddtree", "dflash", "ddtree", "dflash"]
    try:
        for i in range(4):
            engine.submit(Request(PROMPTS[i], LIMITS[i], emitter(i), mode=modes[i]))
        assert done.wait(60), "engine did not finish the jobs"
    finally:
        engine.stop()
    for i in range(4):
        assert ends[i][-1].finish_reason in ("length", "stop"), ends[i][-1].finish_reason
        assert sum(u.tokens for u in ends[i]) == len(solo(target, drafter, PROMPTS[i], LIMITS[i], modes[i]))
    if not trees:
        assert {(L, n) for m, L, n in calls if m == "ddtree"} == {(None, None)}  # the deployment's trees
    else:
        assert {n for m, L, n in calls if m == "ddtree"} <= {0, *trees}
        assert any(n == 0 for m, L, n in calls if m == "ddtree")  # trees cost too much here: chains
    assert all(L is not None and n is None for m, L, n in calls if m == "dflash")
    assert len(policy.slots.population) == drafter.block_size - 1


def test_auto_observe_ignores_slots_past_the_block():
    from trtllm_dflash.policy.auto import AutoDraftLength
    from trtllm_dflash.policy.cost import VerifyCost

    auto = AutoDraftLength(block_size=4, cost=VerifyCost(1e-3, 1e-5, 2e-4), prior=0.6)
    auto.slots.observe(1, 32, 15)  # a tree round's numbers: no IndexError, three slots accepted
    assert len(auto.slots.logits) == 3 and auto.slots.seen == [1.0] * 3 and auto.slots.shifts[1] > 0


def test_stop_answers_every_request_it_leaves(pair):
    """A request left without a final update hangs its client for good (a Triton response sender
    never completed): stop() ends the running and the queued ones, and a later submit, with an error."""
    target, drafter, tokenizer = pair
    engine = ServingEngine(LocalModel(target, drafter), tokenizer, max_seq_len=512, max_batch_size=1)
    ends: dict[int, list[str]] = {}
    started = threading.Event()

    def emit(i):
        def f(u):
            started.set()
            if u.finish_reason:
                ends.setdefault(i, []).append(u.finish_reason)
        return f

    for i in range(4):  # one runs (max_batch_size 1), three wait in the inbox
        engine.submit(Request(PROMPTS[i], 400, emit(i)))
    assert started.wait(30)
    engine.stop()
    engine.submit(Request(PROMPTS[0], 8, emit(4)))
    assert ends == {i: ["error: the server is shutting down"] for i in range(5)}


def test_the_engine_reports_each_verify_round_before_the_request_ends(pair):
    """ServingEngine._deliver counts verify rounds (never the prefill) with the group's mode. Counters
    reach /metrics every flush_s; a request that ends flushes them first, so a client that scrapes on
    its answer sees its rounds (not only once the engine goes idle)."""
    pytest.importorskip("prometheus_client", reason="needs prometheus_client (the serve extra)")
    from trtllm_dflash.serve.metrics import PrometheusInstruments, SpecMetrics
    from trtllm_dflash.sweep.server_metrics import parse, totals

    target, drafter, tok = pair
    ins = PrometheusInstruments()
    engine = ServingEngine(LocalModel(target, drafter), tok, block_size=4,
                           metrics=SpecMetrics(ins, "x", flush_s=3600))  # no hand-over falls due by itself
    done, seen = threading.Event(), []

    def emit(u):
        if u.finish_reason is not None:  # what a scrape on the client's answer would read
            seen.append((u.spec, totals(parse(ins.exposition()[0].decode()), "x", "dflash")))
            done.set()

    try:
        engine.submit(Request(tok("def f(x):")["input_ids"], 12, emit))
        assert done.wait(60)
    finally:
        engine.stop()
    spec, t = seen[0]
    assert (t.rounds, t.drafted, t.accepted) == (spec.rounds, spec.drafted, spec.accepted)
    assert 0 <= t.accepted <= t.drafted and t.rounds >= 1


def test_the_policy_learns_round_times_in_seconds(pair):
    """The engine times rounds with serve/trace.now (nanoseconds); the policy's cost model is in
    seconds. Passing nanoseconds made every observed round shape look 1e9 times dearer than the
    ones not run yet, so `auto` chased unobserved shapes on every served deployment."""
    target, drafter, tok = pair
    seen = []

    class Recorder:
        modes = ("dflash",)

        def decide(self, requests, concurrency, mode):
            return Drafts(2)

        def learn(self, rec, seconds=None):
            seen.append(seconds)

        def forget(self, request):
            pass

    engine = ServingEngine(LocalModel(target, drafter), tok, block_size=4, policy=Recorder())
    done = [threading.Event(), threading.Event()]
    t0 = time.perf_counter()
    try:
        engine.submit(Request(tok("def f(x):")["input_ids"], 12, lambda u: u.finish_reason and done[0].set()))
        assert done[0].wait(60)
        n = len(seen)
        # a request with its own draft length teaches the cost of its rounds too (the same model)
        engine.submit(Request(tok("def g(y):")["input_ids"], 12, lambda u: u.finish_reason and done[1].set(),
                              draft_len=1))
        assert done[1].wait(60)
    finally:
        engine.stop()
    wall = time.perf_counter() - t0
    assert n and len(seen) > n and all(s is not None and 0 < s <= wall for s in seen), (seen, wall)


def _run_jobs(engine, jobs):
    updates = {i: [] for i in range(len(jobs))}
    done = [threading.Event() for _ in jobs]
    for i, kw in enumerate(jobs):
        emit = (lambda i: lambda u: (updates[i].append(u), u.finish_reason and done[i].set()))(i)
        engine.submit(Request(emit=emit, **kw))
    assert all(d.wait(60) for d in done)
    return updates


def test_engine_token_stop_sequences_bad_words_and_logprobs(pair):
    """A stop sequence ends the output and stays in it; a bad word never appears (the output is the
    masked decode); log-probabilities come with every token and add up to cum_logprob; the end
    token is left out when asked (skip_end_token)."""
    target, drafter, tokenizer = pair
    full = solo(target, drafter, PROMPTS[2], 25)
    stop = full[8:10]
    bad = [[full[3]]]
    masked = generate(target, drafter, [PROMPTS[2]], 25, bad_words=bad, logprobs=True)[0]
    end = full[12]
    engine = ServingEngine(LocalModel(target, drafter), tokenizer, max_seq_len=64)
    try:
        updates = _run_jobs(engine, [dict(prompt_ids=PROMPTS[2], max_tokens=25, stop_sequences=[stop]),
                                     dict(prompt_ids=PROMPTS[2], max_tokens=25, bad_words=bad, logprobs=True),
                                     dict(prompt_ids=PROMPTS[2], max_tokens=25, stop_token_ids=[end],
                                          skip_end_token=True, logprobs=True)])
    finally:
        engine.stop()
    third = [t for u in updates[2] for t in u.ids]
    assert third == full[: full.index(end)] and updates[2][-1].total_tokens == len(third)  # the end token left out
    assert len([x for u in updates[2] for x in u.logprobs]) == len(third)
    first = [t for u in updates[0] for t in u.ids]
    end = next(i for i in range(2, len(full) + 1) if full[i - 2 : i] == stop)
    assert first == full[:end] and updates[0][-1].finish_reason == "stop"
    second = [t for u in updates[1] for t in u.ids]
    lps = [x for u in updates[1] for x in u.logprobs]
    assert second == masked.tokens != full and lps == pytest.approx(masked.logprobs, abs=1e-5)
    assert updates[1][-1].cum_logprob == pytest.approx(sum(masked.logprobs), abs=1e-4)


class _FailingGroup(LocalModel):
    """The sampled group's decoder raises on its second round; `dies` also marks the model failed
    then (a dead rank)."""

    def __init__(self, target, drafter, dies: bool = False):
        super().__init__(target, drafter)
        self.dies, self.failed = dies, None

    def decoder(self, **kwargs):
        d = super().decoder(**kwargs)
        if not kwargs["sampling"].greedy:
            step, calls = d.step, []

            def flaky(drafts):
                calls.append(1)
                if len(calls) == 2:
                    if self.dies:
                        self.failed = "rank 1 died"
                    raise RuntimeError("boom")
                return step(drafts)

            d.step = flaky
        return d


def test_an_exception_in_one_groups_round_fails_that_group_only(pair):
    """Greedy and sampled requests decode in separate groups; the sampled group's round raises: its
    requests end with the error, the greedy ones finish with the target's tokens, and the server
    takes new requests."""
    from trtllm_dflash.reference.verify import SamplingParams

    target, drafter, tokenizer = pair
    engine = ServingEngine(_FailingGroup(target, drafter), tokenizer, max_seq_len=64)
    hot = SamplingParams(temperature=1.0, seed=3)
    try:
        ends = _run_jobs(engine, [dict(prompt_ids=PROMPTS[0], max_tokens=20),
                              dict(prompt_ids=PROMPTS[1], max_tokens=40, sampling=hot),
                              dict(prompt_ids=PROMPTS[2], max_tokens=25),
                              dict(prompt_ids=PROMPTS[3], max_tokens=40, sampling=hot)])
        later = _run_jobs(engine, [dict(prompt_ids=PROMPTS[3], max_tokens=16)])[0]
    finally:
        engine.stop()
    for i, n in ((0, 20), (2, 25)):
        assert [t for u in ends[i] for t in u.ids] == solo(target, drafter, PROMPTS[i], n), i
        assert ends[i][-1].finish_reason in ("length", "stop")
    assert ends[1][-1].finish_reason == ends[3][-1].finish_reason == "error: RuntimeError: boom"
    assert [t for u in later for t in u.ids] == solo(target, drafter, PROMPTS[3], 16)


def test_a_dead_model_fails_every_group(pair):
    """A round that leaves the model failed (a dead rank) ends every request, the other groups'
    too, and tells the front end once."""
    from trtllm_dflash.reference.verify import SamplingParams

    target, drafter, tokenizer = pair
    fatal = []
    engine = ServingEngine(_FailingGroup(target, drafter, dies=True), tokenizer, max_seq_len=512, on_fatal=fatal.append)
    hot = SamplingParams(temperature=1.0, seed=3)
    try:
        ends = _run_jobs(engine, [dict(prompt_ids=PROMPTS[0], max_tokens=400),
                              dict(prompt_ids=PROMPTS[1], max_tokens=400, sampling=hot)])
    finally:
        engine.stop()
    assert ends[1][-1].finish_reason == "error: RuntimeError: boom"
    assert ends[0][-1].finish_reason == "error: RuntimeError: rank 1 died" and fatal == ["rank 1 died"]
