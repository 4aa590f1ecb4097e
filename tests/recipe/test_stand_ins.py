"""`trtllm-dflash models --stand-ins`: tiny random checkpoints of a recipe's architectures under its
Hugging Face ids, marked as stand-ins; the stages take their own facts, check / plan / project
the recipe's (the real model's), with no --set."""

import argparse
import json
from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.commands import models
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import check, list_recipes, load_recipe
from trtllm_dflash.recipe.models_root import STAND_IN_KEY

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
H100 = RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"
GPU_RECIPES = [p for p in list_recipes() if p.parent.name != "cpu"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Qwen/Qwen3-8B and z-lab/Qwen3-8B-DFlash-b16 stand-ins, written once by the command."""
    out = tmp_path_factory.mktemp("models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTLLM_DFLASH_MODELS", "")
        assert main(["models", str(H100), "--stand-ins", "--out", str(out)]) == 0
    return out


@pytest.fixture
def models_env(root, monkeypatch, tmp_path):
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    return root


def test_the_stand_ins_are_laid_out_and_marked(root):
    for repo in ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16"):
        cfg = json.loads((root / repo / "config.json").read_text())
        assert cfg[STAND_IN_KEY]["of"] == repo and "not the model" in cfg[STAND_IN_KEY]["note"]
        assert (root / repo / "model.safetensors").is_file()
        assert "Not the model" in (root / repo / "README.md").read_text()
    assert json.loads((root / "Qwen/Qwen3-8B/config.json").read_text())["model_type"] == "qwen3"
    assert json.loads((root / "z-lab/Qwen3-8B-DFlash-b16/config.json").read_text())["block_size"] == 16


def test_stages_read_the_stand_in_and_planning_reads_the_recipe(models_env):
    """No `--set target.arch=null`: a stand-in cannot agree with the catalog, and need not."""
    stage = load_recipe(H100)
    planned = load_recipe(H100, planning=True)
    assert (stage.target_facts.num_layers, stage.target_facts.hidden_size,
            stage.drafter_facts.block_size) == (4, 64, 16)
    assert (planned.target_facts.num_layers, planned.target_facts.hidden_size) == (36, 4096)
    notes = [i.message for i in check(planned) if i.field == "target.source"]
    assert notes and "is a stand-in for Qwen/Qwen3-8B" in notes[0]


def test_writing_again_keeps_them_and_a_download_is_never_overwritten(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")
    capsys.readouterr()
    assert main(["models", str(H100), "--stand-ins", "--out", str(root)]) == 0
    assert capsys.readouterr().out.count("(already there)") == 2
    real = tmp_path / "Qwen" / "Qwen3-8B"
    real.mkdir(parents=True)
    (real / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert main(["models", str(H100), "--stand-ins", "--out", str(tmp_path)]) == 2
    assert "is not a stand-in (a download?)" in capsys.readouterr().err
    assert not (tmp_path / "z-lab").exists()
    assert json.loads((real / "config.json").read_text()) == {"model_type": "qwen3"}


def test_models_says_where_each_checkpoint_is_or_what_to_download(models_env, capsys, monkeypatch):
    capsys.readouterr()
    assert main(["models", str(H100)]) == 0
    said = f"target: Qwen/Qwen3-8B: {models_env.resolve()}/Qwen/Qwen3-8B (stand-in for Qwen/Qwen3-8B)"
    assert said in capsys.readouterr().out
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")
    assert main(["models", str(RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml")]) == 1
    out = capsys.readouterr().out
    assert "target: meta-llama/Llama-3.1-8B-Instruct: not downloaded: hf download meta-llama/Llama-3.1-8B-Instruct " \
           "--local-dir MODELS/meta-llama/Llama-3.1-8B-Instruct" in out


def test_a_recipe_with_shipped_sources_needs_no_stand_ins(tmp_path, capsys):
    assert main(["models", "--stand-ins", "--out", str(tmp_path)]) == 0
    assert "no stand-ins needed" in capsys.readouterr().out and not any(tmp_path.iterdir())
    with pytest.raises(UserError, match="--out: only with --stand-ins"):
        models.run(argparse.Namespace(recipe=None, overrides=[], stand_ins=False, out=tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_converts_its_stand_ins(recipe, tmp_path, monkeypatch):
    """Every architecture and drafter a shipped recipe names gets stand-ins the convert stage takes
    as they are (shapes, pairing, the backend's layout); the guides run the later stages."""
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", "")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    assert main(["models", str(recipe), "--stand-ins", "--out", str(tmp_path / "m")]) == 0
    assert main(["convert", str(recipe), "--models", str(tmp_path / "m"), "--out", str(tmp_path / "c"),
                 "--no-progress"]) == 0
