"""What perf/bench_loop.py measures the loop against: the workload (prompts and scripts of real
text), the recipe's projected round (project/stepmodel.py), `auto` under projected costs, and the
engine runners' host side over an Executor stand-in that answers at once."""

from __future__ import annotations

import contextlib
import itertools
import time

import torch

from trtllm_dflash.runtime.fake_executor import AdditionalOutput, Response, Result


class _Timers:
    """CPU time of the loop's parts the bench reports apart, each by wrapping its functions while
    `timing` runs: `copies`, the loop's copies of context rows [B, T, hidden] (reference/rounds.py
    Batch.extend, Batch.keep, _pend: device memory work on a GPU, a memcpy on this CPU), and
    `delivery`, what follows a round's decoding (serve/batcher.py ServingEngine._deliver: counts,
    detokenization, stop words, metrics, the responses): what overlapping the next round's device
    work could hide."""

    def __init__(self):
        self.seconds = {"copies": 0.0, "delivery": 0.0}

    @contextlib.contextmanager
    def timing(self):
        from trtllm_dflash.reference import rounds
        from trtllm_dflash.serve.batcher import ServingEngine

        targets = [(rounds.Batch, "extend", "copies"), (rounds.Batch, "keep", "copies"), (rounds, "_pend", "copies"),
                   (ServingEngine, "_deliver", "delivery")]
        saved = [getattr(owner, name) for owner, name, _ in targets]
        for (owner, name, part), f in zip(targets, saved):
            setattr(owner, name, self._timed(f, part))
        try:
            yield self
        finally:
            for (owner, name, _), f in zip(targets, saved):
                setattr(owner, name, f)

    def _timed(self, f, part: str):
        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return f(*args, **kwargs)
            finally:
                self.seconds[part] += time.thread_time() - t0

        return timed


TIMERS = _Timers()


def workload(tokenizer, n: int, prompt_len: int, script_len: int) -> list[tuple[list[int], list[int]]]:
    """n (prompt, script) pairs: consecutive windows of the shipped held-out Python text, each
    prompt unique (its script is looked up by it)."""
    from trtllm_dflash.prompts.corpus import shipped_text
    from trtllm_dflash.prompts.sources import encode_files

    stream = encode_files(tokenizer, [f.text for f in shipped_text().heldout])
    size = prompt_len + script_len
    starts = itertools.cycle(range(0, len(stream) - size, size))
    out, seen = [], set()
    for i in range(n):
        s = next(starts)
        prompt = stream[s : s + prompt_len]
        prompt = [i % len(tokenizer), *prompt[1:]] if tuple(prompt) in seen else prompt
        seen.add(tuple(prompt))
        out.append((prompt, stream[s + prompt_len : s + size]))
    return out


def projected_cost(projected, block: int, batches=(1, 4), prior: bool = True):
    """The VerifyCost a server's start-up would fit (policy/cost.py measure_cost: every draft length
    at batches 1 and 4, packed as the engine runners are) had its rounds taken what `projected`
    (project/rounds.py ProjectedRounds) says; with `prior`, the step model as its shape model."""
    from trtllm_dflash.policy.cost import VerifyCost

    rows, times, timed, timed_draft = [], [], {}, {}
    for B in batches:
        for L in range(block):
            s = projected.round_s(B, L)
            timed[(B, L + 1)], timed_draft[(B, L + 1)] = s, projected.draft_prior(B, L + 1)
            rows.append([1.0, B * (L + 1), 1.0 if L else 0.0])
            times.append(s)
    sol = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64), torch.tensor(times, dtype=torch.float64)[:, None])
    fixed, per_token, draft = (max(0.0, float(x)) for x in sol.solution[:, 0])
    return VerifyCost(fixed, per_token, draft, 0.0, True, timed, timed_draft,
                      projected.prior if prior else None, projected.draft_prior if prior else None)


