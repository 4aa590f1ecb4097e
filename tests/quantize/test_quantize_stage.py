"""quantize: FP8 / NVFP4 checkpoints for each backend, checked against ModelOpt and our formats.

- engine backend: our TensorRT-LLM per-rank checkpoint equals ModelOpt's own
  `export_tensorrt_llm_checkpoint` of an identically calibrated model, tensor for tensor;
- pytorch backend: ModelOpt's HF export, whose scales our formats rebuild from calibration.json;
- reference backend: weight-only target and drafter, dequantized within the format's bound.
"""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file

from checkpoints import converted, make_drafter, make_target, modelopt_trtllm_export_archs, read_config, write_recipe
from trtllm_dflash.artifacts import Manifest, check_files, verify_input
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats import quant as F
from trtllm_dflash.quantize.stage import quantize
from trtllm_dflash.recipe import load_recipe

pytestmark = pytest.mark.filterwarnings("ignore")
CALIB = dict(samples=4, length=16, progress=False)


def _modelopt():
    return pytest.importorskip("modelopt.torch.quantization",
                               reason="nvidia-modelopt not installed (pip install 'trtllm_dflash[quant]')")


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16-pair")
    return make_target(root / "t", dtype=torch.bfloat16), make_drafter(root / "d", dtype=torch.bfloat16)


def _same(a, b):
    if b.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("fmt,gpu", [("fp8", "h100-sxm"), ("nvfp4", "b200")])
def test_engine_checkpoint_equals_modelopt_trtllm_export(tmp_path, bf16_pair, fmt, gpu):
    mtq = _modelopt()
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.compat import modelopt_nvfp4
    from trtllm_dflash.quantize.calibration import calibration_data, modelopt_config
    from trtllm_dflash.quantize.quantize import Scheme

    target, drafter = bf16_pair
    arch = modelopt_trtllm_export_archs()[0]  # ModelOpt < 0.44 exports no Qwen3: compare on Llama there
    if arch != "qwen3":
        target = make_target(tmp_path / "llama", arch, dtype=torch.bfloat16)
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, tp=2, fmt="bf16", gpu=gpu, backend="engine",
                                      quantization={"target_weights": fmt, "activations": fmt, "kv_cache": "fp8"}))
    out = quantize(recipe, converted(recipe, tmp_path / "c"), tmp_path / "q", **CALIB)
    manifest = verify_input(out, ("quantize",), recipe)
    assert manifest.extra["layout"] == "trtllm" and "random token ids" in manifest.extra["calibration_data"]

    # ModelOpt on the same model, same calibration batches
    data = calibration_data(target, 256, None, 4, 16, seed=0)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
    model.config.architectures = [type(model).__name__]
    with warnings.catch_warnings(), modelopt_nvfp4():
        warnings.simplefilter("ignore")
        mtq.quantize(model, modelopt_config(Scheme(fmt), True, True), lambda m: [m(b) for b in data.batches])
        export_tensorrt_llm_checkpoint(model, {"qwen3": "qwen", "llama": "llama"}[arch], torch.bfloat16,
                                       tmp_path / "modelopt", inference_tensor_parallel=2)
    assert read_config(out / "target")["quantization"] == read_config(tmp_path / "modelopt")["quantization"]
    for r in range(2):
        ours = load_file(out / "target" / f"rank{r}.safetensors")
        theirs = load_file(tmp_path / "modelopt" / f"rank{r}.safetensors")
        assert set(ours) == set(theirs)
        for name, t in theirs.items():
            assert _same(ours[name], t), name
    # the drafter stays bf16 unless asked (quantization.drafter)
    d = load_file(out / "drafter" / "rank0.safetensors")
    assert d["transformer.layers.0.attention.kv.weight"].dtype == torch.bfloat16
    assert read_config(out / "drafter")["quantization"]["quant_algo"] is None


