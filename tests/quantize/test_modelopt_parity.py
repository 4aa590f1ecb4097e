"""Our FP8 / NVFP4 tensors equal ModelOpt's, byte for byte.

Two levels:
- ModelOpt's tensor functions on crafted weights (zero blocks, subnormal block scales, exact
  rounding midpoints, negatives that round to zero);
- a tiny Qwen3 calibrated with `mtq.quantize` (FP8_DEFAULT_CFG / NVFP4_DEFAULT_CFG, max
  calibration on CPU) and written by `export_hf_checkpoint`, against our calibration
  (calibrate.py) and formats on the original weights: packed weights, weight_scale,
  weight_scale_2 and input_scale of every linear layer.
NVFP4's fake-quant forward needs CUDA, but its calibration and export run on CPU.
"""

import warnings

import pytest
import torch
from safetensors.torch import load_file

from checkpoints import needs_modelopt
from trtllm_dflash.compat import modelopt_nvfp4
from trtllm_dflash.formats.quant import (
    dequantize_nvfp4,
    fp8_scale,
    nvfp4_global_scale,
    quantize_fp8,
    quantize_nvfp4,
)
from trtllm_dflash.quantize.calibrate import (
    collect_linear_amax,
    group_input_amax,
    group_weight_amax,
    shared_input_groups,
)

# ModelOpt is imported by the tests that use it, not at collection (about 7 s per test process).
pytestmark = [pytest.mark.filterwarnings("ignore"), needs_modelopt]


def _crafted(dtype):
    torch.manual_seed(3)
    w = torch.randn(32, 64)
    w[0, :16] = 0  # all-zero block
    w[1, :16] = 1e-7 * torch.randn(16)  # block scale in E4M3's subnormal range / clamped
    w[2, :16] = -1e-3  # negatives that round to zero inside a block with one large value
    w[2, 0] = 4.0
    w[3] = torch.linspace(-5, 5, 64)
    w[4, 5] = 40.0  # the tensor's amax
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_tensor_functions_match_modelopt(dtype):
    w = _crafted(dtype)
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    ours = quantize_nvfp4(w)
    with modelopt_nvfp4():
        qt, bs, g = NVFP4QTensor.quantize(w, 16)
    assert torch.equal(ours.global_scale, g.reshape(()))
    assert torch.equal(ours.block_scale.view(torch.uint8), bs.view(torch.uint8))
    assert torch.equal(ours.data, qt._quantized_data)
    theirs = qt.dequantize(dtype=torch.float32, scale=bs, double_scale=g, block_sizes={-1: 16})
    assert torch.equal(dequantize_nvfp4(ours.data, ours.block_scale, ours.global_scale), theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_tensor_functions_match_modelopt(dtype):
    from modelopt.torch.export.quant_utils import to_quantized_weight

    w = _crafted(dtype)
    scale = torch.tensor(w.float().abs().max().item() / 448)
    # HF export: a 0-dim scale (quotient in the weight dtype); TensorRT-LLM export: a [1] scale (FP32)
    for ours, theirs_scale in ((quantize_fp8(w), scale), (quantize_fp8(w, fp32_quotient=True), scale.reshape(1))):
        theirs = to_quantized_weight(w, theirs_scale, "fp8")
        assert torch.equal(ours.data.view(torch.uint8), theirs.view(torch.uint8))


CONFIGS = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}


@pytest.fixture(scope="module", params=[(f, d) for f in CONFIGS for d in ("float32", "bfloat16")],
                ids=lambda p: "-".join(p))
def exported(request, tmp_path_factory):
    """(format, original weights, our amax, ModelOpt's exported tensors) for a tiny Qwen3."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fmt, dtype_name = request.param
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )
    model = Qwen3ForCausalLM(cfg).eval().to(dtype)
    model.config.architectures = ["Qwen3ForCausalLM"]  # ModelOpt's export reads it
    batches = [torch.randint(0, 256, (2, 16)) for _ in range(3)]
    ours = collect_linear_amax(model, batches)
    original = {k: v.clone() for k, v in model.state_dict().items()}

    def forward_loop(m):
        with torch.no_grad():
            for b in batches:
                m(b)

    with warnings.catch_warnings(), modelopt_nvfp4():
        warnings.simplefilter("ignore")
        mtq.quantize(model, getattr(mtq, CONFIGS[fmt]), forward_loop)
        out = tmp_path_factory.mktemp(f"modelopt-{fmt}-{dtype_name}")
        export_hf_checkpoint(model, export_dir=out, dtype=dtype)
    return fmt, original, ours, load_file(out / "model.safetensors")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in (torch.float8_e4m3fn,):
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_every_linear_equals_modelopt_export(exported):
    fmt, original, amax, theirs = exported
    layers = [n for n in amax if n.startswith("model.layers.")]
    assert len(layers) == 2 * 7
    for group in shared_input_groups(layers):
        for name in group:
            w = original[f"{name}.weight"]
            if fmt == "fp8":
                # ModelOpt's HF export keeps q/k/v scales separate for FP8 (the loader merges them)
                q = quantize_fp8(w)
                expected = {
                    "weight": q.data,
                    "weight_scale": q.scale,
                    "input_scale": fp8_scale(amax[name].input),
                }
            else:
                # fused layers share the global scale (largest member amax), as TensorRT-LLM requires
                q = quantize_nvfp4(w, nvfp4_global_scale(group_weight_amax(amax, group)))
                expected = {
                    "weight": q.data,
                    "weight_scale": q.block_scale,
                    "weight_scale_2": q.global_scale,
                    "input_scale": nvfp4_global_scale(group_input_amax(amax, group)),
                }
            for suffix, tensor in expected.items():
                got = theirs[f"{name}.{suffix}"]
                assert _same(tensor, got), (f"{name}.{suffix}: ours {tensor.dtype} {list(tensor.shape)} != ModelOpt "
                                            f"{got.dtype} {list(got.shape)}")
    # nothing quantized that we did not produce
    quantized = {k.rsplit(".", 1)[0] for k in theirs if k.endswith("weight_scale")}
    assert quantized == set(layers)
