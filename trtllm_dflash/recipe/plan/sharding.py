"""How tensor parallelism splits the target and the drafter on each backend: one rule per split
dimension (which tp it allows), and what one rank then holds. One definition, used by the recipe
rules (`check`), the memory planner (per-rank sizes, the smallest tp that fits) and convert.

Read from NVIDIA/TensorRT-LLM (file, symbol, stored commit). The engine path was frozen before
the 1.2 branch, so its 1.x copies stand for 1.2.x; the PyTorch backend copies are of the 1.x main
line that 1.3 branched from. Re-check on a 1.2.1 wheel when one can be read.

- Attention heads. tensorrt_llm/layers/attention.py `Attention.__init__` (27712aa7, unchanged in
  the later stored copies) and tensorrt_llm/_torch/modules/attention.py `Attention.__init__`:
  `assert num_attention_heads % tp_size == 0`; each rank holds ceil(num_kv_heads / tp_size) KV
  heads.
- KV heads. tensorrt_llm/layers/linear.py `Linear.postprocess` (2a9abd95, "Duplicate kv heads in
  case of invalid TP size"): when num_kv_heads < tp_size it asserts tp_size % num_kv_heads == 0
  and repeats each KV head tp_size / num_kv_heads times; otherwise the fused QKV is split evenly.
  So tp and num_kv_heads must divide one another; past num_kv_heads, KV heads are replicated.
- Vocabulary. TensorRT-LLM pads it: the engine path's LM head is `ColumnLinear(hidden,
  pad_vocab_size(vocab_size, tp_size))` (tensorrt_llm/models/*/model.py) and a vocab-parallel
  `Embedding` holds ceil(vocab / tp) rows (tensorrt_llm/layers/embedding.py, 0f02b7af); the
  PyTorch backend's `LMHead` / `Embedding` (tensorrt_llm/_torch/modules/embedding.py, fbbc05dd)
  hold ceil(vocab / tp) rows with the padding on the last rank. We do not pad: our converter
  (formats/weight_maps.py rule "vocab", the engine and reference backends' checkpoints) splits
  the embedding and LM head rows evenly, so there vocab_size % tp == 0 is required. The pytorch
  backend loads the HF checkpoint and TensorRT-LLM pads, so any tp splits its vocabulary.
- FFN width. `Linear` keeps out_features // tp_size rows per rank (layers/linear.py): nothing
  pads it, so intermediate_size % tp == 0 (every backend).
- MoE. tensorrt_llm/mapping.py `MappingBase.__init__` (b35ac1b6): moe_tp_size * moe_ep_size ==
  tp_size. The pytorch backend deploys moe_expert_parallel_size = tp (deploy/llmapi.py), whole
  experts per rank, and its fused MoE asserts num_experts % ep_size == 0
  (tensorrt_llm/_torch/modules/fused_moe, the `ep_size` partition without a load balancer). Our
  converter writes moe_tp_size = tp, moe_ep_size = 1 (convert/configs.py `_mapping`): every expert
  split, so moe_intermediate_size % tp == 0.
- The drafter's fc (n x hidden -> hidden) is column-split by our converter (hidden_size % tp);
  TensorRT-LLM's DFlash keeps fc and hidden_norm replicated on every rank (modeling_dflash.py;
  docs/design/upstream-facts.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import BACKENDS

# Backends whose checkpoints come from our converter (no vocabulary padding, MoE split per expert).
OUR_CONVERTER = tuple(n for n, b in BACKENDS.items() if b.layout == "trtllm")
LISTED_UP_TO = 8  # the tps an "allowed" list names: one 8-GPU node


@dataclass(frozen=True)
class ModelDims:
    """The sizes tensor parallelism splits in one model (0: the model has no such dimension)."""

    who: str  # "target" or "drafter", as messages name it
    num_attention_heads: int
    num_kv_heads: int
    intermediate_size: int = 0  # dense FFN width
    vocab_size: int = 0  # rows of the model's own embedding / LM head
    fc_out: int = 0  # the drafter fc's output width (column-split by our converter)
    num_experts: int = 0
    moe_intermediate_size: int = 0

    @classmethod
    def of(cls, who: str, facts: ArchFacts) -> "ModelDims":
        return cls(who, facts.num_attention_heads, facts.num_kv_heads, facts.intermediate_size,
                   facts.vocab_size, facts.hidden_size if facts.is_drafter else 0,
                   facts.num_experts, facts.moe_intermediate_size)


def model_dims(recipe: Recipe) -> list[ModelDims]:
    return [ModelDims.of("target", recipe.target_facts), ModelDims.of("drafter", recipe.drafter_facts)]


def kv_heads_per_rank(n_kv: int, tp: int) -> int:
    """ceil(num_kv_heads / tp): replicated past num_kv_heads (Attention.__init__, both backends)."""
    return max(1, math.ceil(n_kv / tp))


def vocab_rows_per_rank(vocab: int, tp: int) -> int:
    """Rows of the embedding / LM head on one rank: ceil(vocab / tp) (TensorRT-LLM pads; our
    converter needs vocab % tp == 0, where this is exact)."""
    return math.ceil(vocab / tp)


def _rules(d: ModelDims, backend: str) -> list[tuple[str, int, str]]:
    """(dimension name, size, why) for every dimension tp must divide on `backend`."""
    ours = backend in OUR_CONVERTER
    rules = [("num_attention_heads", d.num_attention_heads, "")]
    if d.intermediate_size:
        rules.append(("intermediate_size", d.intermediate_size, ""))
    if ours and d.vocab_size:
        rules.append(("vocab_size", d.vocab_size, " (convert splits the embedding and LM head rows evenly and does "
                      "not pad; TensorRT-LLM's own loaders pad it to {padded})"))
    if ours and d.fc_out:
        rules.append(("hidden_size", d.fc_out, " (convert splits the drafter fc's output)"))
    if d.num_experts and ours:
        rules.append(("moe_intermediate_size", d.moe_intermediate_size, " (convert splits every expert: "
                      "moe_tp_size = tp)"))
    elif d.num_experts:
        rules.append(("num_experts", d.num_experts, " (the pytorch backend runs moe_expert_parallel_size = tp: "
                      "whole experts per rank)"))
    return rules


def problem(d: ModelDims, tp: int, backend: str) -> str | None:
    """Why `tp` cannot split this model on `backend` (the first rule it breaks), or None."""
    for name, size, why in _rules(d, backend):
        if size % tp:
            next_multiple = math.ceil(size / tp) * tp  # what TensorRT-LLM pads a vocabulary to
            return f"{tp} does not divide {d.who} {name} {size}" + why.format(padded=next_multiple)
    if d.num_kv_heads % tp and tp % d.num_kv_heads:
        return (f"{tp} and {d.who} num_kv_heads {d.num_kv_heads}: one must divide the other (TensorRT-LLM "
                "replicates KV heads only when tp is a multiple of num_kv_heads)")
    return None


def first_problem(models: list[ModelDims], tp: int, backend: str) -> str | None:
    return next((p for p in (problem(d, tp, backend) for d in models) if p), None)


def allowed_tps(models: list[ModelDims], backend: str, up_to: int) -> list[int]:
    """Every tp in 1..up_to that splits all `models` on `backend`."""
    return [t for t in range(1, up_to + 1) if first_problem(models, t, backend) is None]


def tp_message(models: list[ModelDims], tp: int, backend: str) -> str | None:
    """The one-line `parallel.tp` problem (None when tp splits every model), with the tps that work."""
    why = first_problem(models, tp, backend)
    if why is None:
        return None
    return f"{why}; allowed: {allowed_tps(models, backend, max(LISTED_UP_TO, tp))}"
