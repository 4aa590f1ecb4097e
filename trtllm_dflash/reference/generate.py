"""The one decode loop: `generate_steps` yields a StepRecord per round; `generate` collects.

Modes share the loop and differ only in what is verified each round:
  ar      the anchor alone (block size 1, no drafter): plain decoding, the baseline
  dflash  [anchor, d_1..d_{T-1}] from one drafter pass, causal verify (DFlash2 drafters:
          the drafts are the selector's path, sampled with its own q)
  ddtree  [anchor, tree nodes] from one drafter pass, ancestor-only verify

Per round, for every running sequence (one batched drafter pass, one batched target pass):
  1. draft   the drafter sees the new context features and the block [anchor, mask...]
  2. verify  the target runs the proposal, writing its K/V and capturing features
  3. accept  greedy or rejection sampling (verify.py), or a tree walk (ddtree.py);
             commit the accepted tokens + the bonus; the target cache "trims" for free
             (slot == position; DDTree first compacts the accepted nodes' K/V)
  4. feed    the accepted positions' target features become the next new context
Sequences carry their own positions and lengths, stop on their own stop tokens or
max_new_tokens, and leave the batch when done.

The loop runs on a TargetRunner and a DrafterRunner (runners.py): our torch modules
(`Decoder(target, drafter)` wraps a Target and a DFlashDraft in the reference runners) or
the engine backend's runners (TensorRT-LLM engines, or their CPU stand-ins). Everything in
this file, rounds.py (one round's draft, verify and accept) and records.py (what the loop
yields) is shared by both backends.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.policy.decision import Drafts
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.records import Generation, Stats, StepRecord
from trtllm_dflash.reference.rounds import Batch, block_round, ddtree_round, now
from trtllm_dflash.reference.runners import (
    PAD,
    DrafterRunner,
    ReferenceDrafter,
    ReferenceTarget,
    RowsFailed,
    TargetRunner,
)
from trtllm_dflash.reference.target import Target
from trtllm_dflash.reference.token_rules import TokenRules
from trtllm_dflash.reference.verify import SamplingParams, probs, sample, top_ids

MODES = ("ar", "dflash", "ddtree")


def _vocab_size(target: Target | TargetRunner) -> int:
    return target.cfg.vocab_size if isinstance(target, Target) else target.vocab_size


def _validate_prompts(vocab: int, prompts, limits):
    bad = [n for n in limits if not isinstance(n, int) or n < 1]
    if bad:
        raise UserError(f"max_new_tokens is {bad[0]!r}, expected an integer >= 1")
    if not prompts:
        raise UserError("no prompts given")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise UserError(f"prompt {i} is empty")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise UserError(f"prompt {i}: token id {bad[0]} is outside the target's vocabulary (0..{vocab - 1})")


def _validate(drafter, mode, block_size, budget):
    if mode not in MODES:
        raise UserError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "ar":
        return 1, 0
    if drafter is None:
        raise UserError(f"mode {mode!r} needs a drafter")
    block_size = drafter.block_size if block_size is None else block_size
    if not 2 <= block_size <= drafter.block_size:
        raise UserError(
            f"block size {block_size} is not one the drafter was trained for: its block_size is "
            f"{drafter.block_size}; use 2..{drafter.block_size}"
        )
    budget = block_size - 1 if budget is None else budget
    if mode == "ddtree" and budget < 1:
        raise UserError(f"ddtree budget is {budget}, expected >= 1")
    return block_size, budget


def _per_request(value, n: int, name: str, nested: bool) -> list:
    """Broadcast a shared setting to n requests, or check a per-request list."""
    per = isinstance(value, (list, tuple)) and (not nested or (len(value) > 0 and isinstance(value[0], (list, tuple))))
    if not per:
        return [value] * n
    if len(value) != n:
        raise UserError(f"{name} has {len(value)} entries for {n} prompts")
    return list(value)



def generate_steps(
    target: Target,
    drafter: DFlashDraft | None,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    mode: str = "dflash",
    block_size: int | None = None,
    ddtree_budget: int | None = None,
    sampling: SamplingParams = SamplingParams(),
    stop_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    bad_words: Sequence[Sequence[int]] | None = None,
    logprobs: bool = False,
) -> Iterator[StepRecord]:
    """Decode `prompts` together; yield one StepRecord per round (round 0 = first token).

    max_new_tokens: one limit for all, or one per prompt. stop_token_ids: one list for
    all, one list per prompt, or None for the target's eos ids; a stop token is kept in
    the output. block_size defaults to the drafter's; ddtree_budget (tree nodes besides
    the root) defaults to block_size - 1. bad_words: token sequences no prompt's output contains
    (token_rules.py); logprobs: the records carry each committed token's log-probability.
    Arguments are validated here, when called,
    before any work; the rounds run as the returned iterator is consumed."""
    limits = _per_request(max_new_tokens, len(prompts), "max_new_tokens", nested=False)
    _validate_prompts(_vocab_size(target), prompts, limits)
    decoder = Decoder(target, drafter, mode, block_size, ddtree_budget, sampling,
                      max_len=max(len(p) for p in prompts) + max(limits))
    stop_lists = _per_request(
        decoder.target.eos_token_ids if stop_token_ids is None else stop_token_ids, len(prompts), "stop_token_ids", True
    )
    n = len(prompts)
    return _run(decoder, list(range(n)), prompts, limits, stop_lists, [bad_words] * n, [logprobs] * n)


def _run(decoder: "Decoder", ids, prompts, limits, stops, bad, logprobs) -> Iterator[StepRecord]:
    yield decoder.admit(ids, prompts, limits, stops, bad, logprobs)
    while decoder.running:
        yield decoder.step()


class Decoder:
    """The state of the one decode loop, for requests that join and leave between rounds.

    `admit` prefills new requests (one batched target pass) and adds them to the running
    batch; `step` runs one round (one batched drafter pass + one batched target pass) for
    every running request; finished requests leave the batch. `generate_steps` admits a
    fixed set of prompts once; the serving engine admits new requests between rounds.
    `max_len` bounds prompt + generated tokens of any request (it sizes the caches).

    target / drafter: a Target and a DFlashDraft (run by the reference runners), or a
    TargetRunner and a DrafterRunner (runners.py)."""

    def __init__(self, target: Target | TargetRunner, drafter: DFlashDraft | DrafterRunner | None, mode: str = "dflash",
                 block_size: int | None = None, ddtree_budget: int | None = None,
                 sampling: SamplingParams = SamplingParams(), max_len: int = 2048):
        self.block_size, self.budget = _validate(drafter, mode, block_size, ddtree_budget)
        self.mode, self.sampling, self.spec = mode, sampling, mode != "ar"
        # Room for a verify block past the last committed token.
        cache_len = max_len + 1 + (self.budget if mode == "ddtree" else self.block_size)
        capture = drafter.target_layer_ids if self.spec else ()
        if isinstance(target, Target):
            drafter = ReferenceDrafter(drafter, target, cache_len) if self.spec else None
            target = ReferenceTarget(target, capture, cache_len)
        if mode == "ddtree" and not hasattr(target, "verify_tree"):
            raise UserError(f"mode ddtree needs a target runner that verifies trees; {type(target).__name__} does not")
        self.target: TargetRunner = target
        self.drafter: DrafterRunner | None = drafter if self.spec else None
        self.gen = None if sampling.greedy else torch.Generator(target.device).manual_seed(sampling.seed)
        self.max_len = max_len
        self.st: Batch | None = None
        self.rounds = 0
        self.limits: dict[int, int] = {}
        self.stops: dict[int, set[int]] = {}
        self.generated: dict[int, list[int]] = {}
        self.rules = TokenRules(self.generated, self.target.vocab_size, 1.0 if sampling.greedy
                                else sampling.temperature)

    @property
    def running(self) -> int:
        return 0 if self.st is None else len(self.st.rows)

    @property
    def packed(self) -> bool:
        """A round verifies only each request's own drafts (rows of different lengths cost less)."""
        return self.target.packed

    def _commit(self, rows: list[int], new: list[list[int]],
                failed: dict[int, str] | None = None) -> tuple[list[list[int]], list[str | None]]:
        """Each row's tokens cut at its limit and its first stop token (new's lists are the round's
        own: kept as they are when nothing is cut), and whether it ended. A row in `failed` {row
        index: message} (its runner pass failed: RowsFailed) commits nothing and ends "error: ..."."""
        if failed:  # their tokens are garbage: none is committed
            new = [[] if b in failed else toks for b, toks in enumerate(new)]
        out, done, limits, generated, stops_of = [], [], self.limits, self.generated, self.stops
        for r, toks in zip(rows, new):
            gen, limit, stops = generated[r], limits[r], stops_of[r]
            if len(gen) + len(toks) > limit:
                toks = toks[: limit - len(gen)]
            hit = None
            if not stops.isdisjoint(toks):
                hit = next(i for i, t in enumerate(toks) if t in stops)
                toks = toks[: hit + 1]
            gen += toks
            out.append(toks)
            done.append("stop" if hit is not None else "length" if len(gen) >= limit else None)
        for b, message in (failed or {}).items():
            done[b] = f"error: {message}"
        return out, done

    def _drop(self, rows: set[int]) -> None:
        for r in rows:
            self.limits.pop(r, None), self.stops.pop(r, None), self.generated.pop(r, None)
            self.rules.drop(r)
        if self.st is None or not rows:
            return
        keep = [b for b, r in enumerate(self.st.rows) if r not in rows]
        if len(keep) == len(self.st.rows):
            return
        for runner in (self.target, self.drafter):
            if runner is not None:
                runner.keep(keep)
        if keep:
            self.st.keep(keep)
        else:
            self.st = None

    def cancel(self, ids: Sequence[int]) -> None:
        """Remove requests from the running batch (their slots are freed at once)."""
        self._drop(set(ids))

    @torch.inference_mode()
    def admit(self, ids: Sequence[int], prompts: Sequence[Sequence[int]], limits: Sequence[int],
              stops: Sequence[Sequence[int]], bad_words: Sequence[Sequence[Sequence[int]] | None] | None = None,
              logprobs: Sequence[bool] | None = None) -> StepRecord:
        """Prefill new requests (first token from the target) and add them to the batch; per
        request its bad words and whether its records carry log-probabilities (token_rules.py)."""
        _validate_prompts(self.target.vocab_size, prompts, limits)
        too_long = [i for i, (p, n) in zip(ids, zip(prompts, limits)) if len(p) + n > self.max_len]
        if too_long:
            raise UserError(f"request {too_long[0]}: prompt + max_new_tokens exceeds the decoder's max_len "
                            f"{self.max_len}")
        dev, sampling, B = self.target.device, self.sampling, len(prompts)
        self._register(ids, prompts, limits, stops, bad_words or [None] * B, logprobs or [False] * B)
        P = max(len(p) for p in prompts)
        plen = torch.tensor([len(p) for p in prompts], device=dev)
        t0 = now()
        self.target.full_logits = self.rules.active
        try:
            logits, feats = self.target.prefill(prompts)  # logits at each prompt's last position [B, V]
            failed = {}
        except RowsFailed as e:  # those requests end with their error, the others join
            failed = e.rows
            if e.result is None:  # none joins
                self._drop(set(ids))  # their registrations: no row of theirs was added
                return StepRecord(0, list(ids), [[] for _ in ids], [f"error: {failed[b]}" for b in range(B)], [0] * B,
                                  t_verify=now() - t0)
            logits, feats = e.result
        if self.spec:
            self.drafter.join(B)
        logits = self.rules.mask(ids, lambda b: [[]], logits[:, None])  # [B, 1, V] (or [B, 1] argmax ids)
        first = top_ids(logits[:, 0]) if sampling.greedy else sample(probs(logits[:, 0], sampling), self.gen)
        new = [[t] for t in first.tolist()]
        lps = self.rules.token_logprobs(ids, logits, [[0]] * B, new)
        st = Batch(list(ids), first, plen, None, None)
        if self.spec:
            pos = torch.arange(P, device=dev).expand(B, -1)
            st.ctx, st.ctx_pos = feats, torch.where(pos < plen[:, None], pos, PAD)
        t1 = now()
        toks, done = self._commit(st.rows, new, failed)
        if self.st is None:
            self.st = st
        else:
            self.st.extend(st)
        self._drop({r for r, d in zip(ids, done) if d})
        return StepRecord(0, list(ids), toks, done, [0] * B, t_verify=t1 - t0, t_overhead=now() - t1,
                          logprobs=_cut(lps, toks))

    def _register(self, ids, prompts, limits, stops, bad_words, logprobs) -> None:
        for i, bad in zip(ids, bad_words):  # every request checked before any is taken
            self.rules.check(i, bad)
        for i, p, n, stop, bad, lp in zip(ids, prompts, limits, stops, bad_words, logprobs):
            self.limits[i], self.stops[i], self.generated[i] = n, set(stop), []
            self.rules.add(i, p, bad, bool(lp))

    @torch.inference_mode()
    def step(self, drafts: Drafts = Drafts()) -> StepRecord:
        """One round for every running request, as `drafts` decides (policy/decision.py: a policy's
        decision, or Drafts.of(...) for a length for all or {request id: length}; Drafts() drafts
        block_size - 1; 0 = a plain target step, speculation off). A request's drafts never go past
        the tokens it has left. Every length is lossless. In a round of different lengths the
        batch drafts the longest; each request verifies its own (a packed target runner runs only
        those tokens, another pads).
        tree_budget, DDTree decoders only: the nodes of this round's trees (1..the decoder's
        budget; their depth is the longest draft length), 0 for a chain round (per-request
        lengths, as a DFlash decoder), None for the decoder's budget.
        trim (chain rounds; `Trim`): after drafting, each request verifies the prefix of its
        drafts trim chooses (lossless as any length; the record's `drafted` is what was verified,
        its `block` what was drafted). Drafters that choose their own path (DFlash2) are not
        trimmed: their slots' distributions depend on the path drawn before them."""
        if not isinstance(drafts, Drafts):
            raise TypeError(f"Decoder.step takes a Drafts (policy/decision.py), not {type(drafts).__name__}: "
                            "Drafts.of(n) for n drafts a request, Drafts.of({request: n}) for one each")
        st = self.st
        assert st is not None, "nothing is running: admit requests first"
        d, tree_budget, trim = drafts, drafts.tree_budget, drafts.trim
        budget = self.budget if tree_budget is None else tree_budget
        if self.mode != "ddtree" and tree_budget:
            raise UserError(f"tree_budget {tree_budget}: only a ddtree decoder builds trees (this one decodes "
                            f"{self.mode})")
        if self.mode == "ddtree" and not 0 <= budget <= self.budget:
            raise UserError(f"tree_budget {tree_budget}: expected 0..{self.budget} (the decoder's ddtree budget)")
        self.rounds += 1
        self.target.full_logits = self.rules.active
        t0 = now()
        longest = self.block_size - 1
        want = d.wanted(st.rows, longest)
        left = [self.limits[r] - len(self.generated[r]) for r in st.rows]
        lengths = [0 if self.mode == "ar" else max(0, min(n, longest, rest - 1)) for n, rest in zip(want, left)]
        T = max(lengths) + 1
        tree = self.mode == "ddtree" and T > 1 and budget > 0
        chain, conf, failed = None, None, {}
        if tree:  # one tree depth for the batch
            new, drafted, chain, t1, t2, lps = ddtree_round(self.target, self.drafter, st, T, budget, self.sampling,
                                                            self.gen, self.rules)
        else:
            new, drafted, conf, t1, t2, lps = block_round(self.target, self.drafter, st, lengths, self.sampling,
                                                          self.gen, trim, self.rules, failed)
        rows = list(st.rows)
        toks, done = self._commit(rows, new, failed)
        if failed:  # nothing of theirs was verified
            drafted = [0 if b in failed else n for b, n in enumerate(drafted)]
        self._drop({r for r, d in zip(rows, done) if d})
        return StepRecord(self.rounds, rows, toks, done, drafted, t1 - t0, t2 - t1, now() - t2,
                          budget if tree else 0, chain, T if conf is not None else 0, conf, _cut(lps, toks))


