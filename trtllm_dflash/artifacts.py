"""Stage artifacts: output directories with a manifest, written atomically, and the hand-off
between stages.

Every stage writes `out_dir/` containing its files plus `manifest.json`:

    {"stage": "quantize", "recipe": "<name>",
     "recipe_fields": {"quantization.drafter": "fp8", ...}, "recipe_fields_sha256": "...",
     "input": {"stage": "convert", "path": "../convert", "manifest_sha256": "..."},
     "sources": [{"role": "target", "path": "...", "sha256": "...", "size": 123, "mtime_ns": 0}],
     "files": {"target/rank0.safetensors": "<sha256>", ...},
     "tools": {"trtllm_dflash": "0.1.0", ...}, "created_at": "...", "extra": {...}}

`recipe_fields` are the recipe fields the output depends on (recipe/stages.py), `input` the
previous stage's output it was made from (its manifest's checksum makes the chain provable),
`sources` the files read from outside the pipeline (convert: the HF / z-lab checkpoints).
`input.path` is relative to the output directory (`Manifest.input_dir` resolves it), so a run
directory moved as a whole keeps its chain; `sources` stay absolute: they are outside it.

Writes go to a temporary sibling directory that is renamed into place only when complete,
so an interrupted stage never leaves a directory that looks finished; leftovers of a killed
writer are removed by the next one. `verify_input` is what a stage calls on its `--from`
directory: one line naming the directory and the manifest field or file that does not match.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.stages import build_command, fields_sha256, stage_fields

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


def source_record(role: str, path: Path) -> dict:
    """A file read from outside the pipeline, as a manifest lists it."""
    st = path.stat()
    return {"role": role, "path": str(path.resolve()), "sha256": sha256_file(path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns}


@dataclass
class Manifest:
    stage: str
    recipe: str
    recipe_fields: dict[str, Any] = field(default_factory=dict)
    recipe_fields_sha256: str = ""
    input: dict | None = None
    sources: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    extra: dict = field(default_factory=dict)
    # Files a user edits after the stage wrote them (glob patterns, e.g. a deployment's config.pbtxt
    # parameters, edited as tensorrtllm_backend's users edit theirs): `files` records them as
    # written; check_files does not hold them to it (their reader validates what they say).
    editable: list[str] = field(default_factory=list)

    def is_editable(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.editable)

    @classmethod
    def for_stage(cls, stage: str, recipe: Recipe, input_dir: Path | None = None, **kw) -> "Manifest":
        """A new manifest of `stage` for `recipe`, made from the stage output in `input_dir`."""
        fields = stage_fields(recipe, stage)
        inp = None
        if input_dir is not None:
            inp = {"stage": Manifest.read(input_dir).stage, "path": str(Path(input_dir).resolve()),
                   "manifest_sha256": manifest_sha256(input_dir)}
        return cls(stage=stage, recipe=recipe.name, recipe_fields=fields, recipe_fields_sha256=fields_sha256(fields),
                   input=inp, **kw)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def input_dir(self, directory: Path) -> Path:
        """The input's directory, for the manifest of the output in `directory` (a relative
        input.path is relative to it; an absolute one, written by older versions, is taken as is)."""
        return (Path(directory) / self.input["path"]).resolve()

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        path = Path(directory) / MANIFEST
        if not path.is_file():
            raise UserError(f"{directory}: no {MANIFEST}; not a finished trtllm-dflash stage output "
                            "(half-written, or not written by trtllm-dflash)")
        try:
            return cls(**json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as e:
            raise UserError(f"{path}: unreadable manifest ({str(e).splitlines()[0]})") from None


def relative_to(path: str | Path, base: Path) -> str:
    """`path` relative to the directory `base` (both resolved), for a file that names another
    stage output: the pair then moves as a whole (a run directory renamed or copied to a GPU box)."""
    return os.path.relpath(Path(path).resolve(), Path(base).resolve())


def planned_build_command(recipe: Recipe, build_dir: Path) -> str:
    """The command that builds the engines of the (dry-run) build output in `build_dir` in place,
    from the checkpoint its manifest says it was planned from."""
    m = Manifest.read(build_dir)
    return build_command(recipe, m.input_dir(build_dir) if m.input else None, build_dir)


def manifest_sha256(directory: Path) -> str:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise UserError(f"{directory}: no {MANIFEST}; not a finished trtllm-dflash stage output")
    return sha256_file(path)


def fields_diff(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Dotted names whose values differ (or exist on one side only), sorted."""
    return sorted(k for k in set(recorded) | set(wanted) if recorded.get(k, "<absent>") != wanted.get(k, "<absent>"))


def edited_files(directory: Path, m: Manifest) -> list[str]:
    """The editable files the manifest lists that are there and differ from what was written
    (only they are read)."""
    return [name for name, digest in m.files.items()
            if m.is_editable(name) and (p := Path(directory) / name).is_file() and sha256_file(p) != digest]


