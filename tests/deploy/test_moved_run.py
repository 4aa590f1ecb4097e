"""A run directory moved as a whole still serves: build and deploy outputs name the stage outputs
they use by paths relative to themselves (tests/serve/test_engine_server.py serves a moved copy
behind a real tritonserver)."""

import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from trtllm_dflash.pipeline import run
from trtllm_dflash.recipe import load_recipe

ENGINE = Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "tiny-pystd-engine.yaml"


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The CPU engine recipe run to deploy in one directory, then moved to another: (recipe, old, new)."""
    root = tmp_path_factory.mktemp("moved")
    recipe = load_recipe(ENGINE)
    run(recipe, root / "here", until="deploy", progress=False, say=lambda _: None)
    shutil.move(root / "here", root / "there" / "renamed")
    return recipe, root / "here", root / "there" / "renamed"


def test_no_output_names_where_the_run_was(moved):
    """Every path inside the run is relative; the only absolute ones are the sources convert read
    from outside it (the package's embedded pair)."""
    _, old, new = moved
    for path in new.rglob("*"):
        if path.is_file() and path.suffix != ".safetensors":
            assert str(old) not in path.read_text(), path.relative_to(new)
    plan = (new / "build" / "plan.json").read_text()
    assert '"--model_cls_file",\n' in plan and '"trtllm_models.py"' in plan
    assert (new / "build/trtllm_models.py").is_file()


def test_the_pipeline_chain_holds_after_the_move(moved):
    recipe, _, new = moved
    done = run(recipe, new, until="deploy", progress=False, say=lambda _: None)
    assert [s.status for s in done] == ["skipped"] * len(done)


@pytest.mark.slow
def test_the_moved_deployment_opens_and_serves_a_request(moved):
    """What the Triton model does in `initialize` (config.pbtxt settings, the runners over the
    checkpoint they name), from the moved copy, then one greedy request through its engine."""
    from trtllm_dflash.serve.deployed import open_deployed, repository_model
    from trtllm_dflash.serve.record import Request

    recipe, _, new = moved
    version, settings = repository_model(new / "deploy", recipe.serve.model_name)
    assert Path(settings.checkpoint) == (new / "convert").resolve()
    assert Path(settings.engine_dir) == (new / "build").resolve()
    deployed = open_deployed(version, replace(settings, runners="emulated"))
    updates, done = [], threading.Event()

    def emit(u):
        updates.append(u)
        if u.finish_reason:
            done.set()

    try:
        deployed.engine.submit(Request(deployed.tokenizer.encode("def add(a, b):"), 8, emit))
        assert done.wait(60), "the engine did not finish the request"
    finally:
        deployed.close()
    assert updates[-1].finish_reason in ("length", "stop") and updates[-1].total_tokens >= 1


def test_a_runners_overlay_of_the_moved_deployment_names_absolute_paths(moved, tmp_path):
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.launch.overlay import with_runners
    from trtllm_dflash.serve.deployed import repository_model

    recipe, _, new = moved
    copy = with_runners(new / "deploy" / REPOSITORY, recipe.serve.model_name, "emulated", tmp_path)
    text = (copy / recipe.serve.model_name / "config.pbtxt").read_text()
    assert f'"{(new / "convert").resolve()}"' in text and f'"{(new / "build").resolve()}"' in text
    _, settings = repository_model(new / "deploy", recipe.serve.model_name)
    assert settings.runners == "tensorrt"  # the deploy output itself is not edited
