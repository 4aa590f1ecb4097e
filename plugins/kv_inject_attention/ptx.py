"""The plugins' kernels compiled to PTX with `triton.compile`, and the launch ABI TensorRT must match.

Kernel ABI (TensorRT's AOT launch passes the input pointers, the int32 extra args, then the
output pointers). Triton >= 3.3 appends trailing pointer parameters to every kernel (global
and profile scratch: 2 with triton 3.9, none with 3.2.0). Instead of pinning triton, each
plugin declares that many extra *padding outputs* ([B] int32, never read or written), so
TensorRT passes exactly the parameter list the PTX declares; the kernels use no scratch
memory (checked at compile time), so the padding slots are never dereferenced.
`triton_extra_params()` measures the count on the installed triton (README.md in this folder,
"Triton version").

Runs without TensorRT, and without a GPU when a triton GPUTarget is given; trt_plugin.py's
AOT implementations call it at engine build time.
"""

import dataclasses
import functools
import inspect
import re
from dataclasses import dataclass

from . import checks
from .checks import AppendProblem, AttentionProblem, KVInjectArgumentError
from .plugin_spec import APPEND_BLOCK_N, APPEND_PLUGIN_ID, PLUGIN_ID

# checks.py dtype name -> Triton pointer type in a kernel signature
_TRITON_POINTERS = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float8_e4m3fn": "*fp8e4nv",
                    "int32": "*i32"}
MAX_STATIC_SHARED_MEM = 48 * 1024  # bytes of dynamic shared memory a kernel may use without opting in


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
    signature = _signature(fn, {"Q": pointer[p.dtype], "K_BLOCK": pointer[p.dtype], "V_BLOCK": pointer[p.dtype],
                                "K_CACHE": pointer[p.cache_dtype], "V_CACHE": pointer[p.cache_dtype],
                                "CACHE_LENS": "*i32", "K_SCALE": "*fp32", "V_SCALE": "*fp32"},
                           {"OUT": pointer[p.dtype]})
    tiles = kernel.tile_config(p)
    constexprs = dict(
        SM_SCALE=p.scale, CAUSAL_BLOCK=p.causal_block, WINDOW=p.window or 0, GROUP=p.group_size,
        HEAD_DIM=p.head_dim, BLOCK_M=tiles["BLOCK_M"], BLOCK_N=tiles["BLOCK_N"],
        HAS_KV_SCALE=p.cache_dtype == checks.FP8_CACHE_DTYPE, **kernel.dot_config(p.dtype, upcast=False),
    )
    compiled = _compile(PLUGIN_ID, fn, signature, constexprs, target, tiles["num_warps"])
    return dataclasses.replace(compiled, block_m=tiles["BLOCK_M"])


def _signature(fn, inputs: dict[str, str], outputs: dict[str, str]) -> dict[str, str]:
    """triton's signature of kernel `fn` in its argument order: the pointer `inputs`, every
    argument between them and the first of `outputs` as int32 (TensorRT's int32 args), `outputs`."""
    ints = fn.arg_names[len(inputs):fn.arg_names.index(next(iter(outputs)))]
    return {**inputs, **{name: "i32" for name in ints}, **outputs}


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
    signature = _signature(fn, {"K_CACHE": pointer[p.cache_dtype], "V_CACHE": pointer[p.cache_dtype],
                                "K_NEW": pointer[p.new_dtype], "V_NEW": pointer[p.new_dtype], "CACHE_LENS": "*i32",
                                "NEW_LENS": "*i32", "K_SCALE": "*fp32", "V_SCALE": "*fp32"},
                           {"K_OUT": pointer[p.cache_dtype], "V_OUT": pointer[p.cache_dtype], "LENS_OUT": "*i32"})
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
