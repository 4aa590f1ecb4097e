"""The engine backend's I/O contract, shared by the build plan (plan.py), the model classes
trtllm-build loads (trtllm_models.py, GPU-only) and the runners (runtime/drafter_runner.py,
runtime/trt_runners.py): tensor names, dimension ranges, and the pure functions behind the
in-graph pieces, written here in torch so they are tested on CPU.

Target engine (design C, docs/design/engine-path.md): besides the stock `logits`, per step
  dflash_ctx     [num_tokens, H]       one fused context row per packed token (gather_context)
  dflash_tail    [num_seq, tail, H]    the rows of each sequence's last `tail` tokens
  dflash_logits  [num_seq, tail, V]    their logits (float32, like `logits`)
  dflash_argmax  [num_seq, tail]       their greedy tokens
`tail_rows` is the row rule: with packed input `last_token_ids` holds each sequence's
inclusive end offset (the cumulative sum gather_last_token_logits reads), and the tail of
sequence s is rows end_s - tail .. end_s - 1, clamped at the sequence's first row.

Drafter engine: inputs `DRAFTER_INPUTS` + one arena per layer (`k_cache_{l}`, `v_cache_{l}`);
outputs `draft_ids`, `draft_logits` and the arena after this step's append
(`present_k_cache_{l}`, `present_v_cache_{l}`), which the runner binds to the very buffers of
the matching inputs (TensorRT-LLM's own convention for a contiguous KV cache,
tensorrt_llm/runtime/generation.py: one buffer for past_key_value_{i} and present_key_value_{i}).

Nothing here imports tensorrt or tensorrt_llm.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trtllm_dflash.errors import UserError

# --------------------------------------------------------------------------- target engine

TARGET_OUTPUTS = ("dflash_ctx", "dflash_tail", "dflash_logits", "dflash_argmax")
# AdditionalModelOutput.gather_context of each, in the ExecutorConfig (the executor binds the
# engine tensor every step; per-token outputs with gather_context, per-sequence ones without).
GATHER_CONTEXT = {"dflash_ctx": True, "dflash_tail": False, "dflash_logits": False, "dflash_argmax": False}
TAP_WEIGHTS = ("dflash.fc.weight", "dflash.hidden_norm.weight")  # the drafter's, copied into the target engine


def tail_rows(last_token_ids: torch.Tensor, tail: int) -> torch.Tensor:
    """[num_seq, tail] packed-row indices of each sequence's last `tail` tokens, clamped at the
    sequence's first row (the target engine computes exactly this in-graph)."""
    ends = last_token_ids.long()
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])  # the previous sequence's end
    rows = ends[:, None] - tail + torch.arange(tail, device=ends.device)[None, :]
    return torch.maximum(rows, starts[:, None])


def executor_outputs(additional_outputs, requested: dict[str, bool]) -> dict[str, torch.Tensor]:
    """{name: tensor} from a 1.2.1 Result.additional_outputs for the outputs a request asked for
    ({name: gather_context}), copied (the executor's tensors are views of its pinned buffers).

    1.2.1 (cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::createResult) names them
    "context_<name>" ([promptLen, ...], gather_context outputs only) and "generation_<name>"
    ([beamWidth, maxNewTokens, ...], every requested output; llmRequest.h
    allocAdditionalOutputs). A context output is returned as is; a per-sequence output as its
    beam 0, step 0 slot (max_tokens is 1), i.e. the engine's row for that sequence."""
    by_name = {o.name: o.output for o in additional_outputs}
    out = {}
    for name, gather in requested.items():
        key = ("context_" if gather else "generation_") + name
        if key not in by_name:
            raise RuntimeError(f"the executor returned no {key!r} (got {sorted(by_name)}): is {name!r} in the "
                               "ExecutorConfig's additional_model_outputs and an output of the engine?")
        t = torch.as_tensor(by_name[key])
        out[name] = (t if gather else t[0, 0]).clone()
    return out


def read_drafter_config(target_checkpoint_dir: str | Path) -> dict:
    """The drafter checkpoint's config.json beside a target checkpoint (convert / quantize
    write `target/` and `drafter/` side by side): the target engine reads its tap from it."""
    path = Path(target_checkpoint_dir).parent / "drafter" / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: missing; the DFlash target engine is built from a trtllm-dflash convert / quantize "
                        "output, whose drafter/ (target_layer_ids, block size, fc and hidden_norm) sits beside target/")
    cfg = json.loads(path.read_text())
    if "dflash" not in cfg:
        raise UserError(f"{path}: no `dflash` section; not a drafter checkpoint written by trtllm-dflash convert")
    return cfg


