"""Tiny random checkpoints on disk (HF targets, z-lab drafters) and recipes pointing at them.

Norm weights are randomised too (HF initialises them to ones), so a norm mapped to the wrong
place changes the output.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

VOCAB = 256

# For a test module that needs ModelOpt: a mark instead of a module-level importorskip, so that
# collecting the suite does not import ModelOpt (about 7 s per test process).
needs_modelopt = pytest.mark.skipif(importlib.util.find_spec("modelopt") is None,
                                    reason="nvidia-modelopt not installed (pip install 'trtllm_dflash[quant]')")


def _perturb_norms(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))


def make_target(path: Path, arch: str = "qwen3", seed: int = 0, dtype=torch.float32, **overrides) -> Path:
    """A tiny HF model saved with save_pretrained (hidden 64, 2-4 layers, vocab 256)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    common.update(overrides)
    if arch == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    elif arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif arch == "qwen3_moe":
        cfg = dict(common, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
        cfg.update(overrides)
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**cfg))
    elif arch == "gpt_oss":  # MoE experts with biases, sliding-window layers alternating with full ones
        cfg = dict(common, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"] * (common["num_hidden_layers"] // 2))
        cfg.update(overrides)
        cfg.setdefault("rope_parameters", {  # YaRN as published, its factor consistent with the context length
            "rope_type": "yarn", "factor": cfg["max_position_embeddings"] / 128,
            "original_max_position_embeddings": 128,
            "rope_theta": 150000.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**cfg))
    else:
        raise ValueError(arch)
    _perturb_norms(model, seed + 100)
    model.to(dtype).save_pretrained(path)
    return path


def modelopt_trtllm_export_archs() -> tuple[str, ...]:
    """Target architectures the installed ModelOpt's `export_tensorrt_llm_checkpoint` writes.
    Qwen3 joined the gpt / gemma / llama branch of modelopt/torch/export/tensorrt_llm_utils.py
    in 0.44; 0.37 (TensorRT-LLM 1.2.1's pin) raises NotImplementedError for it."""
    from trtllm_dflash.compat import version_of

    v = version_of("nvidia-modelopt")
    return ("qwen3", "llama") if v is not None and v.release >= (0, 44) else ("llama",)


def make_drafter(path: Path, target_layers: int = 4, seed: int = 1, dtype=torch.float32, **overrides) -> Path:
    """A tiny z-lab-layout DFlash drafter (2 layers) for a `make_target` model."""
    from trtllm_dflash.reference import DFlashDraft, DraftConfig, save_drafter

    raw = dict(
        architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=512, block_size=8, num_target_layers=target_layers,
        dflash_config={"target_layer_ids": [0, target_layers - 2], "mask_token_id": VOCAB - 1},
    )
    raw.update(overrides)
    cfg = DraftConfig.from_dict(raw)
    torch.manual_seed(seed)
    model = DFlashDraft(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
            if name.endswith("base_kernel"):  # DFlash2 convolutions: near identity
                p[:, 0] += 1
    save_drafter(model, path, dtype=dtype)
    # z-lab configs are Qwen3 config dumps and carry vocab_size (the recipe's facts read it)
    cfg_path = path / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "vocab_size": VOCAB}, indent=2))
    return path


DFLASH2 = dict(architectures=["DFlash2DraftModel"], vocab_size=VOCAB, dflash_config={
    "target_layer_ids": [0, 2], "mask_token_id": VOCAB - 1, "conv_kernel_size": 2, "conv_group_size": 16,
    "selector_rank": 8, "selector_top_k": 8})


# poolside's Laguna drafters as published (all layers sliding and causal, per-head gating), scaled
# down: make_drafter(path, **LAGUNA) (reference/config.py LAGUNA_ARCH)
LAGUNA = dict(architectures=["DFlashLagunaForCausalLM"], model_type="llama", gating="per-head",
              layer_types=["sliding_attention"] * 2, sliding_window=6,
              dflash_config={"target_layer_ids": [0, 2], "mask_token_id": VOCAB - 1, "causal": True})


def write_recipe(path: Path, target: Path, drafter: Path, tp: int = 1, fmt: str = "fp32", gpu: str = "cpu",
                 backend: str = "reference", drafter_fmt: str | None = None, **sections) -> Path:
    base = fmt if fmt in ("fp32", "bf16", "fp16") else ("fp32" if gpu == "cpu" else "bf16")
    q = {"target_weights": fmt, "activations": base, "kv_cache": base, "drafter": drafter_fmt or base}
    q.update(sections.pop("quantization", {}))
    raw = {
        "name": "tiny-test",
        "hardware": {"gpu": gpu, "count": max(tp, 1) if gpu != "cpu" else 1},
        "target": {"source": str(target)},
        "drafter": {"source": str(drafter)},
        "quantization": q,
        "parallel": {"tp": tp},
        "backend": backend,
        "build": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256},
        "speculative": {"block_size": 8},
        "sweep": {"concurrency": [1, 2], "input_len": 16, "output_len": 16},
    }
    raw.update(sections)
    path.write_text(yaml.safe_dump(raw))
    return path


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def converted(recipe, out: Path) -> Path:
    """The convert output of a loaded recipe (what quantize and deploy take `--from`)."""
    from trtllm_dflash.convert.convert import convert

    return convert(recipe, out, progress=False)


def step_tokens(records, n: int) -> list[list[int]]:
    """Every request's tokens from a decode's StepRecords (requests 0..n-1)."""
    out = [[] for _ in range(n)]
    for rec in records:
        for r, t in zip(rec.seq_ids, rec.tokens):
            out[r] += t
    return out


FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the 3 low bits of an E2M1 code; bit 3 is the sign


def mxfp4_experts(directory: Path) -> Path:
    """Rewrite a `make_target(..., "gpt_oss")` checkpoint as gpt-oss is published: every expert
    weight in MXFP4 (`{proj}_blocks` [E, rows, cols / 32, 16] uint8, two E2M1 codes per byte, the
    low nibble first; `{proj}_scales` [E, rows, cols / 32] uint8, E8M0 exponents biased by 127;
    rows x cols is the weight transposed from its [E, cols, rows] parameter) and config.json's
    `quantization_config` {"quant_method": "mxfp4"} (transformers' integrations/mxfp4.py layout).
    Returns the directory; the weights become their MXFP4 rounding."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(directory / "model.safetensors")
    grid = torch.tensor(FP4_E2M1)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = tensors.pop(name).float().transpose(1, 2)  # [E, rows, cols]
        groups = w.reshape(*w.shape[:2], -1, 32)  # [E, rows, G, 32]
        amax = groups.abs().amax(-1, keepdim=True).clamp_min(2.0**-100)
        exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)  # every |value| / 2**exp <= 6
        code = (groups / 2.0**exp).abs().unsqueeze(-1).sub(grid).abs().argmin(-1)  # nearest magnitude
        code = (code | (groups < 0).long() << 3).to(torch.uint8)
        tensors[name + "_blocks"] = (code[..., 0::2] | code[..., 1::2] << 4).contiguous()  # [E, rows, G, 16]
        tensors[name + "_scales"] = (exp.squeeze(-1) + 127).to(torch.uint8).contiguous()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((directory / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    return directory
