"""The confidence trim: once a block is drafted, how sure the drafter was of each slot (its
distribution's top probability c_j) says which drafts will hold, far better than past rounds do.
Acceptance given the drafts before is modelled as sigmoid(u_j + w * logit(c_j) + shift * s_r):
the drafter taken at its word (w = 1, u = 0) and corrected per slot and in weight by what rounds
accepted, plus a share of the request's shift. The drafter sees the very text it drafts; the
shift only the rounds before."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from trtllm_dflash.policy.acceptance import sigmoid


@dataclass(frozen=True)
class TrimConfig:
    # rounds of at most `batch` requests are trimmed (0: none): in larger rounds a cut row saves
    # little of a padded round, while rows of different lengths and the trim itself cost time
    batch: int = 2
    shift: float = 0.5  # the request shift's weight
    rate: float = 0.01  # u's learning rate
    weight_rate: float = 0.002  # w's (its feature, a logit, runs to +-9)


@dataclass
class ConfidenceTrim:
    slots: int  # block_size - 1
    config: TrimConfig = field(default_factory=TrimConfig)
    offsets: list[float] = field(default_factory=list)  # u_j
    weight: float = 1.0  # w

    def __post_init__(self):
        self.offsets = self.offsets or [0.0] * self.slots

    def acceptance(self, confidence: torch.Tensor, shifts: Sequence[float]) -> torch.Tensor:
        """Each slot's acceptance given the ones before, from confidence [B, L] and each row's
        request shift: [B, L] (float64)."""
        z = torch.logit(confidence.double().clamp(1e-4, 1 - 1e-4))  # [B, L]
        u = torch.tensor(self.offsets[:confidence.shape[1]], dtype=torch.float64)
        s = torch.tensor(list(shifts), dtype=torch.float64)
        return torch.sigmoid(u + self.weight * z + self.config.shift * s[:, None])

    def slot_acceptance(self, slot: int, confidence: float, shift: float) -> tuple[float, float]:
        """(logit of the confidence, clamped as `acceptance` clamps it; that slot's acceptance)."""
        c = min(max(confidence, 1e-4), 1 - 1e-4)
        z = math.log(c / (1 - c))
        return z, sigmoid(self.offsets[slot] + self.weight * z + self.config.shift * shift)

    def observe(self, confidence: Sequence[float], accepted: int, shift: float) -> None:
        """A trimmed round verified len(confidence) drafts of these confidences and the target
        accepted `accepted`: one gradient step per slot observed."""
        for j in range(min(len(confidence), accepted + 1)):
            z, a = self.slot_acceptance(j, confidence[j], shift)
            miss = (1.0 if j < accepted else 0.0) - a
            self.offsets[j] += self.config.rate * miss
            self.weight += self.config.weight_rate * miss * z
