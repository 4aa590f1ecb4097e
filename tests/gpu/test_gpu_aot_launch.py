"""The PTX the AOT plugins hand to TensorRT, launched the way TensorRT launches it, without TensorRT:
compiled for this GPU by ptx.compile_*_kernel (the plugin's problem as an engine sees it:
batch, block and arena length dynamic), loaded with the CUDA driver (cuda-python, else cupy) and
launched with exactly TensorRT's argument list (input pointers, the aot_impl's int32 args, output
pointers) plus the padding outputs that stand in for triton's trailing scratch parameters
(plugins/kv_inject_attention/README.md, "Triton version"). Results against the torch reference.
Without cuda-python and cupy the same argument list goes through triton's own launcher."""

import pytest
import torch

from aot_launch import append_launch, append_problem, attention_launch, attention_problem, ptx_launch, torch_launch
from trtllm_dflash.plugins.kv_inject_attention import append_context_reference, kv_inject_attention_reference, ptx
from trtllm_dflash.plugins.kv_inject_attention.reference import quantize_to_cache

pytestmark = pytest.mark.gpu

HQ, HKV, D, T = 32, 8, 128, 16


@pytest.fixture(scope="module")
def kernel():
    """kernel.py, imported only here: on a machine without a GPU these tests are skipped first."""
    return pytest.importorskip("trtllm_dflash.plugins.kv_inject_attention.kernel", reason="triton is not installed")


def _launch(compiled, fn, launch, padding):
    try:
        return ptx_launch(compiled, launch, padding)
    except ImportError:
        torch_launch(fn, launch)
        return "triton launcher (cuda-python and cupy missing)"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_attention_ptx_with_tensorrts_argument_list(kernel, fp8, record_property):
    g = torch.Generator(device="cuda").manual_seed(0)
    B, S = 3, 2048
    q = torch.randn(B, T, HQ, D, generator=g, device="cuda").bfloat16()
    kb, vb = (torch.randn(B, T, HKV, D, generator=g, device="cuda").bfloat16() for _ in range(2))
    kc, vc = (torch.randn(B, S, HKV, D, generator=g, device="cuda") for _ in range(2))
    scales = {}
    if fp8:
        scales = dict(k_scale=torch.full((HKV,), 0.01, device="cuda"), v_scale=torch.full((HKV,), 0.01, device="cuda"))
        # Saturating, as the plugin's own append does: on CUDA a plain .to(float8_e4m3fn) turns
        # |x| >= 480 into NaN (randn / 0.01 reaches that ~10 times in 6.3M draws; H200 run, docs/results/gpu-runs.md).
        kc, vc = quantize_to_cache(kc, scales["k_scale"]), quantize_to_cache(vc, scales["v_scale"])
    else:
        kc, vc = kc.bfloat16(), vc.bfloat16()
    lens = torch.tensor([2048, 5, 1000], dtype=torch.int32, device="cuda")
    launch = attention_launch(kernel, q, kb, vb, kc, vc, lens, dynamic=True, **scales)
    problem = attention_problem(*launch.inputs, dynamic=True)
    compiled = ptx.compile_attention_kernel(problem)
    pad = ptx.triton_extra_params()
    assert compiled.num_params == compiled.abi_params + pad == 8 + 22 + 1 + pad
    how = _launch(compiled, kernel._kv_inject_attention_fwd, launch, pad)
    record_property("launched_by", how)
    expected = kv_inject_attention_reference(q, kb, vb, kc, vc, lens, **scales)
    assert not expected.isnan().any()  # a NaN in the inputs would hide in both sides
    torch.testing.assert_close(launch.outputs[0].float(), expected.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_append_ptx_with_tensorrts_argument_list_writes_in_place(kernel, fp8, record_property):
    g = torch.Generator(device="cuda").manual_seed(1)
    B, S, N = 3, 512, 40
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kc, vc = (torch.zeros(B, S, HKV, D, device="cuda").to(dtype) for _ in range(2))
    kn, vn = (torch.randn(B, N, HKV, D, generator=g, device="cuda").bfloat16() for _ in range(2))
    lens = torch.tensor([0, 100, 472], dtype=torch.int32, device="cuda")
    new_lens = torch.tensor([40, 16, 40], dtype=torch.int32, device="cuda")
    scales = dict(k_scale=torch.full((1,), 0.01, device="cuda"), v_scale=torch.full((1,), 0.02, device="cuda")) \
        if fp8 else {}
    expected = [kc.clone(), vc.clone(), lens.clone()]
    append_context_reference(*expected[:2], kn, vn, expected[2], new_lens, **scales)
    launch = append_launch(kernel, kc, vc, kn, vn, lens, new_lens, **scales)  # outputs bound to the caches
    compiled = ptx.compile_append_kernel(append_problem(*launch.inputs))
    pad = ptx.triton_extra_params()
    assert compiled.num_params == compiled.abi_params + pad == 8 + 14 + 3 + pad
    record_property("launched_by", _launch(compiled, kernel._append_context_aot, launch, pad))
    view = (lambda t: t.view(torch.uint8)) if fp8 else (lambda t: t)  # noqa: E731
    assert torch.equal(view(kc), view(expected[0])) and torch.equal(view(vc), view(expected[1]))
    assert torch.equal(launch.outputs[2], expected[2]) and lens.tolist() == [0, 100, 472]  # lens_out; input untouched
