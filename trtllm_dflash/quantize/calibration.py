"""Calibration: the amaxes every static scale comes from, per model.

The target is calibrated by ModelOpt (`mtq.quantize` with max calibration over the calibration
text, its quantizers' amaxes collected afterwards; a checkpoint shipping MXFP4 experts is
dequantized first); the drafter inside the reference DFlash loop with calibrate.py's plain-torch
hooks, since ModelOpt knows no DFlash forward. Both give a Calibration, which the output's
`calibration.json` records.
"""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtllm_dflash import compat
from trtllm_dflash.artifacts import sha256_file
from trtllm_dflash.errors import UserError
from trtllm_dflash.quantize.quantize import QuantPlan, Scheme


@dataclass
class CalibrationData:
    batches: list[torch.Tensor]  # [1, L] token ids each
    source: str  # where the tokens came from (recorded in the manifest)


def calibration_data(target_dir: Path, vocab_size: int, path: Path | None, samples: int, length: int,
                     seed: int = 0) -> CalibrationData:
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
        raise UserError(f"target {target_dir}/config.json: quantization_config.quant_method is {method!r}: quantize "
                        "takes unquantized checkpoints, or gpt-oss's MXFP4 (mxfp4); start from the unquantized model")
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

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=plan.dtypes["target"],
                                                 **_source_quantization(target_dir))
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
            calib.linears[prefix.rstrip("._")] = {"weight": _amax(m),
                                                  "input": _amax(modules.get(prefix + "input_quantizer"))}
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
            drafter, groups, run=lambda _m,
            g: generate(target, drafter, g, new_tokens, mode="dflash", stop_token_ids=[]),
            on_batch=advance,
        )
    calib = Calibration(source=data.source, kv=kv)
    for name, a in amax.items():
        calib.linears[name] = {"weight": float(a.weight), "input": None if a.input is None else float(a.input)}
    return calib
