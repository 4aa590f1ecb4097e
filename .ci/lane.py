"""A parity lane: the default test suite inside the Python stack of one of NVIDIA's TensorRT-LLM
containers (docs/compat.md).

    python .ci/lane.py STACK install   # a Python 3.12 venv: the stack's pins, the project --no-deps,
                                       # the rest of its requirements under the pins
    python .ci/lane.py STACK test      # the README's test run (python -m pytest -q) in that venv

STACK names .ci/stacks/STACK.txt (pins, one per line). `install` also checks what a user inside
that container would see: `pip install --dry-run -e .` must move none of the pinned packages.
The venv lives under $TRTLLM_DFLASH_LANES (default ~/.cache/trtllm_dflash/lanes), never in
the repository.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STACKS = ROOT / ".ci" / "stacks"
# What installing the project must never move inside a container (the list).
PROTECTED = ("torch", "transformers", "nvidia-modelopt", "numpy", "triton", "tokenizers")
# Installed without their dependencies where they pin something a stack moves past:
# nvidia-pytriton 0.7.0 requires numpy<2 (launch/stub_python.py gives its stub a numpy<2 of its own).
NO_DEPS = ("nvidia-pytriton",)


def lane_python() -> str:
    """A Python 3.12 interpreter: $LANE_PYTHON, pyenv's, or python3.12 on PATH (not a pyenv shim,
    which fails unless 3.12 is pyenv's selected version)."""
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    on_path = shutil.which("python3.12")
    found = os.environ.get("LANE_PYTHON") or (pyenv[-1] if pyenv else None)
    found = found or (on_path if on_path and "/shims/" not in on_path else None)
    if not found:
        sys.exit("lane: no Python 3.12 (set LANE_PYTHON)")
    return found


def venv_dir(stack: str) -> Path:
    base = os.environ.get("TRTLLM_DFLASH_LANES") or os.path.expanduser("~/.cache/trtllm_dflash/lanes")
    return Path(base) / stack


def pins(stack: str) -> dict[str, str]:
    lines = (STACKS / f"{stack}.txt").read_text().splitlines()
    return dict(line.split("==") for line in (ln.split("#")[0].strip() for ln in lines) if line)


def requirements() -> list[str]:
    """Every requirement of the project and of the extras the tests use, but the CPU torch pin."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = project["dependencies"] + [r for name in ("serve", "quant", "kernels", "dev") for r in extras[name]]
    return [r for r in reqs if not r.startswith("trtllm_dflash")]


def name_of(req: str) -> str:
    return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def install(stack: str) -> None:
    venv = venv_dir(stack)
    shutil.rmtree(venv, ignore_errors=True)
    run(lane_python(), "-m", "venv", venv)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    constraints = STACKS / f"{stack}.txt"
    pinned = pins(stack)
    run(*pip, "install", "-q", "-c", constraints, *(f"{p}=={v}" for p, v in pinned.items()))
    check_dry_run(pip, pinned)  # a user's `pip install -e .` on the container's stack
    rest = [r for r in requirements() if name_of(r) not in pinned and name_of(r) not in NO_DEPS]
    run(*pip, "install", "-q", "-c", constraints, *rest)
    for req in (r for r in requirements() if name_of(r) in NO_DEPS):
        run(*pip, "install", "-q", "--no-deps", req)
        deps = [d for d in requires(venv, name_of(req)) if name_of(d) not in pinned]
        if deps:
            run(*pip, "install", "-q", "-c", constraints, *deps)
    run(*pip, "install", "-q", "--no-deps", "-e", ROOT)
    if int(pinned.get("numpy", "1").split(".")[0]) >= 2:  # the bundled Triton stub's numpy < 2 (compat.py)
        target = subprocess.run([*pip[:1], "-c",
                                 "from trtllm_dflash.compat import stub_numpy_dir; print(stub_numpy_dir())"],
                                cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
        run(*pip, "install", "-q", "--no-deps", "--upgrade", "--target", target, "numpy>=1.26,<2")


def requires(venv: Path, package: str) -> list[str]:
    """`package`'s requirements that apply in the venv (markers evaluated there, no extras)."""
    code = ("from importlib import metadata; from packaging.requirements import Requirement\n"
            f"for r in map(Requirement, metadata.requires({package!r}) or []):\n"
            "    if r.marker is None or r.marker.evaluate({'extra': ''}): print(str(r).split(';')[0])")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def check_dry_run(pip: list, pinned: dict[str, str]) -> None:
    """What `pip install -e .` would do inside the container: it must move none of PROTECTED."""
    report = subprocess.run([*pip, "install", "--dry-run", "--quiet", "--report", "-", "-e", ROOT],
                            check=True, capture_output=True, text=True).stdout
    moved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report)["install"]}
    moved.pop("trtllm_dflash", None), moved.pop("trtllm-dflash", None)
    bad = {p: v for p, v in moved.items() if p in PROTECTED}
    print(f"lane: pip install --dry-run -e . would install {sorted(moved) or 'nothing else'}")
    if bad:
        sys.exit(f"lane: installing the project would move {bad} (stack pins {pinned})")


def test(stack: str, pytest_args: list[str]) -> int:
    python = venv_dir(stack) / "bin" / "python"
    if not python.exists():
        sys.exit(f"lane: {stack} is not installed; run: python .ci/lane.py {stack} install")
    print(f"+ [{stack}] python -m pytest -q {' '.join(pytest_args)}", flush=True)
    # Tests may name a lane's known failure (a skip with the open issue): TRTLLM_DFLASH_LANE says which lane runs.
    env = {**os.environ, "TRTLLM_DFLASH_LANE": stack}
    return subprocess.run([str(python), "-m", "pytest", "-q", *pytest_args], cwd=ROOT, env=env).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stack", choices=sorted(p.stem for p in STACKS.glob("*.txt")))
    ap.add_argument("action", choices=("install", "test"))
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    if args.action == "install":
        install(args.stack)
    else:
        rc = test(args.stack, args.pytest_args)
        sys.exit(0 if rc == 5 else rc)  # 5: no tests collected


if __name__ == "__main__":
    main()
