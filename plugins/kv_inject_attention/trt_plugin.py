"""TensorRT plugin for KV-injection attention: a Python-defined plugin with an AOT implementation.

`register_plugin()` defines `trtllm_dflash::kv_inject_attention` with `tensorrt.plugin`
(TensorRT >= 10.9; TensorRT-LLM 1.2.1 ships 10.14):

- `@trtp.register`: the op descriptor. Shape and type inference and the argument checks
  delegate to checks.py (the same functions the torch op runs): out = [B, T, Hq, D] in q's
  dtype.
- `@trtp.aot_impl`: compiles kernel.py's `_kv_inject_attention_fwd` to PTX with
  `triton.compile` while the engine is built and returns the kernel name, the PTX, the
  launch grid and the int32 scalar arguments as symbolic shape expressions. TensorRT
  embeds the PTX in the engine, so no Python runs at inference (the C++ Executor and the
  Triton C++ backend can load it). There is deliberately no JIT `@trtp.impl`.

Plugin inputs, in order: q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale,
v_scale (the scales are float32 [1] or [Hkv]; with a non-FP8 cache they are ignored and
`insert_kv_inject_attention` feeds constant ones). Attributes: scale (float, resolved),
causal_block (bool), window (int, 0 = no window: attributes cannot be None). AOT plugin
attributes are not serialized; they only parameterize the PTX compiled at build time.

Everything here that does not need TensorRT (dtype mapping, descriptor -> TensorMeta,
the scalar-argument formulas, the Triton compile) is a plain function tested on CPU;
`tensorrt` itself is imported only inside `register_plugin()` and the insert helpers.

NOTE: no `from __future__ import annotations` in this file: `tensorrt.plugin` inspects
the decorated functions' annotations as real classes.
"""

import inspect
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from . import checks
from .checks import AttentionProblem, KVInjectArgumentError, TensorMeta

PLUGIN_NAMESPACE = "trtllm_dflash"
PLUGIN_NAME = "kv_inject_attention"
PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}"
INPUT_NAMES = ("q", "k_block", "v_block", "k_cache", "v_cache", "cache_lens", "k_scale", "v_scale")

# tensorrt.DataType member name -> checks.py dtype name
_TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "FP8": "float8_e4m3fn",
               "INT32": "int32", "INT64": "int64", "INT8": "int8", "BOOL": "bool", "UINT8": "uint8"}
# checks.py dtype name -> Triton pointer type in a kernel signature
_TRITON_POINTERS = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float8_e4m3fn": "*fp8e4nv",
                    "int32": "*i32"}
_ONE = np.ones(1, dtype=np.float32)
MAX_STATIC_SHARED_MEM = 48 * 1024  # bytes of dynamic shared memory a kernel may use without opting in  # scale input for non-FP8 caches; TensorRT keeps a pointer to it


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


def plugin_problem(metas: Sequence[TensorMeta], scale: float, causal_block: bool, window: int) -> AttentionProblem:
    """Check the plugin's 8 inputs and 3 attributes with checks.py; raises KVInjectArgumentError."""
    if len(metas) != len(INPUT_NAMES):
        raise KVInjectArgumentError(f"{PLUGIN_ID}: expected {len(INPUT_NAMES)} inputs {INPUT_NAMES}, got {len(metas)}")
    q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale = metas
    for name, m in (("k_scale", k_scale), ("v_scale", v_scale)):
        if m.dtype != checks.SCALE_DTYPE or len(m.shape) != 1:
            raise KVInjectArgumentError(f"{PLUGIN_ID}: plugin input {name} must be a float32 [1] or [Hkv] tensor "
                                        f"(constant ones with a non-FP8 cache), got {m.dtype} {m.shape}")
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


@dataclass(frozen=True)
class CompiledKernel:
    """What the AOT implementation hands to TensorRT."""

    name: str
    ptx: str
    num_warps: int
    shared_mem: int  # bytes of dynamic shared memory per block
    block_m: int  # query rows per program (grid dim 1 = ceil(T * GROUP / block_m))
    num_params: int  # .param entries of the PTX entry point
    abi_params: int  # what TensorRT passes: input pointers + int32 extra args + output pointer


