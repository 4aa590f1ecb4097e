"""What the one round loop (generate.py) runs on: a TargetRunner and a DrafterRunner.

The loop owns the requests (tokens, positions, acceptance, stops, joins and cancels); a
runner owns model state (KV caches, the drafter's context cache) for the running batch, row
b of every call being the loop's row b. Two pairs implement the interfaces:
  reference  ReferenceTarget / ReferenceDrafter below: our torch modules in this process;
             their context rows are the raw target-layer outputs [n*H] (the drafter applies
             fc + hidden_norm itself)
  engine     runtime/engine_runners.py: the TensorRT-LLM 1.2.1 target (Executor, one context
             request per round) and the drafter engine, or their CPU stand-ins; their context
             rows are the fused DFlash features [H] the target engine computes in-graph
A target runner and a drafter runner of the same pair agree on what a context row is.

Positions: a row's committed tokens occupy positions [0, start); its anchor (the newest
committed token, not yet run through the target) is at `start`. Padding in ragged tensors
is marked by position -1 (PAD).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from trtllm_dflash.reference.cache import KVCache
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.target import Target
from trtllm_dflash.reference.verify import SamplingParams

PAD = -1  # position of a padding entry in ctx_pos


class RowsFailed(Exception):
    """A target runner's pass in which some rows failed and the others did not (an engine that
    answers each row as a request of its own: one error response). `rows`: {row: message};
    `result`: the pass's return value, whose other rows stand (the failed rows' values are
    unspecified), None when every row failed (a prefill that failed whole leaves the runner's
    rows as they were). The decoder ends the failed rows' requests with their message and goes
    on with the rest. A pass that fails as a whole (the engine's step) raises anything else."""

    def __init__(self, rows: dict[int, str], result: tuple | None) -> None:
        super().__init__(f"{len(rows)} row(s) failed: {next(iter(rows.values()))}")
        self.rows, self.result = rows, result


class TargetRunner(Protocol):
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    packed: bool  # verify runs only each row's own lengths[b] + 1 tokens (see `verify`)
    # The decoder sets this before each pass: True when its logits must be the target's full
    # scores even when decoding greedily (bad words, log-probabilities: reference/token_rules.py).
    # A runner that returns exact logits anyway may ignore it.
    full_logits: bool

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New rows join the batch (appended after the running ones). Returns the logits at
        each prompt's last position [B_new, V] and the context rows of every prompt position
        [B_new, P, F] (P = the longest prompt; None when the drafter needs none)."""

    def verify(self, tokens: torch.Tensor, start: torch.Tensor,
               lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [B, T] ([anchor, drafts]) at positions start + [0, T) for every running row:
        logits [B, T, V] and context rows [B, T, F]. Positions after the accepted ones are
        simply overwritten by the next call (nothing to trim). lengths [B]: row b's drafts are
        only its first lengths[b] (the rest is padding, its logits and rows unspecified); a
        runner whose `packed` is True runs only the lengths[b] + 1 tokens of each row.
        prefill and verify raise RowsFailed when only some rows failed."""

    def keep(self, idx: list[int]) -> None:
        """Only rows idx stay, in that order (finished and cancelled rows free their state)."""


class DrafterRunner(Protocol):
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]

    def join(self, n: int) -> None:
        """n new rows with empty context (appended after the running ones)."""

    def draft(self, anchor: torch.Tensor, start: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor,
              T: int) -> torch.Tensor:
        """Append the new context rows ctx [B, Tc, F] at positions ctx_pos [B, Tc] (PAD =
        padding) to the drafter's context, then draft the block [anchor, mask x (T-1)] at
        positions start + [0, T): logits of the mask slots [B, T-1, V]."""

    def keep(self, idx: list[int]) -> None:
        """Only rows idx stay, in that order."""


