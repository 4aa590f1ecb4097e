"""The engine backend's runners on CPU (FakeExecutor over the tap engine, the torch drafter
network) drive the one round loop to exactly the reference runners' tokens.

- greedy: random prompts, batch mixes, mid-flight joins and cancels (seeded scenarios), on
  a Qwen3 and a Llama pair: identical tokens round by round;
- sampling: the target's distribution (chi-square, as tests/reference/test_sampling.py);
- the fake Executor's 1.2.1 rules: reused prefixes return no context rows, unknown outputs
  and over-long requests are error responses;
- a runner failure mid-round fails only that batch's requests in the serving batcher.
"""

import random
import re
import time

import pytest
import torch

from reference_helpers import make_drafter, make_target
from sampling_stats import PROMPT, chi_square_p, exact_joint
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.recipe import recipes_root
from trtllm_dflash.reference import SamplingParams, load_pair, rounds
from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.runtime.engine_runners import (
    ENGINE_OUTPUTS,
    EngineTarget,
    TapEngine,
    drafter_weights,
    engine_model_from_pair,
)
from trtllm_dflash.runtime.fake_executor import AdditionalModelOutput, FakeExecutor, OutputConfig, Request
from trtllm_dflash.runtime.local_model import LocalModel

RECIPES = recipes_root()


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"engine-{request.param}")
    t = make_target(root / "t", request.param, seed=3)
    return load_pair(t, make_drafter(root / "d", t, seed=4, block_size=8))


def scenario(seed: int, vocab: int):
    """A seeded script of admits (with prompts and limits) and cancels, by round."""
    rng = random.Random(seed)
    events, rid = [], 0
    for rnd in range(8):
        if rnd == 0 or rng.random() < 0.5:
            n = rng.randint(1, 3)
            prompts = [[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 20))] for _ in range(n)]
            events.append((rnd, "admit", list(range(rid, rid + n)), prompts, [rng.randint(1, 30) for _ in range(n)]))
            rid += n
        if rid and rng.random() < 0.25:
            events.append((rnd, "cancel", [rng.randrange(rid)], None, None))
    return events


def play(decoder: Decoder, events, stops, per_request: bool = False) -> list:
    """Run the script; returns every StepRecord as comparable tuples. per_request: every round
    gives each request a draft length of its own (0 included), from its id and the round."""
    log, rnd = [], 0
    while True:
        for at, kind, ids, prompts, limits in events:
            if at != rnd:
                continue
            if kind == "admit":
                rec = decoder.admit(ids, prompts, limits, [stops] * len(ids))
                log.append(("admit", rec.seq_ids, rec.tokens, rec.finished))
            else:
                decoder.cancel(ids)
        if decoder.running:
            rec = decoder.step(Drafts.of({r: (3 * r + rnd) % 8 for r in range(64)} if per_request else None))
            log.append(("step", rec.seq_ids, rec.tokens, rec.finished, rec.drafted))
        elif rnd > max(e[0] for e in events):
            return log
        rnd += 1


def oracle_drafts(monkeypatch, futures: dict[int, list[int]], corrupt_every: int = 3):
    """Drafts = the target's true greedy continuation (futures[r] = prompt + output of request r),
    one slot corrupted every few rounds, so rounds accept ragged amounts. The real drafter still
    runs (its context state stays in use)."""
    real = rounds._draft_logits

    def oracle(target, drafter, st, T):
        logits = real(target, drafter, st, T)
        fake = torch.full_like(logits, -10.0)
        for b, (r, start) in enumerate(zip(st.rows, st.start.tolist())):
            future = futures.get(r, [])[start + 1 : start + T] + [0] * T
            k = r + start  # which slot is corrupted depends on the request's state only: the same in every run
            for j in range(T - 1):
                bad = k % corrupt_every == 0 and j == k % (T - 1)
                fake[b, j, (future[j] + bad) % logits.shape[-1]] = 10.0
        return fake

    monkeypatch.setattr(rounds, "_draft_logits", oracle)


