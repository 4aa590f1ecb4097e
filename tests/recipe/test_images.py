"""Every image tag and every "this Triton image carries TensorRT-LLM x" written anywhere in the
repository (code, recipes, docs) agrees with the image table (recipe/catalog/images.yaml, facts
read from upstream's own files). An earlier note said Triton 25.12 carries TensorRT-LLM 1.2.1; its
Dockerfile says 1.1.0, and the engine guide sent users to it."""

import re
import subprocess
from pathlib import Path

import pytest

from trtllm_dflash.recipe import images
from trtllm_dflash.recipe.containers import TRITON_TRTLLM_1_2, backend_image

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".pbtxt", "Dockerfile")
CATALOG = "trtllm_dflash/recipe/catalog/images.yaml"

IMAGE_REF = re.compile(r"(?:(?:nvcr\.io/)?nvidia/)?(?:tritonserver:\d\d\.\d\d-trtllm-python-py3"
                       r"|tensorrt-llm/release:\d[\w.]*|ai-dynamo/tensorrtllm-runtime:\d[\w.]*)")
# A Triton tag named with no version after it stands for the engine backend's image: it must carry
# TensorRT-LLM 1.2.1, unless the line says there is no such image.
ENGINE_LINE = "1.2.1"
NONE = re.compile(r"not (?:built|included)|\bnone\b|\bno (?:trtllm|TensorRT-LLM|Triton)|no r\d\d\.\d\d", re.IGNORECASE)
# On a line about Triton's TensorRT-LLM images: a tag (or a range of tags), then the TensorRT-LLM
# version that follows it before the next tag.
TRITON_LINE = re.compile(r"Triton|tritonserver|trtllm-python-py3")
TAG = re.compile(r"(?<![\w.])(2[5-9]\.\d\d)(?:\s*(?:-|–|to)\s*(2[5-9]\.\d\d))?(?![\w.])")
VERSION = re.compile(r"(?<![\w.])(1\.[0-9]\.(?:\d+(?:rc\d+)?|x))(?![\w.])")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.splitlines() if p.endswith(TEXT)
            and p not in (CATALOG, "tests/recipe/test_images.py")]


def triton_rows(first: str, last: str | None) -> list[images.Image]:
    lo, hi = first, last or first
    return [im for im in images.images() if im.family == "triton-trtllm" and lo <= im.tag.split("-")[0] <= hi]


def claims(line: str) -> list[tuple[str, str | None, str]]:
    """(first tag, last tag or None, version) for each tag on a Triton line followed by a version."""
    if not TRITON_LINE.search(line):
        return []
    tags = list(TAG.finditer(line))
    out = []
    for i, t in enumerate(tags):
        end = tags[i + 1].start() if i + 1 < len(tags) else len(line)
        v = VERSION.search(line, t.end(), end)
        if v:
            out.append((t.group(1), t.group(2), v.group(1)))
    return out


def carries(row: images.Image, version: str) -> bool:
    if row.trtllm is None:
        return False
    return row.trtllm.startswith(version[:-1]) if version.endswith(".x") else row.trtllm == version


def disagreements(path: str, text: str) -> list[str]:
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in IMAGE_REF.finditer(line):
            row = images.lookup(m.group(0))
            if row is None or row.status not in images.USABLE:
                bad.append(f"{path}:{n}: {m.group(0)} is {'not in the table' if row is None else row.status}")
        named = [(t.group(1), t.group(2)) for t in TAG.finditer(line)] if TRITON_LINE.search(line) else []
        claimed = {(f, la) for f, la, _ in claims(line)}
        for first, last in named:
            rows = triton_rows(first, last)
            if (first, last) not in claimed and not NONE.search(line) and not all(
                    carries(r, ENGINE_LINE) for r in rows):
                bad.append(f"{path}:{n}: names Triton {first}{'-' + last if last else ''}, whose TensorRT-LLM is not "
                           f"1.2.1 ({', '.join(r.trtllm or r.status for r in rows) or 'no row'}), with no version said")
        for first, last, version in claims(line):
            rows = triton_rows(first, last)
            if not rows or not all(carries(r, version) for r in rows):
                got = ", ".join(f"{r.tag.split('-')[0]} {r.trtllm or r.status}" for r in rows) or "no row"
                bad.append(f"{path}:{n}: says Triton {first}{'-' + last if last else ''} carries {version}; "
                           f"the table: {got}")
    return bad


def test_every_image_and_triton_version_written_agrees_with_the_table():
    bad = [b for p in tracked() for b in disagreements(p, (ROOT / p).read_text(errors="replace"))]
    assert not bad, "fix these against recipe/catalog/images.yaml:\n" + "\n".join(bad)


def test_the_check_catches_the_claims_that_drifted():
    wrong = ("The engine backend runs in `tritonserver:25.12-trtllm-python-py3`: TensorRT-LLM 1.2.1\n"
             "the Triton image line 25.12-26.07 all carry 1.2.1\n"
             "docker pull nvcr.io/nvidia/tritonserver:26.08-trtllm-python-py3\n"
             "nvcr.io/nvidia/tensorrt-llm/release:9.9.9\n"
             "run inside NVIDIA's Triton 25.12 trtllm-python-py3 container\n")
    assert len(disagreements("x.md", wrong)) == 6  # the 26.08 pull is unbuilt twice: its ref and its tag
    right = ("Triton 26.04-26.07 (TensorRT-LLM 1.2.1); 25.12-26.02 carry 1.1.0, 26.03 1.2.0rc8, 26.08 none\n"
             "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 (TensorRT-LLM 1.2.x)\n")
    assert disagreements("y.md", right) == []


def test_the_engine_default_is_the_newest_triton_image_with_1_2_1():
    row = images.lookup(TRITON_TRTLLM_1_2)
    assert row.trtllm == "1.2.1" and row.tag == "26.07-trtllm-python-py3" and row.status == "published"
    assert row.tensorrt.startswith("10.14") and row.min_driver == 580  # CUDA 13.1
    assert backend_image("engine", "triton", None) == row.name


def test_every_row_quotes_the_upstream_line_its_versions_came_from():
    for row in images.images():
        if row.status == "published":
            assert row.sources["trtllm"].line.endswith(f"TENSORRTLLM_VER={row.trtllm}"), row.ref
            assert row.sources["tensorrt"].line.endswith(f"TRT_VER={row.tensorrt}"), row.ref
            assert (f"| {row.trtllm} |" in row.sources["compat_row"].line
                    or row.tag.startswith(("25.11", "26.03"))), row.ref
            assert row.sources["trtllm"].commit and len(row.sources["trtllm"].commit) == 40, row.ref
        if row.status != "unconfirmed":
            assert row.sources, row.ref
