"""Triton model configurations, built as typed protobuf messages and rendered to config.pbtxt.

The messages are Triton's own `ModelConfig` schema (shipped with tritonclient), so field names
and enum values are checked by protobuf, not by string templates.

Two request interfaces:
- `dflash` (reference and engine backends): TensorRT-LLM ensemble / BLS names, so existing
  clients work: `text_input`, `max_tokens`, optional `temperature`, `top_p`, `top_k`, `seed`,
  `stop_words`, `stream`, `exclude_input_in_output`, and our per-request `draft_len` and `mode`;
  output `text_output` (generated text only, streamed as deltas) plus acceptance statistics.
- `tensorrt_llm` LLM-API model (pytorch backend): the names TensorRT-LLM's `llmapi` Triton
  model reads (`sampling_param_*`, `streaming`), served by the model.py of the container.
"""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_dflash.deploy.settings import DFLASH_INPUTS, DFLASH_OUTPUTS, Tensor
from trtllm_dflash.recipe import Recipe

# The LLM-API model of TensorRT-LLM >= 1.3, as upstream declares it
# (triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt; the multimodal `image_url` and
# the LoRA inputs are left out: a DFlash deployment serves text with one adapter-free model).
# A table like DFLASH_INPUTS (deploy/settings.py) by design: two request interfaces, each listed once.
LLMAPI_INPUTS = (
    Tensor("text_input", mc.TYPE_STRING, (-1,)),
    Tensor("streaming", mc.TYPE_BOOL, optional=True),
    Tensor("sampling_param_best_of", mc.TYPE_INT32, optional=True),
    Tensor("sampling_param_temperature", mc.TYPE_FP32, optional=True),
    Tensor("sampling_param_top_k", mc.TYPE_INT32, optional=True),
    Tensor("sampling_param_top_p", mc.TYPE_FP32, optional=True),
    Tensor("sampling_param_frequency_penalty", mc.TYPE_FP32, optional=True),
    Tensor("sampling_param_presence_penalty", mc.TYPE_FP32, optional=True),
    Tensor("sampling_param_max_tokens", mc.TYPE_INT32, optional=True),
    Tensor("sampling_param_stop", mc.TYPE_STRING, (-1,), optional=True),
    Tensor("sampling_param_seed", mc.TYPE_UINT64, optional=True),
    Tensor("sampling_param_exclude_input_from_output", mc.TYPE_BOOL, optional=True),
    Tensor("sampling_param_return_perf_metrics", mc.TYPE_BOOL, optional=True),
    Tensor("return_finish_reason", mc.TYPE_BOOL, optional=True),
    Tensor("return_stop_reason", mc.TYPE_BOOL, optional=True),
    Tensor("return_cumulative_logprob", mc.TYPE_BOOL, optional=True),
    Tensor("stop", mc.TYPE_BOOL, optional=True),
)
# Everything upstream's model.py `_create_response` can send: text_output always; the reasons
# and logprob when the request asks (return_*); the KV-cache, timing and speculative-decoding
# metrics when the request sets sampling_param_return_perf_metrics and the LLM has
# return_perf_metrics (model.yaml). Types and dims as upstream's config.pbtxt declares them.
LLMAPI_OUTPUTS = (
    Tensor("text_output", mc.TYPE_STRING, (-1,)),
    Tensor("finish_reason", mc.TYPE_STRING, (-1,)),
    Tensor("stop_reason", mc.TYPE_STRING, (-1,)),
    Tensor("cumulative_logprob", mc.TYPE_FP32, (-1,)),
    Tensor("kv_cache_reused_block", mc.TYPE_INT32, (-1,)),
    Tensor("kv_cache_missed_block", mc.TYPE_INT32, (-1,)),
    Tensor("kv_cache_alloc_new_blocks", mc.TYPE_INT32, (-1,)),
    Tensor("kv_cache_alloc_total_blocks", mc.TYPE_INT32, (-1,)),
    Tensor("kv_cache_hit_rate", mc.TYPE_FP32, (-1,)),
    Tensor("arrival_time_ns", mc.TYPE_INT64),
    Tensor("first_scheduled_time_ns", mc.TYPE_INT64),
    Tensor("first_token_time_ns", mc.TYPE_INT64),
    Tensor("last_token_time_ns", mc.TYPE_INT64),
    Tensor("acceptance_rate", mc.TYPE_FP32),
    Tensor("total_accepted_draft_tokens", mc.TYPE_INT32),
    Tensor("total_draft_tokens", mc.TYPE_INT32),
)


def _model_config(
    name: str,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    *,
    instances: int,
    decoupled: bool,
    parameters: dict[str, str],
    max_batch_size: int = 0,
) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    for t in inputs:
        cfg.input.add(name=t.name, data_type=t.dtype, dims=list(t.dims), optional=t.optional)
    for t in outputs:
        cfg.output.add(name=t.name, data_type=t.dtype, dims=list(t.dims))
    # Python-backend models run on the CPU side; the engine inside picks its GPUs.
    cfg.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    # Written even when false: our servers run with --disable-auto-complete-config, so nothing
    # else would set it (upstream's LLM-API model sets it in auto_complete_config from model.yaml).
    cfg.model_transaction_policy.decoupled = decoupled
    for key, value in sorted(parameters.items()):
        cfg.parameters[key].string_value = value
    return cfg


def dflash_model_config(recipe: Recipe, parameters: dict[str, str]) -> mc.ModelConfig:
    """The public `dflash` model (reference and engine backends)."""
    return _model_config(
        recipe.serve.model_name,
        DFLASH_INPUTS,
        DFLASH_OUTPUTS,
        instances=recipe.serve.instances,
        decoupled=recipe.serve.decoupled,
        parameters=parameters,
    )


def llmapi_model_config(recipe: Recipe) -> mc.ModelConfig:
    """The LLM-API model for the pytorch backend. Upstream's model.py would fill max_batch_size
    and the transaction policy in `auto_complete_config` from model.yaml's triton_config; the
    launch line disables auto-complete, so both are written here, equal to model.yaml's."""
    return _model_config(
        recipe.serve.model_name, LLMAPI_INPUTS, LLMAPI_OUTPUTS, instances=1, decoupled=recipe.serve.decoupled,
        parameters={},
    )


def render(cfg: mc.ModelConfig, header: str) -> str:
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + text_format.MessageToString(cfg)
