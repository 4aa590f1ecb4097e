"""A dry-run build (plan.json, no engines) is deployed only on request (`deploy --plan-only`),
and such a deployment serves only with the CPU runners: `serve` and the Triton model refuse the
TensorRT runners in one line saying what to build where."""

from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.errors import UserError
from trtllm_dflash.pipeline import run
from trtllm_dflash.recipe import load_recipe

ENGINE = Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "tiny-pystd-engine.yaml"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The CPU engine recipe through convert and build (a dry run: no TensorRT-LLM here)."""
    root = tmp_path_factory.mktemp("plan-only")
    recipe = load_recipe(ENGINE)
    run(recipe, root, until="build", progress=False, say=lambda _: None)
    return recipe, root


def test_deploy_refuses_a_dry_run_build_in_one_line(planned, tmp_path, capsys):
    recipe, root = planned
    with pytest.raises(UserError, match=r"a dry-run build \(plan.json, no engines\); build the engines inside Triton "
                                        r"26.07-trtllm-python-py3 .*: trtllm-dflash build .* --from .*convert .*"
                                        r"--plan-only") as e:
        deploy(recipe, root / "build", tmp_path / "deploy")
    assert "\n" not in str(e.value) and not (tmp_path / "deploy").exists()
    assert main(["deploy", str(ENGINE), "--from", str(root / "build"), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_plan_only_deployment_serves_only_on_the_cpu_runners(planned, tmp_path, capsys):
    recipe, root = planned
    out = tmp_path / "deploy"
    assert main(["deploy", str(ENGINE), "--from", str(root / "build"), "--out", str(out), "--plan-only"]) == 0
    capsys.readouterr()
    for launcher in ("single_node", "srun"):
        assert main(["serve", str(ENGINE), "--from", str(out), "--launcher", launcher]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a plan-only deployment" in err and "inside Triton 26.07" in err
        assert f"trtllm-dflash build {ENGINE} --from" in err and "--runners reference or emulated" in err


def test_the_triton_model_refuses_tensorrt_runners_over_a_dry_run_build(planned, tmp_path):
    from dataclasses import replace

    from trtllm_dflash.serve.deployed import open_deployed, repository_model

    recipe, root = planned
    out = deploy(recipe, root / "build", tmp_path / "deploy", plan_only=True)
    version, settings = repository_model(out, recipe.serve.model_name)
    with pytest.raises(UserError, match=r"a dry-run build \(no engines\) cannot serve with the tensorrt runners"):
        open_deployed(version, replace(settings, runners="tensorrt"))
