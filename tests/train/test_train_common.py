"""train/common.py: the export directory swap keeps OUT whole on success and on failure."""

import pytest

from trtllm_dflash.train.common import atomic_dir


def test_atomic_dir_replaces_the_whole_directory(tmp_path):
    out = tmp_path / "drafter"
    out.mkdir()
    (out / "stale.bin").write_text("old run")
    with atomic_dir(out) as tmp:
        tmp.mkdir()  # the writers (save_pretrained, save_drafter) create it
        (tmp / "model.safetensors").write_text("new run")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]  # no tmp or trash left behind


def test_atomic_dir_leaves_the_old_export_on_failure(tmp_path):
    out = tmp_path / "drafter"
    out.mkdir()
    (out / "model.safetensors").write_text("old run")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            tmp.mkdir()
            (tmp / "model.safetensors").write_text("half")
            raise RuntimeError("killed mid-export")
    assert (out / "model.safetensors").read_text() == "old run"
    with atomic_dir(out) as tmp:  # the half-written OUT.tmp is cleared for the next export
        assert not tmp.exists()
        tmp.mkdir()
        (tmp / "model.safetensors").write_text("new run")
    assert (out / "model.safetensors").read_text() == "new run"
