"""Where a stop word or stop sequence ends a request's output (serve/batcher.py applies them as
rounds are delivered): token stop sequences end it at once, and while streaming, a text tail
that may begin a stop word is held back until the next round tells."""

from __future__ import annotations


def sequence_stop(tokens: list[int], new: int, sequences: list[list[int]]) -> int | None:
    """How many tokens to keep when a stop sequence ends among the last `new` of `tokens` (the
    first such end), None when none does."""
    for end in range(len(tokens) - new + 1, len(tokens) + 1):
        if any(0 < len(s) <= end and tokens[end - len(s) : end] == s for s in sequences):
            return end
    return None


def stop_prefix(text: str, stop_words: list[str]) -> int:
    """Length of the longest tail of `text` that begins a stop word: held back while streaming."""
    best = 0
    for w in stop_words:
        for n in range(min(len(w) - 1, len(text)), best, -1):
            if text.endswith(w[:n]):
                best = n
                break
    return best