@pytest.mark.parametrize("fmt,gpu", [("fp8", "h100-sxm"), ("nvfp4", "b200")])
def test_pytorch_backend_gets_modelopt_hf_export(tmp_path, bf16_pair, fmt, gpu):
    """The HF export is a function of calibration.json alone, whichever ModelOpt wrote it (0.37, TensorRT-LLM
    1.2.1's pin, or current: compat.py makes the older one's KV scales and exclude list equal)."""
    _modelopt()
    from trtllm_dflash.quantize.calibrate import shared_input_groups
    from trtllm_dflash.reference import load_drafter

    target, drafter = bf16_pair
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, tp=2, fmt="bf16", gpu=gpu,
                                      backend="pytorch",
                                      quantization={"target_weights": fmt, "activations": fmt, "kv_cache": "fp8"}))
    out = quantize(recipe, converted(recipe, tmp_path / "c"), tmp_path / "q", **CALIB)
    check_files(out, Manifest.read(out))
    hf_quant = json.loads((out / "target" / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == fmt.upper() and hf_quant["kv_cache_quant_algo"] == "FP8"
    assert hf_quant["exclude_modules"] == ["lm_head", "model.embed_tokens"]
    assert read_config(out / "target")["quantization_config"]["quant_method"] == "modelopt"
    # every exported scale is rebuilt from the recorded amaxes by our formats
    calib = json.loads((out / "calibration.json").read_text())["target"]
    tensors = load_file(out / "target" / "model.safetensors")
    source = load_file(target / "model.safetensors")
    assert len(calib["linears"]) == 4 * 7
    for group in shared_input_groups(sorted(calib["linears"])):
        amax = {n: calib["linears"][n] for n in group}
        for name in group:
            w = source[f"{name}.weight"]
            if fmt == "fp8":
                q = F.quantize_fp8(w, F.fp8_scale(amax[name]["weight"]))
                expected = {"weight": q.data, "weight_scale": q.scale, "input_scale": F.fp8_scale(amax[name]["input"])}
            else:  # fused layers share one global scale (the largest member's amax)
                g = F.nvfp4_global_scale(torch.tensor(max(a["weight"] for a in amax.values())))
                q = F.quantize_nvfp4(w, g)
                expected = {"weight": q.data, "weight_scale": q.block_scale, "weight_scale_2": q.global_scale,
                            "input_scale": F.nvfp4_global_scale(torch.tensor(max(a["input"] for a in amax.values())))}
            for suffix, t in expected.items():
                assert _same(t.reshape(tensors[f"{name}.{suffix}"].shape),
                             tensors[f"{name}.{suffix}"]), f"{name}.{suffix}"
    for layer, kv in calib["kv"].items():  # FP8 KV: amax / 448, not clamped to 1 (ModelOpt <= 0.42 clamped)
        for k in ("k", "v"):
            scale = tensors[f"model.layers.{layer}.self_attn.{k}_proj.{k}_scale"]
            assert torch.equal(scale, (torch.tensor(kv[k], dtype=torch.float32) / 448).reshape(scale.shape))
    d = load_drafter(out / "drafter", dtype=torch.bfloat16)
    assert torch.equal(d.layers[1].mlp.down_proj.weight,
                       load_file(drafter / "model.safetensors")["layers.1.mlp.down_proj.weight"])


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_reference_backend_weight_only_target_and_drafter(tmp_path, tiny_pair, fmt):
    _modelopt()
    target, drafter = tiny_pair
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, tp=2, fmt=fmt, drafter_fmt=fmt))
    out = quantize(recipe, converted(recipe, tmp_path / "c"), tmp_path / "q", **CALIB)
    for role in ("target", "drafter"):
        cfg = read_config(out / role)
        assert cfg["quantization"]["quant_algo"] == fmt.upper() and cfg["quantization"]["weight_only"] is True
        assert cfg["dtype"] == "float32"
        shard = load_file(out / role / "rank1.safetensors")
        assert not any(k.endswith("activation_scaling_factor") for k in shard)
    # rank 1's share of o_proj (row-parallel): dequantize, compare with the source within the bound
    src = load_file(target / "model.safetensors")["model.layers.3.self_attn.o_proj.weight"][:, 32:]
    shard = load_file(out / "target" / "rank1.safetensors")
    p = "transformer.layers.3.attention.dense."
    if fmt == "fp8":
        scale = shard[p + "weights_scaling_factor"].reshape(())
        deq, bound = F.dequantize_fp8(shard[p + "weight"], scale), F.fp8_error_bound(src, scale, fp32_quotient=True)
    else:
        bs, g = shard[p + "weights_scaling_factor"], shard[p + "weights_scaling_factor_2"]
        deq, bound = F.dequantize_nvfp4(shard[p + "weight"], bs, g), F.nvfp4_error_bound(src, bs, g)
    assert bool(((deq - src).abs() <= bound).all())
    # the drafter was calibrated in the reference loop: every linear has an input amax
    calib = json.loads((out / "calibration.json").read_text())["drafter"]
    calibrated = {n for n, a in calib["linears"].items() if a["input"] is not None}
    assert calibrated >= {"fc", "layers.0.self_attn.k_proj", "layers.1.mlp.down_proj"}
    assert sorted(calib["kv"]) == ["0", "1"]


