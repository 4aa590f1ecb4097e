"""Fixtures of the kernel tests (tests/plugins, tests/perf): Triton kernels run on CPU under the
Triton interpreter.

`triton.jit` picks interpreter or compiler when the decorated function is *defined*,
i.e. when kernel.py is imported, so TRITON_INTERPRET=1 is set here, and the conftest.py of
every folder with kernel tests imports this module before its test modules import kernel.py. Without a GPU nothing in
the package compiles Triton code, so setting it for the whole pytest process is harmless. If kernel.py was
imported earlier anyway (say by a test elsewhere), the `kernel` fixture reloads it.

Without triton installed the kernel tests skip with the reason; reference and
validation tests run regardless.
"""

import importlib
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def kernel():
    """The kernel module, compiled on a GPU, interpreted on CPU."""
    pytest.importorskip("triton", reason="triton is not installed (pip install 'trtllm_dflash[kernels]')",
                        exc_type=ImportError)
    from trtllm_dflash.plugins.kv_inject_attention import kernel as module

    if not ON_GPU:
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(module._kv_inject_attention_fwd, InterpretedFunction):
            module = importlib.reload(module)
    return module


@pytest.fixture(scope="session")
def device():
    """Where kernel tests put their tensors: CUDA when present, else CPU (interpreter)."""
    return torch.device("cuda" if ON_GPU else "cpu")
