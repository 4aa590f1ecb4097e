"""TensorRT-LLM LLM-API arguments for the pytorch backend, per TensorRT-LLM version.

What `deploy` writes for TensorRT-LLM >= 1.3 (native DFlash, PyTorch backend):
- the LLM(...) arguments: Triton's LLM-API model reads them from `model.yaml`
  (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py: every key but `triton_config`
  goes through `update_llm_args_with_extra_dict`), and `trtllm-serve --config` reads the same
  keys from a YAML that overrides its command line (tensorrt_llm/commands/serve.py `serve`;
  `--config` is the documented name since PR #9104, `--extra_llm_api_options` its alias);
- `speculative_config`: a `DFlashDecodingConfig` (tensorrt_llm/llmapi/llm_args.py, a strict
  pydantic model: an unknown key is an error at start-up, on the GPU, after the container
  pulled). Its fields differ between releases, so the recipe's `backend.trtllm_version` picks
  the field table below, every key written is checked against it, and a version without a
  table is refused with the versions we know.

The tables were read from upstream, never guessed (the API reference pages are rendered from
tensorrt_llm/llmapi/llm_args.py of that release):
- 1.3.x: `DFlashDecodingConfig` of the 1.3.0rc27 API reference. `attention_backend` there is
  Literal["VANILLA", "TRTLLM", "FA4"], but earlier 1.3 release candidates (and the unversioned
  reference page) have only VANILLA and TRTLLM; FA4 came with PR #18553 (Sept 2026). We write
  only the two every 1.3 build has.
- 1.4.x: `DFlashDecodingConfig` of the 1.4.0rc1 API reference: adds `moe_backend`,
  `spec_dec_variant`, `context_recompute_tail` (default 0) and `skip_ctx_buffer_budget_check`,
  and FA4.

Decisions per version (what the fields are used for):
- drafter attention (`attention_backend`, independent of the target's `attn_backend`):
  TRTLLM on Blackwell (FlashInfer trtllm-gen kernels, SM100/SM103 only: dflash_attention.py);
  on Hopper VANILLA (flash-attn over a dense context arena) on 1.3.x, FA4 on 1.4.x (PR #18553:
  "selectable for SM90", the fastest Hopper row of its table).
- prefix-cache reuse: a reused prefix never runs through the target, so the drafter gets no
  hidden states for it (issue #16005). On 1.3.x there is no remedy: `enable_block_reuse: false`.
  1.4.x caps reuse so at least `context_recompute_tail` prompt tokens are recomputed
  (`_spec_recompute_claim_limit` in pyexecutor/kv_cache/kv_cache_manager_v2.py,
  `KVCacheManager._maybe_rewind_reused_context` in pyexecutor/resource_manager.py; both
  block-aligned), so we turn reuse on with a recompute tail of RECOMPUTE_TAIL tokens and
  chunked prefill (the V1 manager skips the rewind without chunked prefill,
  `KVCacheManager._maybe_apply_spec_recompute_tail`). That same gate turns the tail off when
  a target has sliding-window layers, so such targets (gpt-oss) keep reuse off on 1.4 too.
- `moe_backend` (1.4) would set the drafter's MoE backend; z-lab drafters are dense, so it is
  not written (the target's comes from `moe_config`, whose default picks per GPU).
- the drafter stays BF16: upstream loads `fc` as a plain nn.Linear and applies the raw
  `qkv_proj` slice in `precompute_context_kv` (modeling_dflash.py), so a quantized drafter
  does not load (recipe rule `quantization.drafter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.placement import placement
from trtllm_dflash.recipe.plan.rows import KV_CACHE_FREE_GPU_MEM_FRACTION
from trtllm_dflash.recipe.rules import (
    MIN_RUNTIME_DRAFT_LEN,
    PYTORCH_TRTLLM_LINES,
    pytorch_draft_len_schedule,
    recompute_tail,
)
from trtllm_dflash.recipe.support import backend as backend_spec
from trtllm_dflash.recipe.support import trtllm_line
from trtllm_dflash.recipe.trtllm_api import (
    ACCEPT_STATS_ENV,
    ACCEPT_STATS_FLUSH_ENV,
    acceptance_source,
    drafter_attention,
    has,
)

# Prompt tokens recomputed after a prefix-cache hit on 1.4 (the drafter's context then starts
# there). A few KV blocks: enough recent context for drafting, most of a long shared prefix reused.
RECOMPUTE_TAIL = 512

# DecodingBaseConfig fields (tensorrt_llm/llmapi/llm_args.py), the same in both tables.
_DECODING_BASE = frozenset({
    "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
    "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
    "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
})

# TorchLlmArgs / BaseLlmArgs keys we write (tensorrt_llm/llmapi/llm_args.py), and the keys of
# their nested configs: KvCacheConfig, CudaGraphConfig (BaseCudaGraphConfig).
LLM_KEYS = frozenset({
    "model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size",
    "max_batch_size", "max_seq_len", "max_num_tokens", "kv_cache_config", "cuda_graph_config",
    "enable_chunked_prefill", "return_perf_metrics", "enable_iter_perf_stats", "speculative_config",
    "perf_metrics_output_dir", "per_request_spec_decode_stats",
})
# Beside the options file: where TensorRT-LLM's acceptance recorder writes (before PR #16668's
# release), and where trtllm-serve writes its per-request metrics JSONL (from it on).
ACCEPT_STATS_DIR = "accept_stats"
PERF_METRICS_DIR = "perf_metrics"
KV_CACHE_KEYS = frozenset({"dtype", "free_gpu_memory_fraction", "enable_block_reuse"})
CUDA_GRAPH_KEYS = frozenset({"enable_padding", "max_batch_size"})


@dataclass(frozen=True)
class DFlashFields:
    """`DFlashDecodingConfig` of one TensorRT-LLM release line."""

    line: str  # "1.3": every 1.3.x
    source: str  # where the fields were read
    fields: frozenset[str]
    attention_backends: tuple[str, ...]  # the values its Literal has (recipe/trtllm_api.py: since which release)


DFLASH_FIELDS: dict[str, DFlashFields] = {
    "1.3": DFlashFields(
        "1.3",
        "tensorrt_llm/llmapi/llm_args.py DFlashDecodingConfig (API reference 1.3.0rc27)",
        _DECODING_BASE | {"mask_token_id", "target_layer_ids", "decoding_type", "attention_backend"},
        ("VANILLA", "TRTLLM", "FA4"),
    ),
    "1.4": DFlashFields(
        "1.4",
        "tensorrt_llm/llmapi/llm_args.py DFlashDecodingConfig (API reference 1.4.0rc1)",
        _DECODING_BASE | {"mask_token_id", "target_layer_ids", "decoding_type", "attention_backend", "moe_backend",
                          "spec_dec_variant", "context_recompute_tail", "skip_ctx_buffer_budget_check"},
        ("VANILLA", "TRTLLM", "FA4"),
    ),
}
assert set(DFLASH_FIELDS) == set(PYTORCH_TRTLLM_LINES), "one field table per TensorRT-LLM line the rules accept"


def dflash_fields(recipe: Recipe) -> DFlashFields:
    """The field table for the recipe's TensorRT-LLM version (default: DEFAULT_TRTLLM_VERSION)."""
    version = _version(recipe)
    line = trtllm_line(version)
    if line not in DFLASH_FIELDS:
        known = ", ".join(f"{v}.x" for v in DFLASH_FIELDS)
        raise UserError(f"backend.trtllm_version: {version}: no DFlashDecodingConfig field table for it; known: "
                        f"{known}")
    return DFLASH_FIELDS[line]


