"""A convert / quantize output in the TensorRT-LLM layout (`target/` and `drafter/`,
`rank{r}.safetensors` each), read into reference modules one rank at a time.

Per rank (the checkpoint's splits, formats/weight_maps.py):
  attention   q/k/v column-parallel by heads (KV heads replicated when tp > num_kv_heads),
              o_proj row-parallel: the attention output is all-reduced
  MLP         gate/up column-parallel, down row-parallel: the MLP output is all-reduced;
              MoE: every expert's FFN width split, router replicated, the block output all-reduced
  embedding   vocab-parallel: each rank looks up its rows (others zero), then all-reduce
  LM head     vocab-parallel: local logits, all-gathered on the vocabulary axis
  drafter     the same, and fc column-parallel with its output all-gathered before hidden_norm;
              a drafter checkpoint kept whole (engine backend, placement rank0: recipe/plan/drafter.py
              drafter_placement) is loaded whole on every rank here (the reference runners), and
              on rank 0 only by the emulated engine runners, which broadcast its drafts
  norms       replicated; row-parallel biases live on rank 0 only (summed once)
Quantized tensors (FP8 / NVFP4 weights with their scales) are dequantized on load into the
compute dtype: the reference emulates quantized weights; activations and the KV cache stay in
high precision.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.runtime.tp_layers import Comm, GatherLinear, VocabParallelEmbedding


@dataclass(frozen=True)
class CheckpointInfo:
    directory: Path
    tp: int
    target_cfg: object  # reference TargetConfig (global sizes)
    drafter_cfg: object  # reference DraftConfig
    dtype: torch.dtype  # the checkpoint's high-precision dtype
    quantization: dict  # role -> config.json quantization section
    tokenizer_dir: Path | None
    manifest: object  # artifacts.Manifest of the stage output
    drafter_tp: int = 0  # ranks the drafter checkpoint is split over: tp, or 1 (kept whole); 0 = tp

    @property
    def drafter_whole(self) -> bool:
        """The drafter checkpoint is one rank file under a tensor-parallel target."""
        return self.tp > 1 and self.drafter_tp == 1


def reference_configs(tc: dict, dc: dict, target_dir: Path, drafter_dir: Path):
    """The reference TargetConfig / DraftConfig of a TensorRT-LLM target and drafter config.json
    (checkpoint or engine: tc / dc hold `hf_config`), the target's eos ids merged with its
    generation_config's."""
    from trtllm_dflash.reference.config import DraftConfig, TargetConfig

    tcfg = TargetConfig.from_dict(tc["hf_config"], f"{target_dir}/config.json hf_config")
    eos = (tc.get("generation_config") or {}).get("eos_token_id")
    eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
    tcfg = dataclasses.replace(tcfg, eos_token_ids=tuple(dict.fromkeys([*tcfg.eos_token_ids, *eos])))
    return tcfg, DraftConfig.from_dict(dc["hf_config"], f"{drafter_dir}/config.json hf_config")


