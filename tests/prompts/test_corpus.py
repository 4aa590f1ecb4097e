"""Corpus selection and the by-file train/held-out split."""

from pathlib import Path

import pytest

from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.corpus import is_heldout, list_files, load_corpus

BODY = "def f(x):\n    return x + 1\n" * 20  # 540 characters, above the 200 minimum


def _make_tree(root: Path, n_plain: int = 60) -> None:
    files = {f"mod{i:02d}.py": BODY + f"# {i}\n" for i in range(n_plain)}
    files.update({
        "pkg/sub/deep.py": BODY,
        "tiny.py": "x = 1\n",  # below min_chars
        "test/test_x.py": BODY,
        "pkg/tests/test_y.py": BODY,
        "idlelib/editor.py": BODY,
        "idlelib/idle_test/t.py": BODY,
        "site-packages/numpy/core.py": BODY,
        "pydoc_data/topics.py": BODY,
        "_sysconfigdata__linux_x86_64-linux-gnu.py": BODY,
        "config-3.11-x86_64-linux-gnu/python-config.py": BODY,
        "notes.txt": BODY,
    })
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "latin1.py").write_bytes(b"# caf\xe9\n" + BODY.encode())  # not UTF-8: skipped


def test_selection_rules(tmp_path):
    _make_tree(tmp_path)
    paths = [f.path for f in list_files(tmp_path)]
    assert paths == sorted(paths)
    assert "pkg/sub/deep.py" in paths
    assert len(paths) == 61  # 60 plain modules + pkg/sub/deep.py; everything else is excluded


def test_split_is_deterministic_disjoint_and_recorded(tmp_path):
    _make_tree(tmp_path)
    a = load_corpus(tmp_path, heldout_fraction=0.2)
    b = load_corpus(tmp_path, heldout_fraction=0.2)
    train = {f.path for f in a.train}
    held = {f.path for f in a.heldout}
    assert train and held and not train & held
    assert train | held == {f.path for f in list_files(tmp_path)}
    assert [f.path for f in b.train] == [f.path for f in a.train]
    assert a.info.heldout_files == sorted(held) == [f.path for f in b.heldout]
    assert a.info.fingerprint == b.info.fingerprint
    assert a.info.num_files == len(train) + len(held)


def test_split_of_a_file_does_not_depend_on_other_files(tmp_path):
    _make_tree(tmp_path)
    before = {f.path for f in load_corpus(tmp_path, heldout_fraction=0.2).heldout}
    (tmp_path / "added_later.py").write_text(BODY)
    after = load_corpus(tmp_path, heldout_fraction=0.2)
    assert {f.path for f in after.heldout} - {"added_later.py"} == before
    assert is_heldout("added_later.py", 0.2) == ("added_later.py" in after.info.heldout_files)


def test_bad_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        list_files(tmp_path / "missing")
    with pytest.raises(UserError, match="no .py files"):
        list_files(tmp_path)
    _make_tree(tmp_path)
    with pytest.raises(UserError, match="heldout_fraction"):
        load_corpus(tmp_path, heldout_fraction=1.5)


def test_real_stdlib_corpus():
    c = load_corpus()
    held = {f.path for f in c.heldout}
    assert c.info.num_files > 300  # CPython 3.10-3.13 each have 600+ qualifying files
    assert held and not held & {f.path for f in c.train}
    assert not any(p.startswith(("test/", "idlelib/")) or "/test/" in p or "/tests/" in p
                   for p in held | {f.path for f in c.train})
    assert c.info.fingerprint == load_corpus().info.fingerprint


def test_shipped_text_is_pinned_and_split():
    import hashlib

    from trtllm_dflash.prompts.corpus import SHIPPED, SHIPPED_SHA256, shipped_text

    text = shipped_text()
    assert hashlib.sha256(SHIPPED.read_bytes()).hexdigest() == SHIPPED_SHA256 == text.sha256
    held, calib = {f.path for f in text.heldout}, {f.path for f in text.calibration}
    assert held and calib and not held & calib  # calibration never sees a prompt's file
    assert sum(len(f.text) for f in text.heldout) > 200_000 and sum(len(f.text) for f in text.calibration) > 50_000


def test_prompts_and_calibration_do_not_read_the_interpreter(tmp_path, monkeypatch):
    """Prompts and the default calibration text are the same whatever stdlib the interpreter has
    (they were cut from it, and on Python 3.12 the shipped pair's acceptance fell below its gate)."""
    import sysconfig

    from trtllm_dflash.perf.bench_quant import shipped_pair
    from trtllm_dflash.prompts import corpus
    from trtllm_dflash.prompts.sources import heldout_token_prompts, load_prompts
    from trtllm_dflash.quantize.calibration import calibration_data

    target = shipped_pair()[0]
    before = (load_prompts("builtin:pystd-heldout", 6, 64, 0), heldout_token_prompts(target, 3, 32),
              [b.tolist() for b in calibration_data(target, 4096, None, 2, 64).batches])
    real = sysconfig.get_paths

    def no_stdlib(*a, **kw):  # a different (here: empty) stdlib
        return {**real(*a, **kw), "stdlib": str(tmp_path)}

    monkeypatch.setattr(sysconfig, "get_paths", no_stdlib)
    corpus.shipped_text.cache_clear()
    after = (load_prompts("builtin:pystd-heldout", 6, 64, 0), heldout_token_prompts(target, 3, 32),
             [b.tolist() for b in calibration_data(target, 4096, None, 2, 64).batches])
    assert after == before and len(before[2]) == 2


def test_a_changed_shipped_text_is_refused(tmp_path, monkeypatch):
    from trtllm_dflash.prompts import corpus

    changed = tmp_path / "python-heldout.jsonl"
    changed.write_bytes(corpus.SHIPPED.read_bytes().replace(b"def ", b"def  ", 1))
    monkeypatch.setattr(corpus, "SHIPPED", changed)
    corpus.shipped_text.cache_clear()
    try:
        with pytest.raises(UserError, match="is not the pinned"):
            corpus.shipped_text()
    finally:
        corpus.shipped_text.cache_clear()


def test_a_calibration_file_is_recorded_with_its_checksum(tmp_path):
    """quantize's manifest says which text calibrated (`calibration_data`), down to its bytes: a
    file edited after quantizing reads as another source."""
    from trtllm_dflash.perf.bench_quant import shipped_pair
    from trtllm_dflash.quantize.calibration import calibration_data

    target = shipped_pair()[0]
    text = tmp_path / "calib.txt"
    text.write_text("def area(r):\n    return 3.14159 * r * r\n" * 40)
    first = calibration_data(target, 4096, text, 2, 32).source
    text.write_text("def volume(r):\n    return 4.18879 * r * r * r\n" * 40)
    second = calibration_data(target, 4096, text, 2, 32).source
    assert first.startswith(f"file {text} (sha256 ") and second.startswith(f"file {text} (sha256 ") and first != second