@pytest.mark.parametrize("seed,per_request", [(0, False), (1, False), (2, False), (3, False), (4, True), (5, True)])
def test_greedy_engine_runners_equal_reference_runners(pair, seed, per_request, monkeypatch):
    """Step for step, the engine backend's runners commit what the reference runners commit, with
    one draft length for all or (per_request) each request's own, where each engine request runs
    only its own tokens."""
    target, drafter = pair
    events = scenario(seed, target.cfg.vocab_size)
    stops = [7]  # a stop token that does occur: requests end on it too
    ref = LocalModel(target, drafter)
    first = play(ref.decoder(sampling=SamplingParams(), max_len=64), events, stops, per_request)
    futures = {e_id: list(p) for e in events if e[1] == "admit" for e_id, p in zip(e[2], e[3])}
    for rec in first:
        for r, toks in zip(rec[1], rec[2]):
            futures[r] += toks
    oracle_drafts(monkeypatch, futures)
    sent = []  # per verify: the tokens each row sent past its committed ones, and its own drafts + 1
    verify = EngineTarget.verify

    def spy(self, tokens, start, lengths=None):
        out = verify(self, tokens, start, lengths)
        sent.append((list(self.ran), [tokens.shape[1]] * len(self.ran) if lengths is None
                     else (lengths + 1).tolist()))
        return out

    monkeypatch.setattr(EngineTarget, "verify", spy)
    engine = engine_model_from_pair(target, drafter, max_seq_len=64)
    got = play(engine.decoder(sampling=SamplingParams(), max_len=64), events, stops, per_request)
    assert all(ran == own for ran, own in sent)  # every row ran only its own anchor + drafts
    assert got == play(ref.decoder(sampling=SamplingParams(), max_len=64), events, stops, per_request)
    assert any(len(set(map(len, rec[2]))) > 1 for rec in got if rec[0] == "step")  # ragged acceptance happened
    if per_request:
        assert any(0 in rec[4] and max(rec[4]) > 0 for rec in got if rec[0] == "step")  # 0 beside drafts, one round
    assert engine.executor.reused_tokens > 0  # verify rounds reused their committed prefix


def test_bad_words_and_logprobs_through_engine_runners_equal_reference_runners(pair):
    """Per-request bad words (a one-token word, none, a two-token word) and log-probabilities: the
    engine runners commit the reference runners' tokens and log-probabilities."""
    from trtllm_dflash.reference import generate

    target, drafter = pair
    rng = random.Random(9)
    prompts = [[rng.randrange(target.cfg.vocab_size - 1) for _ in range(8)] for _ in range(3)]
    free = [generate(target, drafter, [p], 24, stop_token_ids=[])[0].tokens for p in prompts]
    bad = [[[free[0][2]]], None, [free[2][5:7]]]

    def run(decoder):
        rec = decoder.admit([0, 1, 2], prompts, [24] * 3, [[]] * 3, bad, [True] * 3)
        out = {r: (list(t), list(lp)) for r, t, lp in zip(rec.seq_ids, rec.tokens, rec.logprobs)}
        while decoder.running:
            rec = decoder.step()
            for r, t, lp in zip(rec.seq_ids, rec.tokens, rec.logprobs):
                out[r] = (out[r][0] + t, out[r][1] + lp)
        return out

    ref = run(LocalModel(target, drafter).decoder(sampling=SamplingParams(), max_len=64))
    got = run(engine_model_from_pair(target, drafter, max_seq_len=64, registered=ENGINE_OUTPUTS).decoder(
        sampling=SamplingParams(), max_len=64))
    assert [got[r][0] for r in range(3)] == [ref[r][0] for r in range(3)]
    assert ref[0][0] != free[0] and ref[1][0] == free[1] and ref[2][0] != free[2]
    for r in range(3):
        assert got[r][1] == pytest.approx(ref[r][1], abs=1e-4)


