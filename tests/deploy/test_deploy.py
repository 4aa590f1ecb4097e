"""deploy: generated Triton repositories are pinned by golden files, and serve the artifact
deploy was given (`--from`) and nothing else.

To accept an intended change, regenerate the goldens with
`python tests/deploy/test_deploy.py --regenerate` and review the diff.
"""

import sys
from pathlib import Path

import pytest
import yaml

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir, manifest_sha256, verify_input
from trtllm_dflash.deploy.repository import deploy, llmapi_model_yaml
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe, list_recipes
from trtllm_dflash.recipe.stages import input_stage

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
ARTIFACT, SHA = "<ARTIFACT>", "<MANIFEST_SHA256>"

CASES = {
    # golden name: (recipe, file inside the model directory)
    "reference.config.pbtxt": ("recipes/cpu/tiny-pystd.yaml", "config.pbtxt"),
    "reference.recipe.yaml": ("recipes/cpu/tiny-pystd.yaml", "1/recipe.yaml"),
    "engine.config.pbtxt": ("recipes/hopper/h100-qwen3-8b-fp8.yaml", "config.pbtxt"),
    "pytorch.config.pbtxt": ("recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", "config.pbtxt"),
    "pytorch.model.yaml": ("recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", "1/model.yaml"),
}
LAYOUT = {"reference": "trtllm", "pytorch": "hf", "engine": None}


def artifact(recipe, root: Path, stage: str | None = None) -> Path:
    """A stand-in for the stage output deploy takes (deploy reads manifests, never weights)."""
    stage = stage or input_stage(recipe, "deploy")
    layout = LAYOUT[recipe.backend.name]
    with atomic_stage_dir(root / stage, Manifest.for_stage(stage, recipe, extra={"layout": layout} if layout else {})) as d:
        (d / "weights.safetensors").write_bytes(b"stand-in")
    return root / stage


def generate(name: str, tmp: Path) -> str:
    recipe_path, inner = CASES[name]
    recipe = load_recipe(ROOT / recipe_path)
    src = artifact(recipe, tmp)
    out = deploy(recipe, src, tmp / "out")
    text = (out / "model_repository" / recipe.serve.model_name / inner).read_text()
    return text.replace(str(src.resolve()), ARTIFACT).replace(manifest_sha256(src), SHA)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_golden(name, tmp_path):
    assert generate(name, tmp_path) == (GOLDEN / name).read_text(), f"{name} differs from tests/deploy/golden/{name}"


def test_repository_layout_and_manifest(tmp_path):
    recipe = load_recipe(None)
    src = artifact(recipe, tmp_path)
    out = deploy(recipe, src, tmp_path / "repo")
    m = verify_input(out, ("deploy",), recipe)
    assert set(m.files) == {
        "model_repository/dflash/config.pbtxt",
        "model_repository/dflash/1/model.py",
        "model_repository/dflash/1/recipe.yaml",
    }
    assert m.input == {"stage": "convert", "path": str(src.resolve()), "manifest_sha256": manifest_sha256(src)}
    assert m.extra["artifact"] == str(src.resolve())
    # The deployed recipe is a valid recipe in its own right (it is what the server loads).
    deployed = out / "model_repository/dflash/1/recipe.yaml"
    assert load_recipe(deployed).sha256() == recipe.sha256()


def test_model_name_comes_from_the_recipe(tmp_path):
    recipe = load_recipe(None, ["serve.model_name=tiny"])
    out = deploy(recipe, artifact(recipe, tmp_path), tmp_path / "repo")
    assert 'name: "tiny"' in (out / "model_repository/tiny/config.pbtxt").read_text()


def test_deploy_takes_the_stage_before_it(tmp_path):
    fp8 = load_recipe(ROOT / "recipes/cpu/tiny-pystd-fp8.yaml")
    conv = artifact(fp8, tmp_path, "convert")
    with pytest.raises(UserError, match=r"manifest field stage is 'convert'; expected a quantize output"):
        deploy(fp8, conv, tmp_path / "a")
    engine = load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml")
    with pytest.raises(UserError, match=r"expected a build output"):
        deploy(engine, artifact(engine, tmp_path / "e", "quantize"), tmp_path / "b")
    # a convert output of another recipe
    plain = load_recipe(None)
    with pytest.raises(UserError, match=r"recipe_fields.checkpoint_dtype|recipe_fields.target.source"):
        deploy(plain, artifact(load_recipe(None, ["quantization.target_weights=bf16"]), tmp_path / "o"), tmp_path / "c")
    assert not any((tmp_path / n).exists() for n in "abc")


@pytest.mark.parametrize("path", [p for p in list_recipes() if load_recipe(p).backend.name == "pytorch"],
                         ids=lambda p: p.stem)
def test_pytorch_model_is_the_quantize_output(tmp_path, path):
    recipe = load_recipe(path)
    assert recipe.quantization.quantizes
    src = artifact(recipe, tmp_path)
    assert src.name == "quantize"
    out = deploy(recipe, src, tmp_path / "out")
    model = yaml.safe_load((out / "model_repository" / recipe.serve.model_name / "1/model.yaml").read_text())
    assert model["model"] == str(src.resolve() / "target")
    assert model["speculative_config"]["speculative_model"] == str(src.resolve() / "drafter")


def test_llmapi_yaml_maps_draft_bands(tmp_path):
    spec = llmapi_model_yaml(load_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"), tmp_path)["speculative_config"]
    assert spec["max_draft_len"] == 9 and spec["draft_len_schedule"] == {16: 9, 64: 7, 256: 3}
    assert spec["target_layer_ids"] == [1, 9, 17, 25, 33] and spec["attention_backend"] == "TRTLLM"


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    for name in CASES:
        with tempfile.TemporaryDirectory() as d:
            (GOLDEN / name).write_text(generate(name, Path(d)))
            print("wrote", GOLDEN / name)
