"""The `quantize` stage: calibrate, then write FP8 / NVFP4 checkpoints for a backend.

Schemes are an enum resolved once from the recipe (never flag combinations downstream):
  FP8    E4M3 weights, one scale per tensor; W8A8 with static FP8 input scales
  NVFP4  E2M1 weights, E4M3 scale per 16, FP32 global; W4A4 with static global input scales
  KV     an FP8 KV cache gets per-layer k / v scales (ModelOpt's convention: amax / 448, at least 1)
On the reference backend activations stay in high precision (weight-only emulation); the
engine and pytorch backends need activations in the weight format (W8A8 / W4A4).

Who does what:
  target   nvidia-modelopt calibrates the HF model (`mtq.quantize`, max calibration, on CPU
           or GPU; NVFP4 calibration and export run on CPU even though its fake-quant forward
           does not). pytorch backend: ModelOpt's `export_hf_checkpoint` writes the HF-layout
           checkpoint (hf_quant_config.json, quantized safetensors). engine / reference
           backends: the amaxes ModelOpt collected drive our converter, which writes the
           TensorRT-LLM per-rank checkpoint with tensors packed by formats/quant.py (equal to
           ModelOpt's own packing: tests/quantize/test_modelopt_parity.py).
  drafter  (optional) calibrated by running the reference DFlash loop with max-calibration
           hooks (calibrate.py; ModelOpt knows no DFlash forward), packed by formats/quant.py.
The amaxes are written to `calibration.json` in the output: every scale can be re-derived.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch

from trtllm_dflash import compat
from trtllm_dflash.artifacts import sha256_file
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats import quant as F
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.engine_layout import QUANT_ALGO
from trtllm_dflash.recipe.support import backend as backend_spec

FLOAT_FORMATS = ("fp32", "bf16", "fp16")
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Scheme(str, Enum):
    NONE = "none"
    FP8 = "fp8"
    NVFP4 = "nvfp4"

    @property
    def quant_algo(self) -> str | None:
        return QUANT_ALGO.get(self.value)


@dataclass(frozen=True)
class QuantPlan:
    """What the recipe asks for, resolved and checked."""

    target: Scheme
    drafter: Scheme
    activations: bool  # quantize GEMM inputs (static scales); False = weight-only emulation
    kv_fp8: bool
    dtypes: dict  # role -> torch dtype of everything not quantized

    def describe(self) -> dict:
        return {
            "target": self.target.value, "drafter": self.drafter.value, "activations": self.activations,
            "kv_cache": "fp8" if self.kv_fp8 else None,
            "dtypes": {k: str(v).removeprefix("torch.") for k, v in self.dtypes.items()},
        }


def resolve(recipe: Recipe) -> QuantPlan:
    """The recipe's quantization section as a plan; UserError naming the field otherwise."""
    q, backend = recipe.quantization, recipe.backend.name
    file = str(recipe.file or "(default recipe)")

    def scheme(field_: str, fmt: str) -> Scheme:
        if fmt in FLOAT_FORMATS:
            return Scheme.NONE
        if fmt in ("fp8", "nvfp4"):
            return Scheme(fmt)
        raise UserError(f"{file}: quantization.{field_}: {fmt} is not produced by quantize; allowed: fp8, nvfp4, {', '.join(FLOAT_FORMATS)}")

    target, drafter = scheme("target_weights", q.target_weights), scheme("drafter", q.drafter)
    if not q.quantizes:
        raise UserError(
            f"{file}: quantization.target_weights is {q.target_weights}, quantization.drafter is {q.drafter} and "
            f"quantization.kv_cache is {q.kv_cache}: nothing to quantize (run `convert`); set one of them to fp8 "
            "(or the weights to nvfp4)"
        )
    activations = q.activations not in FLOAT_FORMATS
    if not backend_spec(backend).emulates_quantization:
        for who, s in (("target_weights", target),) + ((("drafter", drafter),) if drafter is not Scheme.NONE else ()):
            if s is not Scheme.NONE and q.activations != s.value:
                raise UserError(
                    f"{file}: quantization.activations: {q.activations} with {s.value} quantization.{who} on the {backend} "
                    f"backend; allowed: activations {s.value} (W8A8 FP8 / W4A4 NVFP4; weight-only runs only on the reference backend)"
                )
    elif activations:
        activations = False  # the reference emulates weights only (recipe rules warn about it)
    if q.kv_cache not in FLOAT_FORMATS + ("fp8",):
        raise UserError(f"{file}: quantization.kv_cache: {q.kv_cache} is not implemented; allowed: fp8, {', '.join(FLOAT_FORMATS)}")
    dtypes = {role: TORCH_DTYPES[q.checkpoint_dtype(role)] for role in ("target", "drafter")}
    return QuantPlan(target, drafter, activations, q.kv_cache == "fp8", dtypes)


