"""One draft layer's plugin pair, built the way the engine backend builds it, on TensorRT's own
plugin layer (trt_plugin_layer.installed()) and our stand-in network (trt_core).

As in engines/ops_trtllm.py: the context cache and the step's new rows go through
trtllm_dflash::kv_append; the attention reads the same cache inputs with the append's lens_out
as its cache lengths. B, T (block), S_max and N (new rows) are dynamic; Hq, Hkv, D static.

`python kv_inject_trt_network.py` (no TRITON_INTERPRET: the AOT impls compile PTX) builds the
network for every case, builds both plugin layers with trt_build and prints one JSON report line,
"REPORT {...}": per case and plugin, the output types, output shapes, launch grid and int32
arguments evaluated for PROFILES, and the kernel name, PTX target and parameter count.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

import numpy as np

HQ, HKV, D = 8, 2, 64
# Padding outputs the in-process tests register with: what triton >= 3.3 appends (global and
# profile scratch). In-process tests run under the Triton interpreter and compile nothing, so
# triton_extra_params (a PTX compile) is replaced by this value there (tests/plugins/conftest.py).
PAD = 2
WINDOW = 12  # a sliding layer: causal block, window
# Concrete shapes the symbolic expressions are evaluated for (B, T, S_max, N).
PROFILES = {"a": dict(B=3, T=16, S=40, N=5), "b": dict(B=1, T=7, S=64, N=20)}


@dataclass(frozen=True)
class Case:
    act: str  # DataType member of q / k_block / v_block / k_new / v_new
    cache: str  # DataType member of the caches
    scale_len: int  # 0: no scale inputs given (non-FP8 cache), 1 per tensor, HKV per KV head


CASES = {"fp16": Case("HALF", "HALF", 0), "bf16": Case("BF16", "BF16", 0), "fp8-kv": Case("BF16", "FP8", HKV)}


def _inputs(trt, net, case: Case) -> dict:
    act, cache = trt.DataType[case.act], trt.DataType[case.cache]
    shapes = dict(q=(HQ, act), k_block=(HKV, act), v_block=(HKV, act), k_new=(HKV, act), v_new=(HKV, act),
                  k_cache=(HKV, cache), v_cache=(HKV, cache))
    t = {name: net.add_input(name, dtype, (-1, -1, heads, D)) for name, (heads, dtype) in shapes.items()}
    t["cache_lens"] = net.add_input("cache_lens", trt.DataType.INT32, (-1,))
    t["new_lens"] = net.add_input("new_lens", trt.DataType.INT32, (-1,))
    if case.scale_len:
        ones = np.full(case.scale_len, 0.5, dtype=np.float32)
        t["k_scale"] = net.add_constant((case.scale_len,), trt.Weights(ones)).get_output(0)
        t["v_scale"] = net.add_constant((case.scale_len,), trt.Weights(ones)).get_output(0)
    return t


def drafter_layer(trt, case: Case, t=None):
    """(network, append layer, attention layer); `t` overrides input tensors (malformed networks)."""
    from trtllm_dflash.plugins.kv_inject_attention import trt_plugin

    net = trt.INetworkDefinition()
    t = {**_inputs(trt, net, case), **(t(trt, net) if t else {})}
    scales = dict(k_scale=t.get("k_scale"), v_scale=t.get("v_scale"))
    append = trt_plugin.insert_kv_append(net, t["k_cache"], t["v_cache"], t["k_new"], t["v_new"], t["cache_lens"],
                                         t["new_lens"], **scales)
    attention = trt_plugin.insert_kv_inject_attention(
        net, t["q"], t["k_block"], t["v_block"], t["k_cache"], t["v_cache"], append.get_output(2),
        causal_block=True, window=WINDOW, **scales)
    for tensor in (attention.get_output(0), append.get_output(0), append.get_output(1)):
        net.mark_output(tensor)
    return net, append, attention


def input_shapes(B: int, T: int, S: int, N: int) -> dict:
    """Concrete shapes of the network inputs for a profile."""
    return dict(q=(B, T, HQ, D), k_block=(B, T, HKV, D), v_block=(B, T, HKV, D), k_new=(B, N, HKV, D),
                v_new=(B, N, HKV, D), k_cache=(B, S, HKV, D), v_cache=(B, S, HKV, D), cache_lens=(B,), new_lens=(B,))


def _layer_report(build, envs: dict) -> dict:
    from trt_build import evaluate
    from trtllm_dflash.plugins.kv_inject_attention import ptx

    return dict(
        types=[t.name for t in build.output_types], kernel=build.kernel_name,
        ptx_params=ptx.ptx_param_count(build.ptx.decode(), build.kernel_name),
        ptx_target=re.findall(r"^\.target\s+(\S+)", build.ptx.decode(), re.M),
        shapes={k: [evaluate(s, env) for s in build.output_shapes] for k, env in envs.items()},
        launch={k: {n: e.evaluate(env) for n, e in build.launch.items()} for k, env in envs.items()},
        extra={k: evaluate(build.extra_args, env) for k, env in envs.items()})


def report() -> dict:
    """Build every case through TensorRT's plugin layer and the AOT impls (sm_90 PTX)."""
    import triton
    from triton.backends.compiler import GPUTarget

    import trt_plugin_layer
    from trt_build import build_plugin_layer, profile_env
    from trtllm_dflash.plugins.kv_inject_attention import trt_plugin

    out = {"triton": triton.__version__, "cases": {}}
    with trt_plugin_layer.installed() as trt:
        out["pad"] = trt_plugin.register_plugin(GPUTarget("cuda", 90, 32)).padding
        for name, case in CASES.items():
            net, append, attention = drafter_layer(trt, case)
            envs = {k: profile_env(net, input_shapes(**p)) for k, p in PROFILES.items()}
            out["cases"][name] = {
                "append": _layer_report(build_plugin_layer(append, envs["a"]), envs),
                "attention": _layer_report(build_plugin_layer(attention, envs["a"]), envs)}
    return out


if __name__ == "__main__":
    sys.stdout.write("REPORT " + json.dumps(report()) + "\n")
