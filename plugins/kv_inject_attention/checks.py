"""Argument checks and shape/type inference for KV-injection attention.

Plain functions over `TensorMeta` (a shape tuple, a dtype name, optionally a device
name), with no torch, triton or tensorrt import, so the torch op, the kernel launcher
and the TensorRT plugin all run the *same* checks, and tests exercise them anywhere.

Dimensions may be `None` when they are not known yet (symbolic TensorRT shapes); a
check involving an unknown dimension is skipped, everything else still applies.

Every error is a `KVInjectArgumentError` (a `UserError` and a `ValueError`) whose
message names the offending argument, its value and what is allowed.
"""

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from trtllm_dflash.errors import UserError

Dim = Optional[int]

ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")
FP8_CACHE_DTYPE = "float8_e4m3fn"
INDEX_DTYPE = "int32"
SCALE_DTYPE = "float32"
# Head dims the Triton kernel is compiled for (power of two: `tl.arange`; >= 16: `tl.dot`).
KERNEL_HEAD_DIMS = (16, 32, 64, 128)


class KVInjectArgumentError(UserError, ValueError):
    """A bad argument to kv_inject_attention / append_context, raised before any launch."""


@dataclass(frozen=True)
class TensorMeta:
    """What the checks need to know about a tensor."""

    shape: Tuple[Dim, ...]
    dtype: str  # "float16", "bfloat16", "float32", "float8_e4m3fn", "int32", ...
    device: Optional[str] = None  # "cpu", "cuda", ...; None when not applicable (TensorRT)


def tensor_meta(t) -> TensorMeta:
    """TensorMeta of a torch.Tensor (duck-typed, so this module does not import torch)."""
    return TensorMeta(tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""), t.device.type)


@dataclass(frozen=True)
class AttentionProblem:
    """A checked kv_inject_attention call: sizes, dtypes and resolved options."""

    batch: Dim  # B
    block_len: Dim  # T, block queries (and block keys) per sequence
    num_q_heads: Dim  # Hq
    num_kv_heads: Dim  # Hkv
    head_dim: Dim  # D
    max_cache_len: Dim  # S_max
    dtype: str  # q / k_block / v_block / out
    cache_dtype: str  # k_cache / v_cache: `dtype`, or float8_e4m3fn with k_scale / v_scale
    kv_scale_per_head: Optional[bool]  # None: no scales (cache not FP8)
    scale: Optional[float]  # softmax scale; None only while head_dim is unknown
    causal_block: bool
    window: Optional[int]

    @property
    def group_size(self) -> Dim:
        """Query heads per KV head (GQA): query head h reads KV head h // group_size."""
        if self.num_q_heads is None or self.num_kv_heads is None:
            return None
        return self.num_q_heads // self.num_kv_heads


@dataclass(frozen=True)
class AppendProblem:
    """A checked append_context call."""

    batch: Dim
    max_new_len: Dim  # N, rows of k_new / v_new per sequence
    num_kv_heads: Dim
    head_dim: Dim
    max_cache_len: Dim
    new_dtype: str
    cache_dtype: str
    kv_scale_per_head: Optional[bool]


def _fail(op: str, msg: str) -> None:
    raise KVInjectArgumentError(f"{op}: {msg}")


