"""The recipe of the first-GPU checklist (tests/gpu/test_gpu_checklist.py): the shipped tiny
engine recipe built in bf16. The shipped recipe is fp32 for exact CPU emulation, but an fp32
target engine has no fused context attention (attentionOp.cpp falls back to unfused MHA), hence
no paged context FMHA and no KV block reuse (recipe/engine_layout.py), which checklist item 1
measures. tests/build checks on CPU that this recipe's plan keeps reuse on."""

from pathlib import Path

from trtllm_dflash.recipe import Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/cpu/tiny-pystd-engine.yaml"
BF16 = ["quantization.target_weights=bf16", "quantization.activations=bf16", "quantization.kv_cache=bf16",
        "quantization.drafter=bf16"]


def checklist_recipe() -> Recipe:
    return load_recipe(TINY, BF16)
