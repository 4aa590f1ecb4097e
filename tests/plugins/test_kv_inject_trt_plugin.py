"""The TensorRT plugin without TensorRT: its pure functions, and the AOT path end to end
against a stand-in `tensorrt.plugin` (TensorRT does not install on a CPU-only machine).

The stand-in only records what the plugin hands to TensorRT. It checks the parts of the
real API that a mistake would break only on a GPU box: the aot_impl signature schema that
TensorRT 10.14's `_validate_aot_impl` enforces ("(inputs..., attrs..., outputs, tactic)"),
the attribute types, `add_plugin(..., aot=True)`, and the PTX, grid and int32 arguments.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from trtllm_dflash.plugins.kv_inject_attention import trt_plugin
from trtllm_dflash.plugins.kv_inject_attention.checks import KVInjectArgumentError, TensorMeta


class FakeEnum:
    def __init__(self, name):
        self.name = name


class FakeExpr:
    """A tensorrt.plugin ShapeExpr: fake (dtype-inference phase), constant, or symbolic."""

    def __init__(self, value=None, fake=False):
        self.value, self.is_fake = value, fake

    @property
    def is_constant(self):
        return self.value is not None

    def constant_value(self):
        return self.value


class FakeDesc:
    def __init__(self, dims, dtype, fake=False):
        self.shape_expr = [FakeExpr(d, fake) for d in dims]
        self.dtype = FakeEnum(dtype)


def test_dtype_name():
    assert [trt_plugin.dtype_name(FakeEnum(n)) for n in ("HALF", "BF16", "FLOAT", "FP8", "INT32")] == \
        ["float16", "bfloat16", "float32", "float8_e4m3fn", "int32"]


def test_desc_meta_keeps_constants_only():
    assert trt_plugin.desc_meta(FakeDesc([None, 16, 8, 128], "HALF")) == TensorMeta((None, 16, 8, 128), "float16")
    assert trt_plugin.desc_meta(FakeDesc([4, 16], "BF16", fake=True)) == TensorMeta((None, None), "bfloat16")


def plugin_metas(dtype="float16", cache_dtype="float16", scale_len=1, D=128):
    return [TensorMeta((None, 16, 8, D), dtype), TensorMeta((None, 16, 2, D), dtype),
            TensorMeta((None, 16, 2, D), dtype), TensorMeta((None, None, 2, D), cache_dtype),
            TensorMeta((None, None, 2, D), cache_dtype), TensorMeta((None,), "int32"),
            TensorMeta((scale_len,), "float32"), TensorMeta((scale_len,), "float32")]


def test_plugin_problem():
    p = trt_plugin.plugin_problem(plugin_metas(), 0.1, True, 0)
    assert (p.group_size, p.window, p.kv_scale_per_head, p.causal_block) == (4, None, None, True)
    p = trt_plugin.plugin_problem(plugin_metas("bfloat16", "float8_e4m3fn", 2), 0.1, False, 2048)
    assert (p.window, p.kv_scale_per_head, p.cache_dtype) == (2048, True, "float8_e4m3fn")
    with pytest.raises(KVInjectArgumentError, match="window attribute = -1"):
        trt_plugin.plugin_problem(plugin_metas(), 0.1, False, -1)
    bad = plugin_metas()
    bad[6] = TensorMeta((1,), "float16")
    with pytest.raises(KVInjectArgumentError, match="k_scale"):
        trt_plugin.plugin_problem(bad, 0.1, False, 0)
    bad = plugin_metas()
    bad[1] = TensorMeta((None, 16, 3, 128), "float16")
    with pytest.raises(KVInjectArgumentError, match="Hkv = 3"):
        trt_plugin.plugin_problem(bad, 0.1, False, 0)


def test_scalar_args_are_the_torch_launchers_arguments():
    """For packed tensors the AOT formulas give exactly what the torch launcher passes."""
    B, T, S, Hq, Hkv, D = 3, 5, 40, 8, 2, 64
    q, out = torch.empty(B, T, Hq, D), torch.empty(B, T, Hq, D)
    kb, vb = torch.empty(B, T, Hkv, D), torch.empty(B, T, Hkv, D)
    kc, vc = torch.empty(B, S, Hkv, D), torch.empty(B, S, Hkv, D)
    for per_head in (False, True):
        launcher_args = [T, S, Hkv, int(per_head), *q.stride()[:3], *kb.stride()[:3], *vb.stride()[:3],
                         *kc.stride()[:3], *vc.stride()[:3], *out.stride()[:3]]
        assert trt_plugin.scalar_args(B, T, S, Hq, Hkv, D, per_head) == launcher_args


# Runs in a fresh interpreter without TRITON_INTERPRET (PTX compilation needs the real
# @triton.jit functions) and with a stand-in `tensorrt` package.
AOT_SCRIPT = r"""
import inspect, json, sys, types, typing