def compile_attention_kernel(problem: AttentionProblem, target=None) -> CompiledKernel:
    """Compile `_kv_inject_attention_fwd` for `problem` to PTX.

    `target` is a triton GPUTarget (e.g. GPUTarget("cuda", 90, 32)); None compiles for the
    current GPU. Runs without TensorRT, and without a GPU when a target is given.
    """
    import triton
    from triton.runtime.jit import JITFunction

    from . import kernel

    sm = None if target is None else int(target.arch)
    reason = checks.kernel_unsupported_reason(problem, sm)
    if reason is not None:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: {reason}")
    fn = kernel._kv_inject_attention_fwd
    if not isinstance(fn, JITFunction):
        raise RuntimeError("cannot compile the kernel to PTX while TRITON_INTERPRET=1 (kernel.py was imported "
                           "in interpreter mode); build engines in a process without it")

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
    signature.update({name: "constexpr" for name in constexprs})
    # triton < 3.3 (e.g. 3.2.0, pinned by TensorRT 10.14's QDP sample) calls it `constants`.
    constexpr_kw = "constexprs" if "constexprs" in inspect.signature(triton.compiler.ASTSource).parameters \
        else "constants"
    src = triton.compiler.ASTSource(fn=fn, signature=signature, **{constexpr_kw: constexprs})
    # Software pipelining stages tiles in shared memory. Above 48 KiB a launch must opt in
    # (cuFuncSetAttribute), which we cannot ask of TensorRT's AOT launcher: pipeline less instead.
    for num_stages in (3, 2, 1):
        compiled = triton.compile(src, target=target, options={"num_warps": tiles["num_warps"],
                                                               "num_stages": num_stages})
        if compiled.metadata.shared <= MAX_STATIC_SHARED_MEM:
            break
    else:
        raise NotImplementedError(f"{PLUGIN_ID}: the kernel needs {compiled.metadata.shared} B of shared memory "
                                  f"even unpipelined; more than the {MAX_STATIC_SHARED_MEM} B a launch gets by default")
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise NotImplementedError(
            f"{PLUGIN_ID}: the compiled kernel asks for Triton scratch memory (global {meta.global_scratch_size} B, "
            f"profile {getattr(meta, 'profile_scratch_size', 0)} B), which a TensorRT AOT plugin cannot provide")
    ptx = compiled.asm["ptx"]
    entry = re.search(r"\.entry\s+" + re.escape(meta.name) + r"\s*\((.*?)\)", ptx, re.S)
    num_params = entry.group(1).count(".param") if entry else -1
    return CompiledKernel(name=meta.name, ptx=ptx, num_warps=tiles["num_warps"], shared_mem=meta.shared,
                          block_m=tiles["BLOCK_M"], num_params=num_params,
                          abi_params=len(signature) - len(constexprs))


ALLOW_EXTRA_PARAMS_ENV = "TRTLLM_DFLASH_AOT_ALLOW_EXTRA_PARAMS"


def check_launch_abi(compiled: CompiledKernel) -> None:
    """Refuse PTX whose entry point takes more parameters than TensorRT passes.

    Triton >= 3.3 appends pointer parameters (global / profile scratch) to every kernel;
    TensorRT's AOT launcher passes exactly the inputs, the int32 extra args and the
    outputs, so the driver would read past its argument array. Triton 3.2.0 (what
    TensorRT 10.14's plugin sample pins) emits no extra parameters. Setting
    TRTLLM_DFLASH_AOT_ALLOW_EXTRA_PARAMS=1 skips this check, for when a GPU run has shown
    that the TensorRT in use copes.
    """
    if compiled.num_params == compiled.abi_params or os.environ.get(ALLOW_EXTRA_PARAMS_ENV) == "1":
        return
    import triton

    raise NotImplementedError(
        f"{PLUGIN_ID}: triton {triton.__version__} compiled {compiled.name} with {compiled.num_params} PTX "
        f"parameters, but a TensorRT AOT plugin launch passes {compiled.abi_params} (inputs, int32 args, output); "
        f"build engines with triton==3.2.0, or set {ALLOW_EXTRA_PARAMS_ENV}=1 once a GPU run proved it safe")


_REGISTERED = None


