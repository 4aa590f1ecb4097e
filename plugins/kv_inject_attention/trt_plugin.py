"""TensorRT plugins for KV-injection attention: Python-defined plugins with AOT implementations.

`register_plugin()` defines two plugins with `tensorrt.plugin` (TensorRT >= 10.9; TensorRT-LLM
1.2.1 ships 10.14), both compiled from kernel.py with `triton.compile` at engine build time:

- `trtllm_dflash::kv_inject_attention`: block queries over [context cache ; block].
  Inputs q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale (the scales are
  float32 [1] or [Hkv]; with a non-FP8 cache they are ignored and the insert helper feeds
  constant ones). Attributes (`attention_attrs`): scale (float64 [1], resolved), causal_block
  (bool), window (int32 [1], 0 = no window: attributes cannot be None); 1-element arrays
  rather than float / int, see ScaleAttr. Output: [B, T, Hq, D] in q's dtype.
- `trtllm_dflash::kv_append`: writes this step's context K/V rows into the caches.
  Inputs k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale; outputs
  k_cache_out, v_cache_out (shaped like the caches) and lens_out = cache_lens + new_lens.
  The kernel writes only the new rows into k_cache_out / v_cache_out: the engine marks them
  as outputs and its runner binds them to the same memory as the k_cache / v_cache inputs
  (TensorRT-LLM's own convention for a contiguous KV cache: runtime/generation.py binds one
  buffer to `past_key_value_{i}` and `present_key_value_{i}`). The attention layer takes
  lens_out as its cache_lens, which orders it after the append.

`@trtp.aot_impl` returns the kernel name, the PTX, the launch grid and the int32 scalar
arguments as symbolic shape expressions. TensorRT embeds the PTX in the engine, so no Python
runs at inference (the C++ Executor and the Triton C++ backend can load it). There is
deliberately no JIT `@trtp.impl`. AOT plugin attributes are not serialized; they only
parameterize the PTX compiled at build time.

Kernel ABI (TensorRT's AOT launch passes the input pointers, the int32 extra args, then the
output pointers). Triton >= 3.3 appends trailing pointer parameters to every kernel (global
and profile scratch: 2 with triton 3.9, none with 3.2.0). Instead of pinning triton, each
plugin declares that many extra *padding outputs* ([B] int32, never read or written), so
TensorRT passes exactly the parameter list the PTX declares; the kernels use no scratch
memory (checked at compile time), so the padding slots are never dereferenced.
`triton_extra_params()` measures the count on the installed triton (README.md, "Triton
version").

Everything here that does not need TensorRT (dtype mapping, descriptor -> TensorMeta, the
scalar-argument formulas, the Triton compiles, the ABI count) is a plain function tested on
CPU; `tensorrt` itself is imported only inside `register_plugin()` and the insert helpers.

NOTE: no `from __future__ import annotations` in this file: `tensorrt.plugin` inspects
the decorated functions' annotations as real classes.
"""

import dataclasses
import functools
import inspect
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import checks
from .checks import AppendProblem, AttentionProblem, KVInjectArgumentError, TensorMeta

PLUGIN_NAMESPACE = "trtllm_dflash"
PLUGIN_NAME = "kv_inject_attention"
PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}"
INPUT_NAMES = ("q", "k_block", "v_block", "k_cache", "v_cache", "cache_lens", "k_scale", "v_scale")
APPEND_PLUGIN_NAME = "kv_append"
APPEND_PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{APPEND_PLUGIN_NAME}"
APPEND_INPUT_NAMES = ("k_cache", "v_cache", "k_new", "v_new", "cache_lens", "new_lens", "k_scale", "v_scale")
APPEND_OUTPUT_NAMES = ("k_cache_out", "v_cache_out", "lens_out")
APPEND_BLOCK_N = 16  # new rows per program (kernel._append_context_fwd)

# tensorrt.DataType member name -> checks.py dtype name
_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "FP8": "float8_e4m3fn",
               "INT32": "int32", "INT64": "int64", "INT8": "int8", "BOOL": "bool", "UINT8": "uint8"}
