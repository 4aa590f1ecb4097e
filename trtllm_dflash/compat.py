"""Where the stacks we install into differ: one small branch each, with the versions it answers to.

The package runs inside NVIDIA's TensorRT-LLM containers without moving their pins
(docs/compat.md has the matrix and the CI lanes that prove it):

| stack                    | Python | torch          | transformers | ModelOpt | numpy |
|--------------------------|--------|----------------|--------------|----------|-------|
| TensorRT-LLM 1.2.1 / Triton 26.07 | 3.12 | 2.9 (NGC 2.10.0a0 in Triton) | 4.57.3 | 0.37 | 1.26 |
| TensorRT-LLM >= 1.3      | 3.12   | 2.10 -> 2.13   | 4.57 / 5.x   | 0.37+    | 2.x   |
| CPU quick start / CI     | 3.11   | 2.13.0 (CPU)   | 5.x          | 0.4x     | 1.26  |

Everything version-dependent is decided here and nowhere else; each branch says which
releases take which side, as read from those releases' wheels.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from importlib import metadata
from pathlib import Path

from packaging.version import Version

from trtllm_dflash.errors import UserError


@functools.cache
def version_of(package: str) -> Version | None:
    """The installed release of `package` (local and pre-release parts kept), None if absent."""
    try:
        return Version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- transformers
# transformers 5 reads RoPE from `rope_parameters` (theta inside it); 4.x (4.57.3 in
# TensorRT-LLM 1.2.1 and 1.3) reads `rope_theta` and `rope_scaling` and ignores
# `rope_parameters`, silently running plain RoPE.


def transformers_5() -> bool:
    v = version_of("transformers")
    return v is not None and v.major >= 5


def rope_config_kwargs(theta: float, scaling: dict | None = None) -> dict:
    """Config keyword arguments that give an HF LlamaConfig / Qwen3Config this RoPE on the
    installed transformers. `scaling`: e.g. {"rope_type": "llama3", "factor": ...}."""
    if transformers_5():
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta, **(scaling or {})}}
    return {"rope_theta": theta, "rope_scaling": dict(scaling) if scaling else None}


def never_stopping_eos(vocab_size: int) -> int | None:
    """An HF generation_config.eos_token_id under which generate() runs to max_new_tokens. transformers
    5 takes None; 4.57's PromptLookupCandidateGenerator.get_candidates passes eos_token_id to torch.isin
    unchecked (None raises TypeError), so there it is an id no step can produce: vocab_size."""
    return None if transformers_5() else vocab_size


# ----------------------------------------------------------------------------- ModelOpt
# quant_cfg: a dict {pattern: cfg} up to 0.43 (0.37 is TensorRT-LLM 1.2.1's pin), a list of
# {"quantizer_name", "cfg" | "enable"} entries from 0.44 on. In both, later entries win
# and the dict's "default" key is applied first.
MODELOPT_MIN = Version("0.37")


def require_modelopt() -> None:
    """One line naming what is needed when ModelOpt is missing or too old."""
    v = version_of("nvidia-modelopt")
    if v is None:
        raise UserError("quantize needs nvidia-modelopt >= 0.37; install it with: pip install 'trtllm_dflash[quant]'")
    if v.release < MODELOPT_MIN.release:
        raise UserError(f"quantize needs nvidia-modelopt >= {MODELOPT_MIN} (TensorRT-LLM 1.2.1 ships 0.37), "
                        f"found {v}; install it with: pip install 'nvidia-modelopt>=0.37'")
    try:
        import modelopt.torch.quantization  # noqa: F401
    except ImportError as e:
        raise UserError(f"nvidia-modelopt {v} does not import ({e}); "
                        "install its requirements with: pip install 'trtllm_dflash[quant]'") from None


def quant_cfg_disable(cfg: dict, pattern: str) -> None:
    """Append 'quantizers matching `pattern` are off' to a ModelOpt config (in place)."""
    entries = cfg["quant_cfg"]
    if isinstance(entries, list):  # >= 0.44
        entries.append({"quantizer_name": pattern, "enable": False})
    else:  # <= 0.43: re-insert so that it comes last, as an appended list entry does
        entries.pop(pattern, None)
        entries[pattern] = {"enable": False}


def quant_cfg_extend(cfg: dict, other: dict) -> None:
    """Apply `other`'s quant_cfg after `cfg`'s (in place), e.g. FP8_KV_CFG onto FP8_DEFAULT_CFG.
    A dict-shaped `other` carries "default": {"enable": False}; ModelOpt applies "default" first,
    so merging it (as upstream's own examples do for 0.37) does not switch off what `cfg` enables."""
    entries = cfg["quant_cfg"]
    if isinstance(entries, list):
        entries.extend(other["quant_cfg"])
    else:
        for pattern, value in other["quant_cfg"].items():
            if pattern != "default":
                entries.pop(pattern, None)
                entries[pattern] = value


# NVFP4 export: ModelOpt < 0.45 casts block scales to E4M3 unclamped, so a block whose scale
# is below E4M3's smallest subnormal (2**-9) is written as 0 (it dequantizes to zeros) and
# one above 448 as NaN; from 0.45 (`nvfp4_tensor.py::_cast_per_block_scale_to_fp8`) and in
# formats/quant.py the scale is clamped to [2**-9, 448]. ModelOpt < 0.45 also asks
# `backends/utils.py::fp4_compatible` -> torch.cuda.get_device_capability(0) before looking at
# the tensor's device, which raises without a GPU; 0.45 returns False when CUDA is unavailable.
MODELOPT_NVFP4_AS_CURRENT = Version("0.45")
E4M3_SCALE_RANGE = (2.0**-9, 448.0)


@contextlib.contextmanager
def modelopt_nvfp4():
    """Inside this block an older ModelOpt packs NVFP4 as 0.45+ does (clamped block scales, no
    CUDA query on a CPU-only machine), so that exports are equal across versions. No-op on >= 0.45."""
    v = version_of("nvidia-modelopt")
    if v is None or v.release >= MODELOPT_NVFP4_AS_CURRENT.release:
        yield
        return
    import modelopt.torch.quantization.backends.utils as backend_utils
    import torch
    from modelopt.torch.quantization.qtensor import nvfp4_tensor

    cls = nvfp4_tensor.NVFP4QTensor
    saved = backend_utils.fp4_compatible, nvfp4_tensor.fp4_compatible, cls.__dict__["get_weights_scaling_factor"]
    unclamped = saved[2].__func__

    def clamped(cls_, input, block_size, weights_scaling_factor_2=None, keep_high_precision=False):
        scale, scale_2 = unclamped(cls_, input, block_size, weights_scaling_factor_2, keep_high_precision=True)
        if not keep_high_precision:
            scale = scale.clamp(*E4M3_SCALE_RANGE).to(torch.float8_e4m3fn)
        return scale, scale_2

    cls.get_weights_scaling_factor = classmethod(clamped)
    if not torch.cuda.is_available():
        backend_utils.fp4_compatible = nvfp4_tensor.fp4_compatible = lambda: False
    try:
        yield
    finally:
        backend_utils.fp4_compatible, nvfp4_tensor.fp4_compatible, _ = saved
        cls.get_weights_scaling_factor = saved[2]


# Unified HF export (pytorch backend): ModelOpt <= 0.42 writes FP8 KV scales clamped to >= 1.0
# (export/quant_utils.py::postprocess_state_dict), 0.43 on the calibrated amax / 448; ModelOpt
# < 0.45 leaves the (never quantized) embedding and MoE routers that carry no quantizer (on
# transformers >= 5 and for gpt-oss they are not nn.Linear: GptOssTopKRouter) out of
# exclude_modules, 0.45 on lists both (export/quant_utils.py::_get_unquantized_moe_router_names,
# NVIDIA/Model-Optimizer PR #1858). Unlisted, a loader may take the bf16 router for a quantized weight.
MODELOPT_REAL_KV_SCALES = Version("0.43")
MODELOPT_EXCLUDES_EMBEDDING = Version("0.45")


def modelopt_hf_export_as_current(model, export_dir: Path) -> None:
    """Make an older ModelOpt's `export_hf_checkpoint` output equal to what 0.45+ writes for the
    same calibrated `model` (the KV scales and the exclude list above); no-op on 0.45+."""
    v = version_of("nvidia-modelopt")
    if v is None or v.release >= MODELOPT_EXCLUDES_EMBEDDING.release:
        return
    import torch

    if v.release < MODELOPT_REAL_KV_SCALES.release:
        scales = {}
        for name, m in model.named_modules():
            for kv in ("k", "v"):
                q = getattr(m, f"{kv}_bmm_quantizer", None)
                if q is not None and q.is_enabled and q.amax is not None:
                    scales[f"{name}.{kv}_proj.{kv}_scale"] = q.amax.float() / q.maxbound
        _rewrite_tensors(export_dir, scales)
    embeddings = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
    _add_excludes(export_dir, embeddings + _unquantized_moe_routers(model))


MOE_ROUTER_ATTRS = ("gate", "router", "shared_expert_gate")


def _unquantized_moe_routers(model) -> list[str]:
    """The MoE routers left in the model dtype: a module with `experts` whose `gate` / `router` /
    `shared_expert_gate` child owns a weight and has no enabled weight quantizer (0.45's rule)."""
    import torch

    names = []
    for name, m in model.named_modules():
        if not hasattr(m, "experts"):
            continue
        for attr in MOE_ROUTER_ATTRS:
            router = getattr(m, attr, None)
            if not isinstance(router, torch.nn.Module) or not isinstance(getattr(router, "weight", None), torch.Tensor):
                continue
            q = getattr(router, "weight_quantizer", None)
            if q is not None and q.is_enabled:
                continue
            names.append(f"{name}.{attr}" if name else attr)
    return names


def _rewrite_tensors(export_dir: Path, values: dict) -> None:
    """Replace the named tensors (same shape and dtype as written) in the export's safetensors files."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    for path in sorted(export_dir.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            metadata = f.metadata()
        tensors = load_file(path)
        hit = [k for k in tensors if k in values]
        for k in hit:
            tensors[k] = values[k].reshape(tensors[k].shape).to(tensors[k].dtype)
        if hit:
            save_file(tensors, path, metadata=metadata)


def _add_excludes(export_dir: Path, modules: list[str]) -> None:
    """List `modules` as unquantized in hf_quant_config.json and config.json, sorted as 0.45 does."""
    import json

    for file, keys in (("hf_quant_config.json", ("quantization", "exclude_modules")),
                       ("config.json", ("quantization_config", "ignore"))):
        path = export_dir / file
        cfg = json.loads(path.read_text())
        section = cfg.get(keys[0])
        if section is None or section.get(keys[1]) is None:
            continue
        section[keys[1]] = sorted(set(section[keys[1]]) | set(modules))
        path.write_text(json.dumps(cfg, indent=4))  # as ModelOpt writes both files


# ----------------------------------------------------------------------------- numpy
# Triton's Python backend stub built with pybind11 < 2.12 reads numpy 1's dtype layout: under
# numpy 2 it sees every itemsize as 0, so numeric inputs arrive as their first element repeated,
# BYTES inputs kill the stub and every output comes back empty. python_backend moved to
# pybind11 2.12 in triton-inference-server/python_backend PR #384 (Nov 2024, Triton 24.11);
# nvidia-pytriton 0.7.0 (the CPU server we serve with) bundles Triton 2.51 = 24.10, before it.
# So under numpy 2 the bundled stub gets a numpy < 2 of its own (launch/stub_python.py).
STUB_NUMPY_ENV = "TRTLLM_DFLASH_STUB_NUMPY"


def numpy_2() -> bool:
    v = version_of("numpy")
    return v is not None and v.major >= 2


def stub_numpy_dir() -> Path:
    """Where a numpy < 2 for the bundled Triton stub lives: $TRTLLM_DFLASH_STUB_NUMPY, else a
    directory per Python version under the user's cache (filled by the command stub_numpy_hint gives)."""
    explicit = os.environ.get(STUB_NUMPY_ENV)
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trtllm_dflash" / "triton-stub-numpy1" / f"py{sys.version_info.major}.{sys.version_info.minor}"


def stub_numpy_hint(target: Path) -> str:
    return f"{sys.executable} -m pip install --no-deps --target {target} 'numpy>=1.26,<2'"
