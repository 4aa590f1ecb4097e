"""The stacks we install into (docs/compat.md): requirement ranges that admit them, and compat.py's
branches, each exercised on both sides whatever the installed versions are."""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from trtllm_dflash import compat
from trtllm_dflash.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Version strings NVIDIA's containers report (docs/compat.md): NGC's torch builds are pre-releases.
CONTAINER_TORCH = ("2.9.0a0+145a3a7bda.nv25.10", "2.10.0a0+b4e4ee81d3.nv25.12", "2.9.1", "2.10.0", "2.13.0")


def _requirement(name: str, extra: str | None = None) -> Requirement:
    reqs = PROJECT["optional-dependencies"][extra] if extra else PROJECT["dependencies"]
    return next(Requirement(r) for r in reqs if Requirement(r).name == name)


@pytest.mark.parametrize("version", CONTAINER_TORCH)
def test_torch_range_admits_every_container_build(version):
    # pip checks an installed version with prereleases allowed when the specifier names one
    assert _requirement("torch").specifier.contains(Version(version), prereleases=True)
    assert not Requirement("torch>=2.9").specifier.contains(Version(CONTAINER_TORCH[0]), prereleases=True)


@pytest.mark.parametrize("lane", sorted(p.stem for p in (ROOT / ".ci" / "stacks").glob("*.txt")))
def test_every_lane_pin_satisfies_our_ranges(lane):
    pins = dict(line.split("==") for line in ((ROOT / ".ci" / "stacks" / f"{lane}.txt").read_text().splitlines())
                if line and not line.startswith("#"))
    where = {"nvidia-modelopt": "quant", "triton": "kernels", "fastapi": "serve"}
    for name, version in pins.items():
        req = _requirement(name, where.get(name))
        assert req.specifier.contains(Version(version), prereleases=True), f"{lane}: {name}=={version} vs {req}"


def _cfg(shape: str) -> dict:
    if shape == "dict":  # ModelOpt <= 0.43 (0.37: TensorRT-LLM 1.2.1)
        return {"quant_cfg": {"*weight_quantizer": {"num_bits": (4, 3)}, "*input_quantizer": {"num_bits": (4, 3)},
                              "*lm_head*": {"enable": False}, "default": {"enable": False}}, "algorithm": "max"}
    return {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                          {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": (4, 3)}},
                          {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": (4, 3)}}], "algorithm": "max"}


def _kv(shape: str) -> dict:
    if shape == "dict":
        return {"quant_cfg": {"*[kv]_bmm_quantizer": {"num_bits": (4, 3), "enable": True},
                              "default": {"enable": False}}}
    return {"quant_cfg": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3)}}]}


def _effective(cfg: dict) -> list[tuple[str, object]]:
    """(pattern, setting) in the order ModelOpt applies them: a dict's "default" first."""
    entries = cfg["quant_cfg"]
    if isinstance(entries, list):
        return [(e["quantizer_name"], e.get("cfg", e.get("enable"))) for e in entries]
    return sorted(entries.items(), key=lambda kv: kv[0] != "default")


@pytest.mark.parametrize("shape", ["dict", "list"])
def test_quant_cfg_edits_mean_the_same_in_both_shapes(shape):
    cfg = _cfg(shape)
    compat.quant_cfg_disable(cfg, "*input_quantizer")
    compat.quant_cfg_extend(cfg, _kv(shape))
    applied = _effective(cfg)
    names = [p for p, _ in applied]
    # input quantizers end up off (the last entry for them wins), KV quantizers on, the rest kept
    assert [s for p, s in applied if p == "*input_quantizer"][-1] in (False, {"enable": False})
    assert names[-1] == "*[kv]_bmm_quantizer" and "*weight_quantizer" in names
    assert names.count("default") <= 1 and (shape == "list" or dict(applied)["default"] == {"enable": False})


def test_modelopt_too_old_or_missing_is_one_line(monkeypatch):
    for found, needle in ((None, "needs nvidia-modelopt >= 0.37; install it"), ("0.35.1", "found 0.35.1")):
        monkeypatch.setattr(compat, "version_of", lambda pkg, v=found: Version(v) if v and pkg == "nvidia-modelopt"
                            else None)
        with pytest.raises(UserError, match=needle) as e:
            compat.require_modelopt()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("major", [4, 5])
def test_rope_and_eos_follow_the_transformers_major(monkeypatch, major):
    monkeypatch.setattr(compat, "version_of", lambda pkg: Version(f"{major}.57.3" if major == 4 else "5.24.0"))
    kw = compat.rope_config_kwargs(500000.0, {"rope_type": "llama3", "factor": 8.0})
    if major == 5:
        assert kw == {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}}
        assert compat.never_stopping_eos(1024) is None
    else:
        assert kw == {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
        assert compat.never_stopping_eos(1024) == 1024


def test_llama3_rope_reaches_the_installed_transformers():
    """The config the test helpers build is read with its scaling by whichever transformers is installed
    (4.57 ignores rope_parameters: the model would run plain RoPE)."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    common = dict(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=512)
    scaled = LlamaRotaryEmbedding(LlamaConfig(**common, **compat.rope_config_kwargs(10000.0, scaling)))
    plain = LlamaRotaryEmbedding(LlamaConfig(**common, **compat.rope_config_kwargs(10000.0)))
    assert not torch.allclose(scaled.inv_freq, plain.inv_freq)
    assert torch.allclose(plain.inv_freq, 1.0 / 10000.0 ** (torch.arange(0, 16, 2).float() / 16))


def test_the_dynamo_extra_is_ai_dynamos_requirements_but_aisimulate():
    """pyproject's `dynamo` extra lists ai-dynamo 1.6.1's own requirements (its METADATA, read from
    the installed wheel) but aisimulate, which only its planner, profiler and simulators import, so
    that `pip install --no-deps ai-dynamo==1.6.1` leaves nothing missing that the frontend and a
    worker import (docs/compat.md "NVIDIA Dynamo")."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    try:
        wanted = [Requirement(r) for r in requires("ai-dynamo")]
    except PackageNotFoundError:
        pytest.skip("ai-dynamo is not installed (pip install --no-deps ai-dynamo==1.6.1)")
    listed = PROJECT["optional-dependencies"]["dynamo"]
    extra = {Requirement(r).name.lower().replace("_", "-"): Requirement(r) for r in listed}
    assert version("ai-dynamo") == "1.6.1" and str(extra["ai-dynamo-runtime"].specifier) == "==1.6.1"
    plain = [r for r in wanted if r.marker is None or r.marker.evaluate({"extra": ""})]  # no extra of its own
    for r in plain:
        name = r.name.lower().replace("_", "-")
        if name == "aisimulate":
            assert name not in extra
            continue
        assert name in extra and extra[name].specifier == r.specifier, f"{r} is not in the dynamo extra as written"
    assert "trtllm_dflash[cpu,serve,quant,kernels,dynamo]" in PROJECT["optional-dependencies"]["dev"]
