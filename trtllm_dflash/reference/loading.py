"""Load a target (HF directory) and a DFlash drafter (z-lab directory); save a drafter.

Everything is validated before any weight is read: config fields, the presence and shape
of every tensor (from the safetensors headers), and the drafter against the target
(hidden size, target_layer_ids within the target's depth, mask token inside the
vocabulary). Problems raise `UserError` naming the file and the field or tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference.config import DraftConfig, TargetConfig, read_json
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.target import Rope, Target

# Why a tensor has the shape it has, by name suffix; shown in shape errors.
_SHAPE_WHY = {
    "embed_tokens.weight": "vocab_size, hidden_size",
    "lm_head.weight": "vocab_size, hidden_size",
    "q_proj.weight": "num_attention_heads*head_dim, hidden_size",
    "k_proj.weight": "num_key_value_heads*head_dim, hidden_size",
    "v_proj.weight": "num_key_value_heads*head_dim, hidden_size",
    "o_proj.weight": "hidden_size, num_attention_heads*head_dim",
    "q_norm.weight": "head_dim",
    "k_norm.weight": "head_dim",
    "layernorm.weight": "hidden_size",
    "norm.weight": "hidden_size",
    "gate_proj.weight": "intermediate_size, hidden_size",
    "up_proj.weight": "intermediate_size, hidden_size",
    "down_proj.weight": "hidden_size, intermediate_size",
    "mlp.gate.weight": "num_experts, hidden_size",
    "fc.weight": "hidden_size, len(target_layer_ids)*hidden_size",
    "base_kernel": "2, conv_kernel_size, hidden_size",
    "kernel_projection.weight": "2*conv_kernel_size*hidden_size/conv_group_size, hidden_size",
    "codebook": "vocab_size, selector_rank",
    "hidden_projection.weight": "selector_rank, hidden_size",
    "g_proj.weight": "num_attention_heads, hidden_size",  # Laguna's head gates
}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _why(name: str) -> str:
    for suffix, why in _SHAPE_WHY.items():
        if name.endswith(suffix):
            return f" ({why})"
    return ""


def _shard_files(directory: Path, who: str) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the sharded index if present."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{who} {index.name}: missing 'weight_map'")
        return {name: directory / shard for name, shard in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"{who} {directory}: no *.safetensors file (only safetensors checkpoints are supported)")
    out = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            out.update((name, path) for name in f.keys())
    return out


def _read_tensors(directory: Path, expected: dict[str, tuple[int, ...]], who: str, dtype, device):
    """Check every expected tensor's presence and shape from the headers, then load them."""
    where = _shard_files(directory, who)
    by_file: dict[Path, list[str]] = {}
    for name, shape in expected.items():
        if name not in where:
            raise UserError(f"{who} {directory.name}: missing tensor {name} (expected shape {list(shape)}{_why(name)})")
        by_file.setdefault(where[name], []).append(name)
    for path, names in by_file.items():
        if not path.is_file():
            raise UserError(f"{who} {path.name}: file not found (listed in model.safetensors.index.json)")
        with safe_open(path, framework="pt") as f:
            for name in names:
                got = tuple(f.get_slice(name).get_shape())
                if got != expected[name]:
                    raise UserError(
                        f"{who} {path.name}: {name} has shape {list(got)}, "
                        f"expected {list(expected[name])}{_why(name)}"
                    )
    tensors = {}
    for path, names in by_file.items():
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in names:
                t = f.get_tensor(name)
                if t.dtype not in _FLOAT_DTYPES:
                    raise UserError(f"{who} {path.name}: {name} has dtype {t.dtype}, expected float32, bfloat16 or "
                                    "float16")
                tensors[name] = t.to(device=device, dtype=dtype)
    return tensors


def _materialize(module, cfg_rope, head_dim, state, device):
    """Load `state` into a meta-device module and rebuild its (non-persistent) RoPE tables."""
    module.load_state_dict(state, strict=True, assign=True)
    module.rope = Rope(cfg_rope, head_dim).to(device)
    return module.eval()


