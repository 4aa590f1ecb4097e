"""The quantize stage's acceptance guardrail: quantization must not quietly cost acceptance.

Quantized weights can lower acceptance without any error (the shipped pair's tau once fell below
our own gate when only the prompt and calibration text changed). So the stage decodes a few
prompts greedily with the unquantized checkpoint (its `--from` convert output) and with the
quantized one it just wrote, before that one becomes the stage's output, and compares the taus:

    drop = (tau_before - tau_after) / tau_before   must be <= quantization.max_acceptance_drop

Prompts: the first GUARD_PROMPTS calibration sequences cut to GUARD_PROMPT_LEN tokens, or the
user's own (`quantize --prompts FILE`, prompts/user.py); GUARD_NEW_TOKENS greedy tokens each, no
stop token, one batch per checkpoint. The two checkpoints' greedy texts part ways, so each tau is
measured on its own text; 16 prompts of 64 tokens are the fewest that keep the drop's noise well
under the 10% default limit (docs/design/measurements.md), at two decodes of about 2 s each on
the tiny CPU pair.

How a checkpoint is decoded, and whether this machine can decode it at all, is the caller's
(`measure`): the pipeline and the `quantize` command hand it runtime/acceptance.checkpoint_tau,
the decoder the servers run, where it can run (tests hand in their own). Without one the stage
records that the guard did not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trtllm_dflash.errors import UserError

GUARD_PROMPTS = 16
GUARD_PROMPT_LEN = 32
GUARD_NEW_TOKENS = 64

# (checkpoint directory, prompts as token ids, new tokens, block size) -> greedy tau
Measure = Callable[[Path, list[list[int]], int, int], float]


@dataclass
class GuardResult:
    tau_before: float
    tau_after: float
    max_drop: float
    prompts: int
    new_tokens: int
    source: str

    @property
    def drop(self) -> float:
        return (self.tau_before - self.tau_after) / self.tau_before

    @property
    def passed(self) -> bool:
        return self.drop <= self.max_drop + 1e-12

    def to_json(self) -> dict:
        return {"tau_before": self.tau_before, "tau_after": self.tau_after, "drop": self.drop,
                "max_drop": self.max_drop, "passed": self.passed, "prompts": self.prompts,
                "new_tokens": self.new_tokens, "source": self.source}

    def message(self) -> str:
        return (f"quantization.max_acceptance_drop: tau fell from {self.tau_before:.3f} (unquantized) to "
                f"{self.tau_after:.3f} (quantized), a {self.drop:.1%} drop > {self.max_drop:.0%}, on {self.prompts} "
                f"{self.source} x {self.new_tokens} greedy tokens; nothing written (check the calibration, or raise "
                "quantization.max_acceptance_drop to accept it)")


def calibration_prompts(batches, n: int = GUARD_PROMPTS, length: int = GUARD_PROMPT_LEN) -> list[list[int]]:
    """The first `n` calibration sequences ([1, L] token tensors), cut to `length` tokens."""
    return [b[0, :length].tolist() for b in batches[:n]]


def user_prompts(path: Path, target_dir: Path, n: int = GUARD_PROMPTS) -> list[list[int]]:
    """The first `n` prompts of the user's file (prompts/user.py), encoded by the target's tokenizer."""
    from trtllm_dflash.prompts.user import load_user_prompts, prompt_token_ids

    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"--prompts {path}: the target {target_dir} has no tokenizer to encode it")
    from transformers import AutoTokenizer

    return prompt_token_ids(load_user_prompts(path)[:n], AutoTokenizer.from_pretrained(target_dir))


def check(measure: Measure, before: Path, after: Path, prompts: list[list[int]], block_size: int, max_drop: float,
          source: str, new_tokens: int = GUARD_NEW_TOKENS) -> GuardResult:
    """Measure both checkpoints on the same prompts; the caller raises on `not passed`."""
    return GuardResult(measure(before, prompts, new_tokens, block_size),
                       measure(after, prompts, new_tokens, block_size),
                       max_drop, len(prompts), new_tokens, source)
