"""A shipped recipe names Hugging Face ids; after `huggingface-cli download` every stage finds the
checkpoints under one models root (--models DIR or $TRTLLM_DFLASH_MODELS) or in the local Hugging
Face cache, with no per-stage --set, and the manifests record where they came from."""

import json
import shutil

import yaml
from checkpoints import make_drafter, make_target, write_recipe

from trtllm_dflash.artifacts import Manifest
from trtllm_dflash.cli import main
from trtllm_dflash.recipe import load_recipe

TARGET, DRAFTER = "acme/tiny-target", "acme/tiny-target-DFlash"


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
    assert f"huggingface-cli download {TARGET} --local-dir MODELS/{TARGET}`, then --models MODELS" in err
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
