"""Stage directories: atomic writes, manifests, and the hand-off checks a stage runs on `--from`."""

import os
import subprocess
import sys

import pytest

from trtllm_dflash.artifacts import (
    MANIFEST,
    Manifest,
    atomic_stage_dir,
    check_files,
    manifest_sha256,
    verify_input,
)
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe


@pytest.fixture(scope="module")
def recipe():
    return load_recipe(None)


def write(out, recipe, stage="convert", files=None, input_dir=None):
    with atomic_stage_dir(out, Manifest.for_stage(stage, recipe, input_dir)) as d:
        for name, data in (files or {"rank0.safetensors": b"weights"}).items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
    return out


def test_complete_write_has_manifest_with_fields_checksums_and_input(tmp_path, recipe):
    conv = write(tmp_path / "convert", recipe)
    dep = write(tmp_path / "deploy", recipe, "deploy", {"model_repository/x": b"1"}, input_dir=conv)
    m = verify_input(dep, ("deploy",), recipe)
    assert set(m.files) == {"model_repository/x"} and m.created_at and "torch" in m.tools
    assert m.recipe_fields["backend.name"] == "reference" and "sweep.concurrency" not in m.recipe_fields
    # input.path is relative to the output (the pair moves as a whole); input_dir resolves it
    assert m.input == {"stage": "convert", "path": "../convert", "manifest_sha256": manifest_sha256(conv)}
    assert m.input_dir(dep) == conv.resolve()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directory left behind"


def test_interrupted_write_leaves_nothing_that_looks_complete(tmp_path, recipe):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with atomic_stage_dir(out, Manifest.for_stage("convert", recipe)) as d:
            (d / "rank0.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_leftovers_of_a_killed_writer_are_removed_by_the_next(tmp_path, recipe):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.partial-{dead.stdout.strip()}-abc"
    stale.mkdir()
    mine = tmp_path / f".out.partial-{os.getpid()}-xyz"  # a live writer's: kept
    mine.mkdir()
    write(tmp_path / "out", recipe)
    assert not stale.exists() and mine.exists()


def test_editable_files_may_change_but_not_go(tmp_path, recipe):
    """A stage output's editable files (a deployment's config.pbtxt) are recorded as written but
    not held to it: check_files reports them edited; every other file is still checked."""
    files = {"model_repository/m/config.pbtxt": b"a", "model_repository/m/1/model.py": b"b"}
    with atomic_stage_dir(tmp_path / "d", Manifest.for_stage("convert", recipe,
                                                             editable=["model_repository/*/config.pbtxt"])) as d:
        for name, data in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
    out = tmp_path / "d"
    assert check_files(out, Manifest.read(out)) == []
    (out / "model_repository/m/config.pbtxt").write_bytes(b"edited")
    assert check_files(out, Manifest.read(out)) == ["model_repository/m/config.pbtxt"]
    verify_input(out, ("convert",), recipe)
    (out / "model_repository/m/1/model.py").write_bytes(b"edited")
    with pytest.raises(UserError, match="file model_repository/m/1/model.py does not match its checksum"):
        verify_input(out, ("convert",), recipe)
    (out / "model_repository/m/1/model.py").write_bytes(b"b")
    older = Manifest.read(out)
    older.stage, older.editable = "deploy", []  # a deployment written before config.pbtxt was editable
    with pytest.raises(UserError, match="a deployment from before config.pbtxt could be edited in place: deploy again"):
        check_files(out, older)
    (out / "model_repository/m/config.pbtxt").unlink()
    with pytest.raises(UserError, match="file model_repository/m/config.pbtxt listed in manifest.json is missing"):
        verify_input(out, ("convert",), recipe)


def test_verify_input_names_the_field_or_file(tmp_path, recipe):
    out = write(tmp_path / "out", recipe)
    with pytest.raises(UserError, match=r"manifest field stage is 'convert'; expected a quantize output"):
        verify_input(out, ("quantize",), recipe)
    other = load_recipe(None, ["parallel.tp=2"])
    with pytest.raises(UserError,
                       match=r"manifest field recipe_fields.parallel.tp is 1, recipe 'cpu-tiny-pystd' has 2"):
        verify_input(out, ("convert",), other)
    # fields a stage does not depend on do not matter to it
    verify_input(out, ("convert",), load_recipe(None, ["sweep.seed=7", "serve.http_port=9000"]))
    (out / "rank0.safetensors").write_bytes(b"tampered")
    with pytest.raises(UserError, match="file rank0.safetensors does not match its checksum in manifest.json"):
        verify_input(out, ("convert",), recipe)
    (out / "rank0.safetensors").unlink()
    with pytest.raises(UserError, match="file rank0.safetensors listed in manifest.json is missing"):
        verify_input(out, ("convert",), recipe)
    with pytest.raises(UserError, match="no manifest.json; not a finished trtllm-dflash stage output"):
        verify_input(tmp_path, ("convert",), recipe)
    (out / MANIFEST).write_bytes(b"\xff\xfe not json")
    with pytest.raises(UserError, match="unreadable manifest"):
        verify_input(out, ("convert",), recipe)


def test_never_clobbers_a_different_output(tmp_path, recipe):
    out = write(tmp_path / "out", recipe, files={"a.bin": b"1"})
    with pytest.raises(UserError, match="already holds a convert output of recipe 'cpu-tiny-pystd' made from other "
                                        r"recipe fields \(parallel.tp\); pass --overwrite"):
        write(out, load_recipe(None, ["parallel.tp=2"]))
    with pytest.raises(UserError,
                       match="already holds a convert output .* for the same recipe fields; pass --overwrite"):
        write(out, recipe)
    with pytest.raises(UserError,
                       match="already holds a convert output of recipe 'cpu-tiny-pystd'; choose another --out"):
        with atomic_stage_dir(out, Manifest.for_stage("deploy", recipe), overwrite=True):
            pass
    with atomic_stage_dir(out, Manifest.for_stage("convert", recipe), overwrite=True) as d:
        (d / "a.bin").write_bytes(b"2")
    assert (out / "a.bin").read_bytes() == b"2" and (out / MANIFEST).exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is not a trtllm-dflash output"):
        write(foreign, recipe)
    assert (foreign / "notes.txt").read_text() == "mine"