class PathDrafterRunner(DrafterRunner, Protocol):
    """A drafter that chooses its own path (DFlash2: the candidate selector), marked by
    `selects_path = True`. The loop then takes the drafts from `draft_path` instead of
    sampling the logits of `draft` slot by slot (DDTree still builds its tree from `draft`)."""

    selects_path: bool

    def draft_path(self, anchor: torch.Tensor, start: torch.Tensor, ctx: torch.Tensor, ctx_pos: torch.Tensor, T: int,
                   sampling: SamplingParams, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `draft`, then the selector's path: draft tokens [B, T-1] and, when sampling, the
        distributions q [B, T-1, V] each token was drawn from, given the tokens before it
        (what rejection sampling needs); None when greedy."""


def causal_mask(start: torch.Tensor, T: int, kv_len: int) -> torch.Tensor | None:
    """[B, 1, T, kv_len]: query t of row b (position start_b + t) sees slots <= start_b + t."""
    rel = torch.arange(kv_len, device=start.device)[None, :] - start[:, None]  # [B, S]
    vis = rel[:, None, :] <= torch.arange(T, device=start.device)[None, :, None]  # [B, T, S]
    return None if bool(vis.all()) else vis[:, None]


def tree_mask(start: torch.Tensor, vis: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[B, 1, n, kv_len]: committed slots (< start_b) plus the node's ancestors (vis [B, n, n])."""
    B, n, _ = vis.shape
    rel = torch.arange(kv_len, device=start.device)[None, :] - start[:, None]  # [B, S]
    in_tree = (rel >= 0) & (rel < n)
    tree_vis = vis.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # [B, n, S]
    return ((rel < 0)[:, None, :] | (in_tree[:, None, :] & tree_vis))[:, None]


class ReferenceTarget:
    """Our torch Target over a static KV cache (slot == position); rows live in the cache's batch axis.
    Also verifies DDTree trees (verify_tree / compact), which only the reference backend runs."""

    packed = True  # verify runs only each row's own tokens (Target.forward's packed batch)

    def __init__(self, target: Target, capture: Sequence[int], cache_len: int):
        self.model, self.capture, self.cache_len = target, tuple(capture), cache_len
        self.vocab_size, self.eos_token_ids = target.cfg.vocab_size, target.cfg.eos_token_ids
        self.device = target.device
        self.cache: KVCache | None = None

    def prefill(self, prompts):
        dev, B = self.device, len(prompts)
        lengths = [len(p) for p in prompts]
        P = max(lengths)
        tok = torch.zeros(B, P, dtype=torch.long, device=dev)  # right-padded
        for b, p in enumerate(prompts):
            tok[b, : len(p)] = torch.tensor(p, dtype=torch.long)
        plen = torch.tensor(lengths, device=dev)
        pos = torch.arange(P, device=dev).expand(B, -1)
        cache = self.model.new_cache(B, self.cache_len)
        logits, feats = self.model(tok, pos, cache, P, causal_mask(torch.zeros_like(plen), P, P), self.capture,
                                   (plen - 1)[:, None])
        if self.cache is None:
            self.cache = cache
        else:
            self.cache.extend(cache)
        return logits[:, 0], feats

    def verify(self, tokens, start, lengths=None):
        T = tokens.shape[1]
        pos = start[:, None] + torch.arange(T, device=tokens.device)
        kv_len = int(start.max()) + T
        valid = None
        if lengths is not None and bool((lengths < T - 1).any()):
            valid = torch.arange(T, device=tokens.device)[None, :] <= lengths[:, None]  # [B, T]
        return self.model(tokens, pos, self.cache, kv_len, causal_mask(start, T, kv_len), self.capture, valid=valid)

    def verify_tree(self, tokens, depth, vis, start):
        """DDTree: node i of row b (token tokens[b, i], ancestors vis[b, i]) at position
        start_b + depth[b, i], written to slot start_b + i."""
        n = tokens.shape[1]
        slots = start[:, None] + torch.arange(n, device=tokens.device)
        kv_len = int(start.max()) + n
        return self.model(tokens, start[:, None] + depth, self.cache, kv_len, tree_mask(start, vis, kv_len),
                          self.capture, slots=slots)

    def compact(self, row: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move the accepted tree nodes' K/V to contiguous slots (DDTree)."""
        self.cache.move(row, src, dst)

    def keep(self, idx):
        if not idx:
            self.cache = None
        else:
            self.cache.keep_rows(torch.tensor(idx, device=self.device))


class ReferenceDrafter:
    """Our torch DFlashDraft with its context cache; embeds the block and projects the drafts with
    the target's embedding and LM head (DFlash shares both). A DFlash2 drafter also chooses
    its path (PathDrafterRunner); its per-row state is the same context cache (the
    convolutions restart at every block)."""

    def __init__(self, drafter: DFlashDraft, target: Target, cache_len: int):
        self.model, self.target, self.cache_len = drafter, target, cache_len
        self.block_size, self.mask_token_id = drafter.block_size, drafter.mask_token_id
        self.target_layer_ids = drafter.target_layer_ids
        self.selects_path = drafter.candidate_selector is not None
        self.cache: KVCache | None = None

    def join(self, n):
        cache = self.model.new_cache(n, self.cache_len)
        if self.cache is None:
            self.cache = cache
        else:
            self.cache.extend(cache)

    def _slots(self, anchor, start, ctx, ctx_pos, T) -> torch.Tensor:
        """One drafter pass: final-normed states of the mask slots [B, T-1, H]."""
        block = torch.full((anchor.shape[0], T), self.mask_token_id, dtype=torch.long, device=anchor.device)
        block[:, 0] = anchor
        slots = torch.where(ctx_pos == PAD, self.cache.trash, ctx_pos)  # padding -> the trash slot (not written)
        return self.model(self.target.embed_tokens(block), start, ctx, slots, self.cache)[:, 1:]

    def draft(self, anchor, start, ctx, ctx_pos, T):
        return self.model.logits(self._slots(anchor, start, ctx, ctx_pos, T), self.target.lm_head)

    def draft_path(self, anchor, start, ctx, ctx_pos, T, sampling, gen):
        hidden = self._slots(anchor, start, ctx, ctx_pos, T)  # [B, T-1, H]
        sel = self.model.candidate_selector.select(hidden, self.model.logits(hidden, self.target.lm_head), anchor,
                                                   sampling, gen)
        return sel.path, None if sel.q is None else sel.q_vocab(self.target.cfg.vocab_size)

    def keep(self, idx):
        if not idx:
            self.cache = None
        else:
            self.cache.keep_rows(torch.tensor(idx, device=self.cache.k.device))