def _version(recipe: Recipe) -> str:
    return recipe.backend.trtllm_version or backend_spec(recipe.backend.name).default_trtllm_version


def _prefix_reuse(recipe: Recipe) -> bool:
    """Prefix-cache reuse keeps the drafter's context only where a recompute tail exists and applies."""
    return recompute_tail(recipe, _version(recipe))


def speculative_config(recipe: Recipe, artifact: Path) -> dict:
    """`speculative_config` (a DFlashDecodingConfig) for the drafter in `artifact`/drafter."""
    table = dflash_fields(recipe)
    spec, d = recipe.speculative, recipe.drafter_facts
    bands = spec.bands
    attention = drafter_attention(recipe.backend.drafter_attention, recipe.gpu.is_blackwell)
    out = {
        "decoding_type": "DFlash",
        # The first band is the longest draft (rule): the schedule's smallest key maps to it.
        "max_draft_len": max(spec.draft_len_at(1), MIN_RUNTIME_DRAFT_LEN),
        # A local directory, so upstream could also read dflash_config; the ids are written
        # anyway (with a hub id nothing would capture the target's hidden states).
        "speculative_model": str(Path(artifact).resolve() / "drafter"),
        "target_layer_ids": list(d.target_layer_ids or []),
    }
    # VANILLA is DFlashDecodingConfig's default: not written, so releases before the field (PR
    # #16914) take the config too (recipe/trtllm_api.py; check refuses what a version lacks).
    if attention != "VANILLA":
        out["attention_backend"] = attention
    trained = d.block_size or spec.block_size
    if out["max_draft_len"] + 1 > trained:  # TensorRT-LLM raises at start-up since PR #17935
        raise UserError(f"speculative.draft_len: max_draft_len {out['max_draft_len']} needs a block of "
                        f"{out['max_draft_len'] + 1}; the drafter was trained with block_size {trained}")
    if d.mask_token_id is not None:
        out["mask_token_id"] = d.mask_token_id
    if bands:
        # Never `max_concurrency`, never a 0: both turn drafting off, which PR #16888 shows
        # collapses DFlash acceptance (rules.pytorch_draft_len_schedule).
        out["draft_len_schedule"] = pytorch_draft_len_schedule(recipe)
    if _prefix_reuse(recipe):
        out["context_recompute_tail"] = RECOMPUTE_TAIL
    _check_keys(out, table.fields, f"speculative_config ({table.source})")
    assert attention in table.attention_backends
    return out


