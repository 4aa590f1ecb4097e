"""Kernel fixtures (tests/helpers/kernel_fixtures.py): TRITON_INTERPRET=1 is set on import, before
any test module here imports the kernel. `trt`: TensorRT's own plugin layer (trt_plugin_layer)."""

import pytest

from kernel_fixtures import device, kernel  # noqa: F401
from kv_inject_trt_network import PAD


@pytest.fixture
def trt(monkeypatch):
    """`tensorrt` = trt_core stand-in + TensorRT 10.14's real `tensorrt.plugin`, fresh per test; our
    plugins unregistered (trt_plugin._REGISTERED reset) and registered with PAD padding outputs."""
    import trt_plugin_layer
    from trtllm_dflash.plugins.kv_inject_attention import trt_plugin

    trt_plugin_layer.require()
    monkeypatch.setattr(trt_plugin, "_REGISTERED", None)
    monkeypatch.setattr(trt_plugin, "triton_extra_params", lambda target=None: PAD)
    with trt_plugin_layer.installed() as module:
        yield module