def load_target(directory: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Target:
    """An HF Qwen3 / Llama / Qwen3-MoE checkpoint directory (config.json + *.safetensors)."""
    directory = Path(directory)
    cfg = TargetConfig.from_dict(read_json(directory / "config.json"), f"target {directory.name}/config.json")
    gen = directory / "generation_config.json"
    if gen.is_file():  # HF generate() stops on generation_config's eos ids; so do we
        eos = read_json(gen).get("eos_token_id")
        eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
        cfg = TargetConfig(**{**cfg.__dict__, "eos_token_ids": tuple(dict.fromkeys([*cfg.eos_token_ids, *eos]))})
    with torch.device("meta"):
        model = Target(cfg)
    expected = {
        (k if k.startswith("lm_head.") else f"model.{k}"): tuple(v.shape)
        for k, v in model.state_dict().items()
        if not (cfg.tie_word_embeddings and k == "lm_head.weight")
    }
    tensors = _read_tensors(directory, expected, "target", dtype, device)
    state = {k.removeprefix("model."): v for k, v in tensors.items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model = _materialize(model, cfg.rope, cfg.head_dim, state, device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model


def check_pair(draft_cfg: DraftConfig, target_cfg: TargetConfig, where: str = "drafter config.json") -> None:
    """The drafter must fit the target it will be paired with."""
    n = target_cfg.num_layers
    if draft_cfg.hidden_size != target_cfg.hidden_size:
        raise UserError(
            f"{where}: hidden_size {draft_cfg.hidden_size} does not match the target's hidden_size "
            f"{target_cfg.hidden_size} (the drafter shares the target's embedding and LM head)"
        )
    bad = [i for i in draft_cfg.target_layer_ids if not 0 <= i < n]
    if bad:
        raise UserError(
            f"{where}: dflash_config.target_layer_ids {list(draft_cfg.target_layer_ids)} has {bad[0]}, "
            f"beyond the target's depth ({n} layers, valid ids 0..{n - 1})"
        )
    if draft_cfg.num_target_layers != n:
        raise UserError(
            f"{where}: num_target_layers is {draft_cfg.num_target_layers} but the target has {n} layers "
            "(this drafter was trained for another target)"
        )
    if draft_cfg.dflash2 and draft_cfg.vocab_size != target_cfg.vocab_size:
        raise UserError(
            f"{where}: vocab_size {draft_cfg.vocab_size} differs from the target's {target_cfg.vocab_size} "
            "(DFlash2's selector codebooks have one row per target token)"
        )
    if not draft_cfg.mask_token_id < target_cfg.vocab_size:
        raise UserError(
            f"{where}: dflash_config.mask_token_id {draft_cfg.mask_token_id} is outside the target's vocabulary "
            f"(vocab_size {target_cfg.vocab_size}, valid ids 0..{target_cfg.vocab_size - 1})"
        )


def load_drafter(
    directory: str | Path,
    target: TargetConfig | Target | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> DFlashDraft:
    """A z-lab DFlash or DFlash2 drafter directory (config.json + model.safetensors), checked
    against `target`. Tensor names are the checkpoint's (DFlash2's codebooks are bare tensors,
    `candidate_selector.predecessor_codebook`); every one is read as `dtype`."""
    directory = Path(directory)
    where = f"drafter {directory.name}/config.json"
    cfg = DraftConfig.from_dict(read_json(directory / "config.json"), where)
    if target is not None:
        check_pair(cfg, target.cfg if isinstance(target, Target) else target, where)
    with torch.device("meta"):
        model = DFlashDraft(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = _read_tensors(directory, expected, "drafter", dtype, device)
    return _materialize(model, cfg.rope, cfg.head_dim, state, device)


def load_pair(target_dir, drafter_dir, dtype=torch.float32, device="cpu") -> tuple[Target, DFlashDraft]:
    """Validates both configs (and the pairing) before reading any weights."""
    target_dir, drafter_dir = Path(target_dir), Path(drafter_dir)
    target_cfg = TargetConfig.from_dict(read_json(target_dir / "config.json"), f"target {target_dir.name}/config.json")
    where = f"drafter {drafter_dir.name}/config.json"
    check_pair(DraftConfig.from_dict(read_json(drafter_dir / "config.json"), where), target_cfg, where)
    target = load_target(target_dir, dtype, device)
    return target, load_drafter(drafter_dir, target, dtype, device)


def save_drafter(model: DFlashDraft, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write the z-lab layout: config.json + model.safetensors with top-level tensor names."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: (v if dtype is None else v.to(dtype)).detach().contiguous().cpu() for k,
             v in model.state_dict().items()}
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    return directory