# checks.py dtype name -> Triton pointer type in a kernel signature
_TRITON_POINTERS = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float8_e4m3fn": "*fp8e4nv",
                    "int32": "*i32"}
_ONE = np.ones(1, dtype=np.float32)  # scale input for non-FP8 caches; TensorRT keeps a pointer to it
MAX_STATIC_SHARED_MEM = 48 * 1024  # bytes of dynamic shared memory a kernel may use without opting in


def dtype_name(trt_dtype) -> str:
    """tensorrt.DataType -> "float16", "float8_e4m3fn", ... (by member name, no tensorrt import)."""
    name = getattr(trt_dtype, "name", str(trt_dtype).split(".")[-1])
    return _TRT_DTYPES.get(name, name.lower())


def desc_meta(desc) -> TensorMeta:
    """TensorMeta of a tensorrt.plugin.TensorDesc: constant dims known, symbolic or fake ones None."""
    dims = []
    for expr in desc.shape_expr:
        known = not expr.is_fake and expr.is_constant
        dims.append(expr.constant_value() if known else None)
    return TensorMeta(tuple(dims), dtype_name(desc.dtype))


def itensor_meta(tensor) -> TensorMeta:
    """TensorMeta of a network tensor (tensorrt.ITensor): -1 (dynamic) dims become None."""
    return TensorMeta(tuple(None if d < 0 else int(d) for d in tensor.shape), dtype_name(tensor.dtype))


def _check_scales(plugin_id: str, k_scale: TensorMeta, v_scale: TensorMeta) -> None:
    """The plugins always take k_scale / v_scale inputs (TensorRT plugins have fixed inputs)."""
    for name, m in (("k_scale", k_scale), ("v_scale", v_scale)):
        if m.dtype != checks.SCALE_DTYPE or len(m.shape) != 1:
            raise KVInjectArgumentError(f"{plugin_id}: plugin input {name} must be a float32 [1] or [Hkv] tensor "
                                        f"(constant ones with a non-FP8 cache), got {m.dtype} {m.shape}")


def plugin_problem(metas: Sequence[TensorMeta], scale: float, causal_block: bool, window: int) -> AttentionProblem:
    """Check the plugin's 8 inputs and 3 attributes with checks.py; raises KVInjectArgumentError."""
    if len(metas) != len(INPUT_NAMES):
        raise KVInjectArgumentError(f"{PLUGIN_ID}: expected {len(INPUT_NAMES)} inputs {INPUT_NAMES}, got {len(metas)}")
    q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale = metas
    _check_scales(PLUGIN_ID, k_scale, v_scale)
    fp8 = k_cache.dtype == checks.FP8_CACHE_DTYPE
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: window attribute = {window!r}; must be an int >= 1, or 0 for none")
    return checks.check_attention(
        q, k_block, v_block, k_cache, v_cache, cache_lens, scale=scale, causal_block=causal_block,
        window=window or None, k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)


def scalar_args(B, T, S, num_q_heads: int, num_kv_heads: int, head_dim: int, scale_per_head: bool) -> list:
    """The kernel's int32 arguments for packed (contiguous) tensors, in signature order.

    B, T, S may be ints or TensorRT shape expressions (kept as the left operand, since
    shape expressions define `*` but not its reflection); the head counts are ints.
    """
    q_strides = [T * (num_q_heads * head_dim), num_q_heads * head_dim, head_dim]  # [B, T, Hq, D]
    block_strides = [T * (num_kv_heads * head_dim), num_kv_heads * head_dim, head_dim]  # [B, T, Hkv, D]
    cache_strides = [S * (num_kv_heads * head_dim), num_kv_heads * head_dim, head_dim]  # [B, S_max, Hkv, D]
    return [T, S, num_kv_heads, 1 if scale_per_head else 0,
            *q_strides, *block_strides, *block_strides, *cache_strides, *cache_strides, *q_strides]


