"""The TensorRT plugins' pure functions: plugin_spec.py (descriptor -> TensorMeta, the plugin
checks, the int32 argument formulas) and ptx.py (the launch ABI check). The plugins on TensorRT's
own plugin layer: test_kv_inject_trt_layer.py (network construction) and test_kv_inject_trt_aot.py
(AOT build).
"""

import numpy as np
import pytest
import torch

from trtllm_dflash.plugins.kv_inject_attention import plugin_spec, ptx, trt_plugin
from trtllm_dflash.plugins.kv_inject_attention.checks import KVInjectArgumentError, TensorMeta


def test_dtype_name(trt):
    names = {d: plugin_spec.dtype_name(d) for d in trt.DataType}
    assert [names[trt.DataType[n]] for n in ("HALF", "BF16", "FLOAT", "FP8", "INT32")] == \
        ["float16", "bfloat16", "float32", "float8_e4m3fn", "int32"]


def test_desc_meta_keeps_constants_only(trt):
    """tensorrt.plugin TensorDescs as the descriptor function gets them (TensorRT 10.14
    _plugin_class.py): fake ShapeExprs for dtype inference, then constant or symbolic ones."""
    from tensorrt import plugin as trtp
    from tensorrt.plugin import _tensor

    import trt_core

    fake = trtp.TensorDesc(trtp.ShapeExprs(4, _is_dummy=True), trt.DataType.BF16)
    assert plugin_spec.desc_meta(fake) == TensorMeta((None,) * 4, "bfloat16")
    _tensor.SymIntExpr._exprBuilder = builder = trt.IExprBuilder()
    exprs = [trt_core.symbol("q.0"), builder.constant(16), builder.constant(8), builder.constant(128)]
    shape = trtp.ShapeExprs.from_tuple([trtp.ShapeExpr(e) for e in exprs])
    assert plugin_spec.desc_meta(trtp.TensorDesc(shape, trt.DataType.HALF)) == TensorMeta((None, 16, 8, 128), "float16")


def plugin_metas(dtype="float16", cache_dtype="float16", scale_len=1, D=128):
    return [TensorMeta((None, 16, 8, D), dtype), TensorMeta((None, 16, 2, D), dtype),
            TensorMeta((None, 16, 2, D), dtype), TensorMeta((None, None, 2, D), cache_dtype),
            TensorMeta((None, None, 2, D), cache_dtype), TensorMeta((None,), "int32"),
            TensorMeta((scale_len,), "float32"), TensorMeta((scale_len,), "float32")]


def test_plugin_problem():
    p = plugin_spec.plugin_problem(plugin_metas(), 0.1, True, 0)
    assert (p.group_size, p.window, p.kv_scale_per_head, p.causal_block) == (4, None, None, True)
    p = plugin_spec.plugin_problem(plugin_metas("bfloat16", "float8_e4m3fn", 2), 0.1, False, 2048)
    assert (p.window, p.kv_scale_per_head, p.cache_dtype) == (2048, True, "float8_e4m3fn")
    with pytest.raises(KVInjectArgumentError, match="window attribute = -1"):
        plugin_spec.plugin_problem(plugin_metas(), 0.1, False, -1)
    bad = plugin_metas()
    bad[6] = TensorMeta((1,), "float16")
    with pytest.raises(KVInjectArgumentError, match="k_scale"):
        plugin_spec.plugin_problem(bad, 0.1, False, 0)
    bad = plugin_metas()
    bad[1] = TensorMeta((None, 16, 3, 128), "float16")
    with pytest.raises(KVInjectArgumentError, match="Hkv = 3"):
        plugin_spec.plugin_problem(bad, 0.1, False, 0)


