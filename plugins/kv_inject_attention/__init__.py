"""KV-injection attention for the DFlash drafter (see README.md in this folder).

Block queries attend over the injected context K/V cache plus the block itself.
"""

from .checks import KVInjectArgumentError
from .reference import append_context_reference, kv_inject_attention_reference

__all__ = ["KVInjectArgumentError", "append_context_reference", "kv_inject_attention_reference"]