def llm_args(recipe: Recipe, artifact: Path) -> dict:
    """LLM(...) arguments serving `artifact` (a convert or quantize output in the HF layout:
    target/ and drafter/), without Triton's `triton_config`."""
    reuse = _prefix_reuse(recipe)
    kv_dtype = {"fp8": "fp8", "nvfp4": "nvfp4"}.get(recipe.quantization.kv_cache, "auto")
    b = recipe.build
    out = {
        "model": str(Path(artifact).resolve() / "target"),
        "backend": "pytorch",
        "tensor_parallel_size": recipe.parallel.tp,
        "pipeline_parallel_size": recipe.parallel.pp,
        **({"moe_expert_parallel_size": recipe.parallel.tp} if recipe.target_facts.is_moe else {}),
        # Both also size the drafter's dense context arena: (max_batch_size + 1) x max_seq_len.
        "max_batch_size": b.max_batch_size,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens,
        # The DFlash context arena is allocated after the KV pool: leave room for it.
        "kv_cache_config": {"dtype": kv_dtype, "free_gpu_memory_fraction": KV_CACHE_FREE_GPU_MEM_FRACTION,
                            "enable_block_reuse": reuse},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": b.max_batch_size},
        **({"enable_chunked_prefill": True} if reuse else {}),
        # Per-request metrics: the perf-metric outputs of Triton's LLM-API model; trtllm-serve's
        # response headers (a request asking with X-TRTLLM-return-metrics).
        "return_perf_metrics": True,
        "speculative_config": speculative_config(recipe, artifact),
    }
    _check_keys(out, LLM_KEYS, "LLM arguments (TorchLlmArgs)")
    _check_keys(out["kv_cache_config"], KV_CACHE_KEYS, "kv_cache_config (KvCacheConfig)")
    _check_keys(out["cuda_graph_config"], CUDA_GRAPH_KEYS, "cuda_graph_config (CudaGraphConfig)")
    return out