def check_files(directory: Path, m: Manifest) -> list[str]:
    """Every file the manifest lists exists and matches its checksum, but those it lists as
    editable, which need only exist; returns the editable ones that were edited."""
    edited = []
    for name, digest in m.files.items():
        p = Path(directory) / name
        if not p.is_file():
            raise UserError(f"{directory}: file {name} listed in {MANIFEST} is missing")
        if sha256_file(p) != digest:
            if m.is_editable(name):
                edited.append(name)
                continue
            older = m.stage == "deploy" and not m.editable and name.endswith("config.pbtxt")
            raise UserError(f"{directory}: file {name} does not match its checksum in {MANIFEST} (changed after it was "
                            "written" + ("; a deployment from before config.pbtxt could be edited in place: deploy "
                                         "again, then edit the new one" if older else "") + ")")
    return edited


def changed_source(m: Manifest) -> str | None:
    """The first source file that is missing or no longer what the manifest recorded, or None.
    Size and mtime decide quickly; a file that differs in either is re-hashed."""
    for s in m.sources:
        p = Path(s["path"])
        if not p.is_file():
            return f"source {p} is missing"
        st = p.stat()
        if (st.st_size, st.st_mtime_ns) != (s.get("size"), s.get("mtime_ns")) and sha256_file(p) != s["sha256"]:
            return f"source {p} changed"
    return None


def verify_input(directory: Path, stages: tuple[str, ...], recipe: Recipe, check_contents: bool = True) -> Manifest:
    """Check a `--from` directory: a finished output of one of `stages`, made from `recipe`'s
    fields for that stage, its files unchanged. Raise UserError naming the field or file."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"--from {directory}: no such directory")
    m = Manifest.read(directory)
    if m.stage not in stages:
        want = " or ".join(stages)
        raise UserError(f"{directory}: manifest field stage is {m.stage!r}; expected a {want} output")
    wanted = stage_fields(recipe, m.stage)
    diff = fields_diff(m.recipe_fields, wanted)
    if diff:
        k = diff[0]
        raise UserError(
            f"{directory}: manifest field recipe_fields.{k} is {m.recipe_fields.get(k, '<absent>')!r}, recipe "
            f"{recipe.name!r} has {wanted.get(k, '<absent>')!r} (written for another recipe or an older version "
            f"of this one{f'; {len(diff) - 1} more field(s) differ' if len(diff) > 1 else ''}); re-run {m.stage}"
        )
    if m.recipe_fields_sha256 != fields_sha256(m.recipe_fields):
        raise UserError(f"{directory}: manifest field recipe_fields_sha256 does not match its recipe_fields (edited by "
                        "hand?)")
    if check_contents:
        check_files(directory, m)
    return m


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_leftovers(out_dir: Path) -> None:
    """Temporary siblings of out_dir whose writer process is gone (killed mid-write)."""
    for p in out_dir.parent.glob(f".{out_dir.name}.*-*"):
        kind, _, rest = p.name[len(out_dir.name) + 2 :].partition("-")
        pid = rest.split("-", 1)[0]
        if kind in ("partial", "old") and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


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


def check_out_dir(out_dir: Path, manifest: Manifest, overwrite: bool) -> None:
    """Refuse an out_dir that holds something else: a foreign directory, another stage's output,
    another recipe's output; an output of this stage and recipe only with overwrite=True."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a directory; choose another --out")
    if not (out_dir / MANIFEST).exists():
        if any(out_dir.iterdir()):
            raise UserError(f"{out_dir}: exists and is not a trtllm-dflash output; choose another --out")
        return
    old = Manifest.read(out_dir)
    if old.stage != manifest.stage or old.recipe != manifest.recipe:
        raise UserError(f"{out_dir}: already holds a {old.stage} output of recipe {old.recipe!r}; choose another --out "
                        "or remove it")
    if not overwrite:
        diff = fields_diff(old.recipe_fields, manifest.recipe_fields)
        what = f"made from other recipe fields ({', '.join(diff[:3])})" if diff else "for the same recipe fields"
        raise UserError(f"{out_dir}: already holds a {old.stage} output of recipe {old.recipe!r} {what}; "
                        "pass --overwrite to replace it")


@contextlib.contextmanager
def atomic_stage_dir(out_dir: Path, manifest: Manifest, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory to write into; on success add the manifest and rename it to
    out_dir (check_out_dir decides whether an existing out_dir may be replaced)."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, manifest, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-{os.getpid()}-", dir=out_dir.parent))
    try:
        yield tmp
        manifest.files = {
            str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()
        }
        if manifest.input is not None:  # relative to the output: tmp is renamed to out_dir, its sibling
            manifest.input["path"] = relative_to(manifest.input["path"], out_dir)
        manifest.tools = manifest.tools or tool_versions()
        manifest.created_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        (tmp / MANIFEST).write_text(manifest.to_json())
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
