"""ruff passes over the repository with the configuration in pyproject.toml ([tool.ruff]): the
rules and line length every file is held to, checked here the way import-linter's contracts are
(tests/test_import_contracts.py), so CI enforces them."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    """ruff through this interpreter (the dev extra installs it beside pytest), else the one on
    PATH; None where neither has it."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else None


def test_ruff_finds_nothing():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    # --no-cache: nothing written into the checkout; the whole tree takes ruff well under a second
    proc = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    found = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, "ruff check (pyproject.toml [tool.ruff]):\n" + found
