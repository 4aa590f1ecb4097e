"""The bundled Triton stub and numpy 2 (compat.py): the stub of nvidia-pytriton 0.7.0 (Triton 24.10,
pybind11 2.10) reads numpy 1's dtype layout, so under numpy 2 it runs on an interpreter overlay
with a numpy < 2 of its own, and a stub that cannot read numpy 2 arrays refuses to serve."""

import subprocess
from pathlib import Path

import pytest

from trtllm_dflash import compat
from trtllm_dflash.errors import UserError
from trtllm_dflash.launch import server as launch
from trtllm_dflash.launch.stub_python import stub_interpreter


def _fake_numpy(directory: Path, version: str) -> Path:
    (directory / f"numpy-{version}.dist-info").mkdir(parents=True)
    (directory / "numpy").mkdir()
    (directory / "numpy" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return directory


def test_overlay_puts_its_numpy_first_and_keeps_this_environment(tmp_path):
    numpy1 = _fake_numpy(tmp_path / "np1", "1.26.4")
    bindir = stub_interpreter(tmp_path / "overlay", numpy1)
    # The overlay's python3 is this interpreter; its numpy is the overlay's; our package still imports.
    code = "import numpy, trtllm_dflash, sys; print(numpy.__version__); print(trtllm_dflash.__file__)"
    out = subprocess.run([str(bindir / "python3"), "-c", code], capture_output=True, text=True, check=True).stdout
    version, package = out.split()
    assert version == "1.26.4"
    assert Path(package).resolve() == (Path(__file__).parents[2] / "trtllm_dflash" / "__init__.py").resolve()


@pytest.mark.parametrize("found", [None, "2.1.0"])
def test_overlay_without_a_numpy_1_is_one_line_naming_the_fix(tmp_path, found):
    numpy1 = tmp_path / "np1"
    numpy1.mkdir()
    if found:
        _fake_numpy(numpy1 / "x", found)
        numpy1 = numpy1 / "x"
    with pytest.raises(UserError) as e:
        stub_interpreter(tmp_path / "overlay", numpy1)
    msg = str(e.value)
    assert "\n" not in msg and "-m pip install --no-deps --target" in msg and str(numpy1) in msg
    assert (f"has numpy {found}" if found else "has no numpy") in msg


MODEL = """
from trtllm_dflash.serve.triton_model import check_stub_numpy
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        check_stub_numpy()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""
CONFIG = 'name: "probe"\nbackend: "python"\nmax_batch_size: 0\n' \
         'input [ { name: "x" data_type: TYPE_INT32 dims: [ -1 ] } ]\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n'


@pytest.mark.skipif(not compat.numpy_2(), reason="numpy 1: the bundled stub reads numpy 1 arrays correctly")
def test_a_stub_that_misreads_numpy_2_refuses_to_serve(tmp_path, monkeypatch):
    pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
    (tmp_path / "repo" / "probe" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "probe" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "repo" / "probe" / "1" / "model.py").write_text(MODEL)
    ports = launch.free_ports(3)
    monkeypatch.setattr(launch.compat, "numpy_2", lambda: False)  # no overlay: the stub sees numpy 2
    with pytest.raises(UserError, match=f"cannot exchange tensors with numpy {compat.version_of('numpy')}"):
        launch.TritonServer(tmp_path / "repo", launch.Endpoints("127.0.0.1", *ports)).start(timeout_s=60)
    monkeypatch.undo()  # with the overlay it loads
    server = launch.TritonServer(tmp_path / "repo", launch.Endpoints("127.0.0.1", *ports)).start(timeout_s=60)
    server.stop()

