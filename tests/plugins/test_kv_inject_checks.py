"""Argument checks and shape/type inference (plain functions, no torch / triton / tensorrt needed).

Every bad argument must raise KVInjectArgumentError whose message names that argument.
"""

import math
from dataclasses import replace

import pytest
import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.plugins.kv_inject_attention import checks
from trtllm_dflash.plugins.kv_inject_attention.checks import KVInjectArgumentError, TensorMeta
from trtllm_dflash.plugins.kv_inject_attention.reference import (
    append_context_reference,
    kv_inject_attention_reference,
)

B, T, HQ, HKV, D, S = 2, 4, 8, 2, 64, 32


def good_metas(dtype="float16", cache_dtype=None):
    cache_dtype = cache_dtype or dtype
    return dict(
        q=TensorMeta((B, T, HQ, D), dtype),
        k_block=TensorMeta((B, T, HKV, D), dtype),
        v_block=TensorMeta((B, T, HKV, D), dtype),
        k_cache=TensorMeta((B, S, HKV, D), cache_dtype),
        v_cache=TensorMeta((B, S, HKV, D), cache_dtype),
        cache_lens=TensorMeta((B,), "int32"),
    )


def call(metas, **options):
    return checks.check_attention(*metas.values(), **options)


def test_good_call_and_inference():
    p = call(good_metas(), window=16)
    assert (p.batch, p.block_len, p.num_q_heads, p.num_kv_heads, p.head_dim, p.max_cache_len) == (B, T, HQ, HKV, D, S)
    assert p.group_size == 4 and p.window == 16 and p.kv_scale_per_head is None
    assert math.isclose(p.scale, 1 / 8)  # default 1/sqrt(D)
    assert checks.attention_output(p) == TensorMeta((B, T, HQ, D), "float16")


def test_unknown_dims_are_skipped_but_known_ones_checked():
    metas = good_metas()
    metas["q"] = TensorMeta((None, None, HQ, D), "bfloat16")
    metas["k_block"] = TensorMeta((None, None, HKV, D), "bfloat16")
    metas["v_block"] = TensorMeta((None, None, HKV, D), "bfloat16")
    metas["k_cache"] = metas["v_cache"] = TensorMeta((None, None, HKV, D), "bfloat16")
    metas["cache_lens"] = TensorMeta((None,), "int32")
    p = call(metas)
    assert checks.attention_output(p) == TensorMeta((None, None, HQ, D), "bfloat16")
    metas["k_cache"] = TensorMeta((None, None, HKV, 32), "bfloat16")
    with pytest.raises(KVInjectArgumentError, match="k_cache"):
        call(metas)


def test_fp8_cache_needs_scales_and_infers_per_head():
    metas = good_metas("bfloat16", "float8_e4m3fn")
    per_tensor, per_head = TensorMeta((1,), "float32"), TensorMeta((HKV,), "float32")
    assert call(metas, k_scale=per_tensor, v_scale=TensorMeta((), "float32")).kv_scale_per_head is False
    assert call(metas, k_scale=per_head, v_scale=per_head).kv_scale_per_head is True
    with pytest.raises(KVInjectArgumentError, match="k_scale is required"):
        call(metas)
    with pytest.raises(KVInjectArgumentError, match="k_scale and v_scale"):
        call(metas, k_scale=per_tensor, v_scale=per_head)