def tap_weights(target_checkpoint_dir: str | Path, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The drafter's fc and hidden_norm for target rank `rank` (fc is column-split like the
    target's ColumnLinear), in the target's dtype. The drafter checkpoint is split like the
    target, or kept whole where rank 0 holds the drafter (recipe/plan/drafter.py drafter_placement):
    then every target rank reads rank0.safetensors and takes its columns by DRAFTER_MAP's own
    rule (formats/weight_maps.py rank_part). A quantized fc is dequantized first: the tap runs
    in the model dtype (trtllm_models.py excludes it from the target's quantization)."""
    from trtllm_dflash.formats.weight_maps import DRAFTER_MAP, rank_part

    target_checkpoint_dir = Path(target_checkpoint_dir)
    tp = _mapping_tp(target_checkpoint_dir / "config.json")
    dtp = int(read_drafter_config(target_checkpoint_dir).get("mapping", {}).get("tp_size", 1))
    if dtp not in (1, tp):
        raise UserError(f"{target_checkpoint_dir.parent / 'drafter' / 'config.json'}: mapping.tp_size {dtp}: a drafter "
                        f"is split like its target (tp {tp}) or kept whole (1); convert again")
    fc, norm = _read_tap(target_checkpoint_dir.parent / "drafter" / f"rank{rank if dtp == tp else 0}.safetensors")
    if dtp != tp:
        entries = {e.dst: e for e in DRAFTER_MAP.top}
        fc, norm = (rank_part(entries[n], x, rank, tp) for n, x in zip(TAP_WEIGHTS, (fc, norm)))
    return {TAP_WEIGHTS[0]: fc.to(dtype), TAP_WEIGHTS[1]: norm.to(dtype)}


def _mapping_tp(config_path: Path) -> int:
    """mapping.tp_size of a TensorRT-LLM checkpoint config.json (1 when it has no mapping)."""
    if not config_path.is_file():
        raise UserError(f"{config_path}: missing; not a checkpoint written by trtllm-dflash convert")
    return int(json.loads(config_path.read_text()).get("mapping", {}).get("tp_size", 1))


def _read_tap(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(fc, hidden_norm) of one drafter rank file, fc dequantized to float32 if quantized."""
    from safetensors import safe_open

    from trtllm_dflash.formats.quant import dequantize_fp8, dequantize_nvfp4

    if not path.is_file():
        raise UserError(f"{path}: missing; the target engine's tap reads the drafter's fc and hidden_norm from it")
    with safe_open(str(path), "pt") as f:
        names = set(f.keys())
        missing = [n for n in TAP_WEIGHTS if n not in names]
        if missing:
            raise UserError(f"{path}: no {missing[0]}; not a drafter checkpoint written by trtllm-dflash convert")
        fc, norm = (f.get_tensor(n) for n in TAP_WEIGHTS)
        scale = lambda suffix: f.get_tensor("dflash.fc." + suffix)  # noqa: E731
        if fc.dtype == torch.float8_e4m3fn:
            fc = dequantize_fp8(fc, scale("weights_scaling_factor").reshape(()), torch.float32)
        elif fc.dtype == torch.uint8:
            fc = dequantize_nvfp4(fc, scale("weights_scaling_factor"), scale("weights_scaling_factor_2"), torch.float32)
    return fc, norm


# --------------------------------------------------------------------------- drafter engine

DRAFTER_INPUTS = ("block_ids", "block_positions", "ctx_rows", "ctx_positions", "new_ctx_lens", "cache_lens")
DRAFTER_OUTPUTS = ("draft_ids", "draft_logits")


def arena_names(num_layers: int) -> list[tuple[str, str]]:
    """(input, output) name pairs of the arena: the output is bound to the input's buffer."""
    return [(f"{kv}_cache_{layer}", f"present_{kv}_cache_{layer}") for layer in range(num_layers) for kv in ("k", "v")]


def drafter_dim_ranges(max_batch_size: int, max_input_len: int, max_seq_len: int, block: int) -> dict[str, tuple]:
    """(min, opt, max) of the drafter engine's dynamic dims (one optimization profile):
    batch = running sequences, block = anchor + drafts (>= 2: at least one draft), new_ctx = new
    context rows per sequence this step (>= 1; a prefill brings a whole prompt), max_seq_len =
    the arena's rows per sequence (the runner's own S_max)."""
    return {
        "batch": (1, max(1, (max_batch_size + 1) // 2), max_batch_size),
        "block": (2, block, block),
        "new_ctx": (1, min(block, max_input_len), max_input_len),
        "max_seq_len": (1, max_seq_len, max_seq_len),
    }
