"""What a serving model's runners can decode, asked before a request is admitted.

The engine backend's verify pass returns, per sequence, the fused context rows and either the
argmax of the block's logits (`dflash_argmax`) or the logits themselves (`dflash_logits`). The
shipped plans register only the argmax with the Executor: the logits output would be
pre-allocated at max_num_tokens x block x vocab fp32 (recipe/plan/engine_memory.py). Without the
logits a runner cannot sample, mask bad words or score log-probabilities, so such requests are
refused at admission (serve/requests.check_decodable) instead of failing inside a round that
other requests share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    full_logits: bool = True  # the verify pass gives every vocabulary score (sampling, bad words, log-probs)
    why_not: str = ""  # when full_logits is False: why, in one clause a refusal can quote


FULL = Capabilities()
ARGMAX_ONLY = Capabilities(
    False, "this engine-backend deployment verifies greedily: its Executor registers the verify argmax, not the "
           "full logits (dflash_logits, recipe/plan/engine_memory.py)")


def of_outputs(registered) -> Capabilities:
    """Capabilities of engine runners whose Executor registered these additional outputs."""
    return FULL if "dflash_logits" in registered else ARGMAX_ONLY