class ProjectedClock:
    """A DraftPolicy that hands `inner` each round's projected seconds plus what the loop took
    (the seconds a GPU server's round would take with this loop)."""

    def __init__(self, inner, projected):
        self.inner, self.projected, self.modes = inner, projected, inner.modes

    def decide(self, requests, concurrency, mode):
        return self.inner.decide(requests, concurrency, mode)

    def learn(self, rec, seconds=None):
        gpu = self.projected.round_s(len(rec.seq_ids), max(rec.drafted, default=0))
        self.inner.learn(rec, gpu + (seconds or 0.0))

    def forget(self, request):
        self.inner.forget(request)


def projected_policy(projected, block: int, c: int):
    from trtllm_dflash.policy.auto import AutoDraftLength

    return ProjectedClock(AutoDraftLength(block, projected_cost(projected, block)), projected)


class InstantExecutor:
    """FakeExecutor's interface (runtime/fake_executor.py: enqueue_request, await_responses,
    cancel_request, shutdown) answering every request at once with precomputed outputs of the
    target engine's shapes: dflash_ctx [prompt, H] (gather_context), dflash_tail [tail, H],
    dflash_argmax [tail]."""

    def __init__(self, hidden: int, tail: int, dtype=torch.bfloat16):
        self.hidden, self.dtype = hidden, dtype
        self.tail = torch.zeros(tail, hidden, dtype=dtype)
        self.argmax = torch.zeros(tail, dtype=torch.int32)
        self._ids = itertools.count(1)
        self._asked: dict[int, tuple] = {}
        self._made: dict[tuple, list[Response]] = {}

    def enqueue_request(self, request) -> int:
        rid = next(self._ids)
        names = tuple(o.name for o in request.output_config.additional_model_outputs)
        self._asked[rid] = (len(request.input_token_ids) if "dflash_ctx" in names else 0, names)
        return rid

    def enqueue_requests(self, requests) -> list[int]:
        return [self.enqueue_request(r) for r in requests]

    def await_responses(self, rid: int, timeout_s: float | None = None) -> list[Response]:
        key = self._asked.pop(rid)
        if key not in self._made:  # one response of each shape, handed out again (the caller only reads it)
            n, names = key
            out = {"dflash_tail": self.tail, "dflash_argmax": self.argmax}
            extra = [AdditionalOutput(name, out[name] if name in out else torch.zeros(n, self.hidden, dtype=self.dtype))
                     for name in names]
            self._made[key] = [Response(0, Result([[0]], True, extra))]
        return self._made[key]

    def cancel_request(self, rid: int) -> None:
        self._asked.pop(rid, None)

    def shutdown(self) -> None:
        pass


def engine_host(c: int, vocab: int, hidden: int, block: int, prompt_len: int, rounds: int,
                conditional, seed: int = 0) -> dict:
    """µs per row per verify round of EngineTarget (greedy, argmax outputs) over InstantExecutor:
    c rows, `rounds` rounds (acceptance drawn from `conditional`), after one warm-up round."""
    from trtllm_dflash.runtime.engine_runners import EngineTarget

    g = torch.Generator().manual_seed(seed)
    tgt = EngineTarget(InstantExecutor(hidden, block), vocab_size=vocab, eos_token_ids=(0,), tail=block, greedy=True)
    tgt.prefill([[1 + (i % 7)] * prompt_len for i in range(c)])
    start = torch.full((c,), prompt_len, dtype=torch.long)
    p = torch.tensor(conditional[: block - 1], dtype=torch.float64)
    took = 0.0
    for r in range(rounds + 1):
        tokens = torch.randint(0, vocab, (c, block), generator=g)
        t0 = time.thread_time()
        tgt.verify(tokens, start)
        if r:
            took += time.thread_time() - t0
        accepted = (torch.rand(c, len(p), generator=g, dtype=torch.float64) < p).int().cumprod(-1).sum(-1)
        start = start + accepted + 1
    return {"c": c, "us_row": took / rounds / c * 1e6, "us_round": took / rounds * 1e6}
