"""The pytorch backend as an NVIDIA Dynamo TensorRT-LLM worker: what `deploy` writes beside the
repository for `python3 -m dynamo.trtllm` (recipe/dynamo.py holds Dynamo's facts, from the 1.6.1
wheel):

  OUT/dynamo/engine_args.yaml   for --extra-engine-args: our LLM arguments (deploy/llmapi.py
                                llm_args, the same as trtllm-serve's and Triton's, DFlash's
                                speculative_config included) without the keys the worker owns
  OUT/dynamo/launch.json        the worker's and the frontend's arguments, and the router mode

The worker builds LLM(...) arguments of its own (dynamo/trtllm/workers/llm_worker.py `arg_map`)
and then merges the YAML over them top-level key by top-level key
(`update_llm_args_with_extra_options`: `llm_args | yaml`), so a key in the YAML replaces the
worker's. The keys it sets from its own flags (model, the parallel sizes, iteration stats from
--publish-metrics) go on its command line instead, where they are visible and cannot disagree
with the YAML; `backend` it sets to pytorch itself, and `return_perf_metrics` it turns off on
purpose (per-step timing nothing in Dynamo reads): both are left to it. `kv_cache_config`,
`max_batch_size`, `max_seq_len` and `max_num_tokens` are ours (the worker syncs the last three
back into what it advertises); the YAML's `kv_cache_config` replaces the worker's whole, so its
--free-gpu-memory-fraction flag is not written.

The launchers (launch/dynamo.py) add what depends on where it runs: the discovery backend, the
GPUs each worker sees, the MPI world across nodes, the container.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.deploy.llmapi import llm_args
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe import dynamo as upstream

DYNAMO_DIR = "dynamo"  # under the deploy output
ENGINE_ARGS = "engine_args.yaml"
LAUNCH = "launch.json"
# Disaggregation modes other than this one are refused (launch/dynamo.py disaggregation_problem).
AGGREGATED = "agg"


def engine_args(recipe: Recipe, artifact: Path) -> dict:
    """The --extra-engine-args YAML: the LLM arguments without the keys the worker owns."""
    owned = upstream.worker_owned()
    return {k: v for k, v in llm_args(recipe, artifact).items() if k not in owned}


def worker_args(recipe: Recipe, artifact: Path, engine_args_path: Path) -> list[str]:
    """`python3 -m dynamo.trtllm` arguments: the model, its name, the YAML, the parallel sizes the
    worker owns (from the same LLM arguments), aggregated serving, its TensorRT-LLM metrics
    (iteration and per-request statistics on its Prometheus endpoint: DFlash's acceptance among
    them), and KV events where the router uses them."""
    args, owned = llm_args(recipe, artifact), upstream.worker_owned()
    out = ["--model", args["model"], "--served-model-name", recipe.serve.model_name,
           "--extra-engine-args", str(engine_args_path)]
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size"):
        if key in args:
            out += [owned[key], str(args[key])]
    out += ["--disaggregation-mode", AGGREGATED, owned["enable_iter_perf_stats"]]
    if upstream.router(recipe)[0] == "kv":
        out.append("--publish-kv-events")
    return upstream.checked("worker", out)


def frontend_args(recipe: Recipe) -> list[str]:
    """`python3 -m dynamo.frontend` arguments: the recipe's address and HTTP port, the router."""
    s = recipe.serve
    return upstream.checked("frontend", ["--http-host", s.host, "--http-port", str(s.http_port),
                                       "--router-mode", upstream.router(recipe)[0]])


def launch(recipe: Recipe, artifact: Path, engine_args_path: Path) -> dict:
    """launch.json: what serve --api dynamo starts, before the launcher adds where it runs."""
    mode, why = upstream.router(recipe)
    return {"dynamo": upstream.version(), "frontend": frontend_args(recipe),
            "worker": worker_args(recipe, artifact, engine_args_path), "router_mode": mode, "router_why": why}