@pytest.fixture(scope="module")
def tiny8(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny8")
    t = make_target(root / "t8", "qwen3", seed=4, vocab=8, layers=2, std=0.25)
    d = make_drafter(root / "d8", t, seed=5, block_size=4, target_layer_ids=(0, 1), std=0.25)
    return t, d


# The engine recipes verify greedily; sampling through the engine runners runs with the slow tests.
@pytest.mark.slow
@pytest.mark.parametrize("s,bad", [(SamplingParams(temperature=1.0, seed=11), None),
                                   (SamplingParams(temperature=0.8, top_k=4, seed=12), None),
                                   (SamplingParams(temperature=1.0, seed=13), [[3], [2, 5]])],
                         ids=["t1", "topk", "bad-words"])
def test_sampling_through_engine_runners_keeps_the_target_distribution(tiny8, s, bad):
    """bad: the target's masked distribution (the bad words' rule is the shared loop's, token_rules.py)."""
    target, drafter = load_pair(*tiny8)
    n = 6000  # 6000 requests per round through the fake Executor: alpha 1e-3 as the reference test
    decoder = engine_model_from_pair(target, drafter, max_seq_len=16, registered=ENGINE_OUTPUTS).decoder(sampling=s,
                                                                                                      max_len=16)
    rec = decoder.admit(list(range(n)), [PROMPT] * n, [4] * n, [[]] * n, [bad] * n)
    tokens = [list(t) for t in rec.tokens]
    while decoder.running:
        rec = decoder.step()
        for r, t in zip(rec.seq_ids, rec.tokens):
            tokens[r] += t
    p = chi_square_p([tuple(t[:3]) for t in tokens], exact_joint(tiny8[0], s, bad_words=bad))
    assert p > 1e-3, f"chi-square rejects the target distribution through the engine runners: p = {p:.2e}"


def test_fake_executor_follows_the_121_rules(pair):
    target, drafter = pair
    w = drafter_weights(target, drafter)
    engine = TapEngine(target, {k: w[k] for k in ("dflash.fc.weight", "dflash.hidden_norm.weight")},
                       tuple(drafter.target_layer_ids), drafter.cfg.rms_norm_eps, tail=8)
    ex = FakeExecutor(engine, max_seq_len=40, max_input_len=32, tokens_per_block=4, enable_partial_reuse=False)
    ctx = OutputConfig([AdditionalModelOutput("dflash_ctx", gather_context=True)])
    seq = list(range(1, 23))

    def rows(tokens, salt):
        (r,) = ex.await_responses(ex.enqueue_request(Request(tokens, 1, ctx, cache_salt_id=salt)))
        return r.result.additional_outputs[0].output.shape[0]

    assert rows(seq, salt=1) == 22  # nothing cached yet: every prompt row
    assert rows(seq + [5, 6], salt=1) == 24 - 20  # 22 tokens cached -> 5 whole blocks of 4 reused
    assert rows(seq, salt=2) == 22  # another salt sees nothing of salt 1
    (bad,) = ex.await_responses(ex.enqueue_request(Request(seq, 1, OutputConfig([AdditionalModelOutput("hidden")]))))
    assert bad.has_error() and "not an output of the engine" in bad.error_msg
    # an output of the engine that the ExecutorConfig did not register (the deployments' dflash_logits)
    logits = OutputConfig([AdditionalModelOutput("dflash_logits")])
    (unbound,) = ex.await_responses(ex.enqueue_request(Request(seq, 1, logits, cache_salt_id=3)))
    assert unbound.has_error() and "not in the ExecutorConfig" in unbound.error_msg
    # 1.2.1 with context FMHA takes prompts up to min(max_seq_len - 1, max_num_tokens) (trtGptModel.h).
    (long,) = ex.await_responses(ex.enqueue_request(Request(list(range(40)), 1, ctx)))
    assert long.has_error() and long.error_msg == "Prompt length (40) exceeds maximum input length (39)."
    # the engine runner refuses a prefill whose context rows were hidden by reuse
    runner = EngineTarget(ex, vocab_size=target.cfg.vocab_size, eos_token_ids=(), tail=8, greedy=True)
    runner._salts = iter([1])
    with pytest.raises(RuntimeError, match="KV reuse hid some"):
        runner.prefill([seq])


def _tap(pair):
    target, drafter = pair
    w = drafter_weights(target, drafter)
    return TapEngine(target, {k: w[k] for k in ("dflash.fc.weight", "dflash.hidden_norm.weight")},
                     tuple(drafter.target_layer_ids), drafter.cfg.rms_norm_eps, tail=8)


def test_fake_executor_reuses_kv_only_with_paged_context_fmha(pair):
    """fixExecutorConfig (trtGptModelInflightBatching.cpp) switches block reuse off for an engine
    built without paged context FMHA (fp32, or bf16 weights over an FP8 KV cache): every prompt row
    is computed again. The stand-in used to reuse blocks regardless."""
    ctx = OutputConfig([AdditionalModelOutput("dflash_ctx", gather_context=True)])
    seq = list(range(1, 23))
    for paged, second in ((True, 24 - 20), (False, 24)):
        ex = FakeExecutor(_tap(pair), max_seq_len=40, max_input_len=39, tokens_per_block=4, enable_partial_reuse=False,
                          paged_context_fmha=paged)
        rows = []
        for tokens in (seq, seq + [5, 6]):
            (r,) = ex.await_responses(ex.enqueue_request(Request(tokens, 1, ctx, cache_salt_id=1)))
            rows.append(r.result.additional_outputs[0].output.shape[0])
        assert rows == [22, second] and ex.reuse is paged and (ex.reused_tokens > 0) is paged


def test_fake_executor_clamps_the_tail_and_packs_steps_to_max_num_tokens(pair):
    """LlmRequest::validate clamps max_tokens to max_seq_len - prompt (a warning, no error; the
    stand-in used to refuse the request); MicroBatchScheduler packs context requests up to
    max_num_tokens tokens a step and leaves the rest for the next (the stand-in ran any batch)."""
    tail = OutputConfig([AdditionalModelOutput("dflash_tail")])
    ex = FakeExecutor(_tap(pair), max_seq_len=40, max_input_len=39, max_num_tokens=25)
    (r,) = ex.await_responses(ex.enqueue_request(Request(list(range(1, 21)), 64, tail)))
    assert not r.has_error() and ex.limits.admit(20, 64) == (None, 20)
    # The input cap is min(max_seq_len - 1, max_num_tokens) = 25 here.
    (r,) = ex.await_responses(ex.enqueue_request(Request(list(range(1, 27)), 1, tail)))
    assert r.error_msg == "Prompt length (26) exceeds maximum input length (25)."
    ids = [ex.enqueue_request(Request(list(range(1 + i, 11 + i)), 1, tail, cache_salt_id=9 + i)) for i in range(3)]
    got = [ex.await_responses(i)[0] for i in reversed(ids)]  # awaiting the last runs every step before it
    assert not any(g.has_error() for g in got) and ex.steps[-2:] == [20, 10]
    assert all(n <= 25 for n in ex.steps)
    # Without context FMHA the cap is the engine's max_input_len (trtGptModel.h).
    assert FakeExecutor(_tap(pair), max_seq_len=40, max_input_len=30, context_fmha=False).limits.input_cap == 30


def test_the_engine_runners_do_not_rely_on_kv_reuse(pair):
    """An engine without paged context FMHA gets no block reuse: greedy DFlash through it decodes
    the same tokens, every verify round recomputing its whole sequence."""
    target, drafter = pair
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8]]

    def tokens(paged):
        model = engine_model_from_pair(target, drafter, max_seq_len=64)
        old = model.executor
        model.executor = FakeExecutor(old.engine, max_seq_len=old.limits.max_seq_len,
                                      max_input_len=old.limits.max_input_len, paged_context_fmha=paged)
        dec = model.decoder(sampling=SamplingParams(), max_len=40)
        rec = dec.admit([0, 1], prompts, [12, 9], [[], []])
        out = {r: list(t) for r, t in zip(rec.seq_ids, rec.tokens)}
        while dec.running:
            rec = dec.step()
            for r, t in zip(rec.seq_ids, rec.tokens):
                out[r] += t
        return out, model.executor.reused_tokens

    (with_reuse, saved), (without, none) = tokens(True), tokens(False)
    assert with_reuse == without and saved > 0 and none == 0


