"""Triton-lang kernels for KV-injection attention, and their torch launchers.

`_kv_inject_attention_fwd` is flash attention (online softmax, fp32 accumulation) for
DFlash's draft block. One program serves one (sequence b, KV head) pair and up to
BLOCK_M query rows, where row r is (block position t = r // GROUP, query head
kvh * GROUP + r % GROUP): the GQA group's query heads share every K/V tile, so each
context tile is read from memory once per KV head, not once per query head. The
program first walks the context cache in BLOCK_N tiles up to cache_lens[b] (starting
late when a window hides the oldest entries), then the block's own keys, with masks
on absolute positions (README.md in this folder, "The math").

The parameter order is the TensorRT AOT plugin ABI: input pointers, then int32
scalars, then the output pointer (ptx.py compiles this same function to PTX).
Everything a plugin cannot pass as an int32 (softmax scale, window, causal flag,
dtypes, tile sizes) is a constexpr.

Under TRITON_INTERPRET=1 (CPU tests) bf16 arithmetic is broken, so the launcher then
asks the kernel to upcast tiles to fp32 before `tl.dot` (DOT_DTYPE); on GPU fp16/bf16
tiles feed the tensor cores directly.
"""

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from . import checks
from .checks import AttentionProblem, tensor_meta


@triton.jit
def _online_softmax_step(acc, m_i, l_i, q, k, v, visible, qk_scale,
                         DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Fold one tile of keys into the running (acc, row max m_i, row sum l_i); base-2 domain."""
    # -- scores [BLOCK_M, BLOCK_N] ----
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    # -- update m_i and l_i; a row with nothing visible so far keeps m = -inf and adds 0 ----
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=INPUT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _kv_inject_attention_fwd(
    # inputs (the TensorRT plugin's input order)
    Q, K_BLOCK, V_BLOCK, K_CACHE, V_CACHE, CACHE_LENS, K_SCALE, V_SCALE,
    # int32 scalars
    T, S_MAX, NUM_KV_HEADS, SCALE_STRIDE,
    stride_qb, stride_qt, stride_qh,
    stride_kbb, stride_kbt, stride_kbh,
    stride_vbb, stride_vbt, stride_vbh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    stride_ob, stride_ot, stride_oh,
    # output
    OUT,
    # compile-time constants
    SM_SCALE: tl.constexpr, CAUSAL_BLOCK: tl.constexpr, WINDOW: tl.constexpr,  # WINDOW 0: no window
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr, DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = (pid_bh // NUM_KV_HEADS).to(tl.int64)  # int64: batch offsets can pass 2^31 elements
    kvh = pid_bh % NUM_KV_HEADS
    # A corrupt length must not read out of bounds; the torch entry points reject it before launch.
    cache_len = tl.minimum(tl.maximum(tl.load(CACHE_LENS + b), 0), S_MAX)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t_q = rows // GROUP  # block position of the query row
    head = kvh * GROUP + rows % GROUP  # its query head
    row_ok = t_q < T
    d = tl.arange(0, HEAD_DIM)

    q_ptrs = Q + b * stride_qb + t_q[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
    q_pos = cache_len + t_q  # absolute positions of the queries
    qk_scale = SM_SCALE * 1.4426950408889634  # 1/log(2): softmax in base 2

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)

    # -- context: cache entries [lo, cache_len) at positions lo.. ----
    lo = 0
    if WINDOW > 0:  # the earliest query of this program sees positions > q_pos - WINDOW
        first_t = (pid_m * BLOCK_M) // GROUP
        lo = tl.maximum(cache_len + first_t - WINDOW + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    k_base = K_CACHE + b * stride_kcb + kvh * stride_kch
    v_base = V_CACHE + b * stride_vcb + kvh * stride_vch
    if HAS_KV_SCALE:  # FP8 cache: value = fp8 * scale (per tensor: SCALE_STRIDE 0; per KV head: 1)
        k_s = tl.load(K_SCALE + kvh * SCALE_STRIDE)
        v_s = tl.load(V_SCALE + kvh * SCALE_STRIDE)
    for start in range(lo, cache_len, BLOCK_N):
        n = start + offs_n
        in_cache = n < cache_len
        k = tl.load(k_base + n[:, None] * stride_kcs + d[None, :], mask=in_cache[:, None], other=0.0)
        v = tl.load(v_base + n[:, None] * stride_vcs + d[None, :], mask=in_cache[:, None], other=0.0)
        if HAS_KV_SCALE:
            k = k.to(tl.float32) * k_s
            v = v.to(tl.float32) * v_s
        visible = row_ok[:, None] & in_cache[None, :]
        if WINDOW > 0:
            visible = visible & (q_pos[:, None] - n[None, :] < WINDOW)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k.to(DOT_DTYPE), v.to(DOT_DTYPE), visible,
                                             qk_scale, DOT_DTYPE, INPUT_PRECISION)

    # -- the block itself: key j at position cache_len + j ----
    kb_base = K_BLOCK + b * stride_kbb + kvh * stride_kbh
    vb_base = V_BLOCK + b * stride_vbb + kvh * stride_vbh
    for start in range(0, T, BLOCK_N):
        j = start + offs_n
        in_block = j < T
        k = tl.load(kb_base + j[:, None] * stride_kbt + d[None, :], mask=in_block[:, None], other=0.0)
        v = tl.load(vb_base + j[:, None] * stride_vbt + d[None, :], mask=in_block[:, None], other=0.0)
        visible = row_ok[:, None] & in_block[None, :]
        if CAUSAL_BLOCK:
            visible = visible & (j[None, :] <= t_q[:, None])
        if WINDOW > 0:
            visible = visible & (t_q[:, None] - j[None, :] < WINDOW)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, q, k.to(DOT_DTYPE), v.to(DOT_DTYPE), visible,
                                             qk_scale, DOT_DTYPE, INPUT_PRECISION)

    # -- epilogue: every real query sees at least itself, so l_i > 0 on stored rows ----
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_i[:, None]
    o_ptrs = OUT + b * stride_ob + t_q[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _append_context_fwd(
    K_CACHE, V_CACHE, K_NEW, V_NEW, CACHE_LENS, NEW_LENS, K_SCALE, V_SCALE,
    NUM_KV_HEADS, SCALE_STRIDE,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    stride_knb, stride_knn, stride_knh,
    stride_vnb, stride_vnn, stride_vnh,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, QUANTIZE: tl.constexpr,
):
    """cache[b, cache_lens[b] + i, kvh] = new[b, i, kvh] for i < new_lens[b]. Lengths are advanced by the launcher."""
    pid_bh = tl.program_id(0)
    b = (pid_bh // NUM_KV_HEADS).to(tl.int64)
    kvh = pid_bh % NUM_KV_HEADS
    i = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = i < tl.load(NEW_LENS + b)
    s = tl.load(CACHE_LENS + b) + i
    d = tl.arange(0, HEAD_DIM)
    k = tl.load(K_NEW + b * stride_knb + i[:, None] * stride_knn + kvh * stride_knh + d[None, :], mask=ok[:, None])
    v = tl.load(V_NEW + b * stride_vnb + i[:, None] * stride_vnn + kvh * stride_vnh + d[None, :], mask=ok[:, None])
    if QUANTIZE:  # into float8_e4m3fn: fp8 = clamp(x / scale, +-448)
        k = tl.clamp(k.to(tl.float32) / tl.load(K_SCALE + kvh * SCALE_STRIDE), -448.0, 448.0)
        v = tl.clamp(v.to(tl.float32) / tl.load(V_SCALE + kvh * SCALE_STRIDE), -448.0, 448.0)
    k_ptrs = K_CACHE + b * stride_kcb + s[:, None] * stride_kcs + kvh * stride_kch + d[None, :]
    v_ptrs = V_CACHE + b * stride_vcb + s[:, None] * stride_vcs + kvh * stride_vch + d[None, :]
    tl.store(k_ptrs, k.to(K_CACHE.dtype.element_ty), mask=ok[:, None])
    tl.store(v_ptrs, v.to(V_CACHE.dtype.element_ty), mask=ok[:, None])


# The signature repeats _append_context_fwd's on purpose: TensorRT passes the AOT kernel its
# arguments in this order (inputs, int32 scalars, outputs), and the body calls the shared one.
@triton.jit
def _append_context_aot(
    # inputs (the TensorRT plugin trtllm_dflash::kv_append's input order)
    K_CACHE, V_CACHE, K_NEW, V_NEW, CACHE_LENS, NEW_LENS, K_SCALE, V_SCALE,
    # int32 scalars
    NUM_KV_HEADS, SCALE_STRIDE,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    stride_knb, stride_knn, stride_knh,
    stride_vnb, stride_vnn, stride_vnh,
    # outputs: the caches with this step's rows (bound to the same memory as K_CACHE / V_CACHE at
    # run time, so only the new rows are written) and the new lengths cache_lens + new_lens
    K_OUT, V_OUT, LENS_OUT,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, QUANTIZE: tl.constexpr,
):
    """The append in the TensorRT AOT argument order (inputs, int32 args, outputs): the rows go to
    K_OUT / V_OUT, and LENS_OUT gives the attention layer that reads them a data dependency."""
    _append_context_fwd(K_OUT, V_OUT, K_NEW, V_NEW, CACHE_LENS, NEW_LENS, K_SCALE, V_SCALE, NUM_KV_HEADS, SCALE_STRIDE,
                        stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                        stride_knb, stride_knn, stride_knh, stride_vnb, stride_vnn, stride_vnh,
                        HEAD_DIM, BLOCK_N, QUANTIZE)
    if (tl.program_id(0) % NUM_KV_HEADS == 0) & (tl.program_id(1) == 0):
        b = (tl.program_id(0) // NUM_KV_HEADS).to(tl.int64)
        tl.store(LENS_OUT + b, tl.load(CACHE_LENS + b) + tl.load(NEW_LENS + b))


@triton.jit
def _abi_probe(X, N, Y):
    """Three parameters: whatever else the compiled PTX declares is what this triton appends to
    every kernel (ptx.triton_extra_params)."""
    tl.store(Y, tl.load(X) + N)


# ---------------------------------------------------------------------------------------
# Launch configuration (no @triton.autotune: it cannot run under the interpreter)
# ---------------------------------------------------------------------------------------

def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def tile_config(problem: AttentionProblem) -> dict:
    """BLOCK_M (query rows), BLOCK_N (keys per tile) and num_warps for a problem; by head dim."""
    rows = problem.block_len * problem.group_size if problem.block_len is not None else 128
    block_m = min(128, max(16, triton.next_power_of_2(rows)))
    block_n = 64 if problem.head_dim <= 64 else 32 if block_m == 128 else 64
    num_warps = 8 if block_m * problem.head_dim >= 128 * 128 else 4
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)


def dot_config(dtype: str, upcast: bool) -> dict:
    """Operand dtype of tl.dot and its fp32 precision ("ieee": no TF32 rounding for fp32 inputs)."""
    dot_dtype = {"float32": tl.float32, "float16": tl.float16, "bfloat16": tl.bfloat16}[dtype]
    if upcast:
        dot_dtype = tl.float32
    return dict(DOT_DTYPE=dot_dtype, INPUT_PRECISION="ieee")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_launchable(problem: AttentionProblem, device: torch.device) -> None:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        sm: Optional[int] = major * 10 + minor
    elif interpreting():
        sm = None
    else:
        raise checks.KVInjectArgumentError(
            f"kv_inject_attention: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tests), "
            f"got tensors on {device.type}; use the torch op or the reference instead")
    reason = checks.kernel_unsupported_reason(problem, sm)
    if reason is not None:
        raise checks.KVInjectArgumentError(f"kv_inject_attention: {reason}")


def kv_inject_attention_triton(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal_block: bool = False,
    window: Optional[int] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Launch the kernel; same contract as reference.kv_inject_attention_reference.

    `out` ([B, T, Hq, D], q's dtype) may be passed to write into an existing buffer.
    Checks every argument first; the cache_lens value check reads cache_lens on the host.
    """
    meta = lambda t: None if t is None else tensor_meta(t)  # noqa: E731
    p = checks.check_attention(
        tensor_meta(q), tensor_meta(k_block), tensor_meta(v_block), tensor_meta(k_cache), tensor_meta(v_cache),
        tensor_meta(cache_lens), scale=scale, causal_block=causal_block, window=window,
        k_scale=meta(k_scale), v_scale=meta(v_scale),
    )
    _check_launchable(p, q.device)
    checks.check_cache_lens_values(cache_lens.tolist(), p.max_cache_len)
    if out is None:
        out = q.new_empty(q.shape)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise checks.KVInjectArgumentError(
            f"kv_inject_attention: out must be a {tuple(q.shape)} {q.dtype} tensor on {q.device} with a "
            f"contiguous last dim, got {tuple(out.shape)} {out.dtype} on {out.device}")
    q, k_block, v_block, k_cache, v_cache = map(_last_dim_contiguous, (q, k_block, v_block, k_cache, v_cache))
    cache_lens = cache_lens.contiguous()
    has_scale = k_scale is not None
    # Unused pointer slots still need a tensor; cache_lens is always at hand.
    k_scale = k_scale.reshape(-1).contiguous() if has_scale else cache_lens
    v_scale = v_scale.reshape(-1).contiguous() if has_scale else cache_lens

    tiles = tile_config(p)
    grid = (p.batch * p.num_kv_heads, triton.cdiv(p.block_len * p.group_size, tiles["BLOCK_M"]))
    _kv_inject_attention_fwd[grid](
        q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale,
        p.block_len, p.max_cache_len, p.num_kv_heads, 1 if p.kv_scale_per_head else 0,
        *q.stride()[:3], *k_block.stride()[:3], *v_block.stride()[:3],
        *k_cache.stride()[:3], *v_cache.stride()[:3], *out.stride()[:3],
        out,
        SM_SCALE=p.scale, CAUSAL_BLOCK=p.causal_block, WINDOW=p.window or 0,
        GROUP=p.group_size, HEAD_DIM=p.head_dim, HAS_KV_SCALE=has_scale,
        **dot_config(p.dtype, upcast=interpreting()),
        **tiles,
    )
    return out


def append_context_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_lens: torch.Tensor,
    new_lens: torch.Tensor,
    *,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """Launch the append kernel, then cache_lens += new_lens; same contract as the reference."""
    meta = lambda t: None if t is None else tensor_meta(t)  # noqa: E731
    p = checks.check_append(
        tensor_meta(k_cache), tensor_meta(v_cache), tensor_meta(k_new), tensor_meta(v_new),
        tensor_meta(cache_lens), tensor_meta(new_lens), k_scale=meta(k_scale), v_scale=meta(v_scale),
    )
    if k_cache.device.type != "cuda" and not interpreting():
        raise checks.KVInjectArgumentError(
            f"append_context: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1), got {k_cache.device.type}")
    reason = checks.append_kernel_unsupported_reason(p)
    if reason is not None:
        raise checks.KVInjectArgumentError(f"append_context: {reason}")
    checks.check_append_values(cache_lens.tolist(), new_lens.tolist(), p.max_new_len, p.max_cache_len)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise checks.KVInjectArgumentError("append_context: k_cache / v_cache must have a contiguous last dim "
                                           "(they are written in place)")
    k_new, v_new = _last_dim_contiguous(k_new), _last_dim_contiguous(v_new)
    quantize = p.cache_dtype == checks.FP8_CACHE_DTYPE
    k_scale = k_scale.reshape(-1).contiguous() if quantize else cache_lens
    v_scale = v_scale.reshape(-1).contiguous() if quantize else cache_lens
    block_n = 16
    grid = (p.batch * p.num_kv_heads, max(1, triton.cdiv(p.max_new_len, block_n)))
    if p.max_new_len > 0:
        _append_context_fwd[grid](
            k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale,
            p.num_kv_heads, 1 if p.kv_scale_per_head else 0,
            *k_cache.stride()[:3], *v_cache.stride()[:3], *k_new.stride()[:3], *v_new.stride()[:3],
            HEAD_DIM=p.head_dim, BLOCK_N=block_n, QUANTIZE=quantize,
        )
    cache_lens += new_lens