def _cut(lps: list[list[float] | None] | None, toks: list[list[int]]) -> list[list[float] | None] | None:
    """Log-probabilities of the tokens a round committed (the commit may cut at a stop or the limit)."""
    return None if lps is None else [None if lp is None else lp[: len(t)] for lp, t in zip(lps, toks)]



def generate(
    target: Target,
    drafter: DFlashDraft | None,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    **kwargs,
) -> list[Generation]:
    """Run `generate_steps` to the end; one Generation (tokens + Stats) per prompt."""
    out = [Generation([], Stats(), "length") for _ in prompts]
    for rec in generate_steps(target, drafter, prompts, max_new_tokens, **kwargs):
        for b, (r, toks, done) in enumerate(zip(rec.seq_ids, rec.tokens, rec.finished)):
            g, s = out[r], out[r].stats
            g.tokens.extend(toks)
            if rec.logprobs is not None:
                g.logprobs = (g.logprobs or []) + rec.logprobs[b]
            if rec.round == 0:
                s.t_prefill += rec.t_verify
            else:
                s.rounds += 1
                s.accepted_per_round.append(len(toks))
                s.t_draft += rec.t_draft
                s.t_verify += rec.t_verify
            s.t_overhead += rec.t_overhead
            g.finish_reason = done or g.finish_reason
    return out
