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