def test_bad_requests_fail_before_calibrating(tmp_path, tiny_pair, capsys, monkeypatch):
    import trtllm_dflash.quantize.calibration as calibration_module
    from trtllm_dflash.cli import main

    def calibrating(*a, **k):
        raise AssertionError("calibrated before the problem was found")

    target, drafter = tiny_pair
    assert main(["quantize", str(write_recipe(tmp_path / "a.yaml", target, drafter)), "--from", str(tmp_path / "c"),
                 "--out", str(tmp_path / "q")]) == 2
    assert "nothing to quantize (run `convert`)" in capsys.readouterr().err
    engine = write_recipe(tmp_path / "b.yaml", target, drafter, fmt="bf16", gpu="h100-sxm", backend="engine",
                          quantization={"target_weights": "fp8", "activations": "bf16"})
    with pytest.raises(UserError,
                       match="quantization.activations: bf16 with fp8 quantization.target_weights on the engine "
                             "backend"):
        quantize(load_recipe(engine), tmp_path / "c", tmp_path / "q", **CALIB)
    wide = make_target(tmp_path / "t96", intermediate_size=96)
    r = write_recipe(tmp_path / "c.yaml", wide, drafter, tp=4, fmt="nvfp4")
    c4 = converted(load_recipe(r), tmp_path / "c4")
    # the misaligned tensor comes after aligned ones in its plan: every tensor is checked, not the first
    monkeypatch.setattr(calibration_module, "calibrate_target", calibrating)
    with pytest.raises(UserError,
                       match=r"transformer.layers.0.mlp.proj.weight: 24 input features per rank \(tp 4\) is not a "
                             r"multiple of 16"):
        quantize(load_recipe(r), c4, tmp_path / "q", **CALIB)
    monkeypatch.undo()
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "notes.txt").write_text("someone else's")
    with pytest.raises(UserError, match="exists and is not a trtllm-dflash output"):
        fp8 = load_recipe(write_recipe(tmp_path / "d.yaml", target, drafter, fmt="fp8"))
        quantize(fp8, converted(fp8, tmp_path / "c8"), tmp_path / "q", **CALIB)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".q")] == []


def test_an_fp8_kv_cache_alone_runs_quantize_and_reaches_the_engine_checkpoint(tmp_path, bf16_pair):
    """bf16 weights + FP8 KV: the quantize stage runs (convert writes no KV scales, and a TensorRT-LLM
    checkpoint without kv_cache_quant_algo builds no FP8 KV cache, which build then refuses)."""
    _modelopt()
    from trtllm_dflash.recipe.stages import stages_for

    target, drafter = bf16_pair
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, fmt="bf16", gpu="h100-sxm",
                                      backend="engine",
                                      quantization={"kv_cache": "fp8"}))
    assert "quantize" in stages_for(recipe)
    c = converted(recipe, tmp_path / "c")
    out = quantize(recipe, c, tmp_path / "q", **CALIB)
    q = read_config(out / "target")["quantization"]
    assert q["quant_algo"] is None and q["kv_cache_quant_algo"] == "FP8"
    ours, source = load_file(out / "target" / "rank0.safetensors"), load_file(c / "target" / "rank0.safetensors")
    w = "transformer.layers.0.attention.qkv.weight"
    assert ours[w].dtype == torch.bfloat16 and torch.equal(ours[w], source[w])  # weights untouched
    assert any(k.endswith("kv_cache_scaling_factor") for k in ours)