def test_the_engine_runners_enqueue_a_round_in_one_call(pair, monkeypatch):
    """Each prefill and verify round reaches the Executor as one enqueue_requests call (1.2.1's
    binding, cpp/tensorrt_llm/nanobind/executor/executor.cpp), never request by request."""
    target, drafter = pair
    model = engine_model_from_pair(target, drafter, max_seq_len=64)
    calls, one = [], FakeExecutor.enqueue_request
    batch = FakeExecutor.enqueue_requests
    monkeypatch.setattr(FakeExecutor, "enqueue_requests", lambda self, rs: calls.append(len(rs)) or batch(self, rs))
    monkeypatch.setattr(FakeExecutor, "enqueue_request", lambda self, r: calls.append(None) or one(self, r))
    dec = model.decoder(sampling=SamplingParams(), max_len=40)
    dec.admit([0, 1, 2], [[5, 9, 2], [4, 4, 8], [3, 1]], [6, 6, 6], [[], [], []])
    dec.step()
    rounds = [n for n in calls if n is not None]
    assert rounds and rounds[0] == 3 and all(n == 3 for n in rounds)  # every round: the whole batch at once
    assert calls.count(None) == sum(rounds)  # one request each, all through enqueue_requests


def test_executor_health_condemns_a_broken_device_not_a_bad_minute():
    """After a failed step ExecutorHealth asks the device: a probe that raises (a sticky CUDA
    error) condemns the Executor at once. A device that answers is condemned only by
    FATAL_STEPS failed steps in a row over FATAL_SECONDS: a client retrying one failing request
    (three failures within seconds) does not condemn it; a served step resets the count; errors
    other than a failed step count for nothing."""
    from trtllm_dflash.runtime.executor_health import FATAL_SECONDS, FATAL_STEPS, ExecutorHealth
    from trtllm_dflash.runtime.fake_executor import STEP_FAILED

    step = [f"{STEP_FAILED[0]}[TensorRT-LLM][ERROR] Assertion failed: mNextBlocks.empty()\n(backtrace)"] * 2
    t = [0.0]
    h = ExecutorHealth(clock=lambda: t[0])
    for _ in range(FATAL_STEPS + 2):  # a retry storm: many failures within a second
        h.saw(step)
        t[0] += 0.1
    assert h.failed is None
    h.saw([None, step[0]])  # one row served: the count starts again
    h.saw(["Prompt length (40) exceeds maximum input length (39)."] * 2)  # not a step failure
    assert h.streak == 0
    for _ in range(FATAL_STEPS):
        h.saw(step)
        t[0] += FATAL_SECONDS / (FATAL_STEPS - 1)
    assert h.failed.startswith(f"the target engine failed {FATAL_STEPS} steps in a row over 60 s with none served "
                               "between (last: Encountered an error in forwardAsync function: [TensorRT-LLM][ERROR] "
                               "Assertion failed: mNextBlocks.empty())")

    def sticky():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors ...")

    h = ExecutorHealth(probe=sticky)
    h.saw(step)
    assert h.failed == ("the target engine's step failed (Encountered an error in forwardAsync function: "
                        "[TensorRT-LLM][ERROR] Assertion failed: mNextBlocks.empty()) and its GPU no longer answers "
                        "(CUDA error: an illegal memory access was encountered): this model cannot serve any more "
                        "requests; restart the server")
    healthy = ExecutorHealth(probe=lambda: None, clock=lambda: 0.0)
    healthy.saw(step)
    assert healthy.failed is None


