"""Code comments explain; history and measurements live in docs/ (docs/design/), and no file of
the repository cites a document outside it.

1. No `20YY-MM-DD` date and no "ad hoc" in the comments and docstrings of the package's and the
   plugins' Python code. Data files are not code: dates in catalog `source:` fields say when a
   published figure was recorded, and the shipped prompt text is a frozen snapshot of source
   text; neither is checked here.
2. No tracked file names a document that is not in the repository (the research notes the
   project was started from: engine-path.md, perf-anchors.md, ...) or a path outside it; a
   name that resolves to a file of the repository (docs/design/engine-path.md) is fine.
"""

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PENDING: set[str] = set()  # files exempt while their cleanup is in flight (none now)

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
AD_HOC = re.compile(r"\bad[ -]hoc\b", re.IGNORECASE)

# Documents outside the repository, by the names the code used to cite them.
OUTSIDE_DOCS = ("engine-path", "perf-anchors", "dflash-reference", "pytorch-backend", "trtllm-triton",
                "ecosystem-2026-11", "aesthetics-anchors", "tiny-pair-feasibility", "DESIGN")
DOC_REF = re.compile(r"[\w./-]*\b(?:" + "|".join(map(re.escape, OUTSIDE_DOCS)) + r")\.md")
OUTSIDE_PATHS = re.compile(r"shared/reference|\.\./shared\b|gpu-audit|/work/")
# Frozen prompt text (prompts/corpus.py SHIPPED, pinned by its sha256): a snapshot of source
# text whose bytes every sweep and test decodes, not a document that cites anything.
DATA_SNAPSHOTS = {"trtllm_dflash/prompts/data/python-heldout.jsonl"}
BINARY = (".safetensors", ".png", ".bin", ".pt")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.splitlines()


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module / class / function docstring."""
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def test_no_dates_or_ad_hoc_notes_in_code_comments():
    bad = []
    for path in tracked():
        if not path.endswith(".py") or not path.startswith(("trtllm_dflash/", "plugins/")) or path in PENDING:
            continue
        source = (ROOT / path).read_text()
        if not (DATE.search(source) or AD_HOC.search(source)):
            continue  # the quick look: most files have neither anywhere
        for line, text in comments_and_docstrings(source):
            for pattern in (DATE, AD_HOC):
                bad += [f"{path}:{line}: {m.group(0)!r}" for m in pattern.finditer(text)]
    assert not bad, "history belongs in docs/design/, not in code comments:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_are_for():
    source = '"""Doc."""\n# measured 2026-11-26, an ad hoc loop\nx = "2026-11-26"  # not a comment: fine\n'
    hits = [m.group(0) for _, text in comments_and_docstrings(source) for p in (DATE, AD_HOC) for m in p.finditer(text)]
    assert hits == ["2026-11-26", "ad hoc"]
    assert [m.group(0) for m in DOC_REF.finditer("see engine-path.md §8.2 and docs/design/engine-path.md")] == \
        ["engine-path.md", "docs/design/engine-path.md"]
    assert OUTSIDE_PATHS.search("../shared/reference/perf-anchors.md")


def test_no_file_cites_a_document_outside_the_repository():
    files = set(tracked())
    bad = []
    for path in sorted(files - DATA_SNAPSHOTS - {"tests/test_repository_hygiene.py"}):
        if path.endswith(BINARY):
            continue
        try:
            text = (ROOT / path).read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # other binary files, submodules
        cited = any(f"{name}.md" in text for name in OUTSIDE_DOCS)  # the quick look before the regex
        for m in DOC_REF.finditer(text) if cited else ():
            if m.group(0).removeprefix("./") not in files:
                bad.append(f"{path}: {m.group(0)}")
        bad += [f"{path}: {m.group(0)}" for m in OUTSIDE_PATHS.finditer(text)]
    assert not bad, "restate what is needed in docs/ and cite that:\n" + "\n".join(bad)


# tests/ mirrors the package: a folder per room (trtllm_dflash/<room>/, plugins/, perf/), each
# test file beside the room it tests. What tests no single room sits at the top or in one of
# these folders, and says so here.
CROSS_CUTTING_FOLDERS = {
    "helpers": "shared test code (tiny checkpoints, stand-ins of upstream components), no tests",
    "fixtures": "data the tests read",
    "gpu": "true GPU tests of every room, skipped without a GPU",
}
CROSS_CUTTING_FILES = {
    "conftest.py": "the suite's scheduling, thread count and shared tiny pairs",
    "test_pipeline.py": "recipe -> ... -> sweep, every stage in turn",
    "test_guides.py": "the guides' command blocks as pasted",
    "test_docs.py": "docs against the code",
    "test_repository_hygiene.py": "this file",
    "test_import_contracts.py": "the import contracts of pyproject.toml",
    "test_lint.py": "ruff over every file, as pyproject.toml configures it",
    "test_stage_doors.py": "one door per stage",
    "test_support_rows.py": "every runnable support row through the stages",
    "test_function_length.py": "function length, every room",
    "test_gpu_line_budget.py": "the GPU-only layer's size, every room",
}


def rooms() -> set[str]:
    """The package's rooms: its sub-packages and top-level modules, plugins/ and perf/, and every
    sub-package below them as "room/sub" (recipe/plan: tests/recipe/plan/)."""
    pkg = ROOT / "trtllm_dflash"
    found = {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    found |= {p.stem for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")}
    found |= {"plugins", "perf"}
    tops = {"plugins": ROOT / "plugins", "perf": ROOT / "perf"} | {r: pkg / r for r in found if (pkg / r).is_dir()}
    for room, top in tops.items():
        found |= {f"{room}/{p.parent.relative_to(top).as_posix()}" for p in top.glob("*/**/__init__.py")}
    return found


def misplaced(files: list[str], known: set[str]) -> list[str]:
    """Test files that sit beside no room: a top-level test_<module>.py must name a room (or be
    cross-cutting); a folder tests/<room>/[<sub>/...] must be a room or a sub-package of one."""
    bad = []
    for path in files:
        parts = Path(path).parts
        if parts[0] != "tests" or not path.endswith(".py"):
            continue
        if len(parts) == 2:
            stem = Path(parts[1]).stem.removeprefix("test_")
            if parts[1] not in CROSS_CUTTING_FILES and stem not in known:
                bad.append(f"{path}: a top-level test names no room (test_<module>.py) and is not cross-cutting")
        elif parts[1] in CROSS_CUTTING_FOLDERS:
            continue
        elif (folder := "/".join(parts[1:-1])) not in known:
            bad.append(f"{path}: tests/{folder}/ matches no room of the package")
    return bad


def test_tests_mirror_the_package():
    bad = misplaced(tracked(), rooms())
    assert not bad, "move the test beside its room, or list it as cross-cutting here:\n" + "\n".join(bad)


def test_the_mirror_check_catches_a_stray_folder():
    known = {"serve", "compat"}
    assert misplaced(["tests/serve/test_a.py", "tests/test_compat.py", "tests/helpers/x.py"], known) == []
    assert len(misplaced(["tests/build/test_a.py", "tests/test_things.py"], known)) == 2
    # a sub-room mirrors a sub-package; a folder under a room that is no sub-package is caught
    assert misplaced(["tests/serve/openai/test_a.py", "tests/helpers/deep/x.py"], known | {"serve/openai"}) == []
    assert len(misplaced(["tests/serve/stray/test_a.py"], known)) == 1


def test_rooms_include_sub_packages():
    assert {"recipe", "recipe/plan"} <= rooms()


# Another project's licence header or copyright line: the repository holds only code and prose
# this project wrote (facts about upstream carry over, upstream's files do not).
LICENCE = re.compile(r"SPDX-License-Identifier|Licensed under the Apache License|Permission is hereby granted"
                     r"|Copyright (?:\(c\)|©|\d{4})|All rights reserved", re.IGNORECASE)
TEXT_SUFFIXES = (".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".pbtxt", ".jinja", ".Dockerfile")


def licence_headers(files: list[str]) -> list[str]:
    bad = []
    for path in files:
        if not path.endswith(TEXT_SUFFIXES) and Path(path).name not in ("LICENSE", "NOTICE", "Dockerfile"):
            continue
        try:
            text = (ROOT / path).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        bad += [f"{path}: {m.group(0)!r}" for m in LICENCE.finditer(text)][:1]
    return bad


def test_no_file_carries_another_projects_licence_or_copyright():
    bad = licence_headers([p for p in tracked() if p != "tests/test_repository_hygiene.py"])
    assert not bad, "only code this project wrote belongs here:\n" + "\n".join(bad)


def test_the_licence_check_catches_a_vendored_header(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.py").write_text("# Copyright (c) 2024, NVIDIA CORPORATION.  All rights reserved.\nx = 1\n")
    (tmp_path / "b.py").write_text("# SPDX-License-Identifier: Apache-2.0\n")
    (tmp_path / "c.md").write_text("the tokenizer has a token for the word copyright\n")
    assert len(licence_headers(["a.py", "b.py", "c.md"])) == 2


# huggingface_hub 1.0 removed its old download command; `hf download ORG/NAME --local-dir DIR`
# (recipe/models_root.py) is the one every guide, README and error prints.
OLD_HF_CLI = "huggingface" + "-cli"


def test_no_text_prints_the_removed_hugging_face_cli():
    bad = []
    for path in sorted(set(tracked()) - DATA_SNAPSHOTS):
        if path.endswith(BINARY):
            continue
        try:
            text = (ROOT / path).read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        bad += [f"{path}:{text[:m.start()].count(chr(10)) + 1}" for m in re.finditer(re.escape(OLD_HF_CLI), text)]
    assert not bad, f"`{OLD_HF_CLI}` is gone from huggingface_hub 1.0; print `hf download` instead:\n" + "\n".join(bad)