BAD_ATTENTION = [
    # (argument named in the error, change to the metas or options)
    ("q", dict(q=TensorMeta((B, T, HQ), "float16"))),
    ("q", dict(q=TensorMeta((B, T, HQ, D), "int8"))),
    ("q", dict(q=TensorMeta((B, 0, HQ, D), "float16"),
               k_block=TensorMeta((B, 0, HKV, D), "float16"), v_block=TensorMeta((B, 0, HKV, D), "float16"))),
    ("k_block", dict(k_block=TensorMeta((B, T, HKV, D), "float32"))),
    ("v_block", dict(v_block=TensorMeta((B, T, HKV, D), "bfloat16"))),
    ("k_block", dict(k_block=TensorMeta((B, T + 1, HKV, D), "float16"))),
    ("v_block", dict(v_block=TensorMeta((B, T, HKV, D + 1), "float16"))),
    ("q", dict(k_block=TensorMeta((B, T, 3, D), "float16"), v_block=TensorMeta((B, T, 3, D), "float16"))),
    ("k_cache", dict(k_cache=TensorMeta((B + 1, S, HKV, D), "float16"))),
    ("k_cache", dict(k_cache=TensorMeta((B, S, HKV, D), "float32"))),
    ("v_cache", dict(v_cache=TensorMeta((B, S - 1, HKV, D), "float16"))),
    ("v_cache", dict(v_cache=TensorMeta((B, S, HKV, D), "float8_e4m3fn"))),
    ("cache_lens", dict(cache_lens=TensorMeta((B,), "int64"))),
    ("cache_lens", dict(cache_lens=TensorMeta((B + 1,), "int32"))),
    ("cache_lens", dict(cache_lens=TensorMeta((B, 1), "int32"))),
    ("k_scale", dict(k_scale=TensorMeta((1,), "float32"))),
    ("window", dict(window=0)),
    ("window", dict(window=-3)),
    ("window", dict(window=2.5)),
    ("window", dict(window=True)),
    ("scale", dict(scale=0.0)),
    ("scale", dict(scale=float("nan"))),
    ("causal_block", dict(causal_block=1)),
    ("all tensors must be on one device", dict(q=TensorMeta((B, T, HQ, D), "float16", "cuda"))),
]


@pytest.mark.parametrize("name,change", BAD_ATTENTION, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_ATTENTION)])
def test_bad_attention_arguments_name_the_argument(name, change):
    metas, options = good_metas(), {}
    for key, value in change.items():
        (metas if key in metas else options)[key] = value
    if name == "all tensors must be on one device":
        metas = {k: replace(v, device="cpu") if k != "q" else v for k, v in metas.items()}
    with pytest.raises(KVInjectArgumentError, match=name) as err:
        call(metas, **options)
    assert isinstance(err.value, UserError) and isinstance(err.value, ValueError)
    assert str(err.value).startswith("kv_inject_attention: ")


def test_fp8_scale_shape_and_dtype_errors():
    metas = good_metas("float16", "float8_e4m3fn")
    with pytest.raises(KVInjectArgumentError, match="v_scale must be float32"):
        call(metas, k_scale=TensorMeta((1,), "float32"), v_scale=TensorMeta((1,), "float16"))
    with pytest.raises(KVInjectArgumentError, match=r"k_scale has shape \(3,\)"):
        call(metas, k_scale=TensorMeta((3,), "float32"), v_scale=TensorMeta((1,), "float32"))


def test_cache_len_values():
    checks.check_cache_lens_values([0, S], S)
    with pytest.raises(KVInjectArgumentError, match=r"cache_lens\[1\] = 33 .*overflow"):
        checks.check_cache_lens_values([0, S + 1], S)
    with pytest.raises(KVInjectArgumentError, match=r"cache_lens\[0\] = -1"):
        checks.check_cache_lens_values([-1, 0], S)


def append_metas(new_dtype="float16", cache_dtype="float16"):
    return dict(
        k_cache=TensorMeta((B, S, HKV, D), cache_dtype), v_cache=TensorMeta((B, S, HKV, D), cache_dtype),
        k_new=TensorMeta((B, 5, HKV, D), new_dtype), v_new=TensorMeta((B, 5, HKV, D), new_dtype),
        cache_lens=TensorMeta((B,), "int32"), new_lens=TensorMeta((B,), "int32"),
    )


BAD_APPEND = [
    ("k_new", dict(k_new=TensorMeta((B, 5, HKV + 1, D), "float16"))),
    ("v_new", dict(v_new=TensorMeta((B, 4, HKV, D), "float16"))),
    ("k_new", dict(k_new=TensorMeta((B, 5, HKV, D), "bfloat16"))),
    ("v_cache", dict(v_cache=TensorMeta((B, S, HKV, D), "float32"))),
    ("new_lens", dict(new_lens=TensorMeta((B,), "int64"))),
    ("new_lens", dict(new_lens=TensorMeta((B + 1,), "int32"))),
    ("cache_lens", dict(cache_lens=TensorMeta((B,), "float32"))),
]


