"""Per-request rules on the target's logits, applied inside verification: bad words, and the
log-probabilities of the committed tokens.

A bad word is a token sequence s_1..s_k: its last token s_k is masked (logit -inf) at every
position whose k-1 preceding tokens are s_1..s_{k-1} (a one-token word: everywhere). Preceding
tokens are the prompt, the committed output and, inside a verify block, the drafts before the
slot: the mask at slot j of [anchor, d_1..d_D] depends on d_1..d_j, so whether d_{j+1} may follow
is decided exactly as a plain decode would decide it after committing d_1..d_j. Verifying
against the masked logits (greedy: argmax; sampling: rejection sampling against the masked
distribution) therefore gives the target's masked greedy decoding, or samples of its masked
distribution. This is the rule of HF transformers' NoBadWordsLogitsProcessor and of
TensorRT-LLM's bad-words kernel (cpp/tensorrt_llm/kernels/banBadWords.cu), which the
tensorrtllm_backend `bad_words` input feeds.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from trtllm_dflash.errors import UserError


def bans(history: Sequence[int], suffixes: Sequence[Sequence[int]],
         bad: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(slot, token) pairs the bad words forbid: slot j predicts the token after history + suffixes[j]."""
    out = []
    for j, suffix in enumerate(suffixes):
        ctx = list(history) + list(suffix)
        for word in bad:
            k = len(word)
            if k == 1 or (len(ctx) >= k - 1 and ctx[len(ctx) - k + 1:] == list(word[:-1])):
                out.append((j, word[-1]))
    return out


class TokenRules:
    """The bad words and log-prob requests of a decoder's running requests. `generated` is the
    decoder's own {request: committed tokens}; the prompt's tail is kept here, as long as the
    longest bad word needs to look back. Log-probabilities are taken at `temperature` (the
    decoder's sampling temperature, 1 when it decodes greedily)."""

    def __init__(self, generated: dict[int, list[int]], vocab_size: int, temperature: float = 1.0):
        self.generated, self.vocab_size, self.temperature = generated, vocab_size, temperature
        self.bad: dict[int, list[list[int]]] = {}
        self.tail: dict[int, list[int]] = {}
        self.logprobs: set[int] = set()

    @property
    def active(self) -> bool:
        """A running request has bad words or wants log-probabilities: verification needs the
        target's full logits (TargetRunner.full_logits)."""
        return bool(self.bad or self.logprobs)

    def check(self, r: int, bad: Sequence[Sequence[int]] | None) -> None:
        """UserError naming the first bad word of request r with a token outside the vocabulary."""
        for w in bad or ():
            out = [t for t in w if not 0 <= t < self.vocab_size]
            if out:
                raise UserError(f"request {r}: bad word {list(w)}: token id {out[0]} is outside the vocabulary "
                                f"(0..{self.vocab_size - 1})")

    def add(self, r: int, prompt: Sequence[int], bad: Sequence[Sequence[int]] | None, logprobs: bool) -> None:
        words = [list(w) for w in bad or () if len(w)]
        if words:
            self.bad[r] = words
            self.tail[r] = list(prompt[len(prompt) - max(len(w) for w in words) + 1:])
        if logprobs:
            self.logprobs.add(r)

    def drop(self, r: int) -> None:
        self.bad.pop(r, None), self.tail.pop(r, None), self.logprobs.discard(r)

    def mask(self, rows: Sequence[int], suffixes: Callable[[int], Sequence[Sequence[int]]],
             logits: torch.Tensor) -> torch.Tensor:
        """logits [B, T, V] (row b is request rows[b]; its slot j follows its committed tokens +
        suffixes(b)[j]) with every banned token at -inf; a copy when anything is masked."""
        idx = [(b, j, t) for b, r in enumerate(rows) if r in self.bad
               for j, t in bans(self._history(r), suffixes(b), self.bad[r])]
        if not idx:
            return logits
        b, j, t = (torch.tensor(x, device=logits.device) for x in zip(*idx))
        logits = logits.clone()
        logits[b, j, t] = float("-inf")
        return logits

    def _history(self, r: int) -> list[int]:
        """The tokens before request r's next slot that its longest bad word can look back on."""
        back = max(len(w) for w in self.bad[r]) - 1
        return (self.tail[r] + self.generated[r][-back:])[-back:] if back else []

    def token_logprobs(self, rows: Sequence[int], logits: torch.Tensor, slots: Sequence[Sequence[int]],
                       tokens: Sequence[Sequence[int]]) -> list[list[float] | None] | None:
        """Per row, log p(tokens[b][i]) under the target's distribution at slot slots[b][i] of logits
        [B, T, V] (masked, at the temperature); None for rows that did not ask, None overall when
        none did."""
        if not any(r in self.logprobs for r in rows):
            return None
        out: list[list[float] | None] = []
        for b, r in enumerate(rows):
            if r not in self.logprobs:
                out.append(None)
                continue
            lp = torch.log_softmax(logits[b, list(slots[b])].float() / self.temperature, -1)  # [n, V]
            out.append(lp.gather(-1, torch.tensor(tokens[b], device=lp.device)[:, None])[:, 0].tolist())
        return out