class DataType:
    def __init__(self, name): self.name = name

class TensorDesc:
    def __init__(self, dims, dtype):
        self.shape_expr = [Dim(d) for d in dims]
        self.dtype = DataType(dtype)
    def like(self):
        return ("like", self)

class Dim(int):  # a constant shape expression
    is_fake = False
    is_constant = True
    def constant_value(self): return int(self)

class KernelLaunchParams:
    pass

class SymInt32:
    def __init__(self, value): self.value = int(value)

class SymIntExprs(list):
    @classmethod
    def from_tuple(cls, items): return cls(items)

registry = {}
def decorator(kind):
    def by_id(plugin_id):
        def wrap(fn):
            registry[(kind, plugin_id)] = fn
            return fn
        return wrap
    return by_id

class Op:
    def __init__(self, plugin_id): self.plugin_id = plugin_id
    def __call__(self, *tensors, **attrs): return ("plugin", self.plugin_id, tensors, attrs)

trtp = types.ModuleType("tensorrt.plugin")
trtp.TensorDesc, trtp.KernelLaunchParams, trtp.SymInt32, trtp.SymIntExprs = TensorDesc, KernelLaunchParams, SymInt32, SymIntExprs
trtp.register, trtp.aot_impl = decorator("register"), decorator("aot_impl")
trtp.cdiv = lambda a, b: -(-a // b)
trtp.op = types.SimpleNamespace(trtllm_dflash=types.SimpleNamespace(
    kv_inject_attention=Op("trtllm_dflash::kv_inject_attention"), kv_append=Op("trtllm_dflash::kv_append")))
trt = types.ModuleType("tensorrt")
trt.plugin = trtp
trt.Weights = lambda array: ("weights", array.tolist())
sys.modules["tensorrt"], sys.modules["tensorrt.plugin"] = trt, trtp

from triton.backends.compiler import GPUTarget
from trtllm_dflash.plugins.kv_inject_attention import trt_plugin
import triton

SM90 = GPUTarget("cuda", 90, 32)  # no GPU here: compile for sm_90
results = {"triton": triton.__version__, "pad": trt_plugin.triton_extra_params(SM90)}
# 1) what TensorRT would see at registration
plugins = trt_plugin.register_plugin(SM90)
assert trt_plugin.register_plugin() is plugins and plugins.padding == results["pad"]  # idempotent
def signature(kind, plugin_id):
    fn = registry[(kind, plugin_id)]
    sig = inspect.signature(fn)
    ret = sig.return_annotation
    return dict(params=list(sig.parameters),
                annotations=[getattr(p.annotation, "__name__", str(p.annotation)) for p in sig.parameters.values()],
                ret=[getattr(a, "__name__", str(a)) for a in typing.get_args(ret)], ret_tuple=typing.get_origin(ret) is tuple)
for key, pid in (("attention", "trtllm_dflash::kv_inject_attention"), ("append", "trtllm_dflash::kv_append")):
    results[key] = dict(register=signature("register", pid), aot=signature("aot_impl", pid))

# 2) build time: shape/type inference and the AOT implementations for concrete problems
B, T, S, Hq, Hkv, D, N = 4, 16, 3000, 8, 2, 64, 40
descs = [TensorDesc((B, T, Hq, D), "BF16"), TensorDesc((B, T, Hkv, D), "BF16"), TensorDesc((B, T, Hkv, D), "BF16"),
         TensorDesc((B, S, Hkv, D), "FP8"), TensorDesc((B, S, Hkv, D), "FP8"), TensorDesc((B,), "INT32"),
         TensorDesc((Hkv,), "FLOAT"), TensorDesc((Hkv,), "FLOAT")]
out = registry[("register", "trtllm_dflash::kv_inject_attention")](*descs, 0.125, True, 2048)
results["attention"]["inferred"] = [out[0][1] is descs[0], [o[1] is descs[5] for o in out[1:]]]
name, ptx, launch, extra = registry[("aot_impl", "trtllm_dflash::kv_inject_attention")](*descs, 0.125, True, 2048, out, 0)
results["attention"]["kernel"] = dict(
    name=name, num_params=trt_plugin.ptx_param_count(ptx, name), grid=[int(launch.grid_x), int(launch.grid_y)],
    block_x=launch.block_x, shared=launch.shared_mem, extra=[a.value for a in extra],
    expected_extra=trt_plugin.scalar_args(B, T, S, Hq, Hkv, D, True))
adescs = [TensorDesc((B, S, Hkv, D), "FP8"), TensorDesc((B, S, Hkv, D), "FP8"), TensorDesc((B, N, Hkv, D), "BF16"),
          TensorDesc((B, N, Hkv, D), "BF16"), TensorDesc((B,), "INT32"), TensorDesc((B,), "INT32"),
          TensorDesc((1,), "FLOAT"), TensorDesc((1,), "FLOAT")]
out = registry[("register", "trtllm_dflash::kv_append")](*adescs)
results["append"]["inferred"] = [o[1] is adescs[i] for o, i in zip(out, [0, 1, 4] + [4] * results["pad"])]
name, ptx, launch, extra = registry[("aot_impl", "trtllm_dflash::kv_append")](*adescs, out, 0)
results["append"]["kernel"] = dict(
    name=name, num_params=trt_plugin.ptx_param_count(ptx, name), grid=[int(launch.grid_x), int(launch.grid_y)],
    block_x=launch.block_x, extra=[a.value for a in extra],
    expected_extra=trt_plugin.append_scalar_args(N, S, Hkv, D, False))

# 3) network construction through the insert helpers
class ITensor:
    def __init__(self, shape, dtype): self.shape, self.dtype = shape, DataType(dtype)
class Layer:
    def __init__(self, out): self.out = out
    def get_output(self, i): return self.out
class Network:
    def __init__(self): self.calls = []
    def add_constant(self, shape, weights):
        self.calls.append(["add_constant", list(shape), weights[1]])
        return Layer(ITensor(shape, "FLOAT"))
    def add_plugin(self, plugin, aot=False):
        _, plugin_id, tensors, attrs = plugin
        self.calls.append(["add_plugin", plugin_id, len(tensors), [[k, type(v).__name__, v] for k, v in attrs.items()], aot])
        return Layer(ITensor(tensors[0].shape, "HALF"))
net = Network()
t = lambda *s: ITensor(s, "HALF")
trt_plugin.insert_kv_inject_attention(net, t(-1, 16, 8, 128), t(-1, 16, 2, 128), t(-1, 16, 2, 128), t(-1, -1, 2, 128),
                                      t(-1, -1, 2, 128), ITensor((-1,), "INT32"), causal_block=True)
trt_plugin.insert_kv_append(net, t(-1, -1, 2, 128), t(-1, -1, 2, 128), t(-1, -1, 2, 128), t(-1, -1, 2, 128),
                            ITensor((-1,), "INT32"), ITensor((-1,), "INT32"))
results["network"] = net.calls
try:
    trt_plugin.insert_kv_inject_attention(net, t(-1, 16, 8, 128), t(-1, 16, 2, 128), t(-1, 16, 2, 128),
                                          t(-1, -1, 2, 128), t(-1, -1, 2, 128), ITensor((-1,), "INT32"), window=0)
    results["bad_window"] = None
except ValueError as e:
    results["bad_window"] = str(e)
print("RESULTS " + json.dumps(results))
"""


def test_aot_plugins_end_to_end_with_stand_in_tensorrt():
    pytest.importorskip("triton", reason="triton is not installed (pip install 'trtllm_dflash[kernels]')",
                        exc_type=ImportError)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULTS ", 1)[1])
    pad = results["pad"]
    # Triton >= 3.3 appends the global and profile scratch pointers to every kernel; 3.2.0 appends none.
    assert pad == (0 if results["triton"].startswith(("3.0", "3.1", "3.2")) else 2), results["triton"]

    att, app = results["attention"], results["append"]
    inputs = list(trt_plugin.INPUT_NAMES)
    assert att["register"]["params"] == inputs + ["scale", "causal_block", "window"]
    assert att["register"]["annotations"] == ["TensorDesc"] * 8 + ["float", "bool", "int"]
    assert att["register"]["ret_tuple"] and att["register"]["ret"] == ["TensorDesc"] * (1 + pad)
    assert att["aot"]["params"] == inputs + ["scale", "causal_block", "window", "outputs", "tactic"]
    assert att["aot"]["ret_tuple"] and len(att["aot"]["ret"]) == 4
    assert att["inferred"] == [True, [True] * pad]  # out like q; padding like cache_lens
    assert app["register"]["params"] == list(trt_plugin.APPEND_INPUT_NAMES)
    assert app["register"]["ret"] == ["TensorDesc"] * (3 + pad)
    assert app["aot"]["params"] == list(trt_plugin.APPEND_INPUT_NAMES) + ["outputs", "tactic"]
    assert app["inferred"] == [True] * (3 + pad)  # k/v caches, lens, padding

    k = att["kernel"]
    assert k["name"] == "_kv_inject_attention_fwd"
    assert k["grid"] == [4 * 2, 1]  # B * Hkv programs; T * GROUP = 64 rows fit one BLOCK_M
    assert k["block_x"] % 32 == 0 and 0 < k["shared"] <= trt_plugin.MAX_STATIC_SHARED_MEM
    assert k["extra"] == k["expected_extra"] and len(k["extra"]) == 22
    # What TensorRT passes (8 inputs, 22 int32, the output, the padding outputs) is what the PTX declares.
    assert k["num_params"] == 8 + 22 + 1 + pad
    k = app["kernel"]
    assert k["name"] == "_append_context_aot" and k["grid"] == [4 * 2, 3]  # 40 new rows in tiles of 16
    assert k["extra"] == k["expected_extra"] and len(k["extra"]) == 14
    assert k["num_params"] == 8 + 14 + 3 + pad

    constant, plugin, constant2, append = results["network"]
    assert constant == constant2 == ["add_constant", [1], [1.0]]  # scale inputs for a non-FP8 cache
    assert plugin == ["add_plugin", "trtllm_dflash::kv_inject_attention", 8,
                      [["scale", "float", 1 / math.sqrt(128)], ["causal_block", "bool", True], ["window", "int", 0]], True]
    assert append == ["add_plugin", "trtllm_dflash::kv_append", 8, [], True]
    assert results["bad_window"].startswith("kv_inject_attention: window = 0")


def test_check_launch_abi_names_the_mismatch():
    compiled = trt_plugin.CompiledKernel("k", "", 4, 0, 0, num_params=33, abi_params=31)
    trt_plugin.check_launch_abi("p", compiled, 2)
    with pytest.raises(NotImplementedError, match="33 PTX parameters, but TensorRT's AOT launch passes 31"):
        trt_plugin.check_launch_abi("p", compiled, 0)


def test_append_scalar_args_are_the_torch_launchers_arguments():
    B, N, S, Hkv, D = 3, 5, 40, 2, 64
    kc, kn = torch.empty(B, S, Hkv, D), torch.empty(B, N, Hkv, D)
    assert trt_plugin.append_scalar_args(N, S, Hkv, D, True) == [Hkv, 1, *kc.stride()[:3], *kc.stride()[:3],
                                                                 *kn.stride()[:3], *kn.stride()[:3]]


def test_register_needs_tensorrt():
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            trt_plugin.register_plugin()
    else:  # a real TensorRT (GPU box): registration must succeed
        assert trt_plugin.register_plugin() is not None
