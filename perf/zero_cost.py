"""Zero-cost runners: a target and a drafter that cost the round loop nothing but the calls, so
that what the loop spends in Python shows (perf/bench_loop.py).

They return precomputed tensors of the recipe's shapes: context rows [B, T, hidden] of its
hidden size, blocks of its block size, logits over its vocabulary. Work over the vocabulary or
the hidden size is device work (one GPU kernel; on a 2-core CPU an argmax over [64, 16, 151936]
takes 300 ms, a copy of [128, 16, 4096] rows milliseconds), so neither is materialised: the
logits are `ArgmaxScores`, which carry their own argmax and top probability and answer the few
reductions the loop takes of them (argmax, softmax + max) with those, and the context rows are
`ContextRows`, whose ops run on a [B, T, 1] skeleton: one small tensor op each, as a GPU launch
would cost the host.

What they decode: each request follows a script (the tokens of a real text after its prompt).
The drafter proposes the script's next tokens and misses at a slot drawn from an acceptance
profile (the projection's per-slot conditional acceptance); the target's argmax is the script.
So greedy verification accepts the drawn prefix, commits the script and the text streamed is
the script's text. All per-row state is tensors (gathers and index_selects, no per-row Python).
"""

from __future__ import annotations

import time
from collections import namedtuple

import torch

from trtllm_dflash.reference.generate import Decoder

_Max = namedtuple("_Max", "values indices")


class ArgmaxScores:
    """Logits [..., V] that stand for their argmax ids [...] (and their top probability)."""

    def __init__(self, ids: torch.Tensor, vocab: int, top: torch.Tensor | None = None):
        self.ids, self.vocab, self.top = ids, vocab, top  # top: the drafter's confidence (None: sure)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.ids.shape, self.vocab))

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def dim(self) -> int:
        return self.ids.dim() + 1

    def is_floating_point(self) -> bool:  # logits, not argmax ids (reference/verify.py top_ids)
        return True

    def __getitem__(self, idx) -> "ArgmaxScores":  # indexes the leading (non-vocabulary) axes
        return ArgmaxScores(self.ids[idx], self.vocab, None if self.top is None else self.top[idx])

    def argmax(self, dim: int = -1) -> torch.Tensor:
        assert dim in (-1, self.ids.dim()), "only the vocabulary axis is reduced"
        return self.ids

    def float(self) -> "ArgmaxScores":
        return self

    def softmax(self, dim: int = -1) -> "ArgmaxScores":
        return self

    def max(self, dim: int = -1) -> _Max:
        return _Max(torch.ones(self.ids.shape) if self.top is None else self.top, self.ids)


class ContextRows:
    """Context rows [B, T, hidden] with no hidden-sized memory: every op the loop takes of them (cat,
    pad, indexing, slicing, new_zeros, assignment: reference/rounds.py Batch and _pend) runs on a
    [B, T, 1] skeleton and reports the hidden size back, one small op each, as a GPU launch costs
    the host. (Real rows on this CPU would charge the host a memcpy that a GPU does in microseconds:
    at 128 requests, 28 ms a round.)"""

    def __init__(self, skeleton: torch.Tensor, hidden: int):
        self.skeleton, self.hidden = skeleton, hidden

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.skeleton.shape[:-1], self.hidden))

    @property
    def device(self) -> torch.device:
        return self.skeleton.device

    @property
    def dtype(self) -> torch.dtype:
        return self.skeleton.dtype

    def dim(self) -> int:
        return self.skeleton.dim()

    def __getitem__(self, idx) -> "ContextRows":
        return ContextRows(self.skeleton[idx], self.hidden)

    def __setitem__(self, idx, value) -> None:
        self.skeleton[idx] = value.skeleton if isinstance(value, ContextRows) else value

    def new_zeros(self, *size) -> "ContextRows":
        size = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return ContextRows(self.skeleton.new_zeros(*size[:-1], 1), self.hidden)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """torch.cat / F.pad / anything else: the same op on the skeletons."""
        hidden = next(a.hidden for a in _flat(args) if isinstance(a, ContextRows))
        out = func(*_skeletons(args), **_skeletons(kwargs or {}))
        return ContextRows(out, hidden) if isinstance(out, torch.Tensor) else out


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


def _skeletons(x):
    if isinstance(x, ContextRows):
        return x.skeleton
    if isinstance(x, (list, tuple)):
        return type(x)(_skeletons(a) for a in x)
    if isinstance(x, dict):
        return {k: _skeletons(v) for k, v in x.items()}
    return x