@pytest.mark.parametrize("fault", ["sticky CUDA error", "step that never ends"])
def test_a_model_that_cannot_serve_is_reported_and_later_requests_are_told_why(pair, fault):
    """Served: the step that meets a sticky CUDA error fails its requests and the probe finds the
    device broken; a step that never ends (at tp > 1, a rank whose step threw alone leaves the
    leader in the all-reduce) leaves a request unanswered for hung_s. Either way the server
    reports it once (health checks then fail) and answers what comes next with the reason."""
    import threading

    from trtllm_dflash.runtime.executor_health import ExecutorHealth
    from trtllm_dflash.runtime.fake_executor import StepNeverEnds
    from trtllm_dflash.serve.batcher import ServingEngine
    from trtllm_dflash.serve.record import Request

    target, drafter = pair
    model = engine_model_from_pair(target, drafter, max_seq_len=64)
    real, broken = model.executor.engine.run, [False]
    hangs = fault == "step that never ends"

    def run(sequences):
        if broken[0]:
            raise StepNeverEnds() if hangs else RuntimeError(
                "[TensorRT-LLM][ERROR] CUDA runtime error in cudaMemcpyAsync: an illegal memory access")
        return real(sequences)

    def probe():
        if broken[0] and not hangs:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    model.executor.engine.run, model.health = run, ExecutorHealth(probe=probe, hung_s=0.05)
    fatal = []

    class Tok:
        def decode(self, ids):
            return " ".join(map(str, ids))

    eng = ServingEngine(model, Tok(), max_seq_len=64, max_batch_size=4, on_fatal=fatal.append)

    def one(prompt):
        done, reason = threading.Event(), []

        def emit(u):
            if u.finish_reason is not None:
                reason.append(u.finish_reason)
                done.set()
        eng.submit(Request(prompt, 6, emit, stop_token_ids=[]))
        assert done.wait(30)
        return reason[0]

    try:
        assert one([1, 2, 3]) == "length" and not fatal
        broken[0] = True
        first = one([4, 5])
        deadline = time.monotonic() + 10
        while not fatal and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fatal == [model.failed] and model.failed.endswith(
            "this model cannot serve any more requests; restart the server")
        if hangs:
            assert first == f"error: RuntimeError: {model.failed}" and model.failed.startswith(
                "the target engine answered no request for 0.05 s (a step that never ends: at tp > 1, a rank whose "
                "step failed alone)")
        else:
            assert first.startswith("error: target engine request failed: Encountered an error in forwardAsync")
            assert "its GPU no longer answers (CUDA error: an illegal memory access" in model.failed
        assert one([6, 7]) == f"error: {model.failed}"
    finally:
        eng.stop()
    model.close()  # the front end's unload: a stuck Executor is left alone (its shutdown would never return)


