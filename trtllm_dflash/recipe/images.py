"""NVIDIA's container images the product names, and what each carries: recipe/catalog/images.yaml,
facts read from upstream's own files (each with the line it was read from).

Everything that names an image or says which TensorRT-LLM an image carries asks this table:
the backends' default images (recipe/containers.py), `check` (an image whose TensorRT-LLM is not
the backend's, or that was never built), `doctor` (the driver an image's CUDA needs), the
launchers. tests/recipe/test_images.py fails when a tag or version written anywhere in the code,
recipes or docs disagrees with it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trtllm_dflash.errors import UserError

CATALOG = Path(__file__).parent / "catalog" / "images.yaml"
REGISTRY = "nvcr.io"  # NGC's container registry: the images are not on Docker Hub
USABLE = ("published", "listed", "unconfirmed")  # statuses of images a deployment may name


@dataclass(frozen=True)
class Source:
    repo: str
    ref: str
    path: str
    line: str
    commit: str | None = None
    line_no: int | None = None


@dataclass(frozen=True)
class Image:
    ref: str  # registry/name:tag, as upstream writes it
    family: str  # triton-trtllm | trtllm-release | dynamo-trtllm-runtime
    status: str  # published | listed | not-built | unconfirmed (catalog header)
    trtllm: str | None = None
    tensorrt: str | None = None
    cuda: str | None = None
    python: str | None = None
    torch: str | None = None
    dynamo: str | None = None
    note: str = ""
    sources: dict[str, Source] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Without the registry: what `serve --registry` puts a mirror in front of."""
        return self.ref.split("/", 1)[1]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]

    @property
    def min_driver(self) -> int | None:
        """The oldest data-center driver branch its CUDA runs on (None: CUDA not known)."""
        if self.cuda is None:
            return None
        return drivers().get(self.cuda.split(".")[0])

    def describe(self) -> str:
        carries = ", ".join(f"{k} {v}" for k, v in (("TensorRT-LLM", self.trtllm), ("TensorRT", self.tensorrt),
                                                     ("CUDA", self.cuda)) if v)
        return f"{self.ref} ({carries or 'contents not known'}; {self.status})"


@functools.cache
def _catalog() -> dict:
    return yaml.safe_load(CATALOG.read_text())


@functools.cache
def drivers() -> dict[str, int]:
    """CUDA major version -> minimum data-center driver branch."""
    return {str(d["cuda"]): int(d["min_driver"]) for d in _catalog()["drivers"]}


@functools.cache
def images() -> tuple[Image, ...]:
    out = []
    for row in _catalog()["images"]:
        row = dict(row)
        sources = {k: Source(**v) for k, v in (row.pop("sources", None) or {}).items()}
        out.append(Image(ref=row.pop("image"), sources=sources, **{k: str(v) if v is not None else None
                                                                   for k, v in row.items()}))
    return tuple(out)


def lookup(ref: str) -> Image | None:
    """The row of an image, named with or without its registry; None when the table has none."""
    ref = ref.strip().removeprefix(REGISTRY + "/").removeprefix("nvidia/")
    for im in images():
        if ref == im.name.removeprefix("nvidia/"):
            return im
    return None


def carrying(family: str, trtllm: str) -> list[Image]:
    """Usable images of `family` that carry exactly TensorRT-LLM `trtllm`, oldest first."""
    return [im for im in images() if im.family == family and im.trtllm == trtllm and im.status in USABLE]


def newest(family: str, trtllm: str) -> Image:
    found = carrying(family, trtllm)
    if not found:
        raise UserError(f"recipe/catalog/images.yaml has no {family} image carrying TensorRT-LLM {trtllm}")
    return found[-1]


def refusal(ref: str, backend_problem) -> str | None:
    """Why image `ref` cannot serve a backend (None: it can, or the table does not know it).
    backend_problem(trtllm_version) -> why that TensorRT-LLM does not suit the backend, or None."""
    im = lookup(ref)
    if im is None:
        return None
    if im.status not in USABLE:
        return f"{im.ref} was not built ({im.note or im.status})"
    if im.trtllm is not None:
        problem = backend_problem(im.trtllm)  # "<version>: why"
        if problem:
            return f"{im.ref} carries TensorRT-LLM {problem}"
    return None


def tags(family: str, trtllm: str) -> str:
    """The tags of `family` carrying `trtllm`, as a range: '26.04-26.07'."""
    found = [im.tag.split("-")[0] for im in carrying(family, trtllm)]
    return found[0] if len(found) == 1 else f"{found[0]}-{found[-1]}"