def append_plugin_problem(metas: Sequence[TensorMeta]) -> AppendProblem:
    """Check the append plugin's 8 inputs with checks.py; raises KVInjectArgumentError.

    Unknown dims (None) pass, as in plugin_problem: TensorRT's dtype-inference pass hands the
    descriptor function "fake" dims only (tensorrt/plugin/_plugin_class.py
    `_TemplatePluginBase.get_output_data_types`, TensorRT 10.14). What the kernel needs static
    (Hkv, D) is checked where it is compiled (compile_append_kernel)."""
    if len(metas) != len(APPEND_INPUT_NAMES):
        raise KVInjectArgumentError(f"{APPEND_PLUGIN_ID}: expected {len(APPEND_INPUT_NAMES)} inputs "
                                    f"{APPEND_INPUT_NAMES}, got {len(metas)}")
    k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale = metas
    _check_scales(APPEND_PLUGIN_ID, k_scale, v_scale)
    fp8 = k_cache.dtype == checks.FP8_CACHE_DTYPE
    return checks.check_append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens,
                               k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)


def append_scalar_args(N, S, num_kv_heads: int, head_dim: int, scale_per_head: bool) -> list:
    """The append kernel's int32 arguments for packed tensors, in signature order
    (kernel._append_context_aot): NUM_KV_HEADS, SCALE_STRIDE, then the batch / row / head strides
    of k_cache, v_cache (= of the outputs), k_new, v_new. N, S may be shape expressions."""
    row = num_kv_heads * head_dim
    cache_strides = [S * row, row, head_dim]  # [B, S_max, Hkv, D]
    new_strides = [N * row, row, head_dim]  # [B, N, Hkv, D]
    return [num_kv_heads, 1 if scale_per_head else 0, *cache_strides, *cache_strides, *new_strides, *new_strides]


@dataclass(frozen=True)
class CompiledKernel:
    """What an AOT implementation hands to TensorRT."""

    name: str
    ptx: str
    num_warps: int
    shared_mem: int  # bytes of dynamic shared memory per block
    block_m: int  # attention: query rows per program (grid dim 1 = ceil(T * GROUP / block_m)); append: 0
    num_params: int  # .param entries of the PTX entry point
    abi_params: int  # what the plugin's own I/O makes TensorRT pass: input pointers + int32 args + output pointers


def _compile(plugin_id: str, fn, signature: dict, constexprs: dict, target, num_warps: int) -> CompiledKernel:
    """triton.compile `fn` to PTX (shared memory capped at 48 KiB, no scratch memory)."""
    import triton
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        raise RuntimeError("cannot compile the kernel to PTX while TRITON_INTERPRET=1 (kernel.py was imported "
                           "in interpreter mode); build engines in a process without it")
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    # triton < 3.3 (e.g. 3.2.0, pinned by TensorRT 10.14's QDP sample) calls it `constants`.
    constexpr_kw = "constexprs" if "constexprs" in inspect.signature(triton.compiler.ASTSource).parameters \
        else "constants"
    src = triton.compiler.ASTSource(fn=fn, signature=signature, **{constexpr_kw: constexprs})
    # Software pipelining stages tiles in shared memory. Above 48 KiB a launch must opt in
    # (cuFuncSetAttribute), which we cannot ask of TensorRT's AOT launcher: pipeline less instead.
    for num_stages in (3, 2, 1):
        compiled = triton.compile(src, target=target, options={"num_warps": num_warps, "num_stages": num_stages})
        if compiled.metadata.shared <= MAX_STATIC_SHARED_MEM:
            break
    else:
        raise NotImplementedError(f"{plugin_id}: the kernel needs {compiled.metadata.shared} B of shared memory "
                                  f"even unpipelined; more than the {MAX_STATIC_SHARED_MEM} B a launch gets by default")
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise NotImplementedError(
            f"{plugin_id}: the compiled kernel asks for Triton scratch memory (global {meta.global_scratch_size} B, "
            f"profile {getattr(meta, 'profile_scratch_size', 0)} B), which a TensorRT AOT plugin cannot provide")
    ptx = compiled.asm["ptx"]
    return CompiledKernel(name=meta.name, ptx=ptx, num_warps=num_warps, shared_mem=meta.shared, block_m=0,
                          num_params=ptx_param_count(ptx, meta.name),
                          abi_params=len(signature) - len(constexprs))