def test_awaiting_a_step_that_never_ends_needs_a_timeout():
    """The stand-in refuses a wait without a timeout on a step that never ends (1.2.1's would wait
    for good), and with one answers [] once it has passed, as executorImpl.cpp awaitResponses."""
    from trtllm_dflash.runtime.fake_executor import StepNeverEnds

    class Stuck:
        output_kinds = {}

        def run(self, sequences):
            raise StepNeverEnds()

    ex = FakeExecutor(Stuck(), max_seq_len=16, max_input_len=16)
    rid = ex.enqueue_request(Request([1, 2, 3], 1, OutputConfig([])))
    with pytest.raises(RuntimeError, match="without a timeout would wait for good"):
        ex.await_responses(rid)
    t0 = time.monotonic()
    assert ex.await_responses(rid, timeout_s=0.05) == [] and time.monotonic() - t0 >= 0.05
    assert ex.await_responses(ex.enqueue_request(Request([4], 1, OutputConfig([]))), timeout_s=0.01) == []
    with pytest.raises(RuntimeError, match="shutdown would wait for good"):
        ex.shutdown()


def test_a_failed_engine_step_fails_the_requests_it_ran(pair):
    import threading

    from trtllm_dflash.serve.batcher import ServingEngine
    from trtllm_dflash.serve.record import Request

    target, drafter = pair
    model = engine_model_from_pair(target, drafter, max_seq_len=64)
    real, calls = model.executor.engine.run, [0]

    def flaky(sequences):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("engine step failed (injected)")
        return real(sequences)

    model.executor.engine.run = flaky

    class Tok:  # token ids as text
        def decode(self, ids):
            return " ".join(map(str, ids))

    done = {}
    finished = threading.Event()

    def emit(name):
        def f(update):
            if update.finish_reason is not None:
                done[name] = update.finish_reason
                if len(done) == 3:
                    finished.set()
        return f

    eng = ServingEngine(model, Tok(), max_seq_len=64, max_batch_size=4)
    try:
        eng.submit(Request([1, 2, 3], 20, emit("a"), stop_token_ids=[]))
        eng.submit(Request([4, 5], 20, emit("b"), stop_token_ids=[]))
        while len(done) < 2:
            threading.Event().wait(0.05)
        eng.submit(Request([6, 7, 8], 10, emit("c"), stop_token_ids=[]))
        assert finished.wait(30)
    finally:
        eng.stop()
    # as 1.2.1's Executor answers a step that threw: each request it ran gets the error, and it serves on
    assert done["a"] == "error: target engine request failed: Encountered an error in forwardAsync function: " \
        "engine step failed (injected)" and done["b"] == done["a"]
    assert done["c"] == "length" and model.failed is None  # one failed step does not condemn the Executor


@pytest.mark.parametrize("backend,placement", [
    # what the placement rule gives the shipped pair's engine recipe at tp 2 (two gloo processes: slow)
    pytest.param("engine", "rank0", marks=pytest.mark.slow),
    pytest.param("reference", "split", marks=pytest.mark.slow),  # split like the target: the other placement
])
def test_emulated_engine_at_tp2_reproduces_tp1(tmp_path, backend, placement):
    """The engine runners at tp = 2 (target split per rank, FakeExecutor on every rank, gloo
    collectives between two spawned processes) and the drafter where the placement rule puts it
    give the tp = 1 reference runners' tokens, record for record, on the shipped pair's held-out
    prompts with a request joining mid-flight and one cancelled. The engine recipe's convert
    keeps the drafter whole (rank 0 drafts, every rank takes its drafts); the reference recipe's
    splits it. Time: about 10-15 s (the spawn), 20-30 s on a loaded 2-core machine."""
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.prompts.sources import heldout_token_prompts
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.recipe.plan.drafter import drafter_placement
    from trtllm_dflash.runtime.checkpoint import read_checkpoint
    from trtllm_dflash.runtime.checkpoint_runner import open_checkpoint

    recipe = load_recipe(RECIPES / f"cpu/tiny-pystd{'-engine' if backend == 'engine' else ''}.yaml", ["parallel.tp=2"])
    assert drafter_placement(recipe).mode == placement
    one = load_recipe(None)
    prompts = heldout_token_prompts(one.target.path, 3, 24)
    # Two requests, a third joins at round 2 while they run, the second is cancelled at round 3.
    events = [(0, "admit", [0, 1], prompts[:2], [24, 24]), (2, "admit", [2], prompts[2:], [24]),
              (3, "cancel", [1], None, None)]
    tp1 = open_checkpoint(convert(one, tmp_path / "tp1", progress=False), max_seq_len=64)
    threads = torch.get_num_threads()
    # as each spawned rank runs (hardware.cpu_torch_threads); 2 threads crawl on a busy machine
    torch.set_num_threads(1)
    try:
        ref = play(tp1.decoder(sampling=SamplingParams(), max_len=64), events, [])
    finally:
        torch.set_num_threads(threads)
    two_dir = convert(recipe, tmp_path / "tp2", progress=False)
    assert read_checkpoint(two_dir).drafter_tp == (1 if placement == "rank0" else 2)
    two = open_checkpoint(two_dir, runners="emulated", max_seq_len=64)
    try:
        got = play(two.decoder(sampling=SamplingParams(), max_len=64), events, [])
    finally:
        two.close()
    assert got == ref
    steps = [rec for rec in ref if rec[0] == "step"]
    assert sum(map(len, steps[0][2])) > len(steps[0][2])  # drafts were accepted (more than one token a row)
    assert 2 in steps[2][1] and 1 not in steps[-1][1]  # the join and the cancel took effect