def _fmt(shape: Sequence[Dim]) -> str:
    dims = ["?" if s is None else str(s) for s in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _same(a: Dim, b: Dim) -> bool:
    return a is None or b is None or a == b


def _check_rank(op: str, name: str, meta: TensorMeta, rank: int, layout: str) -> None:
    if len(meta.shape) != rank:
        _fail(op, f"{name} must be {rank}-D {layout}, got shape {_fmt(meta.shape)}")


def _check_shape(op: str, name: str, meta: TensorMeta, expected: Sequence[Dim], layout: str, why: str) -> None:
    if len(meta.shape) != len(expected) or not all(_same(a, b) for a, b in zip(meta.shape, expected)):
        _fail(op, f"{name} has shape {_fmt(meta.shape)} but must be {layout} = {_fmt(expected)} {why}")


def _check_devices(op: str, metas: dict) -> None:
    devices = {name: m.device for name, m in metas.items() if m is not None and m.device is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        _fail(op, f"all tensors must be on one device, got {listing}")


def _check_kv_scales(
    op: str, cache_dtype: str, num_kv_heads: Dim, k_scale: Optional[TensorMeta], v_scale: Optional[TensorMeta]
) -> Optional[bool]:
    """Returns None (no scales), False (per-tensor) or True (per-KV-head)."""
    if cache_dtype != FP8_CACHE_DTYPE:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None:
                _fail(op, f"{name} is given but the cache dtype is {cache_dtype}; scales apply only to a "
                          f"{FP8_CACHE_DTYPE} cache (pass {name}=None)")
        return None
    per_head = []
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            _fail(op, f"{name} is required with a {FP8_CACHE_DTYPE} cache (a float32 tensor of shape (), (1,) "
                      f"or (Hkv,) that dequantizes the cache: value = fp8 * scale)")
        if s.dtype != SCALE_DTYPE:
            _fail(op, f"{name} must be {SCALE_DTYPE}, got {s.dtype}")
        if s.shape in ((), (1,)):
            per_head.append(False)
        elif len(s.shape) == 1 and _same(s.shape[0], num_kv_heads):
            per_head.append(True)
        else:
            _fail(op, f"{name} has shape {_fmt(s.shape)}; allowed: () or (1,) per tensor, "
                      f"or (Hkv,) = ({num_kv_heads},) per KV head")
    if per_head[0] != per_head[1]:
        _fail(op, "k_scale and v_scale must both be per-tensor or both per-KV-head, "
                  f"got shapes {_fmt(k_scale.shape)} and {_fmt(v_scale.shape)}")
    return per_head[0]


def check_attention(
    q: TensorMeta,
    k_block: TensorMeta,
    v_block: TensorMeta,
    k_cache: TensorMeta,
    v_cache: TensorMeta,
    cache_lens: TensorMeta,
    *,
    scale: Optional[float] = None,
    causal_block: bool = False,
    window: Optional[int] = None,
    k_scale: Optional[TensorMeta] = None,
    v_scale: Optional[TensorMeta] = None,
) -> AttentionProblem:
    """Check a kv_inject_attention call (shapes, dtypes, options) and resolve defaults."""
    op = "kv_inject_attention"
    _check_devices(op, dict(q=q, k_block=k_block, v_block=v_block, k_cache=k_cache, v_cache=v_cache,
                            cache_lens=cache_lens, k_scale=k_scale, v_scale=v_scale))
    _check_rank(op, "q", q, 4, "[B, T, Hq, D]")
    _check_rank(op, "k_block", k_block, 4, "[B, T, Hkv, D]")
    _check_rank(op, "k_cache", k_cache, 4, "[B, S_max, Hkv, D]")
    _check_rank(op, "cache_lens", cache_lens, 1, "[B]")
    _check_attention_dtypes(op, q, k_block, v_block, k_cache, v_cache, cache_lens)
    _check_attention_shapes(op, q, k_block, v_block, k_cache, v_cache, cache_lens)
    B, T, Hq, D = q.shape
    Hkv, S_max = k_block.shape[2], k_cache.shape[1]
    per_head = _check_kv_scales(op, k_cache.dtype, Hkv, k_scale, v_scale)

    if scale is None:
        scale = None if D is None else 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        _fail(op, f"scale = {scale!r}; must be a finite float > 0 (default 1/sqrt(D))")
    if not isinstance(causal_block, bool):
        _fail(op, f"causal_block = {causal_block!r}; must be a bool")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        _fail(op, f"window = {window!r}; must be None (no window) or an int >= 1 "
                  "(a query at position p sees keys at positions > p - window)")

    return AttentionProblem(
        batch=B, block_len=T, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_cache_len=S_max,
        dtype=q.dtype, cache_dtype=k_cache.dtype, kv_scale_per_head=per_head,
        scale=None if scale is None else float(scale), causal_block=causal_block, window=window,
    )


def _check_attention_dtypes(op: str, q, k_block, v_block, k_cache, v_cache, cache_lens) -> None:
    if q.dtype not in ACTIVATION_DTYPES:
        _fail(op, f"q has dtype {q.dtype}; allowed: {', '.join(ACTIVATION_DTYPES)}")
    for name, m in (("k_block", k_block), ("v_block", v_block)):
        if m.dtype != q.dtype:
            _fail(op, f"{name} has dtype {m.dtype} but must match q ({q.dtype})")
    if k_cache.dtype not in (q.dtype, FP8_CACHE_DTYPE):
        _fail(op, f"k_cache has dtype {k_cache.dtype}; allowed: {q.dtype} (as q) or {FP8_CACHE_DTYPE} "
                  "(with k_scale / v_scale)")
    if v_cache.dtype != k_cache.dtype:
        _fail(op, f"v_cache has dtype {v_cache.dtype} but must match k_cache ({k_cache.dtype})")
    if cache_lens.dtype != INDEX_DTYPE:
        _fail(op, f"cache_lens must be {INDEX_DTYPE}, got {cache_lens.dtype}")


def _check_attention_shapes(op: str, q, k_block, v_block, k_cache, v_cache, cache_lens) -> None:
    """Every shape against q's [B, T, Hq, D], k_block's Hkv and k_cache's S_max (None: dynamic)."""
    B, T, Hq, D = q.shape
    Hkv = k_block.shape[2]
    S_max = k_cache.shape[1]
    if T is not None and T < 1:
        _fail(op, f"q has block length T = {T}; T must be >= 1 (the block always holds the anchor token)")
    if D is not None and D < 1:
        _fail(op, f"q has head dim D = {D}; D must be >= 1")
    if Hkv is not None and Hkv < 1:
        _fail(op, f"k_block has Hkv = {Hkv} KV heads; Hkv must be >= 1")
    if Hq is not None and Hkv is not None and Hq % Hkv != 0:
        _fail(op, f"q has Hq = {Hq} heads, not a multiple of Hkv = {Hkv} (k_block dim 2); GQA needs Hq % Hkv == 0")
    kv_block_shape = (B, T, Hkv, D)
    _check_shape(op, "k_block", k_block, kv_block_shape, "[B, T, Hkv, D]", f"(B, T, D from q {_fmt(q.shape)})")
    _check_shape(op, "v_block", v_block, kv_block_shape, "[B, T, Hkv, D]", "(like k_block)")
    _check_shape(op, "k_cache", k_cache, (B, S_max, Hkv, D), "[B, S_max, Hkv, D]",
                 f"(B, D from q {_fmt(q.shape)}, Hkv from k_block {_fmt(k_block.shape)})")
    _check_shape(op, "v_cache", v_cache, (B, S_max, Hkv, D), "[B, S_max, Hkv, D]", "(like k_cache)")
    _check_shape(op, "cache_lens", cache_lens, (B,), "[B]", f"(B from q {_fmt(q.shape)})")


def attention_output(problem: AttentionProblem) -> TensorMeta:
    """Shape/type inference: out is [B, T, Hq, D] in q's dtype."""
    p = problem
    return TensorMeta((p.batch, p.block_len, p.num_q_heads, p.head_dim), p.dtype)


def check_cache_lens_values(cache_lens: Sequence[int], max_cache_len: int, op: str = "kv_inject_attention") -> None:
    """Data-dependent check: every valid context length fits the cache (0 <= len <= S_max)."""
    for b, n in enumerate(cache_lens):
        if n < 0 or n > max_cache_len:
            _fail(op, f"cache_lens[{b}] = {n} is outside [0, S_max = {max_cache_len}] (k_cache dim 1): "
                      "the cache would overflow")


def check_append(
    k_cache: TensorMeta,
    v_cache: TensorMeta,
    k_new: TensorMeta,
    v_new: TensorMeta,
    cache_lens: TensorMeta,
    new_lens: TensorMeta,
    *,
    k_scale: Optional[TensorMeta] = None,
    v_scale: Optional[TensorMeta] = None,
) -> AppendProblem:
    """Check an append_context call (shapes and dtypes)."""
    op = "append_context"
    _check_devices(op, dict(k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, cache_lens=cache_lens,
                            new_lens=new_lens, k_scale=k_scale, v_scale=v_scale))
    _check_rank(op, "k_cache", k_cache, 4, "[B, S_max, Hkv, D]")
    _check_rank(op, "k_new", k_new, 4, "[B, N, Hkv, D]")
    _check_rank(op, "cache_lens", cache_lens, 1, "[B]")
    B, S_max, Hkv, D = k_cache.shape
    N = k_new.shape[1]
    _check_shape(op, "v_cache", v_cache, k_cache.shape, "[B, S_max, Hkv, D]", "(like k_cache)")
    _check_shape(op, "k_new", k_new, (B, N, Hkv, D), "[B, N, Hkv, D]",
                 f"(B, Hkv, D from k_cache {_fmt(k_cache.shape)})")
    _check_shape(op, "v_new", v_new, k_new.shape, "[B, N, Hkv, D]", "(like k_new)")
    _check_shape(op, "cache_lens", cache_lens, (B,), "[B]", f"(B from k_cache {_fmt(k_cache.shape)})")
    _check_shape(op, "new_lens", new_lens, (B,), "[B]", f"(B from k_cache {_fmt(k_cache.shape)})")

    if k_cache.dtype not in ACTIVATION_DTYPES + (FP8_CACHE_DTYPE,):
        _fail(op, f"k_cache has dtype {k_cache.dtype}; allowed: {', '.join(ACTIVATION_DTYPES + (FP8_CACHE_DTYPE,))}")
    if v_cache.dtype != k_cache.dtype:
        _fail(op, f"v_cache has dtype {v_cache.dtype} but must match k_cache ({k_cache.dtype})")
    if k_cache.dtype == FP8_CACHE_DTYPE:
        if k_new.dtype not in ACTIVATION_DTYPES:
            _fail(op, f"k_new has dtype {k_new.dtype}; into a {FP8_CACHE_DTYPE} cache it must be one of "
                      f"{', '.join(ACTIVATION_DTYPES)} (quantized with k_scale)")
    elif k_new.dtype != k_cache.dtype:
        _fail(op, f"k_new has dtype {k_new.dtype} but must match k_cache ({k_cache.dtype})")
    if v_new.dtype != k_new.dtype:
        _fail(op, f"v_new has dtype {v_new.dtype} but must match k_new ({k_new.dtype})")
    for name, m in (("cache_lens", cache_lens), ("new_lens", new_lens)):
        if m.dtype != INDEX_DTYPE:
            _fail(op, f"{name} must be {INDEX_DTYPE}, got {m.dtype}")
    per_head = _check_kv_scales(op, k_cache.dtype, Hkv, k_scale, v_scale)
    return AppendProblem(batch=B, max_new_len=N, num_kv_heads=Hkv, head_dim=D, max_cache_len=S_max,
                         new_dtype=k_new.dtype, cache_dtype=k_cache.dtype, kv_scale_per_head=per_head)


def check_append_values(cache_lens: Sequence[int], new_lens: Sequence[int], max_new_len: int,
                        max_cache_len: int) -> None:
    """Data-dependent check: 0 <= new_lens[b] <= N and cache_lens[b] + new_lens[b] <= S_max."""
    op = "append_context"
    check_cache_lens_values(cache_lens, max_cache_len, op)
    for b, (n, m) in enumerate(zip(cache_lens, new_lens)):
        if m < 0 or m > max_new_len:
            _fail(op, f"new_lens[{b}] = {m} is outside [0, N = {max_new_len}] (k_new dim 1)")
        if n + m > max_cache_len:
            _fail(op, f"cache_lens[{b}] + new_lens[{b}] = {n} + {m} = {n + m} exceeds S_max = {max_cache_len} "
                      "(k_cache dim 1): the cache would overflow")


def _kernel_reason(static: dict, head_dim: Dim, cache_dtype: str, sm: Optional[int]) -> Optional[str]:
    """The kernels' compile-time requirements: `static` dims known, D supported, the GPU new enough."""
    for name, value in static.items():
        if value is None:
            return f"{name} must be known when the kernel is compiled (it is a compile-time constant)"
    if head_dim not in KERNEL_HEAD_DIMS:
        return f"head dim D = {head_dim} is not supported by the kernel; supported: {KERNEL_HEAD_DIMS}"
    if sm is not None:
        if sm < 80:
            return f"compute capability sm_{sm} is below sm_80 (the kernel targets Ampere and newer)"
        if cache_dtype == FP8_CACHE_DTYPE and sm < 89:
            return f"an FP8 ({FP8_CACHE_DTYPE}) cache needs sm_89 or newer, this device is sm_{sm}"
    return None


def kernel_unsupported_reason(problem: AttentionProblem, sm: Optional[int] = None) -> Optional[str]:
    """Why the Triton kernel cannot run this problem (None: it can).

    `sm` is the compute capability as an int (90 for sm_90), or None to skip device checks
    (the interpreter, or when only shapes matter).
    """
    p = problem
    static = {"Hq": p.num_q_heads, "Hkv": p.num_kv_heads, "D": p.head_dim}
    return _kernel_reason(static, p.head_dim, p.cache_dtype, sm)


def append_kernel_unsupported_reason(problem: AppendProblem, sm: Optional[int] = None) -> Optional[str]:
    """Why the append kernel cannot run this problem (None: it can); `sm` as in kernel_unsupported_reason."""
    p = problem
    return _kernel_reason({"Hkv": p.num_kv_heads, "D": p.head_dim}, p.head_dim, p.cache_dtype, sm)