def test_scalar_args_are_the_torch_launchers_arguments():
    """For packed tensors the AOT formulas give exactly what the torch launcher passes."""
    B, T, S, Hq, Hkv, D = 3, 5, 40, 8, 2, 64
    q, out = torch.empty(B, T, Hq, D), torch.empty(B, T, Hq, D)
    kb, vb = torch.empty(B, T, Hkv, D), torch.empty(B, T, Hkv, D)
    kc, vc = torch.empty(B, S, Hkv, D), torch.empty(B, S, Hkv, D)
    for per_head in (False, True):
        launcher_args = [T, S, Hkv, int(per_head), *q.stride()[:3], *kb.stride()[:3], *vb.stride()[:3],
                         *kc.stride()[:3], *vc.stride()[:3], *out.stride()[:3]]
        assert plugin_spec.scalar_args(B, T, S, Hq, Hkv, D, per_head) == launcher_args


def test_check_launch_abi_names_the_mismatch():
    compiled = ptx.CompiledKernel("k", "", 4, 0, 0, num_params=33, abi_params=31)
    ptx.check_launch_abi("p", compiled, 2)
    with pytest.raises(NotImplementedError, match="33 PTX parameters, but TensorRT's AOT launch passes 31"):
        ptx.check_launch_abi("p", compiled, 0)


def test_append_scalar_args_are_the_torch_launchers_arguments():
    B, N, S, Hkv, D = 3, 5, 40, 2, 64
    kc, kn = torch.empty(B, S, Hkv, D), torch.empty(B, N, Hkv, D)
    assert plugin_spec.append_scalar_args(N, S, Hkv, D, True) == [Hkv, 1, *kc.stride()[:3], *kc.stride()[:3],
                                                                 *kn.stride()[:3], *kn.stride()[:3]]


def test_register_needs_tensorrt():
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            trt_plugin.register_plugin()
    else:  # a real TensorRT (GPU box): registration must succeed
        assert trt_plugin.register_plugin() is not None


def append_metas(dims=(None, None, 2, 64), cache="float16", new="float16", lens="int32"):
    B, S, Hkv, D = dims
    return [TensorMeta((B, S, Hkv, D), cache), TensorMeta((B, S, Hkv, D), cache), TensorMeta((B, None, Hkv, D), new),
            TensorMeta((B, None, Hkv, D), new), TensorMeta((B,), lens), TensorMeta((B,), lens),
            TensorMeta((1,), "float32"), TensorMeta((1,), "float32")]


def test_append_plugin_problem_takes_unknown_dims():
    """TensorRT's dtype-inference pass knows only dtypes and ranks (every dim None here): the
    problem is still checked for what is known, the kernel's static needs wait for the compile."""
    p = plugin_spec.append_plugin_problem(append_metas((None,) * 4))
    assert (p.num_kv_heads, p.head_dim, p.cache_dtype) == (None, None, "float16")
    with pytest.raises(KVInjectArgumentError, match="cache_lens must be int32, got int64"):
        plugin_spec.append_plugin_problem(append_metas((None,) * 4, lens="int64"))
    with pytest.raises(KVInjectArgumentError, match="k_new has dtype bfloat16 but must match k_cache"):
        plugin_spec.append_plugin_problem(append_metas((None,) * 4, new="bfloat16"))


def test_attention_attrs_are_one_element_arrays():
    attrs = plugin_spec.attention_attrs(0.125, True, None)
    assert attrs["scale"].dtype == np.float64 and attrs["scale"].tolist() == [0.125]
    assert attrs["causal_block"] is True
    assert attrs["window"].dtype == np.int32 and attrs["window"].tolist() == [0]  # 0: no window
    assert plugin_spec.attention_attrs(0.5, False, 2048)["window"].tolist() == [2048]


def test_require_static_scales():
    plugin_spec.require_static_scales("p", TensorMeta((1,), "float32"), TensorMeta((4,), "float32"))
    with pytest.raises(KVInjectArgumentError, match=r"p: v_scale has a dynamic shape \(None,\)"):
        plugin_spec.require_static_scales("p", TensorMeta((1,), "float32"), TensorMeta((None,), "float32"))