def _run(dec, ids, prompts, limits):
    """Every record of `dec` from admitting `prompts` to the end: {request: (tokens, finish reason)}."""
    out = {i: ([], None) for i in ids}
    recs = [dec.admit(ids, prompts, limits, [[] for _ in ids])]
    while dec.running:
        recs.append(dec.step())
    for rec in recs:
        for i, toks, done in zip(rec.seq_ids, rec.tokens, rec.finished):
            out[i] = (out[i][0] + toks, done or out[i][1])
    return out


def test_a_row_the_executor_refuses_ends_alone(pair):
    """One request's error response ends that request, not its batch (issue 49's rule: one bad
    request never fails another). The FakeExecutor refuses, as LlmRequest::validate does, a verify
    whose sequence outgrew the engine's input length: the long request ends with that message,
    the short one decodes what it decodes alone, and no response is left in the Executor (each
    holds pinned output buffers for the life of the process)."""
    import dataclasses

    target, drafter = pair
    prompts = [[5, 9, 2], [4, 4, 8, 1, 7, 3, 3, 2, 6]]
    alone = engine_model_from_pair(target, drafter, max_seq_len=64)
    ref = _run(alone.decoder(sampling=SamplingParams(), max_len=64), [0], prompts[:1], [8])
    model = engine_model_from_pair(target, drafter, max_seq_len=64)
    ex = model.executor
    # request 0's verify sequences stay within 3 + 8 + 15 tokens; request 1's outgrow them
    ex.limits = dataclasses.replace(ex.limits, max_input_len=27, max_seq_len=27)
    got = _run(model.decoder(sampling=SamplingParams(), max_len=64), [0, 1], prompts, [8, 30])
    assert got[0] == ref[0] and ref[0][1] == "length"
    cap = ex.limits.input_cap
    assert re.fullmatch(rf"error: target engine request failed: Prompt length \((\d+)\) exceeds maximum input "
                        rf"length \({cap}\)\.", got[1][1]), got[1]
    assert 0 < len(got[1][0]) < 30  # it decoded until its sequence outgrew the engine
    assert not ex._done and not ex._queue


def test_a_refused_prompt_joining_a_running_batch_fails_alone(pair, monkeypatch):
    """Two prompts join a running request and the Executor refuses the first of them at its
    prefill: it ends with the error, and the running request and the other newcomer decode what
    each decodes alone."""
    from trtllm_dflash.runtime.fake_executor import Response

    target, drafter = pair
    prompts = {0: [5, 9, 2], 1: [4, 4, 8], 2: [3, 1]}

    def decoder():
        return engine_model_from_pair(target, drafter, max_seq_len=64).decoder(sampling=SamplingParams(), max_len=64)

    solo = {i: _run(decoder(), [i], [prompts[i]], [8])[i] for i in (0, 2)}
    dec = decoder()
    out = {i: ([], None) for i in prompts}

    def take(rec):
        for i, toks, done in zip(rec.seq_ids, rec.tokens, rec.finished):
            out[i] = (out[i][0] + toks, done or out[i][1])

    take(dec.admit([0], [prompts[0]], [8], [[]]))
    take(dec.step())
    enqueue = FakeExecutor.enqueue_requests

    def first_refused(self, requests):
        ids = enqueue(self, requests)
        self._queue.pop(ids[0], None)
        self._done[ids[0]] = Response(ids[0], error_msg="injected: refused\n(backtrace line)")
        return ids

    monkeypatch.setattr(FakeExecutor, "enqueue_requests", first_refused)
    take(dec.admit([1, 2], [prompts[1], prompts[2]], [8, 8], [[], []]))
    monkeypatch.undo()
    while dec.running:
        take(dec.step())
    assert out[1] == ([], "error: target engine request failed: injected: refused")  # the first line only
    assert out[0] == solo[0] and out[2] == solo[2]


