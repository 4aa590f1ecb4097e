"""TensorRT's own pure-Python plugin layer (`tensorrt.plugin`), loaded for CPU tests.

The `tensorrt.plugin` package of TensorRT 10.14 (the TensorRT that TensorRT-LLM 1.2.1 pins) is
pure Python over the C++ bindings module (`tensorrt.so`, which needs libnvinfer and a GPU).
This helper downloads the bindings wheel once into a cache outside the repository, checks its
sha256, extracts only `tensorrt_bindings/plugin/*.py`, and imports that package as
`tensorrt.plugin` on top of `trt_core` (our stand-in for the C++ classes it uses).

Cache: `$XDG_CACHE_HOME/trtllm_dflash/tensorrt-plugin/<version>/` (default `~/.cache`). A failed
download fails the tests with the reason; set `TRTLLM_DFLASH_OFFLINE=1` to skip them instead.
The extracted files are identical to NVIDIA/TensorRT `python/packaging/bindings_wheel/tensorrt/
plugin/` on branch release/10.14 (commit 3b4ddc1d, "TensorRT Release 10.14").
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import types
import warnings
import zipfile
from pathlib import Path

import trt_core

TRT_VERSION = "10.14.1.48.post1"
WHEEL_NAME = f"tensorrt_cu12_bindings-{TRT_VERSION}-cp312-none-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "78da2abb803370147e75045eaeaa2a3f134f5aa7537405f86b22eaa36c0a11ed"
PLUGIN_FILES = ("__init__.py", "_autotune.py", "_export.py", "_lib.py", "_plugin_class.py", "_tensor.py",
                "_top_level.py", "_utils.py", "_validate.py")
OFFLINE_ENV = "TRTLLM_DFLASH_OFFLINE"


class PluginLayerUnavailable(RuntimeError):
    """The wheel could not be downloaded or does not match WHEEL_SHA256."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtllm_dflash" / "tensorrt-plugin" / TRT_VERSION


def offline() -> bool:
    return os.environ.get(OFFLINE_ENV, "") not in ("", "0")


def verify(wheel: Path) -> Path:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise PluginLayerUnavailable(f"{wheel.name} has sha256 {digest}, expected {WHEEL_SHA256}")
    return wheel


def _download(dest: Path) -> Path:
    """pip download of the cp312 manylinux wheel (works from any Python: no install, no deps)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--platform", "manylinux_2_28_x86_64", f"tensorrt-cu12-bindings=={TRT_VERSION}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wheel = dest / WHEEL_NAME
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise PluginLayerUnavailable(f"could not download tensorrt-cu12-bindings=={TRT_VERSION} with pip "
                                     f"(exit {proc.returncode}): {' | '.join(tail)}")
    return verify(wheel)


def _extract(wheel: Path, dest: Path) -> None:
    """tensorrt_bindings/plugin/*.py -> dest/tensorrt/plugin/ (nothing else: tensorrt.so cannot load here)."""
    target = dest / "tensorrt" / "plugin"
    target.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in PLUGIN_FILES:
            (target / name).write_bytes(zf.read(f"tensorrt_bindings/plugin/{name}"))


def _cached(src: Path) -> bool:
    return all((src / "tensorrt" / "plugin" / name).is_file() for name in PLUGIN_FILES)


def plugin_source_root() -> Path:
    """A folder holding `tensorrt/plugin/*.py` from the pinned wheel; downloads it on first use."""
    root = cache_dir()
    done = root / "src"
    if _cached(done):
        return done
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        wheel = _download(Path(tmp))
        staging = Path(tmp) / "src"
        _extract(wheel, staging)
        try:
            staging.rename(done)  # atomic: a half-extracted cache never looks complete
        except OSError:
            if not done.is_dir():  # another process won the race: keep its copy
                raise
    return done


def require() -> Path:
    """plugin_source_root() for a test: fails the test when the wheel cannot be had, or skips it
    when TRTLLM_DFLASH_OFFLINE=1 and nothing is cached (then no download is tried)."""
    import pytest

    if offline() and not _cached(cache_dir() / "src"):
        pytest.skip(f"{OFFLINE_ENV} is set and TensorRT {TRT_VERSION}'s tensorrt.plugin is not cached in {cache_dir()}")
    try:
        return plugin_source_root()
    except PluginLayerUnavailable as error:
        pytest.fail(f"TensorRT {TRT_VERSION}'s tensorrt.plugin is needed for these tests and could not be fetched: "
                    f"{error}. Set {OFFLINE_ENV}=1 to skip them on a machine without a package index.")


def _fresh_core(root: Path) -> types.ModuleType:
    """A new `tensorrt` module: trt_core's classes, its own plugin registry, `plugin` found under root."""
    trt = types.ModuleType("tensorrt")
    for name in trt_core.__all__:
        setattr(trt, name, getattr(trt_core, name))
    for name, dtype in trt_core.ALIASES.items():
        setattr(trt, name, dtype)
    trt.get_plugin_registry = trt_core.PluginRegistryFactory()
    trt.__version__ = TRT_VERSION
    trt.__path__ = [str(root / "tensorrt")]
    return trt


@contextlib.contextmanager
def installed():
    """`import tensorrt` / `import tensorrt.plugin` give the stand-in core and the real plugin layer
    inside the block (fresh modules each time: the plugin registry starts empty); sys.modules is
    restored afterwards. Yields the `tensorrt` module."""
    root = plugin_source_root()
    saved = {k: v for k, v in sys.modules.items() if k == "tensorrt" or k.startswith("tensorrt.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["tensorrt"] = trt = _fresh_core(root)
    try:
        with warnings.catch_warnings():
            # upstream docstrings hold "\s" (DeprecationWarning, SyntaxWarning on 3.12) at compile time
            warnings.filterwarnings("ignore", "invalid escape sequence", DeprecationWarning)
            warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)
            trt.plugin = importlib.import_module("tensorrt.plugin")
        yield trt
    finally:
        for name in [k for k in sys.modules if k == "tensorrt" or k.startswith("tensorrt.")]:
            del sys.modules[name]
        sys.modules.update(saved)
