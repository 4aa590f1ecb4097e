"""Tiny random models for the reference-backend tests.

Targets are real HF models (transformers configs + save_pretrained); drafters are our
DFlashDraft saved in the z-lab layout with save_drafter. Weights use a larger init
(std 0.1 instead of HF's 0.02) so that logits are peaked: greedy argmax then has clear
margins (no near-ties that fp32 rounding could flip) and random models produce varied text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config, Qwen3MoeConfig

from trtllm_dflash.compat import rope_config_kwargs
from trtllm_dflash.reference import DFlashDraft, DraftConfig, load_target, save_drafter

COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def hf_config(arch: str, vocab: int = 256, layers: int = 4, **kw):
    if arch == "qwen3":
        return Qwen3Config(vocab_size=vocab, num_hidden_layers=layers, **{**COMMON, **kw})
    if arch == "llama":
        # Llama 3.1-style RoPE scaling with a short original context, so that it matters
        # at the positions the tests reach.
        scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 32}
        rope = rope_config_kwargs(10000.0, scaling)  # transformers 4.x reads rope_scaling, 5.x rope_parameters
        return LlamaConfig(vocab_size=vocab, num_hidden_layers=layers, **rope, **{**COMMON, **kw})
    if arch == "qwen3_moe":
        moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        return Qwen3MoeConfig(vocab_size=vocab, num_hidden_layers=layers, **{**COMMON, **moe, **kw})
    raise ValueError(arch)


def make_target(directory: Path, arch: str = "qwen3", seed: int = 0, std: float = 0.1, **kw) -> Path:
    sharded = kw.pop("sharded", False)
    torch.manual_seed(seed)
    cfg = hf_config(arch, **kw)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, std)
    model.save_pretrained(directory, **({"max_shard_size": "100KB"} if sharded else {}))
    return directory


def hf_model(directory: Path):
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def make_drafter(directory: Path, target_dir: Path, seed: int = 0, layers: int = 2, block_size: int = 8,
                 target_layer_ids=(0, 2), std: float = 0.1, **kw) -> Path:
    tcfg = load_target(target_dir).cfg
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=tcfg.hidden_size, intermediate_size=96, num_layers=layers, num_heads=4, num_kv_heads=2,
        head_dim=16, rms_norm_eps=1e-6, rope=tcfg.rope.__class__(10000.0), max_position_embeddings=4096,
        block_size=block_size, target_layer_ids=tuple(target_layer_ids), mask_token_id=tcfg.vocab_size - 1,
        num_target_layers=tcfg.num_layers, vocab_size=tcfg.vocab_size, **kw,
    )
    model = DFlashDraft(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, std) if not name.endswith("norm.weight") else p.fill_(1.0)
            if name.endswith("base_kernel"):  # DFlash2 convolutions: near identity (tap 0 ~ 1)
                p[:, 0] += 1
            if "codebook" in name:  # DFlash2 selector: a pairwise term as large as the logits
                p.normal_(0, 1.0)
    return save_drafter(model, directory)


DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=6)


def make_dflash2_drafter(directory: Path, target_dir: Path, **kw) -> Path:
    """make_drafter with DFlash2's convolutions and selector (z-lab's DFlash2DraftModel layout)."""
    return make_drafter(directory, target_dir, **{**DFLASH2, **kw})




@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models make every op overhead-bound; with 2 OpenMP threads on a busy 2-core machine
    each op can wait tens of ms at the barrier. One thread is faster and gives identical
    results; the session setting is restored afterwards. Autouse where a conftest imports it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
