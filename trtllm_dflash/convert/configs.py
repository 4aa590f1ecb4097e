"""The trtllm layout's config.json files: the TensorRT-LLM 1.2.x PretrainedConfig fields of the
target (with its HF and generation configs) and of our drafter engine (with the DFlash keys the
drafter network reads), and the mapping and RoPE fields both share.
"""

from __future__ import annotations

import torch

from trtllm_dflash.convert.sources import DTYPE_NAMES
from trtllm_dflash.formats.weight_maps import DRAFTER_MAP, ArchMap
from trtllm_dflash.recipe.support import architecture


def _rope_config(rope) -> dict:
    out: dict = {"position_embedding_type": "rope_gpt_neox", "rotary_base": rope.theta, "rotary_scaling": None}
    if rope.scaling is not None:
        if rope.scaling[0] == "linear":
            out["rotary_scaling"] = {"type": "linear", "factor": rope.scaling[1]}
        else:
            _, factor, low, high, old = rope.scaling
            out["rotary_scaling"] = {
                "type": "llama3", "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": int(old),
            }
    return out


def _mapping(tp: int, moe: bool) -> dict:
    m = {"world_size": tp, "tp_size": tp, "pp_size": 1, "cp_size": 1}
    if moe:
        m.update(moe_tp_size=tp, moe_ep_size=1)
    return m


def target_config(cfg, raw: dict, arch_map: ArchMap, tp: int, dtype: torch.dtype, generation: dict | None) -> dict:
    """TensorRT-LLM 1.2.x PretrainedConfig fields of the target (plus our `hf_config`)."""
    out = {
        "architecture": arch_map.architecture,
        "dtype": DTYPE_NAMES[dtype],
        "logits_dtype": "float32",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_size": cfg.head_dim,
        "hidden_act": "silu",
        "intermediate_size": cfg.intermediate_size,
        "norm_epsilon": cfg.rms_norm_eps,
        **_rope_config(cfg.rope),
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attn_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "mapping": _mapping(tp, cfg.moe is not None),
    }
    qwen_type = architecture(cfg.arch).qwen_type
    if qwen_type is not None:
        out["qwen_type"] = qwen_type
    if cfg.moe is not None:
        out["moe_intermediate_size"] = cfg.moe.intermediate_size
        out["moe"] = {
            "num_experts": cfg.moe.num_experts,
            "top_k": cfg.moe.top_k,
            "normalization_mode": 1 if cfg.moe.norm_topk_prob else 0,  # RENORMALIZE : NONE
        }
        out["mlp_only_layers"] = [i for i, s in enumerate(cfg.moe.sparse_layers) if not s]
    out["hf_config"] = raw
    out["generation_config"] = generation
    return out


def drafter_config(dcfg, raw: dict, tcfg, tp: int, dtype: torch.dtype) -> dict:
    """Our drafter engine's config.json (TensorRT-LLM PretrainedConfig fields + DFlash keys)."""
    return {
        "architecture": DRAFTER_MAP.architecture,
        "dtype": DTYPE_NAMES[dtype],
        "logits_dtype": "float32",
        "vocab_size": tcfg.vocab_size,
        "max_position_embeddings": dcfg.max_position_embeddings,
        "hidden_size": dcfg.hidden_size,
        "num_hidden_layers": dcfg.num_layers,
        "num_attention_heads": dcfg.num_heads,
        "num_key_value_heads": dcfg.num_kv_heads,
        "head_size": dcfg.head_dim,
        "hidden_act": "silu",
        "intermediate_size": dcfg.intermediate_size,
        "norm_epsilon": dcfg.rms_norm_eps,
        **_rope_config(dcfg.rope),
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "attn_bias": dcfg.attention_bias,
        "mapping": _mapping(tp, False),
        "dflash": {
            "block_size": dcfg.block_size,
            "mask_token_id": dcfg.mask_token_id,
            "target_layer_ids": list(dcfg.target_layer_ids),
            "num_target_layers": dcfg.num_target_layers,
            "layer_types": list(dcfg.layer_types),
            "causal": list(dcfg.causal),
            "sliding_window": dcfg.sliding_window,
        },
        "hf_config": raw,
    }