def test_the_mxfp4_stand_in_decodes_through_transformers(tmp_path):
    """tests/helpers mxfp4_experts writes what transformers' MXFP4 loader (integrations/mxfp4.py,
    dequantize) reads back as the same weights within MXFP4's rounding: each value within half
    a step of its group's grid (step <= 2 * 2**exp, exp = ceil(log2(group amax / 6)))."""
    pytest.importorskip("accelerate", reason="transformers dequantizes MXFP4 with accelerate")
    import shutil

    from transformers import AutoModelForCausalLM, Mxfp4Config

    from checkpoints import mxfp4_experts

    src = make_target(tmp_path / "t", "gpt_oss")
    shutil.copytree(src, tmp_path / "mx")
    mxfp4_experts(tmp_path / "mx")
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.float32,
                                               quantization_config=Mxfp4Config(dequantize=True))
    for layer in range(4):
        for proj in ("gate_up_proj", "down_proj"):
            w = getattr(ref.model.layers[layer].mlp.experts, proj).detach().transpose(1, 2)  # [E, rows, cols]
            d = getattr(got.model.layers[layer].mlp.experts, proj).detach().transpose(1, 2)
            step = 2.0 ** torch.ceil(torch.log2(w.reshape(*w.shape[:2], -1, 32).abs().amax(-1) / 6)) * 2  # [E, rows, G]
            err = (w - d).abs().reshape(*w.shape[:2], -1, 32).amax(-1)
            assert (err <= step / 2 + 1e-7).all() and (err > 0).any(), (layer, proj)


@pytest.mark.parametrize("fmt,gpu,source", [("nvfp4", "b300", "mxfp4"), ("fp8", "h100-sxm", "bf16")])
def test_pytorch_backend_quantizes_gpt_oss_experts(tmp_path, fmt, gpu, source):
    """gpt-oss through ModelOpt's HF export: the MoE experts (fused 3-D weights) quantized like
    the linears, their scales the recorded amaxes'; a checkpoint with MXFP4 experts (as gpt-oss
    ships) is dequantized first, and nothing of MXFP4 reaches the export."""
    _modelopt()
    pytest.importorskip("accelerate",
                        reason="transformers dequantizes MXFP4 with accelerate (pip install 'trtllm_dflash[quant]')")
    from checkpoints import mxfp4_experts

    target = make_target(tmp_path / "t", "gpt_oss", dtype=torch.bfloat16)
    if source == "mxfp4":
        mxfp4_experts(target)
    drafter = make_drafter(tmp_path / "d", dtype=torch.bfloat16)
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, tp=2, fmt="bf16", gpu=gpu,
                                      backend="pytorch",
                                      quantization={"target_weights": fmt, "activations": fmt, "kv_cache": "fp8"}))
    convert_dir = converted(recipe, tmp_path / "c")
    assert Manifest.read(convert_dir).extra["source_quantization"] == (None if source == "bf16" else "mxfp4")
    out = quantize(recipe, convert_dir, tmp_path / "q", **CALIB)
    check_files(out, Manifest.read(out))
    hf_quant = json.loads((out / "target" / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == fmt.upper() and hf_quant["kv_cache_quant_algo"] == "FP8"
    assert "model.layers.0.mlp.router" in hf_quant["exclude_modules"]
    assert read_config(out / "target")["quantization_config"]["quant_method"] == "modelopt"
    tensors = load_file(out / "target" / "model.safetensors")
    assert not [n for n in tensors if n.endswith(("_blocks", "_scales"))]
    calib = json.loads((out / "calibration.json").read_text())["target"]["linears"]
    for layer in range(4):
        for proj in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            amax = torch.tensor(calib[name]["weight"])
            if fmt == "nvfp4":
                assert tensors[name].dtype == torch.uint8
                assert torch.equal(tensors[f"{name}_weight_scale_2"], F.nvfp4_global_scale(amax).reshape(()))
            else:
                assert tensors[name].dtype == torch.float8_e4m3fn
                assert torch.equal(tensors[f"{name}_weight_scale"].reshape(()), F.fp8_scale(amax.item()).reshape(()))
