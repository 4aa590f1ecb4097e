"""deploy/dynamo.py: the Dynamo TensorRT-LLM worker's engine-args YAML is our LLM arguments
(deploy/llmapi.py, the same as trtllm-serve's and Triton's) without the keys the 1.6.1 worker owns,
whose values go on its command line instead (the goldens pin both files: tests/deploy/golden/
pytorch-*.dynamo.*)."""

from pathlib import Path

import pytest

from trtllm_dflash.deploy.dynamo import engine_args, worker_args
from trtllm_dflash.deploy.llmapi import llm_args
from trtllm_dflash.recipe import dynamo, list_recipes, load_recipe

PYTORCH = [p for p in list_recipes() if load_recipe(p).backend.name == "pytorch"]


@pytest.mark.parametrize("path", PYTORCH, ids=lambda p: p.stem)
def test_engine_args_are_the_llm_arguments_the_worker_does_not_own(path):
    recipe, artifact = load_recipe(path), Path("/runs/q")
    ours, owned = llm_args(recipe, artifact), dynamo.worker_owned()
    args = engine_args(recipe, artifact)
    assert not set(args) & set(owned)  # a YAML key would replace the worker's own (llm_args | yaml)
    assert args == {k: v for k, v in ours.items() if k not in owned}
    assert args["speculative_config"] == ours["speculative_config"]  # DFlash, passed through whole
    assert "return_perf_metrics" not in args and "backend" not in args  # the worker's defaults stand
    argv = worker_args(recipe, artifact, Path("/d/engine_args.yaml"))
    def value(flag):
        return argv[argv.index(flag) + 1]
    assert value("--model") == ours["model"] and value("--tensor-parallel-size") == str(ours["tensor_parallel_size"])
    assert value("--pipeline-parallel-size") == str(ours["pipeline_parallel_size"])
    assert ("--expert-parallel-size" in argv) == ("moe_expert_parallel_size" in ours)
    assert value("--disaggregation-mode") == "agg" and "--publish-metrics" in argv
