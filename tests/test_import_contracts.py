"""The import contracts of pyproject.toml ([tool.importlinter]) hold: stages never import a later
stage, reference/ imports no stage / serving code / TensorRT, shared foundations import no stage,
nothing imports commands/. Checked with import-linter on the package's real import graph."""

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    if importlib.util.find_spec("importlinter") is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    # lint-imports through this interpreter: the console script may be another environment's
    # (a virtualenv over system site-packages finds the system's, or a pyenv shim)
    lint = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in proc.stdout


EARLIER_STAGES = ("convert", "quantize", "engines", "deploy")


def _imported_modules(path: Path) -> set[str]:
    """Every `trtllm_dflash.*` module a file imports (top level or inside functions)."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("trtllm_dflash.")}


def test_serve_imports_no_earlier_stage_but_deploys_contract():
    """import-linter's forbidden list names deploy's modules one by one; this catches a new one."""
    offending = sorted(f"{path.relative_to(ROOT)}: {module}" for path in (ROOT / "trtllm_dflash" / "serve").glob("*.py")
                       for module in _imported_modules(path)
                       if module.split(".")[1] in EARLIER_STAGES and module != "trtllm_dflash.deploy.settings")
    assert not offending, offending