def ptx_param_count(ptx: str, name: str) -> int:
    """The number of .param entries of the PTX entry point `name` (-1 when it is not found)."""
    entry = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    return entry.group(1).count(".param") if entry else -1


def compile_attention_kernel(problem: AttentionProblem, target=None) -> CompiledKernel:
    """Compile `_kv_inject_attention_fwd` for `problem` to PTX.

    `target` is a triton GPUTarget (e.g. GPUTarget("cuda", 90, 32)); None compiles for the
    current GPU. Runs without TensorRT, and without a GPU when a target is given.
    """
    from . import kernel

    sm = None if target is None else int(target.arch)
    reason = checks.kernel_unsupported_reason(problem, sm)
    if reason is not None:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: {reason}")
    fn = kernel._kv_inject_attention_fwd
    p = problem
    pointer = _TRITON_POINTERS
    signature = {"Q": pointer[p.dtype], "K_BLOCK": pointer[p.dtype], "V_BLOCK": pointer[p.dtype],
                 "K_CACHE": pointer[p.cache_dtype], "V_CACHE": pointer[p.cache_dtype], "CACHE_LENS": "*i32",
                 "K_SCALE": "*fp32", "V_SCALE": "*fp32"}
    int_names = fn.arg_names[len(signature):fn.arg_names.index("OUT")]
    signature.update({name: "i32" for name in int_names})
    signature["OUT"] = pointer[p.dtype]
    tiles = kernel.tile_config(p)
    constexprs = dict(
        SM_SCALE=p.scale, CAUSAL_BLOCK=p.causal_block, WINDOW=p.window or 0, GROUP=p.group_size,
        HEAD_DIM=p.head_dim, BLOCK_M=tiles["BLOCK_M"], BLOCK_N=tiles["BLOCK_N"],
        HAS_KV_SCALE=p.cache_dtype == checks.FP8_CACHE_DTYPE, **kernel.dot_config(p.dtype, upcast=False),
    )
    compiled = _compile(PLUGIN_ID, fn, signature, constexprs, target, tiles["num_warps"])
    return dataclasses.replace(compiled, block_m=tiles["BLOCK_M"])


def compile_append_kernel(problem: AppendProblem, target=None) -> CompiledKernel:
    """Compile `_append_context_aot` (the append in TensorRT's argument order) for `problem` to PTX."""
    from . import kernel

    sm = None if target is None else int(target.arch)
    reason = checks.append_kernel_unsupported_reason(problem, sm)
    if reason is not None:
        raise KVInjectArgumentError(f"{APPEND_PLUGIN_ID}: {reason}")
    fn = kernel._append_context_aot
    pointer = _TRITON_POINTERS
    p = problem
    signature = {"K_CACHE": pointer[p.cache_dtype], "V_CACHE": pointer[p.cache_dtype], "K_NEW": pointer[p.new_dtype],
                 "V_NEW": pointer[p.new_dtype], "CACHE_LENS": "*i32", "NEW_LENS": "*i32", "K_SCALE": "*fp32",
                 "V_SCALE": "*fp32"}
    int_names = fn.arg_names[len(signature):fn.arg_names.index("K_OUT")]
    signature.update({name: "i32" for name in int_names})
    signature.update(K_OUT=pointer[p.cache_dtype], V_OUT=pointer[p.cache_dtype], LENS_OUT="*i32")
    constexprs = dict(HEAD_DIM=p.head_dim, BLOCK_N=APPEND_BLOCK_N, QUANTIZE=p.cache_dtype == checks.FP8_CACHE_DTYPE)
    return _compile(APPEND_PLUGIN_ID, fn, signature, constexprs, target, num_warps=4)


