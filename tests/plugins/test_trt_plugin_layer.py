"""The test-time TensorRT plugin layer itself: the wheel loader (trt_plugin_layer.py) fails loudly
or skips on request, and the stand-in C++ classes (trt_core.py) behave as TensorRT's where
TensorRT 10.14's own `tensorrt.plugin` code relies on them."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import trt_core
import trt_plugin_layer


def _no_index(monkeypatch, tmp_path):
    """pip without any index or wheel folder: `pip download` fails at once, without a network."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))


def test_failed_download_fails_the_tests(monkeypatch, tmp_path):
    _no_index(monkeypatch, tmp_path)
    monkeypatch.delenv(trt_plugin_layer.OFFLINE_ENV, raising=False)
    with pytest.raises(trt_plugin_layer.PluginLayerUnavailable, match="could not download tensorrt-cu12-bindings"):
        trt_plugin_layer.plugin_source_root()
    with pytest.raises(pytest.fail.Exception, match=f"Set {trt_plugin_layer.OFFLINE_ENV}=1 to skip"):
        trt_plugin_layer.require()
    assert not (trt_plugin_layer.cache_dir() / "src").exists()  # nothing half-done left in the cache


def test_offline_skips_without_downloading(monkeypatch, tmp_path):
    _no_index(monkeypatch, tmp_path)
    monkeypatch.setenv(trt_plugin_layer.OFFLINE_ENV, "1")
    monkeypatch.setattr(trt_plugin_layer, "_download", lambda dest: pytest.fail("downloaded while offline"))
    with pytest.raises(pytest.skip.Exception, match="is set and TensorRT .* is not cached"):
        trt_plugin_layer.require()


def test_wheel_checksum_is_enforced(tmp_path):
    wheel = tmp_path / trt_plugin_layer.WHEEL_NAME
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(trt_plugin_layer.PluginLayerUnavailable, match="has sha256 .*, expected 78da2abb"):
        trt_plugin_layer.verify(wheel)


def test_installed_restores_sys_modules(trt):
    """Inside the fixture `tensorrt` is the stand-in with the real plugin package, from the cache."""
    assert sys.modules["tensorrt"] is trt and trt.DimsExprs is trt_core.DimsExprs
    plugin_dir = Path(sys.modules["tensorrt.plugin"].__file__).parent
    assert plugin_dir == trt_plugin_layer.cache_dir() / "src" / "tensorrt" / "plugin"
    assert sorted(p.name for p in plugin_dir.glob("*.py")) == sorted(trt_plugin_layer.PLUGIN_FILES)


def test_shape_exprs_over_the_stand_in_builder(trt):
    """tensorrt.plugin's ShapeExpr arithmetic (_tensor.py, _top_level.py) on our IExprBuilder:
    symbolic dims stay symbolic, constants fold, fake dims refuse constant queries."""
    from tensorrt import plugin as trtp
    from tensorrt.plugin import _tensor

    _tensor.SymIntExpr._exprBuilder = trt.IExprBuilder()
    rows = trtp.ShapeExpr(trt_core.symbol("T")) * 4
    tiles = trtp.cdiv(rows, 16)
    assert not tiles.is_constant and tiles.is_fake is False
    assert [tiles._expr.evaluate({"T": t}) for t in (1, 4, 5)] == [1, 1, 2]
    assert tiles._expr.get_constant_value() == trt_core.INT64_MIN  # NvInferRuntime.h: not a constant
    folded = trtp.ShapeExpr(3) * 4 + 1
    assert folded.is_constant and folded.constant_value() == 13
    fake = trtp.ShapeExpr()
    assert fake.is_fake and (fake * 4).is_fake
    with pytest.raises(RuntimeError, match="Not accessible for fake"):
        fake.is_constant


def test_plugin_fields_read_back_as_tensorrt_does(trt):
    """pyPlugin.cpp's PluginField.data: the buffer read as the field type's numpy dtype."""
    flag = trt.PluginField("causal_block", np.array([True]), trt.PluginFieldType.INT8)
    assert flag.data.dtype == np.int8 and flag.data.tolist() == [1] and flag.size == 1
    scale = trt.PluginField("scale", np.array([0.125]), trt.PluginFieldType.FLOAT64)
    assert scale.data.dtype == np.float64 and scale.data.tolist() == [0.125]
    with pytest.raises(AttributeError, match="No known conversion"):
        trt.PluginField("h", np.ones(1, np.float16), trt.PluginFieldType.FLOAT16).data
    with pytest.raises(TypeError, match="null expression"):
        trt.DimsExprs(1)[0] = None
