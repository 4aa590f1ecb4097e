"""The serving engine: in-flight batched DFlash decoding for concurrent requests.

One background thread owns the model. Each iteration it admits the requests that arrived
since the last round (one batched prefill), drops cancelled ones, runs ONE round for the
running requests together (one drafter pass + one target verify pass per sampling group)
and hands each request its committed tokens. Requests join and leave the running batch
between rounds instead of waiting for each other.

Requests with different sampling settings are decoded in separate groups, because the
reference loop applies one sampling setting per batch; groups take turns round by round.
All greedy requests share one group, unless they ask for their own draft length or mode
(`draft_len`, `mode`: AR, DFlash and DDTree requests on one server), which makes one group
per (sampling, draft length, mode).

The model is a `ServingModel` (runtime/): local_model's `LocalModel` (target and drafter in
this process), sharded's `ShardedModel` (tensor-parallel worker processes) or engine_runners'
`EngineModel` (the engine backend's runners, emulated or TensorRT); its decoders are
`reference.records.DecoderProtocol`s. A model that can no longer serve at all (a dead rank)
says so in `failed`; the engine then fails every request, running and new, with that reason,
and calls `on_fatal` once (the Triton model marks itself unavailable there).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

from trtllm_dflash.policy.decision import DraftPolicy, Drafts
from trtllm_dflash.reference.records import DecoderProtocol, StepRecord
from trtllm_dflash.reference.verify import SamplingParams
from trtllm_dflash.serve.trace import now


@dataclass
class Update:
    """What one response carries."""

    text: str  # new text since the previous update ("" while a character's bytes are incomplete)
    tokens: int  # tokens committed in this update
    total_tokens: int
    rounds: int  # target verify passes so far (the prefill is not a round)
    drafted: int  # draft tokens verified so far
    accepted: int  # draft tokens accepted so far
    finish_reason: str | None  # None while running, then "stop" | "length" | "cancelled" | "error: ..."
    ids: list[int] = field(default_factory=list)  # the tokens committed in this update
    # [max drafts + 1] verify passes so far by the drafts they accepted: histogram[j] = passes that
    # accepted exactly j (sum = rounds, sum of j * histogram[j] = accepted); TensorRT-LLM PR #19311's shape
    histogram: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # their log-probabilities under the target (a Job with logprobs)
    cum_logprob: float = 0.0  # the sum over every token so far

    @property
    def acceptance_length(self) -> float:
        """tau so far: tokens committed per verify pass (the prefill's first token excluded)."""
        return (self.total_tokens - 1) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted so far (0 when nothing was drafted), as TensorRT-LLM reports it."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    emit: Callable[[Update], None]
    sampling: SamplingParams = SamplingParams()
    stop_token_ids: list[int] | None = None  # None: the target's eos ids
    stop_words: list[str] = field(default_factory=list)
    cancelled: Callable[[], bool] = lambda: False
    draft_len: int | None = None  # this request's drafts per round (0 = speculation off); None: the policy's
    mode: str | None = None  # this request's decoding: "ar" | "dflash" | "ddtree"; None: the engine's mode
    tag: str = ""  # the front end's id of the request (timestamps of serve/trace.py name it)
    skip_special_tokens: bool = False  # the text leaves special tokens (eos) out
    bad_words: list[list[int]] | None = None  # token sequences the output never contains (reference/token_rules.py)
    stop_sequences: list[list[int]] = field(default_factory=list)  # token sequences that end it, kept in the output
    logprobs: bool = False  # updates carry the committed tokens' log-probabilities
    skip_end_token: bool = False  # the stop token that ends it is left out of its output (TensorRT-LLM's executor)
    # Progress, kept by the engine.
    tokens: list[int] = field(default_factory=list)
    sent: str = ""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    histogram: list[int] = field(default_factory=list)  # verify passes by drafts accepted (Update.histogram)
    cum_logprob: float = 0.0


def _sequence_stop(tokens: list[int], new: int, sequences: list[list[int]]) -> int | None:
    """How many tokens to keep when a stop sequence ends among the last `new` of `tokens` (the
    first such end), None when none does."""
    for end in range(len(tokens) - new + 1, len(tokens) + 1):
        if any(0 < len(s) <= end and tokens[end - len(s) : end] == s for s in sequences):
            return end
    return None


def _stop_prefix(text: str, stop_words: list[str]) -> int:
    """Length of the longest tail of `text` that begins a stop word: held back while streaming."""
    best = 0
    for w in stop_words:
        for n in range(min(len(w) - 1, len(text)), best, -1):
            if text.endswith(w[:n]):
                best = n
                break
    return best


class GroupKey(NamedTuple):
    """Requests decoded together: the same sampling setting, draft-length request and mode."""

    sampling: tuple  # ("greedy",) or (temperature, top_p, top_k, seed)
    draft_len: int | None  # the requests' own draft length, None: the policy's
    mode: str  # "ar" | "dflash" | "ddtree"


def _group_key(job: "Job", default_mode: str) -> GroupKey:
    s = job.sampling
    return GroupKey(("greedy",) if s.greedy else (s.temperature, s.top_p, s.top_k, s.seed), job.draft_len,
                    job.mode or default_mode)


class ServingModel(Protocol):
    """What the serving engine decodes with (every implementation has these signatures:
    tests/serve/test_interfaces.py)."""

    eos_token_ids: tuple[int, ...]
    failed: str | None  # why the model can no longer serve (a dead rank), else None

    def decoder(self, *, sampling: SamplingParams, mode: str = "dflash", block_size: int | None = None,
                ddtree_budget: int | None = None, max_len: int = 2048) -> DecoderProtocol:
        """A new decode loop (one per sampling group)."""

    def release(self, decoder: DecoderProtocol) -> None:
        """The group of `decoder` is done; must not raise, even for a failed model."""

    def close(self) -> None:
        """Free the model (processes, executors)."""


class ServingEngine:
    """policy: what each round's draft length is (trtllm_dflash/policy: the recipe's bands or
    `auto`); None = block_size - 1 always. A request's own `draft_len` overrides it, and its own
    `mode` ("ar" | "dflash" | "ddtree") replaces `mode` for it (front ends check that a ddtree
    request has a budget: serve/requests.check_mode)."""

    def __init__(self, model, tokenizer, *, mode: str = "dflash", block_size: int | None = None,
                 ddtree_budget: int | None = None, max_seq_len: int = 2048, max_batch_size: int = 64,
                 policy: DraftPolicy | None = None, trace=None, metrics=None, on_fatal: Callable[[str], None] | None = None):
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.on_fatal = on_fatal  # called once, with the reason, when the model can no longer serve
        self.trace = trace  # serve/trace.Trace: per-round timestamps for perf/bench_serve.py, or None
        self.metrics = metrics  # serve/metrics.SpecMetrics: the server's /metrics (front ends set it), or None
        self.mode, self.ddtree_budget = mode, ddtree_budget  # requests without a mode of their own get `mode`
        self.decoder_args = dict(mode=mode, block_size=block_size, ddtree_budget=ddtree_budget, max_len=max_seq_len)
        self.max_batch_size = max_batch_size
        self.histogram_len = block_size or 1  # drafts accepted per pass: 0 .. block_size - 1
        self.inbox: queue.Queue[Job] = queue.Queue()
        self.groups: dict[GroupKey, tuple] = {}  # key -> (decoder, {request id: Job})
        self._next_id = 0
        self._stop = threading.Event()
        self._inbox_lock = threading.Lock()  # a submit racing stop() is answered, never left in the inbox
        self._thread = threading.Thread(target=self._loop, name="dflash-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._inbox_lock:
            if not self._stop.is_set():
                self.inbox.put(job)
                return
        self._finish(job, self._stop_reason())

    def _stop_reason(self) -> str:
        return f"error: {self.model.failed or 'the server is shutting down'}"

    def stop(self) -> None:
        """Stop the loop; every request not finished yet, running or still in the inbox, gets its
        final update (an error): a response sender left without one hangs its client for good."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self._thread.is_alive():  # a round still running: its requests are the loop's to finish
            return
        with self._inbox_lock:
            left = [job for _, jobs in self.groups.values() for job in jobs.values()]
            while not self.inbox.empty():
                left.append(self.inbox.get_nowait())
        self.groups.clear()
        for job in left:
            self._finish(job, self._stop_reason())

    @property
    def running(self) -> int:
        return sum(len(jobs) for _, jobs in self.groups.values())

    # ---- the loop (engine thread only below this line)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._admit()
                for key, (decoder, jobs) in list(self.groups.items()):
                    gone = [i for i, j in jobs.items() if j.cancelled()]
                    if gone:
                        decoder.cancel(gone)
                        for i in gone:
                            self._finish(self._leave(jobs, i), "cancelled")
                    if decoder.running:
                        t0 = now()
                        rec = decoder.step(self._round(key, jobs))
                        t1 = now()
                        if self.policy is not None and key.mode in self.policy.modes:
                            # every round teaches (requests with their own draft_len too): acceptance,
                            # and what a round of its shape costs under this server's real load (but
                            # for the drafter's pass after a join: AutoDraftLength.learn)
                            self.policy.learn(rec, (t1 - t0) * 1e-9)  # now(): ns
                        tags = [jobs[i].tag for i in rec.seq_ids] if self.trace else None
                        self._deliver(decoder, jobs, rec, mode=key.mode)
                        if self.trace:
                            self.trace.add("round", tags, t0, t1, now())
                            if any(rec.finished):
                                self.trace.flush()
                    if not decoder.running:
                        self.model.release(self.groups.pop(key)[0])
            except Exception as e:  # one failing round must not take the server down: fail its requests
                for _, jobs in self.groups.values():
                    for rid in list(jobs):
                        self._finish(self._leave(jobs, rid), f"error: {type(e).__name__}: {e}")
                for decoder, _ in self.groups.values():
                    self.model.release(decoder)
                self.groups.clear()
                self._report_fatal()

    def _report_fatal(self) -> None:
        """Tell the front end, once, that the model can no longer serve (a dead rank)."""
        if self.model.failed and self.on_fatal is not None:
            on_fatal, self.on_fatal = self.on_fatal, None
            on_fatal(self.model.failed)

    def _round(self, key: GroupKey, jobs: dict[int, Job]) -> Drafts:
        """This group's next round: the requests' own draft length, else the policy's decision."""
        if key.draft_len is not None:
            return Drafts(key.draft_len)
        if self.policy is None or key.mode not in self.policy.modes:
            return Drafts()
        return self.policy.decide(list(jobs), self.running, key.mode)

    def _admit(self) -> None:
        arrivals: list[Job] = []
        idle = self.running == 0
        while self.running + len(arrivals) < self.max_batch_size:
            try:
                # Sleep on the queue only when nothing runs; otherwise take what is there.
                arrivals.append(self.inbox.get(timeout=0.1) if idle and not arrivals else self.inbox.get_nowait())
            except queue.Empty:
                break
        by_key: dict[GroupKey, list[Job]] = {}
        for job in arrivals:
            if job.cancelled():
                self._finish(job, "cancelled")
            else:
                by_key.setdefault(_group_key(job, self.mode), []).append(job)
        for key, new in by_key.items():
            if key not in self.groups:
                try:
                    decoder = self.model.decoder(sampling=new[0].sampling, **{**self.decoder_args, "mode": key.mode})
                except Exception as e:  # e.g. a mode these runners cannot decode: fail these requests only
                    for job in new:
                        self._finish(job, f"error: {type(e).__name__}: {e}")
                    self._report_fatal()
                    continue
                self.groups[key] = (decoder, {})
            decoder, jobs = self.groups[key]
            ids = list(range(self._next_id, self._next_id + len(new)))
            self._next_id += len(new)
            jobs.update(zip(ids, new))
            t0 = now()
            rec = decoder.admit(
                ids, [j.prompt_ids for j in new], [j.max_tokens for j in new],
                [j.stop_token_ids if j.stop_token_ids is not None else self.model.eos_token_ids for j in new],
                [j.bad_words for j in new], [j.logprobs for j in new],
            )
            t1 = now()
            self._deliver(decoder, jobs, rec)
            if self.trace:
                self.trace.add("admit", [j.tag for j in new], t0, t1, now())

    def _deliver(self, decoder, jobs: dict[int, Job], rec: StepRecord, mode: str | None = None) -> None:
        """Hand each request its tokens. `mode`: how a verify round was decoded (None for the prefill);
        the server's metrics count every round."""
        if rec.round > 0 and self.metrics is not None:
            # a tree of n nodes over the drafter's block_size - 1 slots is at most min(n, slots) deep
            cap = self.histogram_len - 1 or max(rec.drafted, default=0)
            depths = [min(d, cap) for d in rec.drafted] if mode == "ddtree" else None
            self.metrics.round(mode, rec.drafted, [len(t) for t in rec.tokens], rec.t_draft, rec.t_verify, depths)
        for b, (rid, toks, done, drafted) in enumerate(zip(rec.seq_ids, rec.tokens, rec.finished, rec.drafted)):
            job = jobs[rid]
            job.tokens.extend(toks)
            if rec.round > 0:
                job.rounds += 1
                job.drafted += drafted
                job.accepted += max(0, len(toks) - 1)  # the last committed token is the target's bonus
                _count(job, max(0, len(toks) - 1), self.histogram_len)
            lps = rec.logprobs[b] if rec.logprobs is not None else None
            if done == "stop" and job.skip_end_token:  # the decoder stopped at a stop token, the last one
                job.tokens.pop()
                toks, lps = toks[:-1], None if lps is None else lps[:-1]
            toks, lps, done = self._stop_sequences(decoder, rid, job, toks, lps, done)
            job.cum_logprob += sum(lps or ())
            # The keyword only when asked: a tokenizer with a plain decode(ids) serves the rest.
            text = (self.tokenizer.decode(job.tokens, skip_special_tokens=True) if job.skip_special_tokens
                    else self.tokenizer.decode(job.tokens))
            hits = [text.find(w) for w in job.stop_words if w in text]
            if hits and done is None:
                text, done = text[: min(hits)], "stop"
                decoder.cancel([rid])
            elif hits:
                text = text[: min(hits)]
            if done is None:
                text = text.rstrip("\ufffd")  # a byte-level BPE character is still incomplete
                text = text[: len(text) - _stop_prefix(text, job.stop_words)]  # may become a stop word
            delta = text[len(job.sent):] if text.startswith(job.sent) else ""
            job.sent += delta
            job.emit(Update(delta, len(toks), len(job.tokens), job.rounds, job.drafted, job.accepted, done, list(toks),
                            self._histogram(job), lps, job.cum_logprob))
            if done is not None:
                self._leave(jobs, rid)

    @staticmethod
    def _stop_sequences(decoder, rid: int, job: Job, toks: list[int], lps, done):
        """(tokens, log-probs, finish reason) of this update once the job's stop sequences are
        applied: the output ends with the first one, kept (TensorRT-LLM's stop words)."""
        end = _sequence_stop(job.tokens, len(toks), job.stop_sequences) if job.stop_sequences else None
        if end is None:
            return toks, lps, done
        keep = len(toks) - (len(job.tokens) - end)
        del job.tokens[end:]
        if done is None:
            decoder.cancel([rid])
        return toks[:keep], None if lps is None else lps[:keep], "stop"

    def _leave(self, jobs: dict[int, Job], rid: int) -> Job:
        """Request `rid` leaves its group (finished, cancelled or failed): the policy forgets it."""
        if self.policy is not None:
            self.policy.forget(rid)
        return jobs.pop(rid)

    def _finish(self, job: Job, reason: str) -> None:
        job.emit(Update("", 0, len(job.tokens), job.rounds, job.drafted, job.accepted, reason,
                        histogram=self._histogram(job)))

    def _histogram(self, job: Job) -> list[int]:
        return list(job.histogram) or [0] * self.histogram_len


def _count(job: Job, accepted: int, size: int) -> None:
    """One verify pass of `job` that accepted `accepted` drafts, in its histogram (at least `size` long)."""
    if not job.histogram:
        job.histogram = [0] * size
    if accepted >= len(job.histogram):
        job.histogram += [0] * (accepted + 1 - len(job.histogram))
    job.histogram[accepted] += 1
