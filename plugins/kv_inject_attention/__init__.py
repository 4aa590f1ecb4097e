"""KV-injection attention for the DFlash drafter (see README.md in this folder).

Block queries attend over the injected context K/V cache plus the block itself.

- `kv_inject_attention`, `append_context`: the public API, backed by the torch custom ops
  `torch.ops.trtllm_dflash.kv_inject_attention` / `.append_context` (op.py): the Triton
  kernel on CUDA, the pure-torch reference elsewhere.
- `kv_inject_attention_reference`, `append_context_reference`: the reference (reference.py).
- kernel.py: the Triton kernels (imported only on demand; triton is optional).
- trt_plugin.py: the TensorRT plugins (imported only on demand; needs tensorrt >= 10.9), with
  plugin_spec.py (what they take and check) and ptx.py (their kernels compiled to PTX).
"""

from .checks import KVInjectArgumentError
from .op import append_context, kv_inject_attention
from .reference import append_context_reference, kv_inject_attention_reference

__all__ = [
    "KVInjectArgumentError",
    "append_context",
    "append_context_reference",
    "kv_inject_attention",
    "kv_inject_attention_reference",
]