@pytest.mark.parametrize("name,change", BAD_APPEND, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_APPEND)])
def test_bad_append_arguments_name_the_argument(name, change):
    metas = append_metas()
    metas.update(change)
    with pytest.raises(KVInjectArgumentError, match=name) as err:
        checks.check_append(*metas.values())
    assert str(err.value).startswith("append_context: ")


def test_append_fp8_and_values():
    metas = append_metas("bfloat16", "float8_e4m3fn")
    s = TensorMeta((HKV,), "float32")
    assert checks.check_append(*metas.values(), k_scale=s, v_scale=s).kv_scale_per_head is True
    with pytest.raises(KVInjectArgumentError, match="v_scale is required"):
        checks.check_append(*metas.values(), k_scale=s)
    checks.check_append_values([0, 27], [5, 5], 5, S)
    with pytest.raises(KVInjectArgumentError,
                       match=r"cache_lens\[1\] \+ new_lens\[1\] = 28 \+ 5 = 33 exceeds S_max = 32"):
        checks.check_append_values([0, 28], [5, 5], 5, S)
    with pytest.raises(KVInjectArgumentError, match=r"new_lens\[0\] = 6"):
        checks.check_append_values([0, 0], [6, 0], 5, S)


def test_kernel_unsupported_reason():
    p = call(good_metas())
    assert checks.kernel_unsupported_reason(p) is None
    assert checks.kernel_unsupported_reason(p, sm=90) is None
    assert "sm_75" in checks.kernel_unsupported_reason(p, sm=75)
    odd = good_metas()
    for k in odd:
        if k != "cache_lens":
            odd[k] = TensorMeta(odd[k].shape[:-1] + (96,), odd[k].dtype)
    assert "D = 96" in checks.kernel_unsupported_reason(call(odd))
    fp8 = call(good_metas("float16", "float8_e4m3fn"), k_scale=TensorMeta((1,), "float32"),
               v_scale=TensorMeta((1,), "float32"))
    assert "sm_89" in checks.kernel_unsupported_reason(fp8, sm=80)
    assert checks.kernel_unsupported_reason(fp8, sm=89) is None


def test_append_kernel_unsupported_reason():
    p = checks.check_append(*append_metas().values())
    assert checks.append_kernel_unsupported_reason(p) is None
    assert checks.append_kernel_unsupported_reason(p, sm=90) is None
    unknown = replace(p, num_kv_heads=None)  # what the dtype-inference pass of TensorRT knows
    assert "Hkv must be known when the kernel is compiled" in checks.append_kernel_unsupported_reason(unknown)
    assert "D = 96" in checks.append_kernel_unsupported_reason(replace(p, head_dim=96))
    fp8 = replace(p, cache_dtype="float8_e4m3fn")
    assert "sm_89" in checks.append_kernel_unsupported_reason(fp8, sm=80)
    assert checks.append_kernel_unsupported_reason(fp8, sm=89) is None


def test_torch_entry_points_check_before_computing():
    q = torch.zeros(B, T, HQ, D)
    kb = vb = torch.zeros(B, T, HKV, D)
    kc = vc = torch.zeros(B, S, HKV, D)
    with pytest.raises(KVInjectArgumentError, match=r"cache_lens\[0\] = 40"):
        kv_inject_attention_reference(q, kb, vb, kc, vc, torch.tensor([40, 0], dtype=torch.int32))
    with pytest.raises(KVInjectArgumentError, match="window"):
        kv_inject_attention_reference(q, kb, vb, kc, vc, torch.zeros(B, dtype=torch.int32), window=0)
    lens = torch.tensor([30, 0], dtype=torch.int32)
    k_new = torch.ones(B, 4, HKV, D)
    with pytest.raises(KVInjectArgumentError, match="exceeds S_max"):
        append_context_reference(kc, vc, k_new, k_new, lens, torch.tensor([3, 0], dtype=torch.int32))
    assert lens.tolist() == [30, 0] and (kc == 0).all()  # nothing written on error
