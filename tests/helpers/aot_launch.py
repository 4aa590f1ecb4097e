"""Launch the AOT plugins' kernels the way TensorRT does, without TensorRT.

TensorRT's AOT launch of a `tensorrt.plugin` kernel passes, in order: the input pointers, the
int32 extra args (`plugin_spec.scalar_args` / `append_scalar_args`), the output pointers; the
grid and block come from the plugin's KernelLaunchParams. Two ways here:

- `torch_launch`: triton's own launcher with that argument list (interpreter on CPU, JIT on a
  GPU): checks the argument order and the formulas against the kernels' semantics;
- `ptx_launch`: the PTX the AOT impl hands to TensorRT, loaded with cuda-python (or cupy) and
  launched with exactly TensorRT's argument list plus the padding outputs: checks the ABI on
  silicon (GPU only).

Problems are the plugins' own: `attention_launch` / `append_launch` build the argument lists
from packed torch tensors exactly as the aot_impls build them from shape expressions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_dflash.plugins.kv_inject_attention import checks, plugin_spec, ptx
from trtllm_dflash.plugins.kv_inject_attention.checks import tensor_meta


@dataclass
class Launch:
    inputs: list[torch.Tensor]
    ints: list[int]
    outputs: list[torch.Tensor]
    grid: tuple[int, int]
    constexprs: dict
    num_warps: int


def _dynamic(meta, dims):
    """The meta the plugin sees in an engine: dims `dims` are dynamic (None)."""
    return type(meta)(tuple(None if i in dims else d for i, d in enumerate(meta.shape)), meta.dtype)


def attention_problem(q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale, *, causal_block=False,
                      window=None, dynamic=False):
    """The plugin's problem for these tensors; dynamic=True: B, T, S unknown, as in an engine whose
    batch, block and arena length are dynamic (the kernel is then compiled for BLOCK_M = 128)."""
    metas = [tensor_meta(t) for t in (q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale)]
    if dynamic:
        metas = [_dynamic(m, {0, 1}) for m in metas[:5]] + [_dynamic(metas[5], {0})] + metas[6:]
    return plugin_spec.plugin_problem(metas, 1.0 / q.shape[-1] ** 0.5, causal_block, window or 0)


def attention_launch(kernel, q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale=None, v_scale=None, *,
                     causal_block=False, window=None, dynamic=False) -> Launch:
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    ones = torch.ones(1, dtype=torch.float32, device=q.device)
    k_scale = k_scale.reshape(-1) if fp8 else ones
    v_scale = v_scale.reshape(-1) if fp8 else ones
    p = attention_problem(q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale,
                          causal_block=causal_block, window=window, dynamic=dynamic)
    tiles = kernel.tile_config(p)
    B, T, S = q.shape[0], q.shape[1], k_cache.shape[1]
    ints = plugin_spec.scalar_args(B, T, S, p.num_q_heads, p.num_kv_heads, p.head_dim, bool(p.kv_scale_per_head))
    grid = (B * p.num_kv_heads, -(-T * p.group_size // tiles["BLOCK_M"]))
    constexprs = dict(SM_SCALE=p.scale, CAUSAL_BLOCK=p.causal_block, WINDOW=p.window or 0, GROUP=p.group_size,
                      HEAD_DIM=p.head_dim, BLOCK_M=tiles["BLOCK_M"], BLOCK_N=tiles["BLOCK_N"], HAS_KV_SCALE=fp8,
                      **kernel.dot_config(p.dtype, upcast=kernel.interpreting()))
    return Launch([q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale], ints, [torch.empty_like(q)],
                  grid, constexprs, tiles["num_warps"])


def append_problem(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale):
    return plugin_spec.append_plugin_problem([tensor_meta(t) for t in (k_cache, v_cache, k_new, v_new, cache_lens,
                                                                      new_lens, k_scale, v_scale)])


def append_launch(kernel, k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale=None, v_scale=None, *,
                  k_out=None, v_out=None) -> Launch:
    """k_out / v_out: the output buffers (TensorRT binds them to the caches' memory; default)."""
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    ones = torch.ones(1, dtype=torch.float32, device=k_cache.device)
    k_scale = k_scale.reshape(-1) if fp8 else ones
    v_scale = v_scale.reshape(-1) if fp8 else ones
    p = append_problem(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
    N, S = k_new.shape[1], k_cache.shape[1]
    ints = plugin_spec.append_scalar_args(N, S, p.num_kv_heads, p.head_dim, bool(p.kv_scale_per_head))
    outputs = [k_cache if k_out is None else k_out, v_cache if v_out is None else v_out, torch.empty_like(cache_lens)]
    grid = (k_new.shape[0] * p.num_kv_heads, max(1, -(-N // plugin_spec.APPEND_BLOCK_N)))
    constexprs = dict(HEAD_DIM=p.head_dim, BLOCK_N=plugin_spec.APPEND_BLOCK_N,
                      QUANTIZE=p.cache_dtype == checks.FP8_CACHE_DTYPE)
    return Launch([k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale], ints, outputs, grid,
                  constexprs, 4)


def torch_launch(fn, launch: Launch) -> None:
    """triton's launcher with TensorRT's argument order (inputs, int32 args, outputs)."""
    fn[launch.grid](*launch.inputs, *launch.ints, *launch.outputs, **launch.constexprs, num_warps=launch.num_warps)


def ptx_launch(compiled: ptx.CompiledKernel, launch: Launch, padding: int) -> str:
    """Load the PTX with the CUDA driver and launch it with exactly TensorRT's argument list: the
    input pointers, the int32 args, the output pointers, then `padding` more pointers (the
    plugin's padding outputs, tiny buffers here). Returns the driver binding that ran it
    ("cuda-python" or "cupy"); raises ImportError when neither is installed."""
    import ctypes

    import numpy as np

    pads = [torch.zeros(1, dtype=torch.int32, device="cuda") for _ in range(padding)]
    pointers = [t.data_ptr() for t in launch.inputs], [t.data_ptr() for t in (*launch.outputs, *pads)]
    stream = torch.cuda.current_stream().cuda_stream
    torch.cuda.synchronize()  # the primary context is current and the inputs are written
    try:
        try:
            from cuda.bindings import driver as cu  # cuda-python >= 12.6
        except ImportError:
            from cuda import cuda as cu  # older cuda-python
    except ImportError:
        cu = None
    if cu is not None:
        def ok(ret):
            err, *rest = ret
            if int(err) != 0:
                raise RuntimeError(f"CUDA driver error {err!r}")
            return rest[0] if rest else None

        values = ([ctypes.c_uint64(p) for p in pointers[0]] + [ctypes.c_int32(int(a)) for a in launch.ints]
                  + [ctypes.c_uint64(p) for p in pointers[1]])
        args = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        module = ok(cu.cuModuleLoadData(compiled.ptx.encode() + b"\0"))
        func = ok(cu.cuModuleGetFunction(module, compiled.name.encode()))
        ok(cu.cuLaunchKernel(func, launch.grid[0], launch.grid[1], 1, launch.num_warps * 32, 1, 1,
                             compiled.shared_mem, cu.CUstream(stream), ctypes.addressof(args), 0))
        torch.cuda.synchronize()
        ok(cu.cuModuleUnload(module))
        return "cuda-python"
    import cupy  # ImportError when neither binding is installed

    module = cupy.cuda.function.Module()
    module.load(compiled.ptx.encode())
    func = module.get_function(compiled.name)
    values = ([np.uint64(p) for p in pointers[0]] + [np.int32(a) for a in launch.ints]
              + [np.uint64(p) for p in pointers[1]])
    func(launch.grid, (launch.num_warps * 32, 1, 1), tuple(values), shared_mem=compiled.shared_mem,
         stream=cupy.cuda.ExternalStream(stream))
    torch.cuda.synchronize()
    return "cupy"
