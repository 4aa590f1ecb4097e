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

Front ends submit a `Request` and receive `Update`s (serve/record.py, the response record each
renders); the engine keeps each request's `Progress`.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

from trtllm_dflash.errors import UserError
from trtllm_dflash.policy.decision import FULL_BLOCK, DraftPolicy, Drafts
from trtllm_dflash.reference.records import DecoderProtocol, StepRecord
from trtllm_dflash.reference.verify import SamplingParams
from trtllm_dflash.runtime.capabilities import FULL, Capabilities
from trtllm_dflash.serve.detok import TextStream, stream_for
from trtllm_dflash.serve.record import Request, SpecStats, Update
from trtllm_dflash.serve.requests import needs_full_logits
from trtllm_dflash.serve.stops import sequence_stop, stop_prefix
from trtllm_dflash.serve.trace import now


@dataclass
class Progress:
    """How far the engine has got with one request (engine thread only)."""

    request: Request
    spec: SpecStats  # its speculative decoding so far (one value, replaced each verify pass)
    tokens: list[int] = field(default_factory=list)  # its output so far
    sent: str = ""  # the text handed out so far
    cum_logprob: float = 0.0


def _timed_step(decoder: DecoderProtocol, drafts: Drafts) -> tuple[StepRecord, int, int]:
    t0 = now()
    rec = decoder.step(drafts)
    return rec, t0, now()


class GroupKey(NamedTuple):
    """Requests decoded together: the same sampling setting, draft-length request and mode."""

    sampling: tuple  # ("greedy",) or (temperature, top_p, top_k, seed)
    draft_len: int | None  # the requests' own draft length, None: the policy's
    mode: str  # "ar" | "dflash" | "ddtree"


def _group_key(request: Request, default_mode: str) -> GroupKey:
    s = request.sampling
    return GroupKey(("greedy",) if s.greedy else (s.temperature, s.top_p, s.top_k, s.seed), request.draft_len,
                    request.mode or default_mode)


class ServingModel(Protocol):
    """What the serving engine decodes with (every implementation has these signatures:
    tests/runtime/test_interfaces.py)."""

    eos_token_ids: tuple[int, ...]
    failed: str | None  # why the model can no longer serve (a dead rank), else None
    capabilities: Capabilities  # what its runners can decode (runtime/capabilities.py)

    def decoder(self, *, sampling: SamplingParams, mode: str = "dflash", block_size: int | None = None,
                ddtree_budget: int | None = None, max_len: int = 2048) -> DecoderProtocol:
        """A new decode loop (one per sampling group)."""

    def release(self, decoder: DecoderProtocol) -> None:
        """The group of `decoder` is done; must not raise, even for a failed model."""

    def close(self) -> None:
        """Free the model (processes, executors)."""


@dataclass
class Group:
    """One decoder and the requests it decodes together (one GroupKey), with each request's text so
    far (serve/detok.py)."""

    key: GroupKey
    decoder: DecoderProtocol
    jobs: dict[int, Progress] = field(default_factory=dict)  # request id -> its progress
    texts: dict[int, TextStream] = field(default_factory=dict)  # request id -> its incremental decode
    # overlap (ServingEngine(overlap=True)): the last round, delivered while the device runs the next
    pending: tuple[StepRecord, str] | None = None
    stepping: bool = False  # the decoder's step runs on the device thread: cancels wait (`later`)
    later: set[int] = field(default_factory=set)  # requests to cancel before the next step