def test_a_refused_row_fails_one_served_request(pair):
    """Served: the serving loop ends the request the Executor refused with its error and streams
    the other one to its end in the same batch; the server's counters count only the verify
    passes that ran (the requests' own statistics sum to them)."""
    import dataclasses
    import threading

    pytest.importorskip("prometheus_client", reason="needs prometheus_client (the serve extra)")
    from trtllm_dflash.serve.batcher import ServingEngine
    from trtllm_dflash.serve.metrics import PrometheusInstruments, SpecMetrics
    from trtllm_dflash.serve.record import Request
    from trtllm_dflash.sweep.server_metrics import parse, totals

    target, drafter = pair
    model = engine_model_from_pair(target, drafter, max_seq_len=64)
    model.executor.limits = dataclasses.replace(model.executor.limits, max_input_len=27, max_seq_len=27)

    class Tok:  # token ids as text
        def decode(self, ids):
            return " ".join(map(str, ids))

    done, tokens, spec, finished = {}, {}, {}, threading.Event()

    def emit(name):
        def f(update):
            tokens[name], spec[name] = update.total_tokens, update.spec
            if update.finish_reason is not None:
                done[name] = update.finish_reason
                if len(done) == 2:
                    finished.set()
        return f

    ins = PrometheusInstruments()
    eng = ServingEngine(model, Tok(), max_seq_len=64, max_batch_size=4, metrics=SpecMetrics(ins, "x"))
    try:
        eng.submit(Request([5, 9, 2], 8, emit("short"), stop_token_ids=[]))
        eng.submit(Request([4, 4, 8, 1, 7, 3, 3, 2, 6], 30, emit("long"), stop_token_ids=[]))
        assert finished.wait(30)
    finally:
        eng.stop()
    assert done["short"] == "length" and tokens["short"] == 8
    assert done["long"].startswith("error: target engine request failed: Prompt length (") and tokens["long"] < 30
    t = totals(parse(ins.exposition()[0].decode()), "x", "dflash")
    assert t.rounds == spec["short"].rounds + spec["long"].rounds and spec["long"].rounds >= 1
    assert t.drafted == spec["short"].drafted + spec["long"].drafted
    # every pass of the long request that ran drafted (it had tokens to spare); the refused one is none of them
    assert spec["long"].plain == 0 and t.rounds_by_draft_len.get(0, 0) == spec["short"].plain


def test_rows_that_all_fail_end_each_with_its_own_error(pair, monkeypatch):
    """A verify and a prefill whose every request the Executor answers with an error: each request
    ends with its own message, nothing is left in the Executor, and the decoder takes the next
    requests: how TensorRT-LLM's Executor reports a step that failed (executorImpl.cpp
    terminateActiveRequests: the same error to every active request). A runner that raises fails
    its group in the serving loop: tests/serve/test_batcher.py test_a_round_that_raises_fails_only_its_group."""
    from trtllm_dflash.runtime.fake_executor import Response

    target, drafter = pair
    model = engine_model_from_pair(target, drafter, max_seq_len=64)
    dec = model.decoder(sampling=SamplingParams(), max_len=40)
    dec.admit([0, 1, 2], [[5, 9, 2], [4, 4, 8], [3, 1]], [6, 6, 6], [[], [], []])
    enqueue = FakeExecutor.enqueue_requests

    def all_fail(self, requests):
        ids = enqueue(self, requests)
        for rid in ids:
            self._queue.pop(rid, None)
            self._done[rid] = Response(rid, error_msg=f"injected: request {rid}")
        return ids

    monkeypatch.setattr(FakeExecutor, "enqueue_requests", all_fail)
    rec = dec.step()
    assert rec.tokens == [[], [], []] and not dec.running
    assert len({d for d in rec.finished}) == 3 and all(d.startswith("error: target engine request failed: injected")
                                                       for d in rec.finished)
    rec = dec.admit([3, 4], [[5, 9, 2], [4, 4]], [6, 6], [[], []])
    assert rec.tokens == [[], []] and all(d.startswith("error: ") for d in rec.finished) and not dec.running
    assert not model.executor._done and not model.executor._queue
    monkeypatch.undo()
    assert _run(dec, [5], [[5, 9, 2]], [6])[5][1] == "length"
