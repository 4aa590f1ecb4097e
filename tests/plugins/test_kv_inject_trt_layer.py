"""Our TensorRT plugins on TensorRT 10.14's own plugin layer (`tensorrt.plugin` from the bindings
wheel, trt_plugin_layer.py) over the stand-in C++ classes (trt_core.py), in this process: network
construction, the dtype-inference and shape passes, and what must still fail. No PTX is compiled
here (the Triton interpreter is on in this process): test_kv_inject_trt_aot.py builds the AOT
kernels in a subprocess.
"""

import warnings

import numpy as np
import pytest

from kv_inject_trt_network import CASES, HKV, HQ, PAD, PROFILES, WINDOW, D, drafter_layer, input_shapes
from trt_build import build_plugin_layer, evaluate, profile_env
from trt_core import PluginCallbackError
from trtllm_dflash.plugins.kv_inject_attention import plugin_spec, trt_plugin
from trtllm_dflash.plugins.kv_inject_attention.checks import KVInjectArgumentError


def _outputs(layer):
    return [layer.get_output(i) for i in range(layer.num_outputs)]


@pytest.mark.parametrize("name", list(CASES))
def test_network_construction(trt, name):
    """Output types and shapes of both layers as TensorRT computes them when the layer is added:
    the descriptor functions run on fake dims (dtype inference) and on shape expressions."""
    case = CASES[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net, append, attention = drafter_layer(trt, case)
    act, cache, i32 = case.act, case.cache, "INT32"
    assert [t.dtype.name for t in _outputs(attention)] == [act] + [i32] * PAD
    assert [t.dtype.name for t in _outputs(append)] == [cache, cache, i32] + [i32] * PAD
    assert [tuple(t.shape) for t in _outputs(attention)] == [(-1, -1, HQ, D)] + [(-1,)] * PAD
    assert [tuple(t.shape) for t in _outputs(append)] == [(-1, -1, HKV, D)] * 2 + [(-1,)] * (1 + PAD)
    for p in PROFILES.values():
        env = profile_env(net, input_shapes(**p))
        B, T, S = p["B"], p["T"], p["S"]
        assert [evaluate(t._exprs, env) for t in _outputs(attention)] == [[B, T, HQ, D]] + [[B]] * PAD
        assert [evaluate(t._exprs, env) for t in _outputs(append)] == [[B, S, HKV, D]] * 2 + [[B]] * (1 + PAD)
    # NumPy >= 2.4 turns this deprecation into the TypeError that scalar attributes hit (ScaleAttr).
    assert not [w for w in caught if "ndim > 0 to a scalar" in str(w.message)]


def test_attributes_reach_the_plugin_as_registered(trt):
    """scale / window are 1-element arrays (plugin_spec.ScaleAttr), rebuilt by TensorRT's creator
    from PluginFields; the AOT plugin gets every attribute, in registration order."""
    _, _, attention = drafter_layer(trt, CASES["fp16"])
    plugin = attention.get_plugin()
    assert isinstance(plugin, trt.IPluginV3QuickAOTBuild)
    attrs = plugin.attrs
    assert list(attrs) == ["scale", "causal_block", "window"] == plugin.aot_impl_attr_names
    assert attrs["scale"].dtype == np.float64 and attrs["scale"].tolist() == [1 / np.sqrt(D)]
    assert attrs["causal_block"] is True
    assert attrs["window"].dtype == np.int32 and attrs["window"].tolist() == [WINDOW]


def test_descriptor_sees_fake_dims_then_expressions(trt):
    """TensorRT 10.14 (_plugin_class.py) calls the descriptor with fake ShapeExprs for dtype
    inference, then with shape expressions. The append descriptor used to demand static Hkv / D
    and raised in the first pass, so trtllm-build stopped at the first kv_append layer."""
    _, append, _ = drafter_layer(trt, CASES["bf16"])
    plugin, seen = append.get_plugin().clone(), []
    register = plugin.register_function

    def spy(*descs, **attrs):
        seen.append([d.shape_expr[3].is_fake for d in descs[:4]])
        return register(*descs, **attrs)

    plugin.register_function = spy
    inputs = append.inputs
    types = plugin.get_output_data_types([t.dtype for t in inputs], [len(t.shape) for t in inputs])
    plugin.get_output_shapes([trt.DimsExprs(t._exprs) for t in inputs], [], trt.IExprBuilder())
    assert seen == [[True] * 4, [False] * 4]
    assert [t.name for t in types] == ["BF16", "BF16", "INT32"] + ["INT32"] * PAD


def _scale_constant(trt, net, dtype=np.float32, length=1):
    return net.add_constant((length,), trt.Weights(np.ones(length, dtype=dtype))).get_output(0)


def _direct_attention(trt, net, k_block, v_block, k_scale):
    """The attention layer added without insert_kv_inject_attention's own checks."""
    act = trt.DataType.HALF
    q = net.add_input("q", act, (-1, -1, HQ, D))
    caches = [net.add_input(n, act, (-1, -1, HKV, D)) for n in ("k_cache", "v_cache")]
    lens = net.add_input("cache_lens", trt.DataType.INT32, (-1,))
    op = trt_plugin.register_plugin().attention
    return net.add_plugin(op(q, k_block, v_block, *caches, lens, k_scale, k_scale,
                             **plugin_spec.attention_attrs(0.125, False, None)), aot=True)


def test_wrong_hkv_fails_with_our_message(trt):
    """A k_block with 3 KV heads for 8 query heads: our insert helper refuses it; added directly,
    TensorRT's shape pass does (dims are fake in the dtype pass, so that one passes)."""
    def bad(trt, net):
        return {n: net.add_input(n, trt.DataType.HALF, (-1, -1, 3, D)) for n in ("k_block", "v_block")}
    with pytest.raises(KVInjectArgumentError, match="Hq = 8 heads, not a multiple of Hkv = 3"):
        drafter_layer(trt, CASES["fp16"], t=bad)
    net = trt.INetworkDefinition()
    blocks = bad(trt, net)
    with pytest.raises(PluginCallbackError) as info:
        _direct_attention(trt, net, blocks["k_block"], blocks["v_block"], _scale_constant(trt, net))
    assert info.value.method == "get_output_shapes" and isinstance(info.value.error, KVInjectArgumentError)
    assert "not a multiple of Hkv = 3" in str(info.value.error)


def test_wrong_scale_dtype_fails_with_our_message(trt):
    """float16 scales: refused by the insert helper, and by TensorRT's dtype-inference pass."""
    def bad(trt, net):
        return {n: _scale_constant(trt, net, np.float16) for n in ("k_scale", "v_scale")}
    with pytest.raises(KVInjectArgumentError, match="k_scale must be float32, got float16"):
        drafter_layer(trt, CASES["fp8-kv"], t=bad)
    net = trt.INetworkDefinition()
    blocks = [net.add_input(n, trt.DataType.HALF, (-1, -1, HKV, D)) for n in ("k_block", "v_block")]
    with pytest.raises(PluginCallbackError) as info:
        _direct_attention(trt, net, *blocks, _scale_constant(trt, net, np.float16))
    assert info.value.method == "get_output_data_types"
    assert "plugin input k_scale must be a float32 [1] or [Hkv] tensor" in str(info.value.error)


def test_dynamic_fp8_scale_is_refused(trt):
    """A [-1] scale could be per tensor or per KV head: the FP8 kernel must know which."""
    def dyn(trt, net):
        return {n: net.add_input(n, trt.DataType.FLOAT, (-1,)) for n in ("k_scale", "v_scale")}
    with pytest.raises(KVInjectArgumentError, match=r"k_scale has a dynamic shape \(None,\)"):
        drafter_layer(trt, CASES["fp8-kv"], t=dyn)
    net = trt.INetworkDefinition()
    act, fp8 = trt.DataType.BF16, trt.DataType.FP8
    q = net.add_input("q", act, (-1, -1, HQ, D))
    blocks = [net.add_input(n, act, (-1, -1, HKV, D)) for n in ("k_block", "v_block")]
    caches = [net.add_input(n, fp8, (-1, -1, HKV, D)) for n in ("k_cache", "v_cache")]
    lens = net.add_input("cache_lens", trt.DataType.INT32, (-1,))
    scale = net.add_input("k_scale", trt.DataType.FLOAT, (-1,))
    layer = net.add_plugin(trt_plugin.register_plugin().attention(
        q, *blocks, *caches, lens, scale, scale, **plugin_spec.attention_attrs(0.125, False, None)), aot=True)
    shapes = {**input_shapes(B=2, T=4, S=8, N=1), "k_scale": (HKV,)}
    with pytest.raises(PluginCallbackError, match="k_scale has a dynamic shape") as info:
        build_plugin_layer(layer, profile_env(net, shapes))
    assert info.value.method == "get_launch_params"  # the aot_impl, before any compile


def test_unsupported_head_dim_fails_before_compiling(trt):
    """D = 96 (no kernel): the append's descriptor accepts it (shapes are fine), its insert helper
    and its AOT impl refuse it with the kernel's rule (checks.append_kernel_unsupported_reason)."""
    def d96(trt, net):
        return {n: net.add_input(n, trt.DataType.HALF, (-1, -1, HKV, 96))
                for n in ("k_cache", "v_cache", "k_new", "v_new")}
    with pytest.raises(KVInjectArgumentError, match=r"kv_append: head dim D = 96 is not supported"):
        drafter_layer(trt, CASES["fp16"], t=d96)
    net = trt.INetworkDefinition()
    t = {**d96(trt, net), **{n: net.add_input(n, trt.DataType.INT32, (-1,)) for n in ("cache_lens", "new_lens")}}
    one = _scale_constant(trt, net)
    layer = net.add_plugin(trt_plugin.register_plugin().append(
        t["k_cache"], t["v_cache"], t["k_new"], t["v_new"], t["cache_lens"], t["new_lens"], one, one), aot=True)
    shapes = {"k_cache": (2, 8, HKV, 96), "v_cache": (2, 8, HKV, 96), "k_new": (2, 3, HKV, 96),
              "v_new": (2, 3, HKV, 96), "cache_lens": (2,), "new_lens": (2,)}
    with pytest.raises(PluginCallbackError, match="head dim D = 96 is not supported") as info:
        build_plugin_layer(layer, profile_env(net, shapes))
    assert info.value.method == "get_launch_params"


def test_attribute_arrays_must_hold_one_value(trt):
    """Attributes handed to trtp.op directly: a 2-element scale is refused by name."""
    net = trt.INetworkDefinition()
    blocks = [net.add_input(n, trt.DataType.HALF, (-1, -1, HKV, D)) for n in ("k_block", "v_block")]
    attrs = {**plugin_spec.attention_attrs(0.125, False, None), "scale": np.array([0.1, 0.2])}
    q = net.add_input("q", trt.DataType.HALF, (-1, -1, HQ, D))
    caches = [net.add_input(n, trt.DataType.HALF, (-1, -1, HKV, D)) for n in ("k_cache", "v_cache")]
    one = _scale_constant(trt, net)
    lens = net.add_input("cache_lens", trt.DataType.INT32, (-1,))
    with pytest.raises(PluginCallbackError, match=r"attribute scale must be a 1-element array, got shape \(2,\)"):
        net.add_plugin(trt_plugin.register_plugin().attention(q, *blocks, *caches, lens, one, one, **attrs), aot=True)
