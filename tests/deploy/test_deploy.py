"""deploy: generated Triton repositories are pinned by golden files.

To accept an intended change, regenerate the goldens with
`python tests/deploy/test_deploy.py --regenerate` and review the diff.
"""

import sys
from pathlib import Path

import pytest

from trtllm_dflash.artifacts import verify_stage_dir
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
ENGINE_DIR_PLACEHOLDER = "<ENGINE_DIR>"

CASES = {
    # golden name: (recipe, file inside the model directory)
    "reference.config.pbtxt": ("recipes/cpu/tiny-pystd.yaml", "config.pbtxt"),
    "reference.recipe.yaml": ("recipes/cpu/tiny-pystd.yaml", "1/recipe.yaml"),
    "engine.config.pbtxt": ("recipes/hopper/h100-qwen3-8b-fp8.yaml", "config.pbtxt"),
    "pytorch.config.pbtxt": ("recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", "config.pbtxt"),
    "pytorch.model.yaml": ("recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", "1/model.yaml"),
}


def generate(name: str, tmp: Path) -> str:
    recipe_path, inner = CASES[name]
    recipe = load_recipe(ROOT / recipe_path)
    engine_dir = tmp / "engines" if recipe.backend.name == "engine" else None
    out = deploy(recipe, tmp / "out", engine_dir=engine_dir)
    text = (out / "model_repository" / recipe.serve.model_name / inner).read_text()
    if engine_dir is not None:
        text = text.replace(str(engine_dir.resolve()), ENGINE_DIR_PLACEHOLDER)
    return text


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_golden(name, tmp_path):
    assert generate(name, tmp_path) == (GOLDEN / name).read_text(), f"{name} differs from tests/deploy/golden/{name}"


def test_repository_layout_and_manifest(tmp_path):
    recipe = load_recipe(None)
    out = deploy(recipe, tmp_path / "repo")
    m = verify_stage_dir(out, "deploy", recipe.sha256())
    assert set(m.files) == {
        "model_repository/dflash/config.pbtxt",
        "model_repository/dflash/1/model.py",
        "model_repository/dflash/1/recipe.yaml",
    }
    # The deployed recipe is a valid recipe in its own right (it is what the server loads).
    deployed = out / "model_repository/dflash/1/recipe.yaml"
    assert load_recipe(deployed).sha256() == recipe.sha256()


def test_model_name_comes_from_the_recipe(tmp_path):
    recipe = load_recipe(None, ["serve.model_name=tiny"])
    out = deploy(recipe, tmp_path / "repo")
    assert 'name: "tiny"' in (out / "model_repository/tiny/config.pbtxt").read_text()


def test_engine_dir_rules(tmp_path):
    with pytest.raises(UserError, match="needs --engine-dir"):
        deploy(load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"), tmp_path / "a")
    with pytest.raises(UserError, match="applies to the engine backend only"):
        deploy(load_recipe(None), tmp_path / "b", engine_dir=tmp_path)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_llmapi_yaml_maps_draft_bands():
    from trtllm_dflash.deploy.repository import llmapi_model_yaml

    spec = llmapi_model_yaml(load_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"))["speculative_config"]
    assert spec["max_draft_len"] == 9 and spec["draft_len_schedule"] == {16: 9, 64: 7, 256: 3}
    assert spec["target_layer_ids"] == [1, 9, 17, 25, 33] and spec["attention_backend"] == "TRTLLM"


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    for name in CASES:
        with tempfile.TemporaryDirectory() as d:
            (GOLDEN / name).write_text(generate(name, Path(d)))
            print("wrote", GOLDEN / name)