@functools.lru_cache(maxsize=None)
def _extra_params(arch, warp_size) -> int:
    """triton.compile of kernel._abi_probe for GPUTarget("cuda", arch, warp_size) (None: the current
    GPU); the PTX's parameters beyond the probe's three."""
    import triton
    from triton.backends.compiler import GPUTarget

    from . import kernel

    target = None if arch is None else GPUTarget("cuda", arch, warp_size)
    signature = {"X": "*i32", "N": "i32", "Y": "*i32"}
    compiled = _compile("triton ABI probe", kernel._abi_probe, signature, {}, target, num_warps=1)
    extra = compiled.num_params - compiled.abi_params
    if extra < 0:
        raise RuntimeError(f"triton {triton.__version__}: the probe kernel's PTX declares {compiled.num_params} "
                           f"parameters, fewer than its {compiled.abi_params} arguments")
    return extra


def triton_extra_params(target=None) -> int:
    """How many parameters the installed triton appends to every compiled kernel (0 for triton
    3.2.0; 2 for 3.9: global and profile scratch), measured on a 3-argument probe kernel.
    `target` a triton GPUTarget, None for the current GPU."""
    return _extra_params(None if target is None else int(target.arch),
                         None if target is None else int(target.warp_size))


def check_launch_abi(plugin_id: str, compiled: CompiledKernel, padding: int) -> None:
    """The PTX must declare exactly what TensorRT passes: the plugin's own inputs, int32 args and
    outputs plus its `padding` outputs (one per parameter triton appends)."""
    if compiled.num_params != compiled.abi_params + padding:
        import triton

        raise NotImplementedError(
            f"{plugin_id}: triton {triton.__version__} compiled {compiled.name} with {compiled.num_params} PTX "
            f"parameters, but TensorRT's AOT launch passes {compiled.abi_params + padding} ({compiled.abi_params} "
            f"for the plugin's inputs, int32 args and outputs + {padding} padding outputs); the triton that "
            "compiled the kernel is not the one the plugin was registered with")


@dataclass(frozen=True)
class Plugins:
    """The registered plugins' `trtp.op` entry points, and the padding outputs each declares."""

    attention: object
    append: object
    padding: int


_REGISTERED: Optional[Plugins] = None

# Attribute types. scale and window travel as 1-element numpy arrays, not as float / int:
# TensorRT 10.14's tensorrt.plugin rebuilds a scalar attribute with `float(field.data)` /
# `int(field.data)` on a 1-element array (tensorrt/plugin/_lib.py,
# _TemplatePluginCreator.create_plugin; unchanged on TensorRT main), a NumPy 1.25 deprecation
# that NumPy 2.4 turned into "TypeError: only 0-dimensional arrays can be converted to Python
# scalars" (hit by a QDP plugin's int attribute in
# https://github.com/Stability-AI/stable-audio-3/pull/49). Array attributes are rebuilt with
# `astype`, on every NumPy. bool(1-element array) is not deprecated: causal_block stays a bool.
ScaleAttr = npt.NDArray[np.float64]
WindowAttr = npt.NDArray[np.int32]


def attention_attrs(scale: float, causal_block: bool, window: Optional[int]) -> dict:
    """The attention plugin's attributes, in registration order, as `trtp.op` takes them."""
    return dict(scale=np.array([scale], dtype=np.float64), causal_block=bool(causal_block),
                window=np.array([window or 0], dtype=np.int32))


def _attr_value(name: str, value) -> Union[int, float]:
    """A 1-element array attribute as a Python number."""
    array = np.asarray(value)
    if array.shape != (1,):
        raise KVInjectArgumentError(f"{PLUGIN_ID}: attribute {name} must be a 1-element array, got shape "
                                    f"{array.shape}")
    return array.item()


def _attention_problem(descs, scale, causal_block: bool, window) -> AttentionProblem:
    return plugin_problem([desc_meta(d) for d in descs], _attr_value("scale", scale), causal_block,
                          _attr_value("window", window))


def require_static_scales(plugin_id: str, k_scale: TensorMeta, v_scale: TensorMeta) -> None:
    """An FP8 kernel is compiled for per-tensor ([1]) or per-KV-head ([Hkv]) scales; a scale whose
    length is only known at run time could be either (checks.py would take it for per-head and
    the kernel would read Hkv entries of a [1] buffer)."""
    for name, m in (("k_scale", k_scale), ("v_scale", v_scale)):
        if any(d is None for d in m.shape):
            raise KVInjectArgumentError(f"{plugin_id}: {name} has a dynamic shape {m.shape}; an FP8 cache needs a "
                                        "static [1] (per tensor) or [Hkv] (per KV head) scale")


