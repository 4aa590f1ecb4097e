"""The AOT build of both plugins through TensorRT 10.14's own plugin layer, for an sm_90 target
without a GPU: kv_inject_trt_network.py builds the engine backend's draft-layer plugin pair for
fp16, bf16 and an FP8 KV cache with trt_build (TensorRT's call order, trt_core stand-in) in a
subprocess without TRITON_INTERPRET (the aot_impls compile PTX with triton), and reports what
TensorRT would embed: kernel, PTX parameters, grid, block, int32 arguments, output types and
shapes, all expressions evaluated for two concrete profiles. Six triton compiles (cached by
triton across runs).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kv_inject_trt_network import CASES, HKV, HQ, PROFILES, D
from trtllm_dflash.plugins.kv_inject_attention import plugin_spec, ptx
from trtllm_dflash.plugins.kv_inject_attention.checks import TensorMeta

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
GROUP = HQ // HKV


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("triton", reason="triton is not installed (pip install 'trtllm_dflash[kernels]')",
                        exc_type=ImportError)
    import trt_plugin_layer

    trt_plugin_layer.require()  # download here, so that a failure fails (or skips) with its reason
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HELPERS), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(HELPERS / "kv_inject_trt_network.py")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("REPORT ", 1)[1])


def _block_m() -> int:
    """BLOCK_M the attention kernel is compiled for when T is dynamic (kernel.tile_config)."""
    from trtllm_dflash.plugins.kv_inject_attention import kernel

    metas = [TensorMeta((None, None, h, D), "float16") for h in (HQ, HKV, HKV, HKV, HKV)]
    problem = plugin_spec.plugin_problem(metas + [TensorMeta((None,), "int32")] + [TensorMeta((1,), "float32")] * 2,
                                        0.125, True, 0)
    return kernel.tile_config(problem)["BLOCK_M"]


def test_padding_matches_triton(report):
    # Triton >= 3.3 appends the global and profile scratch pointers to every kernel; 3.2.0 none.
    assert report["pad"] == (0 if report["triton"].startswith(("3.0", "3.1", "3.2")) else 2), report["triton"]


@pytest.mark.parametrize("name", list(CASES))
def test_attention_aot(report, name):
    got, case, pad = report["cases"][name]["attention"], CASES[name], report["pad"]
    assert got["types"] == [case.act] + ["INT32"] * pad
    assert got["kernel"] == "_kv_inject_attention_fwd" and got["ptx_target"] == ["sm_90a"]  # GPUTarget("cuda", 90, 32)
    assert got["ptx_params"] == 8 + 22 + 1 + pad  # inputs, int32 args, out, padding: TensorRT's argument list
    block_m = _block_m()
    for key, p in PROFILES.items():
        B, T, S = p["B"], p["T"], p["S"]
        assert got["shapes"][key] == [[B, T, HQ, D]] + [[B]] * pad
        launch = got["launch"][key]
        assert launch["grid_x"] == B * HKV and launch["grid_z"] == 1
        rows = T * GROUP  # (t, head in group) rows, BLOCK_M per program
        assert (launch["grid_y"] - 1) * block_m < rows <= launch["grid_y"] * block_m
        assert launch["block_x"] % 32 == 0 and launch["block_y"] == launch["block_z"] == 1
        assert 0 < launch["shared_mem"] <= ptx.MAX_STATIC_SHARED_MEM
        q, kb, kc = torch.empty(B, T, HQ, D), torch.empty(B, T, HKV, D), torch.empty(B, S, HKV, D)
        per_head = int(case.scale_len == HKV)
        strides = [*q.stride()[:3], *kb.stride()[:3], *kb.stride()[:3], *kc.stride()[:3], *kc.stride()[:3],
                   *q.stride()[:3]]  # q, k_block, v_block, k_cache, v_cache, out (the kernel's order)
        assert got["extra"][key] == [T, S, HKV, per_head, *strides]


@pytest.mark.parametrize("name", list(CASES))
def test_append_aot(report, name):
    got, case, pad = report["cases"][name]["append"], CASES[name], report["pad"]
    assert got["types"] == [case.cache, case.cache, "INT32"] + ["INT32"] * pad
    assert got["kernel"] == "_append_context_aot" and got["ptx_target"] == ["sm_90a"]  # GPUTarget("cuda", 90, 32)
    assert got["ptx_params"] == 8 + 14 + 3 + pad
    for key, p in PROFILES.items():
        B, S, N = p["B"], p["S"], p["N"]
        assert got["shapes"][key] == [[B, S, HKV, D]] * 2 + [[B]] * (1 + pad)
        launch = got["launch"][key]
        blocks = -(-N // plugin_spec.APPEND_BLOCK_N)  # new rows in tiles of APPEND_BLOCK_N
        assert (launch["grid_x"], launch["grid_y"], launch["grid_z"]) == (B * HKV, blocks, 1)
        assert launch["block_x"] == 4 * 32  # compile_append_kernel: 4 warps
        kc, kn = torch.empty(B, S, HKV, D), torch.empty(B, N, HKV, D)
        per_head = int(case.scale_len == HKV)
        assert got["extra"][key] == [HKV, per_head, *kc.stride()[:3], *kc.stride()[:3], *kn.stride()[:3],
                                     *kn.stride()[:3]]

