"""The reference DFlash backend: the oracle every fast path is checked against.

Plain PyTorch, CPU or any torch device; imports neither TensorRT nor Triton.
Usage: see README.md in this folder.

Glossary (one meaning per word, everywhere in this package):
  target             the model being served (Qwen3 / Llama / Qwen3-MoE HF checkpoint)
  drafter            the DFlash draft model (z-lab checkpoint: Qwen3 layers, no embedding/head)
  DFlash2            z-lab's DFlash2DraftModel: a DFlash drafter with a dynamic causal
                     convolution around every sublayer (along the block, restarted every
                     round) and a candidate selector
  candidates         DFlash2: the top-k tokens of a slot's draft logits
  selector path      DFlash2: one candidate per slot, chosen left to right with a low-rank
                     pairwise score given the previous choice (the anchor for slot 1)
  target_layer_ids   target decoder layers whose outputs feed the drafter; layer i's output
                     is HF `hidden_states[i + 1]` (the un-normed residual stream)
  target_hidden      those outputs concatenated on the feature axis [T, n*H]: the context
  block_size         B: tokens per draft block, [anchor, mask x (B-1)]
  anchor             the newest committed token; block slot 0; not yet run through the target
  mask_token_id      the token filling the draft slots, embedded with the target's embedding
  noise_embedding    target embedding of the block [anchor, mask, ...]
  draft tokens       slot j's proposal for position start + j (same-position prediction)
  accepted           leading drafts the target agreed with
  bonus              the target's own token after the accepted drafts (correction or bonus)
  acceptance length  accepted + 1: tokens committed by one target verify pass
  tau                mean acceptance length over the rounds of a request (counts the bonus)
  round              one drafter pass + one target verify pass
  ddtree budget      draft-tree nodes verified per round, besides the root (the anchor)
"""

from trtllm_dflash.reference.config import DraftConfig, TargetConfig
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.generate import MODES, generate, generate_steps
from trtllm_dflash.reference.loading import load_drafter, load_pair, load_target, save_drafter
from trtllm_dflash.reference.records import Generation, Stats, StepRecord, pooled_tau
from trtllm_dflash.reference.target import Target
from trtllm_dflash.reference.verify import SamplingParams

__all__ = [
    "MODES",
    "DFlashDraft",
    "DraftConfig",
    "Generation",
    "SamplingParams",
    "Stats",
    "StepRecord",
    "Target",
    "TargetConfig",
    "generate",
    "generate_steps",
    "load_drafter",
    "load_pair",
    "load_target",
    "pooled_tau",
    "save_drafter",
]
