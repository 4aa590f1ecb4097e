"""The import contracts of pyproject.toml ([tool.importlinter]) hold: stages never import a later
stage, reference/ imports no stage / serving code / TensorRT, shared foundations import no stage,
nothing imports commands/. Checked with import-linter on the package's real import graph; and no
module imports itself through others (an import cycle), checked on grimp's graph of the same."""

import graphlib
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


def import_cycle(packages: tuple[str, ...]) -> list[str] | None:
    """One circle of imports among the modules of `packages` (None: none), from grimp's graph
    (import-linter's own). It counts every import statement the modules hold, at the top or
    inside a function (grimp reads both); imports under `if TYPE_CHECKING:` never run and are
    left out. A package's __init__ counts as a module of its own."""
    import grimp

    graph = grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=True)
    try:
        graphlib.TopologicalSorter({m: graph.find_modules_directly_imported_by(m) for m in graph.modules}).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_no_module_imports_itself_through_others(monkeypatch):
    """trtllm_dflash, plugins and perf (the roots import-linter checks) hold no import cycle."""
    if importlib.util.find_spec("grimp") is None:
        pytest.skip("grimp is not installed (it comes with import-linter: pip install -e '.[dev]')")
    monkeypatch.syspath_prepend(str(ROOT))  # plugins/ and perf/ import from the repository root
    cycle = import_cycle(("trtllm_dflash", "plugins", "perf"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_circle_through_a_function(tmp_path, monkeypatch):
    if importlib.util.find_spec("grimp") is None:
        pytest.skip("grimp is not installed")
    pkg = tmp_path / "circle_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circle_pkg.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from circle_pkg.a import g as again\n    return again\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert sorted(set(import_cycle(("circle_pkg",)))) == ["circle_pkg.a", "circle_pkg.b"]
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    assert import_cycle(("circle_pkg",)) is None
