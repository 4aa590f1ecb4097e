"""Every stage has the same door (recipe/stages.py): `trtllm_dflash/<package>/stage.py` with NAME,
WRITES_OUTPUT, fingerprint(recipe, options) and run(recipe, input_dir, out, options), and
pipeline.py walks one table of them with no per-stage branch."""

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from trtllm_dflash import pipeline
from trtllm_dflash.errors import StopHere
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.stages import PACKAGE as STAGE_PACKAGE
from trtllm_dflash.recipe.stages import STAGES, StageOptions, door_module

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trtllm_dflash"


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_folder_has_the_same_door(stage):
    path = PACKAGE / STAGE_PACKAGE.get(stage, stage) / "stage.py"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    door = importlib.import_module(door_module(stage))
    assert Path(door.__file__).resolve() == path.resolve()
    assert door.NAME == stage and isinstance(door.WRITES_OUTPUT, bool)
    assert list(inspect.signature(door.run).parameters) == ["recipe", "input_dir", "out", "options"]
    assert list(inspect.signature(door.fingerprint).parameters) == ["recipe", "options"]
    assert pipeline.DOORS[stage] is door


def test_the_pipeline_table_is_the_stages_in_order():
    assert list(pipeline.DOORS) == list(STAGES)


def test_pipeline_has_no_per_stage_branch():
    """No comparison of anything with a stage's name (`if stage == "sweep"`, `door.NAME in (...)`)."""
    tree = ast.parse((PACKAGE / "pipeline.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for const in ast.walk(node):
                if isinstance(const, ast.Constant) and const.value in STAGES:
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not found, f"pipeline.py branches on a stage's name: {found}"


def test_serve_door_stops_where_the_deployment_serves_only_on_gpus(tmp_path):
    options = StageOptions(recipe_arg="R.yaml")
    assert pipeline.DOORS["serve"].run(load_recipe(None), tmp_path / "deploy", tmp_path / "serve", options) is None
    gpu = load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml")
    with pytest.raises(StopHere, match=r"^serve: the .* backend serves on 1x h100-sxm") as e:
        pipeline.DOORS["serve"].run(gpu, tmp_path / "deploy", tmp_path / "serve", options)
    assert f"--from {tmp_path / 'deploy'}" in str(e.value) and f"--out {tmp_path / 'sweep'}" in str(e.value)


def test_fingerprints_name_what_outside_the_recipe_makes_an_output_stale():
    recipe = load_recipe(None)
    prints = {s: pipeline.DOORS[s].fingerprint(recipe, StageOptions(levels=[1, 2])) for s in STAGES}
    assert prints["convert"] == prints["quantize"] == prints["serve"] == {}
    assert prints["sweep"]["levels"] == [1, 2] and prints["sweep"]["runners"] == "reference"
    assert set(prints["build"]) == {"dry_run"} and set(prints["deploy"]) == {"inputs"}


def test_no_stage_package_is_named_like_build_output():
    """Common ignore templates (GitHub's Python .gitignore: `build/`) and structure tools take a
    `build/` folder for build output; the build stage's package is engines/, its name stays build."""
    assert not list((PACKAGE / "build").glob("*.py"))  # a checkout's stale __pycache__ is not a package
    assert door_module("build") == "trtllm_dflash.engines.stage"
    assert door_module("deploy") == "trtllm_dflash.deploy.stage"
    assert set(STAGE_PACKAGE) <= set(STAGES)
