"""A models root of tiny stand-ins for the Hugging Face ids the shipped GPU recipes name, laid out
as `huggingface-cli download ORG/NAME --local-dir ROOT/ORG/NAME` writes them, so the guides'
commands (docs/guides/) run on CPU with `--models ROOT` or $TRTLLM_DFLASH_MODELS=ROOT.

The stand-ins keep each id's architecture and are shaped to split 16 ways (heads, KV heads,
experts, vocabulary), with the drafter block sizes and context lengths the recipes ask; the
recipes' catalog facts (`target.arch`, `drafter.arch`) describe the real models, so a command
run on them adds STANDIN_SETS."""

from __future__ import annotations

from pathlib import Path

from checkpoints import make_drafter, make_target

WIDE = dict(num_attention_heads=16, num_key_value_heads=8, head_dim=8, max_position_embeddings=8192)

# HF id -> (kind, architecture or drafter block size)
STANDINS = {
    "Qwen/Qwen3-8B": ("target", "qwen3"),
    "meta-llama/Llama-3.1-8B-Instruct": ("target", "llama"),
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": ("target", "qwen3_moe"),
    "openai/gpt-oss-120b": ("target", "gpt_oss"),
    "z-lab/Qwen3-8B-DFlash-b16": ("drafter", 16),
    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat": ("drafter", 16),
    "z-lab/Qwen3-Coder-30B-A3B-DFlash": ("drafter", 16),
    "z-lab/gpt-oss-120b-DFlash": ("drafter", 10),
}

# Appended to every stage command run on the stand-ins: their facts come from their config.json,
# and calibration is cut to what a CPU does in seconds.
STANDIN_SETS = ["target.arch=null", "drafter.arch=null", "quantization.calib_samples=4", "quantization.calib_len=16"]


def make_models_root(root: Path, ids=None) -> Path:
    """Write the stand-ins for `ids` (default: every id of STANDINS) under `root`."""
    for repo in ids or STANDINS:
        kind, what = STANDINS[repo]
        if kind == "target":
            extra = dict(num_local_experts=16) if what == "gpt_oss" else dict(num_experts=16) if what == "qwen3_moe" else {}
            make_target(root / repo, what, **WIDE, **extra)
        else:
            make_drafter(root / repo, block_size=what, **WIDE)
    return root