def _outputs(n: int):
    """The return annotation of a descriptor with n outputs (tensorrt.plugin counts its arguments)."""
    import tensorrt.plugin as trtp

    return Tuple[tuple([trtp.TensorDesc] * n)]


def _launch(trtp, compiled: CompiledKernel, grid_x, grid_y, scalar_exprs: list):
    """KernelLaunchParams and the int32 extra arguments (SymIntExprs of SymInt32) for the AOT impl."""
    launch = trtp.KernelLaunchParams()
    launch.grid_x, launch.grid_y = grid_x, grid_y
    launch.block_x = compiled.num_warps * 32
    launch.shared_mem = compiled.shared_mem
    return launch, trtp.SymIntExprs.from_tuple([trtp.SymInt32(a) for a in scalar_exprs])


def _register_attention(trtp, pad: int, target) -> None:
    """trtp.register / trtp.aot_impl of trtllm_dflash::kv_inject_attention (outputs: out, padding)."""

    def kv_inject_attention_desc(
        q: trtp.TensorDesc, k_block: trtp.TensorDesc, v_block: trtp.TensorDesc, k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc, cache_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        scale: ScaleAttr, causal_block: bool, window: WindowAttr,
    ):
        _attention_problem((q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale), scale,
                           causal_block, window)
        return (q.like(), *[cache_lens.like() for _ in range(pad)])  # out [B, T, Hq, D] in q's dtype; padding

    kv_inject_attention_desc.__annotations__["return"] = _outputs(1 + pad)
    trtp.register(PLUGIN_ID)(kv_inject_attention_desc)

    @trtp.aot_impl(PLUGIN_ID)
    def kv_inject_attention_aot(
        q: trtp.TensorDesc, k_block: trtp.TensorDesc, v_block: trtp.TensorDesc, k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc, cache_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        scale: ScaleAttr, causal_block: bool, window: WindowAttr, outputs: Tuple[trtp.TensorDesc], tactic: int,
    ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]:
        p = _attention_problem((q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale), scale,
                               causal_block, window)
        if p.cache_dtype == checks.FP8_CACHE_DTYPE:
            require_static_scales(PLUGIN_ID, desc_meta(k_scale), desc_meta(v_scale))
        compiled = compile_attention_kernel(p, target)
        check_launch_abi(PLUGIN_ID, compiled, pad)
        B, T, S = q.shape_expr[0], q.shape_expr[1], k_cache.shape_expr[1]
        args = scalar_args(B, T, S, p.num_q_heads, p.num_kv_heads, p.head_dim, bool(p.kv_scale_per_head))
        # one program per (sequence, KV head) and BLOCK_M query rows (t, head in group)
        launch, extra = _launch(trtp, compiled, B * p.num_kv_heads, trtp.cdiv(T * p.group_size, compiled.block_m),
                                args)
        return compiled.name, compiled.ptx, launch, extra


