"""A shipped recipe names Hugging Face ids; after `hf download` every stage finds the
checkpoints under one models root (--models DIR or $TRTLLM_DFLASH_MODELS) or in the local Hugging
Face cache, with no per-stage --set, and the manifests record where they came from."""

import json
import shutil
from pathlib import Path

import yaml

from checkpoints import make_drafter, make_target, write_recipe
from trtllm_dflash.artifacts import Manifest
from trtllm_dflash.cli import main
from trtllm_dflash.recipe import load_recipe

TARGET, DRAFTER = "acme/tiny-target", "acme/tiny-target-DFlash"
H100 = Path(__file__).resolve().parents[2] / "recipes" / "hopper" / "h100-qwen3-8b-fp8.yaml"


def hub_recipe(tmp_path, models):
    """A recipe naming HF ids, as the shipped ones do, and their downloads under `models`."""
    make_target(models / TARGET)
    make_drafter(models / DRAFTER)
    path = write_recipe(tmp_path / "recipe.yaml", models / TARGET, models / DRAFTER)
    raw = yaml.safe_load(path.read_text())
    raw["target"]["source"], raw["drafter"]["source"] = TARGET, DRAFTER
    path.write_text(yaml.safe_dump(raw))
    return path


def test_every_stage_finds_hf_ids_under_the_models_root(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")  # recorded, so the value --models sets is undone too
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    models = tmp_path / "models"
    recipe = hub_recipe(tmp_path, models)
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--until", "convert", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"`hf download {TARGET} --local-dir MODELS/{TARGET}`, then pass --models MODELS" in err
    assert main(["run", "--models", str(models), str(recipe), "--until", "deploy", "--out", str(run)]) == 0
    assert Manifest.read(run / "convert").recipe_fields["target.source"] == str((models / TARGET).resolve())
    # The same root from the environment: every stage is current, nothing re-runs.
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", str(models))
    capsys.readouterr()
    assert main(["run", str(recipe), "--until", "deploy", "--out", str(run)]) == 0
    assert "running" not in capsys.readouterr().err


def test_hf_ids_resolve_from_the_local_hugging_face_cache(tmp_path, monkeypatch):
    """huggingface_hub's cache layout: models--ORG--NAME/refs/main -> snapshots/<commit>/."""
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")  # recorded, so the value --models sets is undone too
    cache = tmp_path / "hub"
    downloads = tmp_path / "downloads"
    recipe = hub_recipe(tmp_path, downloads)
    for repo in (TARGET, DRAFTER):
        entry = cache / f"models--{repo.replace('/', '--')}"
        (entry / "refs").mkdir(parents=True)
        (entry / "refs" / "main").write_text("0" * 40)
        shutil.copytree(downloads / repo, entry / "snapshots" / ("0" * 40))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    r = load_recipe(recipe)
    assert r.target.path == cache / f"models--{TARGET.replace('/', '--')}" / "snapshots" / ("0" * 40)
    assert json.loads((r.drafter.path / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


def test_a_models_root_that_does_not_exist_is_one_line_both_ways(tmp_path, capsys, monkeypatch):
    """--models DIR and $TRTLLM_DFLASH_MODELS=DIR say the same, naming how DIR was given."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    recipe = H100
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")
    assert main(["convert", str(recipe), "--out", str(tmp_path / "c"), "--models", "no-such-dir"]) == 2
    by_flag = capsys.readouterr().err
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "no-such-dir")
    assert main(["convert", str(recipe), "--out", str(tmp_path / "c")]) == 2
    by_env = capsys.readouterr().err
    said = ("no-such-dir: no such directory (the models root: create it, then `hf download ORG/NAME --local-dir "
            "no-such-dir/ORG/NAME`")
    assert by_flag.startswith(f"error: --models {said}") and by_flag.count("\n") == 1
    assert by_env == by_flag.replace("--models", "$TRTLLM_DFLASH_MODELS", 1)


def test_an_id_missing_under_the_root_names_the_download_into_it(tmp_path, monkeypatch):
    import pytest

    from trtllm_dflash.convert.sources import load_sources
    from trtllm_dflash.errors import UserError

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", str(root))
    recipe = load_recipe(H100, check_rules=False)  # its catalog facts need no download
    with pytest.raises(UserError) as e:
        load_sources(recipe)
    assert str(e.value) == (
        "target.source: 'Qwen/Qwen3-8B' is neither a local directory nor downloaded: "
        f"`hf download Qwen/Qwen3-8B --local-dir {root.resolve()}/Qwen/Qwen3-8B`, or set target.source to the "
        "directory")


def test_convert_s_own_look_up_says_the_same_for_a_missing_root(tmp_path, monkeypatch):
    """convert/sources.py resolves the sources again at stage time: a root gone since the recipe
    was read is the same line."""
    import pytest

    from trtllm_dflash.convert.sources import load_sources
    from trtllm_dflash.errors import UserError

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")
    recipe = load_recipe(H100, check_rules=False)
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", str(tmp_path / "gone"))
    with pytest.raises(UserError) as e:
        load_sources(recipe)
    assert str(e.value).startswith(f"$TRTLLM_DFLASH_MODELS {tmp_path / 'gone'}: no such directory (the models root: ")