class Scripts:
    """Per running row: its script [S] (the tokens after its prompt), its prompt length, and per
    script position the slot at which the drafter misses there (drawn from the acceptance
    profile): tensors, read with a few gathers a round whatever the batch."""

    def __init__(self, by_prompt: dict[tuple, list[int]], conditional: tuple[float, ...], vocab: int, seed: int = 0):
        self.by_prompt, self.vocab = by_prompt, vocab
        self.p = torch.tensor(conditional, dtype=torch.float64)
        self.gen = torch.Generator().manual_seed(seed)
        self.script = torch.zeros(0, 1, dtype=torch.long)  # [B, S]
        self.miss = torch.zeros(0, 1, dtype=torch.long)  # [B, S]: accepted drafts before the drafter's miss there
        self.plen = torch.zeros(0, dtype=torch.long)  # [B]
        self.slots = torch.arange(64)
        self._rows: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seconds = 0.0  # spent in the runners (the bench reports it apart)

    def join(self, prompts) -> None:
        rows = [self._row(tuple(p)) for p in prompts]
        S = max(self.script.shape[1], *(len(r[0]) for r in rows))
        pad = lambda x: torch.nn.functional.pad(x, (0, S - x.shape[-1]))  # noqa: E731
        self.script = torch.cat([pad(self.script), *(pad(r[0])[None] for r in rows)])
        self.miss = torch.cat([pad(self.miss), *(pad(r[1])[None] for r in rows)])
        self.plen = torch.cat([self.plen, torch.tensor([len(p) for p in prompts])])

    def _row(self, prompt: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """(script [S], the miss at each position [S]) of a prompt, drawn the first time it comes."""
        row = self._rows.get(prompt)
        if row is None:
            script = torch.tensor(self.by_prompt[prompt])
            # a miss at slot j: the slots before it accepted (each with its conditional acceptance), j not
            u = torch.rand(len(script), len(self.p), generator=self.gen, dtype=torch.float64)
            row = self._rows[prompt] = script, (u < self.p).int().cumprod(-1).sum(-1)
        return row

    def keep(self, idx) -> None:
        sel = torch.tensor(idx, dtype=torch.long)
        self.script, self.miss, self.plen = self.script[sel], self.miss[sel], self.plen[sel]

    def at(self, start: torch.Tensor) -> torch.Tensor:
        """[B, 1]: each row's script index of its anchor (the script has room past the end)."""
        return (start - self.plen)[:, None]

    def ahead(self, at: torch.Tensor, n: int) -> torch.Tensor:
        """The script's tokens at positions start + 1 .. start + n [B, n]."""
        return self.script.gather(1, at + 1 + self.slots[:n])


class ZeroTarget:
    """TargetRunner (reference/runners.py) at zero cost: the argmax is the script."""

    packed = True

    def __init__(self, scripts: Scripts, *, vocab: int, hidden: int, block: int, max_batch: int,
                 eos_token_ids: tuple[int, ...] = (0,), dtype=torch.bfloat16, device_s: float = 0.0):
        self.s, self.vocab_size, self.hidden, self.dtype = scripts, vocab, hidden, dtype
        # a device's verify as a wait that holds no GIL (time.sleep, as a CUDA synchronisation): the
        # serving loop's overlap (ServingEngine(overlap=True)) can hide host work behind it
        self.device_s = device_s
        self.eos_token_ids, self.device, self.full_logits = eos_token_ids, torch.device("cpu"), False
        self.rows = ContextRows(torch.zeros(max_batch, block, 1, dtype=dtype), hidden)  # [B, T, H]: every verify's
        self.verifies = 0
        self.on_verify = None  # called after each verify (the bench's clock)

    def prefill(self, prompts):
        t0 = time.thread_time()
        self.s.join(prompts)
        B, P = len(prompts), max(len(p) for p in prompts)
        first = self.s.script[-B:, 0]
        feats = ContextRows(torch.zeros(B, P, 1, dtype=self.dtype), self.hidden)
        self.s.seconds += time.thread_time() - t0
        return ArgmaxScores(first, self.vocab_size), feats

    def verify(self, tokens, start, lengths=None):
        t0 = time.thread_time()
        B, T = tokens.shape
        ids = self.s.ahead(self.s.at(start), T)
        self.s.seconds += time.thread_time() - t0
        if self.device_s:
            time.sleep(self.device_s)
        self.verifies += 1
        if self.on_verify is not None:
            self.on_verify(self.verifies)
        return ArgmaxScores(ids, self.vocab_size), self.rows[:B, :T]

    def keep(self, idx):
        self.s.keep(idx)


class ZeroDrafter:
    """DrafterRunner at zero cost: the script's next tokens, wrong (+1) from the drawn slot on."""

    def __init__(self, scripts: Scripts, *, block: int, vocab: int, mask_token_id: int = 1):
        self.s, self.block_size, self.vocab, self.mask_token_id = scripts, block, vocab, mask_token_id
        self.target_layer_ids = (1,)

    def join(self, n):
        pass

    def draft(self, anchor, start, ctx, ctx_pos, T):
        t0 = time.thread_time()
        at = self.s.at(start)
        ids = self.s.ahead(at, T - 1)
        wrong = self.s.slots[: T - 1] >= self.s.miss.gather(1, at)  # [B, T-1]: right up to the miss, wrong from it
        draft = torch.where(wrong, ids + 1, ids)  # (the script's ids are the tokenizer's, below the vocabulary)
        top = torch.where(wrong, 0.3, 0.9)  # the drafter's confidence: sure of what holds (the trim reads it)
        self.s.seconds += time.thread_time() - t0
        return ArgmaxScores(draft, self.vocab, top)

    def keep(self, idx):
        pass  # the target keeps the shared Scripts (Decoder._drop calls the target first)


class ZeroCostModel:
    """A ServingModel (serve/batcher.py) of zero-cost runners."""

    failed = None

    def __init__(self, scripts: Scripts, *, vocab: int, hidden: int, block: int, max_batch: int,
                 eos_token_ids: tuple[int, ...] = (0,), device_s: float = 0.0):
        self.scripts, self.eos_token_ids = scripts, eos_token_ids
        self.target = ZeroTarget(scripts, vocab=vocab, hidden=hidden, block=block, max_batch=max_batch,
                                 eos_token_ids=eos_token_ids, device_s=device_s)
        self.block = block

    def decoder(self, *, sampling, mode: str = "dflash", block_size=None, ddtree_budget=None, max_len: int = 2048):
        drafter = ZeroDrafter(self.scripts, block=self.block, vocab=self.target.vocab_size)
        return Decoder(self.target, drafter, mode, block_size, ddtree_budget, sampling, max_len)

    def release(self, decoder) -> None:
        pass

    def close(self) -> None:
        pass
