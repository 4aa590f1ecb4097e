"""Stage directories: atomic writes, manifests, refusal of mismatched inputs."""

import pytest

from trtllm_dflash.artifacts import MANIFEST, Manifest, atomic_stage_dir, verify_stage_dir
from trtllm_dflash.errors import UserError


def manifest(stage="convert", sha="abc"):
    return Manifest(stage=stage, recipe="r", recipe_sha256=sha)


def test_complete_write_has_manifest_with_checksums(tmp_path):
    out = tmp_path / "out"
    with atomic_stage_dir(out, manifest()) as d:
        (d / "rank0.safetensors").write_bytes(b"weights")
    m = verify_stage_dir(out, "convert", "abc")
    assert set(m.files) == {"rank0.safetensors"} and m.created_at and "torch" in m.tools
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directory left behind"


def test_interrupted_write_leaves_nothing_that_looks_complete(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with atomic_stage_dir(out, manifest()) as d:
            (d / "rank0.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_refuses_other_stage_recipe_and_tampered_files(tmp_path):
    out = tmp_path / "out"
    with atomic_stage_dir(out, manifest()) as d:
        (d / "a.bin").write_bytes(b"x")
    with pytest.raises(UserError, match="manifest stage is 'convert', expected 'quantize'"):
        verify_stage_dir(out, "quantize")
    with pytest.raises(UserError, match="different content hash"):
        verify_stage_dir(out, "convert", "other")
    (out / "a.bin").write_bytes(b"y")
    with pytest.raises(UserError, match="a.bin does not match its checksum"):
        verify_stage_dir(out, "convert", "abc")
    with pytest.raises(UserError, match="no manifest.json"):
        verify_stage_dir(tmp_path, "convert")


def test_never_clobbers_a_different_output(tmp_path):
    out = tmp_path / "out"
    with atomic_stage_dir(out, manifest(sha="one")) as d:
        (d / "a.bin").write_bytes(b"1")
    with pytest.raises(UserError, match="already holds a convert output of recipe 'r' \\(different content\\)"):
        with atomic_stage_dir(out, manifest(sha="two")):
            pass
    with pytest.raises(UserError, match="pass --overwrite"):
        with atomic_stage_dir(out, manifest(sha="one")):
            pass
    with atomic_stage_dir(out, manifest(sha="one"), overwrite=True) as d:
        (d / "a.bin").write_bytes(b"2")
    assert (out / "a.bin").read_bytes() == b"2" and (out / MANIFEST).exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is not a trtllm-dflash output"):
        with atomic_stage_dir(foreign, manifest()):
            pass
    assert (foreign / "notes.txt").read_text() == "mine"