class ServingEngine:
    """policy: what each round's draft length is (trtllm_dflash/policy: the recipe's bands or
    `auto`); the default, FULL_BLOCK, drafts block_size - 1 always. A request's own `draft_len`
    overrides it, and its own `mode` ("ar" | "dflash" | "ddtree") replaces `mode` for it (front ends
    check that a ddtree request has a budget: serve/requests.check_mode)."""

    def __init__(self, model, tokenizer, *, mode: str = "dflash", block_size: int | None = None,
                 ddtree_budget: int | None = None, max_seq_len: int = 2048, max_batch_size: int = 64,
                 policy: DraftPolicy = FULL_BLOCK, trace=None, metrics=None,
                 on_fatal: Callable[[str], None] | None = None, overlap: bool = False):
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        # overlap: each round's step runs on a device thread while this one delivers the round before
        # (detokenization, stop words, responses, metrics); it pays where the runners' calls wait
        # without the GIL (CUDA synchronisation, the Executor's C++ loop), and costs a thread hand-off
        # a round where they hold it. A request a stop word ends then decodes one round more, unseen.
        self._device = ThreadPoolExecutor(1, thread_name_prefix="dflash-device") if overlap else None
        self.on_fatal = on_fatal  # called once, with the reason, when the model can no longer serve
        self.trace = trace  # serve/trace.Trace: per-round timestamps for perf/bench_serve.py, or None
        self.metrics = metrics  # serve/metrics.SpecMetrics: the server's /metrics (front ends set it), or None
        self.mode, self.ddtree_budget = mode, ddtree_budget  # requests without a mode of their own get `mode`
        self.decoder_args = dict(mode=mode, block_size=block_size, ddtree_budget=ddtree_budget, max_len=max_seq_len)
        self.max_batch_size = max_batch_size
        self.histogram_len = block_size or 1  # drafts accepted per pass: 0 .. block_size - 1
        self.inbox: queue.Queue[Request] = queue.Queue()
        self.groups: dict[GroupKey, Group] = {}
        self._next_id = 0
        self._stop = threading.Event()
        self._inbox_lock = threading.Lock()  # a submit racing stop() is answered, never left in the inbox
        self._thread = threading.Thread(target=self._loop, name="dflash-engine", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> None:
        """Queue `request`; one these runners cannot decode is answered at once (front ends refuse it
        earlier, naming their own field: serve/requests.check_decodable), never joining a round."""
        can = getattr(self.model, "capabilities", FULL)
        if not can.full_logits and needs_full_logits(request.sampling.temperature, request.bad_words, request.logprobs):
            self._finish(self._progress(request), f"error: sampling, bad words and log-probabilities need the full "
                                                  f"verify logits, and {can.why_not}")
            return
        with self._inbox_lock:
            if not self._stop.is_set():
                self.inbox.put(request)
                return
        self._finish(self._progress(request), self._stop_reason())

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
            left = [job for g in self.groups.values() for job in g.jobs.values()]
            while not self.inbox.empty():
                left.append(self._progress(self.inbox.get_nowait()))
        self.groups.clear()
        for job in left:
            self._finish(job, self._stop_reason())

    @property
    def running(self) -> int:
        return sum(len(g.jobs) for g in self.groups.values())

    # ---- the loop (engine thread only below this line)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit()
            for group in list(self.groups.values()):
                if self.model.failed:  # a dead rank: nothing can be decoded any more
                    break
                try:
                    self._round(group)
                except Exception as e:  # one failing round must not take the server down: fail its requests
                    self._fail(group, e)
            if self.model.failed and self.groups:
                for group in list(self.groups.values()):
                    self._fail(group, RuntimeError(self.model.failed))
            self._report_fatal()
            if not self.groups and self.metrics is not None:  # idle: the counters it summed are current
                self.metrics.flush()
        for group in list(self.groups.values()):  # overlap: a round decoded but not yet delivered
            if group.pending is not None:
                (rec, mode), group.pending = group.pending, None
                self._deliver(group, rec, mode=mode)
        if self._device is not None:
            self._device.shutdown(wait=False)

    def _round(self, group: Group) -> None:
        """One round of `group`: cancellations, the decoder's step, what it teaches, delivery."""
        decoder, jobs, key = group.decoder, group.jobs, group.key
        gone = [i for i, j in jobs.items() if j.request.cancelled()]
        if gone:
            decoder.cancel(gone)
            for i in gone:
                self._finish(self._leave(group, i), "cancelled")
        if group.later:  # ended by a stop word while the device ran the group's last round
            decoder.cancel(sorted(group.later))
            group.later.clear()
        if decoder.running:
            rec, t0, t1 = self._step(group)
            if key.mode in self.policy.modes:
                # every round teaches (requests with their own draft_len too): acceptance, and what
                # a round of its shape costs under this server's real load (but for the drafter's
                # pass after a join: AutoDraftLength.learn)
                self.policy.learn(rec, (t1 - t0) * 1e-9)  # now(): ns
            tags = [jobs[i].request.tag for i in rec.seq_ids if i in jobs] if self.trace else None
            if self._device is None:
                self._deliver(group, rec, mode=key.mode)
            else:  # delivered while the device runs the next round
                group.pending = (rec, key.mode)
            if self.trace:
                self.trace.add("round", tags, t0, t1, now())
                if any(rec.finished):
                    self.trace.flush()
        elif group.pending is not None:  # the last round: nothing left to overlap it with
            rec, group.pending = group.pending[0], None
            self._deliver(group, rec, mode=key.mode)
        if not decoder.running and group.pending is None:
            self.model.release(self.groups.pop(key).decoder)

    def _step(self, group: Group) -> tuple[StepRecord, int, int]:
        """(record, start, end) of the group's next step; with overlap, run on the device thread
        while this one delivers the group's previous round."""
        drafts = self._decide(group)
        if group.pending is None:
            return _timed_step(group.decoder, drafts)
        running = self._device.submit(_timed_step, group.decoder, drafts)
        (rec, mode), group.pending, group.stepping = group.pending, None, True
        try:
            self._deliver(group, rec, mode=mode)
        finally:
            out = running.result()  # the decoder is this thread's again
            group.stepping = False
        return out

    def _cancel(self, group: Group, rid: int) -> None:
        """Stop decoding `rid` (now, or before the next step while one runs on the device thread)."""
        if group.stepping:
            group.later.add(rid)
        else:
            group.decoder.cancel([rid])

    def _fail(self, group: Group, e: Exception) -> None:
        """`group`'s requests end with the error; its decoder is released (the other groups go on)."""
        for rid in list(group.jobs):
            self._finish(self._leave(group, rid), f"error: {type(e).__name__}: {e}")
        if self.groups.get(group.key) is group:
            del self.groups[group.key]
        self.model.release(group.decoder)

    def _report_fatal(self) -> None:
        """Tell the front end, once, that the model can no longer serve (a dead rank)."""
        if self.model.failed and self.on_fatal is not None:
            on_fatal, self.on_fatal = self.on_fatal, None
            on_fatal(self.model.failed)

    def _decide(self, group: Group) -> Drafts:
        """This group's next round: the requests' own draft length, else the policy's decision."""
        key = group.key
        if key.draft_len is not None:
            return Drafts(key.draft_len)
        if key.mode not in self.policy.modes:
            return Drafts()
        return self.policy.decide(list(group.jobs), self.running, key.mode)

    def _arrivals(self) -> list[Request]:
        arrivals: list[Request] = []
        idle = self.running == 0
        while self.running + len(arrivals) < self.max_batch_size:
            try:
                # Sleep on the queue only when nothing runs; otherwise take what is there.
                arrivals.append(self.inbox.get(timeout=0.1) if idle and not arrivals else self.inbox.get_nowait())
            except queue.Empty:
                break
        return arrivals

    def _admit(self) -> None:
        if self.model.failed:  # nothing can be decoded any more: what arrives is told why
            for request in self._arrivals():
                self._finish(self._progress(request), self._stop_reason())
            return
        by_key: dict[GroupKey, list[Progress]] = {}
        for request in self._arrivals():
            if request.cancelled():
                self._finish(self._progress(request), "cancelled")
            else:
                by_key.setdefault(_group_key(request, self.mode), []).append(self._progress(request))
        for key, new in by_key.items():
            group = self.groups.get(key)
            try:
                if group is None:
                    decoder = self.model.decoder(sampling=new[0].request.sampling,
                                                 **{**self.decoder_args, "mode": key.mode})
                    group = self.groups[key] = Group(key, decoder)
                self._join(group, new)
            except Exception as e:  # e.g. a mode these runners cannot decode: fail these requests
                taken = {id(j) for j in group.jobs.values()} if group is not None else set()
                for job in new:
                    if id(job) not in taken:
                        self._finish(job, f"error: {type(e).__name__}: {e}")
                if group is not None and (taken or not isinstance(e, UserError)):  # a failed prefill: its group too
                    self._fail(group, e)

    def _join(self, group: Group, new: list[Progress]) -> None:
        """Prefill `new` into `group`'s decoder. A UserError (a request it refuses) leaves the decoder
        as it was (Decoder.admit checks every request first) and fails these requests only."""
        ids = list(range(self._next_id, self._next_id + len(new)))
        self._next_id += len(new)
        t0 = now()
        asked = [j.request for j in new]
        rec = group.decoder.admit(
            ids, [list(r.prompt_ids) for r in asked], [r.max_tokens for r in asked],
            [list(r.stop_token_ids if r.stop_token_ids is not None else self.model.eos_token_ids) for r in asked],
            [None if r.bad_words is None else [list(w) for w in r.bad_words] for r in asked],
            [r.logprobs for r in asked],
        )
        t1 = now()
        group.jobs.update(zip(ids, new))
        group.texts.update((i, stream_for(self.tokenizer, r.skip_special_tokens)) for i, r in zip(ids, asked))
        self._deliver(group, rec)
        if self.trace:
            self.trace.add("admit", [r.tag for r in asked], t0, t1, now())

    def _deliver(self, group: Group, rec: StepRecord, mode: str | None = None) -> None:
        """Hand each request its tokens. `mode`: how a verify round was decoded (None for the prefill);
        the server's metrics count every round."""
        # a tree of n nodes over the drafter's block_size - 1 slots is at most min(n, slots) deep
        cap = self.histogram_len - 1 or max(rec.drafted, default=0)
        depths = [min(d, cap) for d in rec.drafted] if mode == "ddtree" else rec.drafted
        if rec.round > 0 and self.metrics is not None:
            committed = [len(t) for t in rec.tokens]
            if 0 in committed:  # rows the engine failed (each ends with its error) verified nothing
                ran = [b for b, n in enumerate(committed) if n]
                drafted, depths_ran = [rec.drafted[b] for b in ran], [depths[b] for b in ran]
                committed = [committed[b] for b in ran]
            else:
                drafted, depths_ran = rec.drafted, depths
            self.metrics.round(mode, drafted, committed, rec.t_draft, rec.t_verify,
                               depths_ran if mode == "ddtree" else None)
        jobs, verified, all_lps, make = group.jobs, rec.round > 0, rec.logprobs, Update.of
        counted = self.metrics is None  # a request's end reaches its client after its rounds reach the counters
        for b, (rid, toks, done, drafted, depth) in enumerate(zip(rec.seq_ids, rec.tokens, rec.finished, rec.drafted,
                                                                  depths)):
            job = jobs.get(rid)
            if job is None:  # it left while this round ran (overlap: a stop word, a cancel): unseen
                continue
            req = job.request
            job.tokens += toks
            if verified and toks:  # the last committed token is the target's bonus (none: the engine failed it)
                job.spec = job.spec.verified(drafted, len(toks) - 1 if toks else 0, depth)
            lps = None if all_lps is None else all_lps[b]
            if done == "stop" and req.skip_end_token:  # the decoder stopped at a stop token, the last one
                job.tokens.pop()
                toks, lps = toks[:-1], None if lps is None else lps[:-1]
            if req.stop_sequences:
                toks, lps, done = self._stop_sequences(group, rid, job, toks, lps, done)
            if lps:
                job.cum_logprob += sum(lps)
            delta, done = self._text(group, rid, job, toks, done)
            if done is not None and not counted:  # a client that scrapes /metrics on its answer sees its rounds
                self.metrics.flush()
                counted = True
            req.emit(make(delta, len(job.tokens), done, job.spec, tuple(toks), None if lps is None else tuple(lps),
                          job.cum_logprob))
            if done is not None:
                self._leave(group, rid)

    def _text(self, group: Group, rid: int, job: Progress, toks: list[int], done: str | None) -> tuple[str, str | None]:
        """(new text of this update, finish reason): the request's text grows by `toks` (its whole
        decode once it ends); a stop word ends it there, and a tail that may begin one is held back."""
        stream, words = group.texts[rid], job.request.stop_words
        if not words and done is None and getattr(stream, "appends", False):  # the common case, as below
            delta = stream.push(toks)  # its text grew by this, and job.sent is its text before
            job.sent += delta
            return delta, None
        old = len(stream.text)
        text = stream.add(toks)
        if done is not None:  # the last update: exactly the whole decode (a trailing partial character too)
            text = stream.final()
        elif not words:  # the common case: everything decoded so far goes out
            delta = text[len(job.sent):] if text.startswith(job.sent) else ""
            job.sent += delta
            return delta, None
        # earlier text held no stop word: a hit begins at most len(w) - 1 characters before the new text
        hits = [i for w in words if (i := text.find(w, max(0, old - len(w) + 1))) >= 0]
        if hits:
            text = text[: min(hits)]
            if done is None:
                done = "stop"
                self._cancel(group, rid)
        elif done is None:
            text = text[: len(text) - stop_prefix(text, words)]  # may become a stop word
        delta = text[len(job.sent):] if text.startswith(job.sent) else ""
        job.sent += delta
        return delta, done

    def _stop_sequences(self, group: Group, rid: int, job: Progress, toks: list[int], lps, done):
        """(tokens, log-probs, finish reason) of this update once the job's stop sequences are
        applied: the output ends with the first one, kept (TensorRT-LLM's stop words)."""
        stops = job.request.stop_sequences
        end = sequence_stop(job.tokens, len(toks), [list(s) for s in stops]) if stops else None
        if end is None:
            return toks, lps, done
        keep = len(toks) - (len(job.tokens) - end)
        del job.tokens[end:]
        if done is None:
            self._cancel(group, rid)
        return toks[:keep], None if lps is None else lps[:keep], "stop"

    def _leave(self, group: Group, rid: int) -> Progress:
        """Request `rid` leaves its group (finished, cancelled or failed): the policy forgets it."""
        self.policy.forget(rid)
        group.texts.pop(rid, None)
        return group.jobs.pop(rid)

    def _progress(self, request: Request) -> Progress:
        return Progress(request, SpecStats.start(self.histogram_len))

    def _finish(self, job: Progress, reason: str) -> None:
        job.request.emit(Update("", len(job.tokens), reason, job.spec))