# ----------------------------------------------------------------------------- calibration data


@dataclass
class CalibrationData:
    batches: list[torch.Tensor]  # [1, L] token ids each
    source: str  # where the tokens came from (recorded in the manifest)


def calibration_data(target_dir: Path, vocab_size: int, path: Path | None, samples: int, length: int, seed: int = 0) -> CalibrationData:
    """`samples` sequences of `length` tokens: from a text / JSONL file, else the package's built-in
    calibration text (when the target has a tokenizer), else seeded random token ids."""
    tokenizer = None
    if (target_dir / "tokenizer.json").is_file() or (target_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target_dir)
    if path is not None:
        if tokenizer is None:
            raise UserError(f"--calib {path}: the target {target_dir} has no tokenizer to encode it")
        if not path.is_file():
            raise UserError(f"--calib {path}: file not found")
        lines = path.read_text().splitlines()
        if path.suffix == ".jsonl":
            texts = []
            for i, line in enumerate(lines):
                if line.strip():
                    row = json.loads(line)
                    text = row.get("text") or row.get("prompt") if isinstance(row, dict) else None
                    if not isinstance(text, str):
                        raise UserError(f"--calib {path}: line {i + 1} has no 'text' or 'prompt' string")
                    texts.append(text)
            text = "\n".join(texts)
        else:
            text = "\n".join(lines)
        source = f"file {path} (sha256 {sha256_file(path)[:12]})"  # the manifest records which text calibrated
    elif tokenizer is not None:
        from trtllm_dflash.prompts.corpus import shipped_text

        shipped = shipped_text()  # the same text on every interpreter
        text = "\n".join(f.text for f in shipped.calibration)
        source = f"built-in calibration text (Python source, sha256 {shipped.sha256[:12]})"
    else:
        g = torch.Generator().manual_seed(seed)
        return CalibrationData(
            [torch.randint(0, vocab_size, (1, length), generator=g) for _ in range(samples)],
            f"random token ids (seed {seed}; the target has no tokenizer)",
        )
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    if len(ids) < length:
        raise UserError(f"calibration text has {len(ids)} tokens, fewer than --calib-len {length}")
    n = min(samples, len(ids) // length)
    return CalibrationData([ids[i * length : (i + 1) * length][None] for i in range(n)], source)


# ----------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    """Amaxes of one model: per linear module (by source name) and per layer KV."""

    linears: dict[str, dict] = field(default_factory=dict)  # name -> {"weight": float, "input": float | None}
    kv: dict[int, dict] = field(default_factory=dict)  # layer -> {"k": float, "v": float}
    source: str = ""

    def to_json(self) -> dict:
        return {"linears": self.linears, "kv": {str(k): v for k, v in self.kv.items()}, "source": self.source}

    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        return cls(d["linears"], {int(k): v for k, v in d["kv"].items()}, d.get("source", ""))

    def weight_amax(self, names) -> torch.Tensor:
        return torch.tensor(max(self.linears[n]["weight"] for n in names), dtype=torch.float32)

    def input_amax(self, names) -> torch.Tensor | None:
        vals = [self.linears[n]["input"] for n in names if self.linears[n]["input"] is not None]
        return torch.tensor(max(vals), dtype=torch.float32) if vals else None


def _progress(total: int, description: str, enabled: bool):
    """A rich progress bar context yielding an `advance()`; a no-op when disabled."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(lambda: None)

    @contextlib.contextmanager
    def bar():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=None) as p:
            task = p.add_task(description, total=total)
            yield lambda: p.advance(task)

    return bar()


def modelopt_config(scheme: Scheme, activations: bool, kv_fp8: bool) -> dict:
    """ModelOpt's preset for a scheme, in the installed ModelOpt's quant_cfg shape (compat.py)."""
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG if scheme is Scheme.FP8 else mtq.NVFP4_DEFAULT_CFG)
    if not activations:
        compat.quant_cfg_disable(cfg, "*input_quantizer")
    if kv_fp8:
        compat.quant_cfg_extend(cfg, copy.deepcopy(mtq.FP8_KV_CFG))
    return cfg


def _source_quantization(target_dir: Path) -> dict:
    """from_pretrained arguments for a checkpoint that ships quantized weights: gpt-oss's MXFP4
    experts are dequantized (transformers' Mxfp4Config(dequantize=True), which needs accelerate)
    to the model dtype, then ModelOpt calibrates and quantizes them like any other weight."""
    method = (json.loads((target_dir / "config.json").read_text()).get("quantization_config") or {}).get("quant_method")
    if method is None:
        return {}
    if method != "mxfp4":
        raise UserError(f"target {target_dir}/config.json: quantization_config.quant_method is {method!r}: quantize takes "
                        "unquantized checkpoints, or gpt-oss's MXFP4 (mxfp4); start from the unquantized model")
    from importlib.util import find_spec

    if find_spec("accelerate") is None:
        raise UserError(f"target {target_dir}: dequantizing its MXFP4 experts needs accelerate (transformers' "
                        "Mxfp4Config); pip install 'trtllm_dflash[quant]'")
    from transformers import Mxfp4Config

    return {"quantization_config": Mxfp4Config(dequantize=True)}


def calibrate_target(
    target_dir: Path, plan: QuantPlan, data: CalibrationData, device: str = "cpu", progress: bool = True
):
    """Run ModelOpt max calibration on the HF target; return (calibrated model, Calibration)."""
    compat.require_modelopt()
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=plan.dtypes["target"], **_source_quantization(target_dir))
    model = model.to(device).eval()
    if not model.config.architectures:  # ModelOpt's export reads it
        model.config.architectures = [type(model).__name__]
    scheme = plan.target if plan.target is not Scheme.NONE else Scheme.FP8
    cfg = modelopt_config(scheme, plan.activations or plan.target is Scheme.NONE, plan.kv_fp8)

    def forward_loop(m):
        with _progress(len(data.batches), "calibrating target", progress) as advance, torch.no_grad():
            for ids in data.batches:
                m(ids.to(device))
                advance()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mtq.quantize(model, cfg, forward_loop)
    return model, _collected(model, Calibration(source=data.source))


def _amax(q) -> float | None:
    amax = getattr(q, "amax", None) if getattr(q, "is_enabled", False) else None
    return None if amax is None else float(amax.float().max())


def _collected(model, calib: Calibration) -> Calibration:
    """Every amax ModelOpt calibrated: linears (`x.q_proj.weight_quantizer`), fused MoE experts
    (gpt-oss: `x.experts.gate_up_proj_weight_quantizer`, recorded as `x.experts.gate_up_proj`)
    and the per-layer K / V of the cache."""
    modules = dict(model.named_modules())
    for name, m in modules.items():
        if name.endswith("weight_quantizer") and _amax(m) is not None:
            prefix = name.removesuffix("weight_quantizer")
            calib.linears[prefix.rstrip("._")] = {"weight": _amax(m), "input": _amax(modules.get(prefix + "input_quantizer"))}
        kq = getattr(m, "k_bmm_quantizer", None)
        if kq is not None and kq.is_enabled and kq.amax is not None:
            layer = int(name.split(".layers.")[1].split(".")[0])
            calib.kv[layer] = {"k": float(kq.amax.float().max()), "v": float(m.v_bmm_quantizer.amax.float().max())}
    return calib


def calibrate_drafter(target_dir: Path, drafter_dir: Path, data: CalibrationData, prompt_len: int = 64,
                      new_tokens: int = 32, batch: int = 8, progress: bool = True) -> Calibration:
    """Max calibration of the drafter inside the reference DFlash loop (greedy), in fp32:
    every linear's input amax, weight amax, and per-layer K / V amax of its cache writes."""
    from trtllm_dflash.quantize.calibrate import collect_linear_amax
    from trtllm_dflash.reference import generate, load_pair

    target, drafter = load_pair(target_dir, drafter_dir, dtype=torch.float32)
    kv: dict[int, dict] = {}
    new_cache = drafter.new_cache

    def recording_cache(batch, max_len):
        cache = new_cache(batch, max_len)
        write = cache.write

        def record(layer, pos, k, v, rows=None):
            seen = kv.setdefault(layer, {"k": 0.0, "v": 0.0})
            seen["k"] = max(seen["k"], float(k.abs().amax()))
            seen["v"] = max(seen["v"], float(v.abs().amax()))
            write(layer, pos, k, v, rows)

        cache.write = record
        return cache

    drafter.new_cache = recording_cache
    prompts = [ids[0, :prompt_len].tolist() for ids in data.batches]
    groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]  # the reference decodes batches
    with _progress(len(groups), "calibrating drafter", progress) as advance:
        amax = collect_linear_amax(
            drafter, groups, run=lambda _m, g: generate(target, drafter, g, new_tokens, mode="dflash", stop_token_ids=[]),
            on_batch=advance,
        )
    calib = Calibration(source=data.source, kv=kv)
    for name, a in amax.items():
        calib.linears[name] = {"weight": float(a.weight), "input": None if a.input is None else float(a.input)}
    return calib


# ----------------------------------------------------------------------------- TensorRT-LLM tensors


class QuantTransform:
    """Turns planned TensorRT-LLM tensors into FP8 / NVFP4 tensors + scales (convert's Transform).

    Scales come from the group of source linears a tensor shares them with (q/k/v fused into
    qkv, gate/up fused at build time): one weight amax and one input amax per group, the
    largest member's, as TensorRT-LLM's fused GEMMs require and ModelOpt's export does.
    """

    def __init__(self, plan: QuantPlan, calibration: dict[str, Calibration]):
        self.plan, self.calibration = plan, calibration

    def scheme(self, role: str) -> Scheme:
        return self.plan.target if role == "target" else self.plan.drafter

    def dtype(self, role: str) -> torch.dtype:
        return self.plan.dtypes[role]

    def _quantized(self, role: str, t) -> bool:
        return t.entry.linear and self.scheme(role) is not Scheme.NONE

    def validate(self, plan, calibrated: bool = True) -> None:
        """Every quantized tensor of `plan` can be written: no MoE experts, NVFP4-aligned shards
        and, when `calibrated`, calibration for every GEMM it fuses."""
        for planned in plan.ranks:
            for t in planned:
                if not self._quantized(plan.role, t):
                    continue
                if t.entry.rule.startswith("experts_"):
                    raise NotImplementedError(
                        f"{t.name}: quantized MoE experts in the TensorRT-LLM checkpoint layout; the engine backend "
                        "does not serve qwen3_moe (TensorRT-LLM 1.2 engine path) - use the pytorch backend (ModelOpt HF export)"
                    )
                if self.scheme(plan.role) is Scheme.NVFP4 and t.shape[-1] % F.NVFP4_BLOCK:
                    raise UserError(
                        f"{t.name}: {t.shape[-1]} input features per rank (tp {plan.tp}) is not a multiple of "
                        f"{F.NVFP4_BLOCK}, NVFP4's block; choose a tp that keeps every row-parallel shard 16-aligned"
                    )
                missing = [n for n in t.group if n not in self.calibration[plan.role].linears] if calibrated else []
                if missing:
                    raise UserError(f"{t.name}: no calibration for {missing[0]}")

    def outputs(self, role, t):
        if not self._quantized(role, t):
            return [(t.name, t.shape, getattr(torch, t.entry.dtype) if t.entry.dtype else self.dtype(role))]
        prefix = t.name.removesuffix(".weight")
        act = self.plan.activations
        if self.scheme(role) is Scheme.FP8:
            out = [(t.name, t.shape, torch.float8_e4m3fn), (f"{prefix}.weights_scaling_factor", (1,), torch.float32)]
            return out + ([(f"{prefix}.activation_scaling_factor", (1,), torch.float32)] if act else [])
        k = t.shape[-1]
        out = [
            (t.name, t.shape[:-1] + (k // 2,), torch.uint8),
            (f"{prefix}.weights_scaling_factor", t.shape[:-1] + (k // F.NVFP4_BLOCK,), torch.float8_e4m3fn),
            (f"{prefix}.weights_scaling_factor_2", (), torch.float32),
        ]
        return out + ([(f"{prefix}.activation_scaling_factor", (), torch.float32)] if act else [])

    def apply(self, role, t, x):
        if not self._quantized(role, t):
            return {t.name: x.to(getattr(torch, t.entry.dtype) if t.entry.dtype else self.dtype(role))}
        calib = self.calibration[role]
        prefix = t.name.removesuffix(".weight")
        w_amax, in_amax = calib.weight_amax(t.group), calib.input_amax(t.group)
        x = x.to(self.dtype(role))  # quantize from the checkpoint's precision, as ModelOpt does
        if self.scheme(role) is Scheme.FP8:
            q = F.quantize_fp8(x, F.fp8_scale(w_amax), fp32_quotient=True)  # as ModelOpt's TensorRT-LLM export
            out = {t.name: q.data, f"{prefix}.weights_scaling_factor": q.scale.reshape(1)}
            if self.plan.activations:
                out[f"{prefix}.activation_scaling_factor"] = F.fp8_scale(in_amax).reshape(1)
            return out
        q = F.quantize_nvfp4(x, F.nvfp4_global_scale(w_amax))
        out = {t.name: q.data, f"{prefix}.weights_scaling_factor": q.block_scale, f"{prefix}.weights_scaling_factor_2": q.global_scale}
        if self.plan.activations:
            out[f"{prefix}.activation_scaling_factor"] = F.nvfp4_global_scale(in_amax)
        return out

    def extras(self, role, layer, rank):
        if not self.plan.kv_fp8 or layer not in self.calibration[role].kv:
            return {}
        kv = self.calibration[role].kv[layer]
        # ModelOpt's FP8 KV convention: amax / 448, but never below 1 (TensorRT-LLM's default scale)
        k, v = (torch.maximum(F.fp8_scale(kv[x]), torch.tensor(1.0)).reshape(1) for x in ("k", "v"))
        p = f"transformer.layers.{layer}.attention."
        return {p + "kv_cache_scaling_factor": torch.maximum(k, v), p + "k_cache_scaling_factor": k, p + "v_cache_scaling_factor": v}

    def quantization(self, role):
        s = self.scheme(role)
        out = {"quant_algo": s.quant_algo, "kv_cache_quant_algo": "FP8" if self.plan.kv_fp8 else None}
        if s is Scheme.NVFP4:
            out["group_size"] = F.NVFP4_BLOCK
        if s is not Scheme.NONE:
            out["exclude_modules"] = ["lm_head"]
            if not self.plan.activations:
                out["weight_only"] = True  # reference backend: activations stay in high precision
        return out

    def describe(self):
        import hashlib

        blob = json.dumps({r: c.to_json() for r, c in self.calibration.items()}, sort_keys=True)
        return {"transform": "quantize", **self.plan.describe(), "calibration_sha256": hashlib.sha256(blob.encode()).hexdigest()}


# ----------------------------------------------------------------------------- the HF layout (pytorch backend)


def export_hf(model, tmp: Path, recipe: Recipe, target_dir: Path, drafter_dir: Path, plan: QuantPlan) -> None:
    """ModelOpt's unified HF export of the calibrated target + the drafter in z-lab layout."""
    from modelopt.torch.export import export_hf_checkpoint

    from trtllm_dflash.reference import load_drafter, save_drafter

    with warnings.catch_warnings(), compat.modelopt_nvfp4():
        warnings.simplefilter("ignore")
        export_hf_checkpoint(model, export_dir=tmp / "target", dtype=plan.dtypes["target"])
    compat.modelopt_hf_export_as_current(model, tmp / "target")
    for p in sorted(target_dir.iterdir()):
        keep = p.is_file() and (p.name.startswith("tokenizer") or p.name in ("special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja"))
        if keep and not (tmp / "target" / p.name).exists():
            (tmp / "target" / p.name).write_bytes(p.read_bytes())
    drafter = load_drafter(drafter_dir, dtype=plan.dtypes["drafter"])
    save_drafter(drafter, tmp / "drafter", dtype=plan.dtypes["drafter"])
    raw = json.loads((drafter_dir / "config.json").read_text())
    saved = json.loads((tmp / "drafter" / "config.json").read_text())
    # keep every key of the original drafter config (vocab_size, ...) that save_drafter does not write
    (tmp / "drafter" / "config.json").write_text(json.dumps({**raw, **saved}, indent=2) + "\n")


def stderr_note(msg: str) -> None:
    print(msg, file=sys.stderr)
