"""Verification rules: pure functions on tensors, shared by the reference loop and serving.

Shapes: B sequences, D draft tokens per sequence, V vocabulary.
  draft          [B, D]      proposed tokens d_1..d_D (slot j proposes the token after slot j-1)
  target_logits  [B, D+1, V] the target at [anchor, d_1..d_D]; row j predicts the token after slot j
Both rules return (accepted [B], bonus [B]): the number of leading drafts kept, and the
target's own token that follows them (the correction, or the bonus when all D are kept).
Every round therefore commits accepted + 1 tokens (the acceptance length).

Sampling reproduces the target's *filtered* distribution: temperature, then top-k, then
top-p (nucleus: the smallest set of most likely tokens whose mass reaches top_p), as in
HF generate's default order. The drafter's proposal q is filtered the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_dflash.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise UserError(f"temperature is {self.temperature}, expected >= 0")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p is {self.top_p}, expected 0 < top_p <= 1")
        if self.top_k < 0:
            raise UserError(f"top_k is {self.top_k}, expected >= 0 (0 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: torch.Tensor, s: SamplingParams) -> torch.Tensor:
    """Filtered, tempered distribution, fp32, same shape as logits [..., V]."""
    scores = logits.float() / s.temperature
    if 0 < s.top_k < scores.shape[-1]:
        kth = scores.topk(s.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    if s.top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= s.top_p  # mass before this token already reaches top_p
        p = p.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token per row of p [..., V] -> [...]."""
    flat = p.reshape(-1, p.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(p.shape[:-1])


def top_ids(scores: torch.Tensor) -> torch.Tensor:
    """The argmax of logits [..., V]; a greedy runner that returns its argmax ids [...] (integers:
    TargetRunner.verify) hands them over as they are."""
    return scores.argmax(-1) if scores.is_floating_point() else scores


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor,
                  lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Longest prefix of drafts equal to the target's argmax, plus the target's next argmax.
    target_logits [B, D+1, V], or its argmax [B, D+1] (integers). lengths [B]: row b verifies only
    its first lengths[b] drafts (the rest are padding)."""
    best = top_ids(target_logits)  # [B, D+1]
    accepted = (draft == best[:, :-1]).int().cumprod(-1).sum(-1)  # [B]
    if lengths is not None:
        accepted = torch.minimum(accepted, lengths)
    return accepted, best.gather(1, accepted[:, None])[:, 0]


def rejection_verify(
    draft: torch.Tensor,  # [B, D], d_j ~ q_j
    q: torch.Tensor,  # [B, D, V] drafter distributions the drafts were sampled from
    p: torch.Tensor,  # [B, D+1, V] target distributions
    gen: torch.Generator | None,
    lengths: torch.Tensor | None = None,  # [B]: row b verifies only its first lengths[b] drafts
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative (rejection) sampling: keep d_j while u_j * q_j(d_j) < p_j(d_j); at the
    first rejection emit a sample of norm(max(p_j - q_j, 0)); if all D are kept, emit a
    sample of p_{D}. The emitted sequence is distributed exactly as sampling from p.
    q_j may depend on the drafts before slot j (DFlash2's selector conditions each slot on
    the previous choice): slot j is only looked at when d_1..d_{j-1} were accepted, so p_j and
    q_j are both conditioned on that same prefix, and the standard proof applies slot by slot.
    A row with lengths[b] = L < D is the same rule on its first L drafts: its slots past L
    are never looked at, and keeping all L emits a sample of p_L."""
    B, D = draft.shape
    if D == 0:
        return torch.zeros(B, dtype=torch.long, device=p.device), sample(p[:, 0], gen)
    u = torch.rand(B, D, generator=gen, device=p.device)
    px = p[:, :D].gather(-1, draft[..., None])[..., 0]  # [B, D]
    qx = q.gather(-1, draft[..., None])[..., 0]  # [B, D]
    accepted = (u * qx < px).int().cumprod(-1).sum(-1)  # [B]
    full = torch.full_like(accepted, D) if lengths is None else lengths  # [B] drafts each row verifies
    accepted = torch.minimum(accepted, full)
    at = accepted.clamp_max(D - 1)[:, None, None].expand(-1, 1, p.shape[-1])
    p_at = p.gather(1, at)[:, 0]  # [B, V] target at the first rejected slot
    residual = (p_at - q.gather(1, at)[:, 0]).clamp_min(0)
    # An all-zero residual means p == q there, so that slot cannot have been rejected;
    # fall back to p only to keep multinomial well-defined for such rows.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)
    p_end = p.gather(1, full[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]  # [B, V] target after all L
    final = torch.where((accepted == full)[:, None], p_end, residual)
    return accepted, sample(final, gen)