def register_plugin():
    """Define the plugin with tensorrt.plugin (idempotent). Returns its `trtp.op` entry point."""
    global _REGISTERED
    if _REGISTERED is not None:
        return _REGISTERED
    import tensorrt.plugin as trtp

    if not hasattr(trtp, "aot_impl"):
        raise NotImplementedError(f"{PLUGIN_ID} needs TensorRT >= 10.9 (tensorrt.plugin.aot_impl); "
                                  "this TensorRT has no AOT Python plugins")

    @trtp.register(PLUGIN_ID)
    def kv_inject_attention_desc(
        q: trtp.TensorDesc, k_block: trtp.TensorDesc, v_block: trtp.TensorDesc, k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc, cache_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        scale: float, causal_block: bool, window: int,
    ) -> trtp.TensorDesc:
        descs = (q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale)
        plugin_problem([desc_meta(d) for d in descs], scale, causal_block, window)
        return q.like()  # out: [B, T, Hq, D] in q's dtype

    @trtp.aot_impl(PLUGIN_ID)
    def kv_inject_attention_aot(
        q: trtp.TensorDesc, k_block: trtp.TensorDesc, v_block: trtp.TensorDesc, k_cache: trtp.TensorDesc,
        v_cache: trtp.TensorDesc, cache_lens: trtp.TensorDesc, k_scale: trtp.TensorDesc, v_scale: trtp.TensorDesc,
        scale: float, causal_block: bool, window: int, outputs: Tuple[trtp.TensorDesc], tactic: int,
    ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymIntExprs]:
        descs = (q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale)
        problem = plugin_problem([desc_meta(d) for d in descs], scale, causal_block, window)
        compiled = compile_attention_kernel(problem)
        check_launch_abi(compiled)
        B, T, S = q.shape_expr[0], q.shape_expr[1], k_cache.shape_expr[1]
        G = problem.group_size

        launch = trtp.KernelLaunchParams()
        launch.grid_x = B * problem.num_kv_heads  # one program per (sequence, KV head)
        launch.grid_y = trtp.cdiv(T * G, compiled.block_m)  # query rows (t, head in group)
        launch.block_x = compiled.num_warps * 32
        launch.shared_mem = compiled.shared_mem
        args = scalar_args(B, T, S, problem.num_q_heads, problem.num_kv_heads, problem.head_dim,
                           bool(problem.kv_scale_per_head))
        extra_args = trtp.SymIntExprs.from_tuple([trtp.SymInt32(a) for a in args])
        return compiled.name, compiled.ptx, launch, extra_args

    _REGISTERED = trtp.op.trtllm_dflash.kv_inject_attention
    return _REGISTERED


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
    """Add the AOT plugin layer to `network`; returns the layer (output 0: [B, T, Hq, D]).

    Arguments are checked here, at network construction, with the same messages as the
    torch op, instead of surfacing later from inside TensorRT's build callbacks.
    """
    import tensorrt as trt

    metas = [itensor_meta(t) for t in (q, k_block, v_block, k_cache, v_cache, cache_lens)]
    problem = checks.check_attention(
        *metas, scale=scale, causal_block=causal_block, window=window,
        k_scale=None if k_scale is None else itensor_meta(k_scale),
        v_scale=None if v_scale is None else itensor_meta(v_scale))
    reason = checks.kernel_unsupported_reason(problem)
    if reason is not None:
        raise KVInjectArgumentError(f"{PLUGIN_ID}: {reason}")
    if k_scale is None:
        k_scale = v_scale = network.add_constant((1,), trt.Weights(_ONE)).get_output(0)
    op = register_plugin()
    # Attributes in registration order (the AOT impl receives them positionally in that order).
    plugin = op(q, k_block, v_block, k_cache, v_cache, cache_lens, k_scale, v_scale,
                scale=float(problem.scale), causal_block=bool(causal_block), window=int(window or 0))
    return network.add_plugin(plugin, aot=True)


def kv_inject_attention_trtllm(q, k_block, v_block, k_cache, v_cache, cache_lens, *, scale=None,
                               causal_block=False, window=None, k_scale=None, v_scale=None):
    """The plugin inside a TensorRT-LLM 1.2 network: takes and returns tensorrt_llm.functional.Tensor.

    Call inside a model's forward (under net_guard); the engine backend's drafter uses this
    in place of its attention core. TensorRT-LLM networks are strongly typed: cast inputs first.
    """
    from tensorrt_llm._common import default_trtnet
    from tensorrt_llm.functional import _create_tensor

    unwrap = lambda t: None if t is None else t.trt_tensor  # noqa: E731
    layer = insert_kv_inject_attention(
        default_trtnet(), *(t.trt_tensor for t in (q, k_block, v_block, k_cache, v_cache, cache_lens)),
        scale=scale, causal_block=causal_block, window=window, k_scale=unwrap(k_scale), v_scale=unwrap(v_scale))
    return _create_tensor(layer.get_output(0), layer)
