"""The interpreter the bundled Python backend stub runs on under numpy 2.

The tritonserver bundled with nvidia-pytriton ships a stub built for Triton 24.10 (pybind11
2.10), which cannot exchange tensors with numpy 2 (compat.py). So under numpy 2 the stub runs on
an interpreter overlay whose numpy is a numpy < 2 and whose other packages are this
environment's (`stub_interpreter`); launch/server.py puts it first on the server's PATH.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from packaging.version import InvalidVersion, Version

from trtllm_dflash import compat
from trtllm_dflash.errors import UserError


def stub_interpreter(root: Path, numpy1: Path) -> Path:
    """A venv-shaped overlay at `root` for the bundled Python backend stub: this interpreter, the
    numpy < 2 in `numpy1` first, then this environment's site-packages (with their .pth hooks,
    so editable installs resolve). Returns its bin directory; a one-line error without numpy1."""
    version = _numpy_release(numpy1)
    if version is None or version.major >= 2:
        found = "no numpy" if version is None else f"numpy {version}"
        raise UserError(
            f"under numpy {compat.version_of('numpy')} the tritonserver bundled with nvidia-pytriton (Triton 24.10, "
            f"pybind11 2.10) corrupts every tensor; its Python stub needs a numpy < 2 of its own and {numpy1} has "
            f"{found}: run {compat.stub_numpy_hint(numpy1)} (or point ${compat.STUB_NUMPY_ENV} at one)")
    tag = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "lib" / tag / "site-packages"
    (root / "bin").mkdir(parents=True)
    site.mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(Path(sys.executable).resolve())
    (root / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).resolve().parent}\n"
                                     f"include-system-site-packages = false\nversion = {sys.version.split()[0]}\n")
    # .pth lines run in file-name order and append: numpy < 2 comes before this environment's.
    (site / "00-stub-numpy.pth").write_text(f"{numpy1}\n")
    env_sites = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "10-environment.pth").write_text("".join(f"import site; site.addsitedir({str(d)!r})\n" for d in env_sites))
    return root / "bin"


def _numpy_release(directory: Path) -> Version | None:
    """The numpy release installed in `directory` (from its dist-info), None if there is none."""
    for info in sorted(directory.glob("numpy-*.dist-info")) if directory.is_dir() else ():
        try:
            return Version(info.name[len("numpy-"):-len(".dist-info")])
        except InvalidVersion:
            continue
    return None
