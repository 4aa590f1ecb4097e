"""Stage artifacts: output directories with a manifest, written atomically.

Every stage writes `out_dir/` containing its files plus `manifest.json`:

    {"stage": "convert", "recipe": "<name>", "recipe_sha256": "...",
     "inputs": [{"path": "...", "sha256": "..."}], "files": {"rank0.safetensors": "<sha256>", ...},
     "tools": {"trtllm_dflash": "0.1.0", "torch": "2.13.0", ...}, "created_at": "...", "extra": {...}}

Writes go to a temporary sibling directory that is renamed into place only when complete,
so an interrupted stage never leaves a directory that looks finished. A stage refuses an
input directory whose manifest is missing, names another stage, another recipe, or whose
files no longer match their checksums.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Iterator

from trtllm_dflash.errors import UserError

MANIFEST = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tool_versions(*packages: str) -> dict[str, str]:
    out = {}
    for pkg in ("trtllm_dflash", "torch", "transformers", *packages):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


@dataclass
class Manifest:
    stage: str
    recipe: str
    recipe_sha256: str
    inputs: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        path = Path(directory) / MANIFEST
        if not path.exists():
            raise UserError(f"{directory}: no {MANIFEST}; not a complete trtllm-dflash stage output")
        try:
            return cls(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{path}: unreadable manifest ({e})") from None


def verify_stage_dir(directory: Path, stage: str, recipe_sha256: str | None = None, check_files: bool = True) -> Manifest:
    """Load and check a previous stage's manifest; raise UserError naming what does not match."""
    m = Manifest.read(directory)
    if m.stage != stage:
        raise UserError(f"{directory}: manifest stage is {m.stage!r}, expected {stage!r}")
    if recipe_sha256 is not None and m.recipe_sha256 != recipe_sha256:
        raise UserError(
            f"{directory}: written for recipe {m.recipe!r} with a different content hash; rerun the {stage} stage"
        )
    if check_files:
        for name, digest in m.files.items():
            p = Path(directory) / name
            if not p.exists():
                raise UserError(f"{directory}: {name} listed in the manifest is missing")
            if sha256_file(p) != digest:
                raise UserError(f"{directory}: {name} does not match its checksum in the manifest")
    return m


def replace_dir(new: Path, out_dir: Path) -> None:
    """Rename the finished directory `new` to `out_dir`, replacing a previous one: the old one
    is moved aside first and deleted last, so `out_dir` is never a mix of the two."""
    if out_dir.exists():
        trash = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(trash)
        new.rename(out_dir)
        shutil.rmtree(trash)
    else:
        new.rename(out_dir)


@contextlib.contextmanager
def atomic_stage_dir(out_dir: Path, manifest: Manifest, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory to write into; on success add the manifest and rename it to out_dir.

    An existing out_dir is refused unless it is a finished output of the same stage and recipe
    (then it is replaced only with overwrite=True), so a different checkpoint is never clobbered.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not (out_dir / MANIFEST).exists() and any(out_dir.iterdir()):
            raise UserError(f"{out_dir}: exists and is not a trtllm-dflash output; choose another --out")
        if (out_dir / MANIFEST).exists():
            old = Manifest.read(out_dir)
            if old.stage != manifest.stage or old.recipe_sha256 != manifest.recipe_sha256:
                raise UserError(
                    f"{out_dir}: already holds a {old.stage} output of recipe {old.recipe!r} "
                    "(different content); choose another --out or remove it"
                )
            if not overwrite:
                raise UserError(f"{out_dir}: already holds this {old.stage} output; pass --overwrite to redo it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield tmp
        manifest.files = {
            str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        manifest.tools = manifest.tools or tool_versions()
        manifest.created_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        (tmp / MANIFEST).write_text(manifest.to_json())
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