def _register_append(trtp, pad: int, target) -> None:
    """trtp.register / trtp.aot_impl of trtllm_dflash::kv_append (outputs: caches, lens, padding)."""

    def kv_append_desc(
        k_cache: trtp.TensorDesc, v_cache: trtp.TensorDesc, k_new: trtp.TensorDesc, v_new: trtp.TensorDesc,
        cache_lens: trtp.TensorDesc, new_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
    ):
        descs = (k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
        append_plugin_problem([desc_meta(d) for d in descs])
        return (k_cache.like(), v_cache.like(), cache_lens.like(), *[cache_lens.like() for _ in range(pad)])

    kv_append_desc.__annotations__["return"] = _outputs(len(APPEND_OUTPUT_NAMES) + pad)
    trtp.register(APPEND_PLUGIN_ID)(kv_append_desc)

    @trtp.aot_impl(APPEND_PLUGIN_ID)
    def kv_append_aot(
        k_cache: trtp.TensorDesc, v_cache: trtp.TensorDesc, k_new: trtp.TensorDesc, v_new: trtp.TensorDesc,
        cache_lens: trtp.TensorDesc, new_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        outputs: Tuple[trtp.TensorDesc], tactic: int,
    ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]:
        descs = (k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
        p = append_plugin_problem([desc_meta(d) for d in descs])
        if p.cache_dtype == checks.FP8_CACHE_DTYPE:
            require_static_scales(APPEND_PLUGIN_ID, desc_meta(k_scale), desc_meta(v_scale))
        compiled = compile_append_kernel(p, target)
        check_launch_abi(APPEND_PLUGIN_ID, compiled, pad)
        B, N, S = k_new.shape_expr[0], k_new.shape_expr[1], k_cache.shape_expr[1]
        args = append_scalar_args(N, S, p.num_kv_heads, p.head_dim, bool(p.kv_scale_per_head))
        # one program per (sequence, KV head, APPEND_BLOCK_N new rows)
        launch, extra = _launch(trtp, compiled, B * p.num_kv_heads, trtp.cdiv(N, APPEND_BLOCK_N), args)
        return compiled.name, compiled.ptx, launch, extra


def register_plugin(target=None) -> Plugins:
    """Define both plugins with tensorrt.plugin (idempotent). `target`: the triton GPUTarget the
    engine is built for (None: the current GPU), which fixes the padding outputs.

    Upstream (TensorRT 10.14, tensorrt/plugin/): _lib.py `register` (the number of outputs is
    read from the descriptor's return annotation, `_validate.py::_parse_register_return`) and
    `aot_impl` (returns kernel name, PTX, KernelLaunchParams, SymIntExprs; "extra_args ...
    located after the tensor inputs and before the tensor outputs"). _plugin_class.py calls the
    descriptor function with "fake" dims (dtype inference), then with shape expressions, and
    the aot_impl with all attributes positionally, in the order `trtp.op` received them."""
    global _REGISTERED
    if _REGISTERED is not None:
        return _REGISTERED
    import tensorrt.plugin as trtp

    if not hasattr(trtp, "aot_impl"):
        raise NotImplementedError(f"{PLUGIN_ID} needs TensorRT >= 10.9 (tensorrt.plugin.aot_impl); "
                                  "this TensorRT has no AOT Python plugins")
    pad = triton_extra_params(target)
    _register_attention(trtp, pad, target)
    _register_append(trtp, pad, target)
    ops = trtp.op.trtllm_dflash
    _REGISTERED = Plugins(ops.kv_inject_attention, getattr(ops, APPEND_PLUGIN_NAME), pad)
    return _REGISTERED


def _scales(network, k_scale, v_scale):
    """Constant ones for a non-FP8 cache: INetworkDefinition.add_constant(shape, tensorrt.Weights)
    (TensorRT keeps a pointer to the array)."""
    import tensorrt as trt

    if k_scale is None:
        k_scale = v_scale = network.add_constant((1,), trt.Weights(_ONE)).get_output(0)
    return k_scale, v_scale


def insert_kv_inject_attention(
    network,  # tensorrt.INetworkDefinition (strongly typed)
    q, k_block, v_block, k_cache, v_cache, cache_lens,  # tensorrt.ITensor, layouts as in the torch op
    *,
    scale: Optional[float] = None,
    causal_block: bool = False,
    window: Optional[int] = None,
    k_scale=None,  # tensorrt.ITensor float32 [1] or [Hkv], with a float8 cache
    v_scale=None,
):
    """Add the attention plugin layer to `network`; returns the layer (output 0: [B, T, Hq, D];
    the others are ABI padding).

    Arguments are checked here, at network construction, with the same messages as the
    torch op, instead of surfacing later from inside TensorRT's build callbacks.
    Upstream: `INetworkDefinition.add_plugin(..., aot=True)` (TensorRT 10.14,
    samples/python/quickly_deployable_plugins/qdp_runner.py).
    """
    metas = [itensor_meta(t) for t in (q, k_block, v_block, k_cache, v_cache, cache_lens)]
    problem = checks.check_attention(
        *metas, scale=scale, causal_block=causal_block, window=window,
        k_scale=None if k_scale is None else itensor_meta(k_scale),
        v_scale=None if v_scale is None else itensor_meta(v_scale))
    reason = checks.kernel_unsupported_reason(problem)
    if reason is not None:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: {reason}")
    if k_scale is not None:
        require_static_scales(PLUGIN_ID, itensor_meta(k_scale), itensor_meta(v_scale))
    k_scale, v_scale = _scales(network, k_scale, v_scale)
    op = register_plugin().attention
    plugin = op(q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale,
                **attention_attrs(float(problem.scale), causal_block, window))
    return network.add_plugin(plugin, aot=True)


def insert_kv_append(network, k_cache, v_cache, k_new, v_new, cache_lens, new_lens, *, k_scale=None, v_scale=None):
    """Add the append plugin layer to `network`; returns the layer (outputs k_cache_out,
    v_cache_out, lens_out, then ABI padding). Checked at network construction like the torch op.
    Upstream: `INetworkDefinition.add_plugin(..., aot=True)` (TensorRT 10.14)."""
    metas = [itensor_meta(t) for t in (k_cache, v_cache, k_new, v_new, cache_lens, new_lens)]
    problem = checks.check_append(*metas, k_scale=None if k_scale is None else itensor_meta(k_scale),
                                  v_scale=None if v_scale is None else itensor_meta(v_scale))
    reason = checks.append_kernel_unsupported_reason(problem)
    if reason is not None:
        raise KVInjectArgumentError(f"{APPEND_PLUGIN_ID}: {reason}")
    if k_scale is not None:
        require_static_scales(APPEND_PLUGIN_ID, itensor_meta(k_scale), itensor_meta(v_scale))
    k_scale, v_scale = _scales(network, k_scale, v_scale)
    plugin = register_plugin().append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, k_scale, v_scale)
    return network.add_plugin(plugin, aot=True)


def kv_inject_attention_trtllm(q, k_block, v_block, k_cache, v_cache, cache_lens, *, scale=None,
                               causal_block=False, window=None, k_scale=None, v_scale=None):
    """The attention plugin inside a TensorRT-LLM 1.2 network: takes and returns
    tensorrt_llm.functional.Tensor.

    Call inside a model's forward (under net_guard); the engine backend's drafter uses this
    in place of its attention core. TensorRT-LLM networks are strongly typed: cast inputs first.
    Upstream: `tensorrt_llm._common.default_trtnet`, `tensorrt_llm.functional._create_tensor`
    (tensorrt_llm/_common.py, tensorrt_llm/functional.py).
    """
    from tensorrt_llm._common import default_trtnet
    from tensorrt_llm.functional import _create_tensor

    unwrap = lambda t: None if t is None else t.trt_tensor  # noqa: E731
    layer = insert_kv_inject_attention(
        default_trtnet(), *(t.trt_tensor for t in (q, k_block, v_block, k_cache, v_cache, cache_lens)),
        scale=scale, causal_block=causal_block, window=window, k_scale=unwrap(k_scale), v_scale=unwrap(v_scale))
    return _create_tensor(layer.get_output(0), layer)


def kv_append_trtllm(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, *, k_scale=None, v_scale=None):
    """The append plugin inside a TensorRT-LLM 1.2 network: (k_cache_out, v_cache_out, lens_out)
    as tensorrt_llm.functional.Tensor. Upstream: as kv_inject_attention_trtllm."""
    from tensorrt_llm._common import default_trtnet
    from tensorrt_llm.functional import _create_tensor

    unwrap = lambda t: None if t is None else t.trt_tensor  # noqa: E731
    layer = insert_kv_append(default_trtnet(), *(t.trt_tensor for t in (k_cache, v_cache, k_new, v_new, cache_lens,
                                                                        new_lens)),
                             k_scale=unwrap(k_scale), v_scale=unwrap(v_scale))
    return tuple(_create_tensor(layer.get_output(i), layer) for i in range(len(APPEND_OUTPUT_NAMES)))