def model_yaml(recipe: Recipe, artifact: Path) -> dict:
    """Triton's LLM-API `model.yaml`: the LLM arguments plus `triton_config` (max_batch_size 0:
    the LLM batches in flight; decoupled for streaming; the model.py of the container reads both)."""
    return {**llm_args(recipe, artifact), "triton_config": {"max_batch_size": 0, "decoupled": recipe.serve.decoupled}}


def extra_llm_api_options(recipe: Recipe, artifact: Path, serve_dir: Path) -> dict:
    """The YAML for `trtllm-serve MODEL --config FILE` (FILE in `serve_dir`): the LLM arguments
    without the two the command line carries (MODEL and --backend), iteration stats for /metrics,
    and the per-request acceptance surface of the version (recipe/trtllm_api.py acceptance_source):
    the metrics JSONL directory from PR #16668's release on, and PR #19311's per-choice object where
    the release has it (a strict field: written only there)."""
    args = {k: v for k, v in llm_args(recipe, artifact).items() if k not in ("model", "backend")}
    args["enable_iter_perf_stats"] = True
    version = _version(recipe)
    if has(version, "perf_metrics_output_dir"):
        args["perf_metrics_output_dir"] = str(Path(serve_dir).resolve() / PERF_METRICS_DIR)
    if has(version, "per_request_spec_decode_stats"):
        args["per_request_spec_decode_stats"] = True
    _check_keys(args, LLM_KEYS, "LLM arguments (TorchLlmArgs)")
    return args


def trtllm_serve_commands(recipe: Recipe, artifact: Path, options: Path) -> dict[str, list[str]]:
    """The launch commands for trtllm-serve (tensorrt_llm/commands/serve.py) in NVIDIA's container.

    single_node  one process; the LLM spawns its tp x pp MPI workers itself
    mpirun       world size tp x pp under mpirun, each rank under trtllm-llmapi-launch (rank 0
                 runs the server, the others run tensorrt_llm.llmapi.mgmn_worker_node:
                 tensorrt_llm/llmapi/trtllm-llmapi-launch)
    srun         the same under Slurm (--mpi=pmix), on the nodes recipe/plan/placement.py lays out
                 for one model copy (`serve --launcher srun` writes the whole sbatch script around
                 it: one such step per copy of parallel.replicas, each on nodes of its own)
    Every command serves one model copy: replicas are as many of them, each its own endpoint.
    """
    s = recipe.serve
    serve = ["trtllm-serve", str(Path(artifact).resolve() / "target"), "--host", s.host, "--port", str(s.http_port),
             "--backend", "pytorch", _config_flag(recipe), str(options)]
    world = recipe.world_size
    where = placement(recipe)
    env = accept_stats_env(recipe, Path(options).parent / ACCEPT_STATS_DIR)
    return {
        "single_node": [*env, *serve],
        "mpirun": ["mpirun", "--allow-run-as-root", "-n", str(world), *env, "trtllm-llmapi-launch", *serve],
        "srun": ["srun", "-N", str(where.nodes), f"--ntasks-per-node={where.tasks_per_node}", "--mpi=pmix",
                 *env, "trtllm-llmapi-launch", *serve],
    }


def accept_stats_env(recipe: Recipe, stats_dir: Path) -> list[str]:
    """`env VAR=VALUE ...` switching on TensorRT-LLM's acceptance recorder, for versions whose
    per-request metrics read 0 for DFlash (before PR #17082): the sweep's source there. Written
    every verify step, so a sweep reads each level whole. Empty for the others."""
    if acceptance_source(_version(recipe)) != "accept_stats":
        return []
    return ["env", f"{ACCEPT_STATS_ENV}={stats_dir}", f"{ACCEPT_STATS_FLUSH_ENV}=1"]


def _config_flag(recipe: Recipe) -> str:
    """trtllm-serve's option for the LLM-API YAML in the recipe's release (recipe/trtllm_api.py)."""
    return "--config" if has(_version(recipe), "trtllm-serve --config") else "--extra_llm_api_options"


def _check_keys(d: dict, allowed: frozenset[str], what: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:  # a bug here, not a user error: these dicts are built above
        raise AssertionError(f"{what}: {', '.join(unknown)} not fields of it")