def read_checkpoint(directory: str | Path) -> CheckpointInfo:
    """Check a convert / quantize output in the TensorRT-LLM layout and read its configs."""
    from trtllm_dflash.artifacts import Manifest

    directory = Path(directory)
    m = Manifest.read(directory)
    if m.stage not in ("convert", "quantize"):
        raise UserError(f"{directory}: a {m.stage} output; --checkpoint takes a convert or quantize output")
    if m.extra.get("layout") != "trtllm":
        raise UserError(
            f"{directory}: layout {m.extra.get('layout')!r}; the reference runs the TensorRT-LLM layout "
            "(convert / quantize a recipe with the reference or engine backend, or convert --layout trtllm)"
        )
    cfgs = {}
    for role in ("target", "drafter"):
        path = directory / role / "config.json"
        if not path.is_file():
            raise UserError(f"{directory}: missing {role}/config.json")
        cfgs[role] = json.loads(path.read_text())
    tc = cfgs["target"]
    tcfg, dcfg = reference_configs(tc, cfgs["drafter"], directory / "target", directory / "drafter")
    tp = tc["mapping"]["tp_size"]
    dtp = (cfgs["drafter"].get("mapping") or {}).get("tp_size", tp)
    if dtp not in (1, tp):
        raise UserError(f"{directory / 'drafter' / 'config.json'}: mapping.tp_size {dtp}: a drafter is split like "
                        f"the target (tp {tp}) or kept whole (1); convert again")
    tok = directory / "tokenizer"
    has_tok = any((tok / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    return CheckpointInfo(
        directory, tp, tcfg, dcfg, getattr(torch, tc["dtype"]),
        {r: c.get("quantization") or {} for r, c in cfgs.items()}, tok if has_tok else None, m, dtp,
    )


def _dequantized(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """FP8 / NVFP4 weights with their scales -> plain weights; scale tensors are consumed."""
    from trtllm_dflash.formats.quant import dequantize_fp8, dequantize_nvfp4

    out = {}
    for name, t in tensors.items():
        if name.endswith(("_scaling_factor", "_scaling_factor_2")):
            continue
        prefix = name.removesuffix(".weight")
        if t.dtype == torch.float8_e4m3fn:
            t = dequantize_fp8(t, tensors[f"{prefix}.weights_scaling_factor"].reshape(()), dtype)
        elif t.dtype == torch.uint8:
            t = dequantize_nvfp4(t, tensors[f"{prefix}.weights_scaling_factor"],
                                 tensors[f"{prefix}.weights_scaling_factor_2"], dtype)
        out[name] = t
    return out


def _read_rank(directory: Path, role: str, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = directory / role / f"rank{rank}.safetensors"
    if not path.is_file():
        raise UserError(f"{directory}: missing {role}/rank{rank}.safetensors")
    return _dequantized(load_file(path), dtype)


def read_rank(info: CheckpointInfo, role: str, rank: int, dtype: torch.dtype,
              device: str = "cpu") -> dict[str, torch.Tensor]:
    """One rank's tensors of `role` under their checkpoint names, quantized weights dequantized."""
    return {k: v.to(device) for k, v in _read_rank(info.directory, role, rank, dtype).items()}


def _state(arch_map, layers: list[tuple], tensors: dict[str, torch.Tensor], local_heads, experts: int,
           strip_model: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A rank's TensorRT-LLM tensors -> reference parameter names (entries from `origin` target skipped)."""
    from trtllm_dflash.formats.weight_maps import split_back

    state = {}
    for entry, layer in layers:
        if entry.origin == "target":
            continue
        name = entry.dst.replace("{}", str(layer)) if layer is not None else entry.dst
        if name not in tensors:
            raise UserError(f"checkpoint rank file: missing tensor {name}")
        for src, x in split_back(entry, layer, tensors[name], local_heads, experts).items():
            key = src.removeprefix("model.") if strip_model else src
            state[key] = x.to(dtype)
    return state


def load_rank(info: CheckpointInfo, comm: Comm, dtype: torch.dtype | None = None, device: str = "cpu"):
    """The reference target and drafter of one rank, holding only that rank's shard (the whole
    drafter where its checkpoint keeps it whole: then no drafter collectives)."""
    drafter_comm = Comm() if info.drafter_whole else comm
    return load_target(info, comm, dtype, device), _load_drafter(info, drafter_comm, dtype, device)


def load_target(info: CheckpointInfo, comm: Comm, dtype: torch.dtype | None = None, device: str = "cpu"):
    """The reference target of one rank: its shard of the target checkpoint."""
    from trtllm_dflash.formats.weight_maps import WEIGHT_MAPS, Heads, model_entries
    from trtllm_dflash.reference.target import Target

    dtype = dtype or info.dtype
    tp, rank, t = comm.world, comm.rank, info.target_cfg
    heads = Heads(t.num_heads, t.num_kv_heads, t.head_dim).local(tp)
    moe = t.moe and dataclasses.replace(t.moe, intermediate_size=t.moe.intermediate_size // tp)
    local = dataclasses.replace(t, num_heads=heads.num_heads, num_kv_heads=heads.num_kv_heads,
                                intermediate_size=t.intermediate_size // tp, moe=moe)
    with torch.device("meta"):
        target = Target(local)
        vocab = t.vocab_size // tp
        target.embed_tokens = VocabParallelEmbedding(vocab, t.hidden_size, rank * vocab, comm)
        target.lm_head = GatherLinear(t.hidden_size, vocab, comm)
    tensors = _read_rank(info.directory, "target", rank, dtype)
    state = _state(WEIGHT_MAPS[t.arch], model_entries(WEIGHT_MAPS[t.arch], t), tensors, heads,
                   t.moe.num_experts if t.moe else 0, True, dtype)
    return _finish(target, state, t, comm, device)


def _load_drafter(info: CheckpointInfo, comm: Comm, dtype: torch.dtype | None, device: str):
    """The reference drafter of one rank of `comm` (world 1: the whole drafter, rank file 0)."""
    from trtllm_dflash.formats.weight_maps import DRAFTER_MAP, Heads, model_entries
    from trtllm_dflash.reference.draft import DFlashDraft

    dtype = dtype or info.dtype
    tp, d = comm.world, info.drafter_cfg
    heads = Heads(d.num_heads, d.num_kv_heads, d.head_dim).local(tp)
    local = dataclasses.replace(d, num_heads=heads.num_heads, num_kv_heads=heads.num_kv_heads,
                                intermediate_size=d.intermediate_size // tp)
    with torch.device("meta"):
        drafter = DFlashDraft(local)
        drafter.fc = GatherLinear(len(d.target_layer_ids) * d.hidden_size, d.hidden_size // tp, comm)
    tensors = _read_rank(info.directory, "drafter", comm.rank, dtype)
    state = _state(DRAFTER_MAP, model_entries(DRAFTER_MAP, d, drafter=True), tensors, heads, 0, False, dtype)
    return _finish(drafter, state, d, comm, device)


def _finish(model, state: dict, cfg, comm: Comm, device: str):
    """Load a rank's state into a meta-built model, its RoPE, and (tp > 1) the all-reduce after
    every attention and MLP block; row-parallel biases are added once, after the all-reduce."""
    from trtllm_dflash.reference.target import Rope

    if comm.rank != 0:
        for k in [k for k in state if k.endswith(("o_proj.bias", "down_proj.bias"))]:
            state[k] = torch.zeros_like(state[k])
    model.load_state_dict(state, strict=True, assign=True)
    model.rope = Rope(cfg.rope, cfg.head_dim)
    model.to(device).eval()
    if comm.world > 1:
        for layer in model.layers:
            for module in (layer.self_attn, layer.mlp):
                module.register_forward_hook(lambda _m, _i, out: comm.all_reduce(out))
    return model


def checkpoint_paths(args) -> tuple[Path, Path, int | None, int | None]:
    """For `generate --checkpoint DIR`: (tokenizer directory, checkpoint, block size, DDTree budget)."""
    if args.target is not None or args.drafter is not None or args.recipe is not None:
        raise UserError("--checkpoint replaces --target/--drafter/--recipe; give one or the other")
    info = read_checkpoint(args.checkpoint)
    return info.tokenizer_dir or info.directory / "tokenizer", info.directory, args.block_size, args.ddtree_budget
