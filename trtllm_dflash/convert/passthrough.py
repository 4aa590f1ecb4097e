"""The hf layout: HF checkpoints passed through to TensorRT-LLM >= 1.3's pytorch backend.

That backend loads HF checkpoints itself (its model classes map the names and split for tp at
load time), so convert maps no weights for it and needs no weight map: every weight file of the
target and of the drafter is linked (copied across file systems) unchanged, with the target's
tokenizer and generation files. Each `config.json` is written with the recipe's dtype
(Quantization.checkpoint_dtype), the dtype the loader casts the weights to.

Checked before anything is written: the target's model_type is one the support table lists for a
backend of this layout, the config fields the drafter pairing reads, every weight file's
header, and the embedding (and untied LM head) shape [vocab_size, hidden_size]. The checkpoint's
own quantization (gpt-oss ships MXFP4 experts: `quantization_config.quant_method`) is kept and
recorded; the per-tensor names and shapes are the loader's to check (TensorRT-LLM, or ModelOpt's
calibration in `quantize`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_dflash.convert.safetensors_stream import Checkpoint
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.support import ARCHITECTURES, BACKENDS, NATIVE_ONLY

# The target architectures a backend loading HF checkpoints serves (the support table's).
HF_ARCHS: tuple[str, ...] = tuple(
    m for m, a in ARCHITECTURES.items() if any(BACKENDS[b].layout == "hf" for b in a.backends))
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class HfTarget:
    """The target config.json fields convert reads for a checkpoint it passes through."""

    arch: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool
    quant_method: str | None  # the checkpoint's own quantization (quantization_config.quant_method)

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str) -> HfTarget:
        def positive(key: str) -> int:
            v = raw.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"{where}: '{key}' is {v!r}, expected an integer >= 1")
            return v

        q = raw.get("quantization_config")
        if q is not None and not isinstance(q, dict):
            raise UserError(f"{where}: 'quantization_config' is {q!r}, expected an object")
        return HfTarget(raw.get("model_type"), positive("hidden_size"), positive("num_hidden_layers"),
                        positive("vocab_size"), bool(raw.get("tie_word_embeddings", False)),
                        (q or {}).get("quant_method"))


def check_target(ckpt: Checkpoint, cfg: HfTarget) -> None:
    """The embedding and the untied LM head are [vocab_size, hidden_size]: a target whose
    weights are not its config's is refused here, before the loader on the GPU box does."""
    names = ["model.embed_tokens.weight"] + ([] if cfg.tie_word_embeddings else ["lm_head.weight"])
    want = (cfg.vocab_size, cfg.hidden_size)
    for name in names:
        info = ckpt.tensors.get(name)
        if info is None:
            raise UserError(f"target {ckpt.directory}: missing tensor {name} (expected shape {list(want)})")
        if info.shape != want:
            raise UserError(f"target {info.file.name}: tensor {name} has shape {list(info.shape)}, expected "
                            f"{list(want)} (vocab_size, hidden_size of its config.json)")


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def check_native(target_weights: str, quantizes: bool, cfg: HfTarget, directory: Path) -> None:
    """The recipe's target format against what the checkpoint ships: a native format
    (quantization.target_weights mxfp4) is served as shipped, so the checkpoint must be in it;
    a shipped quantization served without `quantize` is served as it is, so the recipe must say so."""
    shipped = cfg.quant_method
    if target_weights in NATIVE_ONLY and shipped != target_weights:
        raise UserError(f"quantization.target_weights: {target_weights} serves the checkpoint's own {target_weights} "
                        f"weights; target {directory}/config.json has quantization_config.quant_method {shipped!r}: "
                        "set the target's float format (bf16), or nvfp4 / fp8 to quantize it")
    if shipped is not None and not quantizes and shipped != target_weights:
        raise UserError(f"target {directory}/config.json: the checkpoint ships {shipped} weights "
                        f"(quantization_config), so quantization.target_weights {target_weights} would be served as "
                        f"{shipped}: set target_weights: {shipped} to serve them as shipped, or nvfp4 / fp8 to "
                        "quantize them")


def _config(raw: dict, dtype_name: str) -> str:
    cfg = dict(raw)
    cfg["torch_dtype" if "torch_dtype" in cfg else "dtype"] = dtype_name
    return json.dumps(cfg, indent=2) + "\n"


def write(tmp: Path, role: str, ckpt: Checkpoint, raw: dict, dtype_name: str, aux: list[Path]) -> None:
    """Model directory `tmp/role`: its weight files (and index) linked, its config.json with
    `dtype_name`, and `aux` (tokenizer / generation files) linked."""
    files = list(ckpt.files) + ([ckpt.directory / INDEX] if (ckpt.directory / INDEX).is_file() else [])
    for p in files + aux:
        link_or_copy(p, tmp / role / p.relative_to(ckpt.directory))
    (tmp / role / "config.json").write_text(_config(raw, dtype_name))
