"""What TensorRT-LLM 1.2.x accepts, as data: the `BuildConfig` and `PluginConfig` field names,
the `SpeculativeDecodingMode` values, the `trtllm-build` flags we emit, and the container.

Read (never copied) from NVIDIA/TensorRT-LLM, the engine-path files of the 1.2 line:

- `tensorrt_llm/builder.py`: `BuildConfig` (its fields, `from_dict`, `from_json_file`,
  `update_kv_cache_type`, `to_dict`) and `build()` (how each field is used);
- `tensorrt_llm/plugin/plugin.py`: `PluginConfig` (a pydantic model since PR #8277,
  `extra="ignore"`, "auto" plugin dtypes resolved to `PluginConfig.dtype`);
- `tensorrt_llm/commands/build.py`: `parse_arguments` (`--checkpoint_dir`, `--build_config`,
  `--model_cls_file`, `--model_cls_name`, `--output_dir`, `--workers`), `main` (a
  `--build_config` file replaces every build flag: `BuildConfig.from_json_file(path,
  plugin_config=PluginConfig.from_arguments(args))`), `parallel_build` (`--workers` or mpirun);
- `tensorrt_llm/models/modeling_utils.py`: `SpeculativeDecodingMode` (an `IntFlag`, NONE = 1).

Which commit: no full 1.2.x tree could be fetched here (the upstream snapshot is over the size
limit and the PyPI `tensorrt-llm` 1.2.1 entry is a 10 kB stub). The stored copies read were:
`builder.py` from the October 2025 main line after the auto-parallel removal (no
`auto_parallel_config`; `PluginConfig` already pydantic) -- the commit just before PR #8330
("Migrate BuildConfig to Pydantic, add a Python wrapper for KVCacheType enum"), which landed on
main before `release/1.2` branched (tensorrtllm_backend `9e828d3` pins `release/1.2@36e34eef`);
`plugin.py` from the same line after PR #8277. PR #8330 turned the dataclass into a pydantic
model with the same field names [I: read in the PR's review threads, not line by line], so
a build_config.json holding only the names below is read identically by `from_dict` in both
forms: the dataclass ignores unknown keys, a strict pydantic model would reject them. Version
caveat (docs/design/engine-path.md): re-check both lists against the 1.2.1 wheel on the first GPU
machine (`tests/build` prints the check: `BuildConfig.from_dict(json.load(f))` round-trips).

What `BuildConfig.from_dict` reads without a default differs between the stored copies of
builder.py (FROM_DICT_REQUIRED below). How build() resolves the attention flags and the runtime
limits that follow (recipe/plan/engine_layout.py) are read from the same files and the 1.2 line's C++.
"""

from __future__ import annotations

from trtllm_dflash.recipe.containers import TRITON_TRTLLM_1_2
from trtllm_dflash.recipe.images import lookup

# tensorrt_llm/builder.py :: BuildConfig -- every field, in declaration order.
BUILD_CONFIG_FIELDS: tuple[str, ...] = (
    "max_input_len",
    "max_seq_len",
    "opt_batch_size",
    "max_batch_size",
    "max_beam_width",
    "max_num_tokens",
    "opt_num_tokens",
    "max_prompt_embedding_table_size",
    "kv_cache_type",
    "gather_context_logits",
    "gather_generation_logits",
    "strongly_typed",
    "force_num_profiles",
    "profiling_verbosity",
    "enable_debug_output",
    "max_draft_len",
    "speculative_decoding_mode",
    "use_refit",
    "input_timing_cache",
    "output_timing_cache",
    "lora_config",
    "weight_sparsity",
    "weight_streaming",
    "plugin_config",
    "use_strip_plan",
    "max_encoder_input_len",
    "dry_run",
    "visualize_network",
    "monitor_memory",
    "use_mrope",
)

# tensorrt_llm/plugin/plugin.py :: PluginConfig -- every field, in declaration order.
PLUGIN_CONFIG_FIELDS: tuple[str, ...] = (
    "dtype",
    # plugins (a dtype, "auto" = PluginConfig.dtype = the model dtype, or None = off)
    "bert_attention_plugin",
    "gpt_attention_plugin",
    "gemm_plugin",
    "gemm_swiglu_plugin",
    "fp8_rowwise_gemm_plugin",
    "qserve_gemm_plugin",
    "identity_plugin",
    "nccl_plugin",
    "lora_plugin",
    "dora_plugin",
    "weight_only_groupwise_quant_matmul_plugin",
    "weight_only_quant_matmul_plugin",
    "smooth_quant_plugins",
    "smooth_quant_gemm_plugin",
    "layernorm_quantization_plugin",
    "rmsnorm_quantization_plugin",
    "quantize_per_token_plugin",
    "quantize_tensor_plugin",
    "moe_plugin",
    "mamba_conv1d_plugin",
    "low_latency_gemm_plugin",
    "low_latency_gemm_swiglu_plugin",
    "gemm_allreduce_plugin",
    # features (booleans, and tokens_per_block)
    "context_fmha",
    "bert_context_fmha_fp32_acc",
    "paged_kv_cache",
    "remove_input_padding",
    "norm_quant_fusion",
    "reduce_fusion",
    "user_buffer",
    "tokens_per_block",
    "use_paged_context_fmha",
    "use_fp8_context_fmha",
    "fuse_fp4_quant",
    "multiple_profiles",
    "paged_state",
    "streamingllm",
    "manage_weights",
    "use_fused_mlp",
    "pp_reduce_scatter",
)

# tensorrt_llm/builder.py :: BuildConfig.from_dict -- the keys it pops WITHOUT a default, so a
# build_config.json lacking one fails with KeyError before anything is built. Read in the stored
# copies: NVIDIA/TensorRT-LLM@008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc (and the fork copy
# Ataraksia/TensorRT-LLM@419b007d7bad5e746865e29c1467cf807e5cd1fc): `config.pop('max_input_len')`
# ... `config.pop('opt_num_tokens')` with no default, and `kv_cache_type` popped without one
# whenever `plugin_config` is in the dict (`KVCacheType.from_string(config.pop('kv_cache_type'))
# if 'plugin_config' in config`). The newest stored copy (the October 2025 main line before PR
# #8330) defaults every key through `get_build_config_defaults()`; the 1.2.x tag itself could not
# be read here, so every build_config.json carries all of these: valid under either form.
FROM_DICT_REQUIRED: tuple[str, ...] = (
    "max_input_len",
    "max_seq_len",
    "max_batch_size",
    "max_beam_width",
    "max_num_tokens",
    "opt_num_tokens",
    "kv_cache_type",  # required because every build_config.json we write has a plugin_config
)

# Keys every build_config.json we write must set: what from_dict needs, plus our own contract
# (upstream defaults the rest, and its defaults -- max_batch_size 2048, max_seq_len from
# max_position_embeddings, output_timing_cache 'model.cache' in the working directory -- are not
# what a recipe asks for).
REQUIRED_BUILD_KEYS: tuple[str, ...] = FROM_DICT_REQUIRED + (
    "max_draft_len",
    "speculative_decoding_mode",
    "gather_context_logits",
    "strongly_typed",
    "input_timing_cache",
    "output_timing_cache",
    "plugin_config",
)
REQUIRED_PLUGIN_KEYS: tuple[str, ...] = (
    "dtype",
    "gpt_attention_plugin",
    "gemm_plugin",
    "nccl_plugin",
    "context_fmha",
    "paged_kv_cache",
    "remove_input_padding",
    "tokens_per_block",
    "use_paged_context_fmha",
    "use_fp8_context_fmha",
)

# tensorrt_llm/models/modeling_utils.py :: SpeculativeDecodingMode (IntFlag, auto() from 1);
# kept in sync upstream with cpp/tensorrt_llm/runtime/speculativeDecodingMode.h. An engine's
# config.json stores the integer.
SPECULATIVE_DECODING_MODE = {"NONE": 1, "DRAFT_TOKENS_EXTERNAL": 2, "MEDUSA": 4, "LOOKAHEAD_DECODING": 8,
                             "EXPLICIT_DRAFT_TOKENS": 16, "EAGLE": 32}

# tensorrt_llm KVCacheType (bindings enum, and its Python wrapper after PR #8330): BuildConfig.to_dict
# writes the member name.
KV_CACHE_TYPES = ("CONTINUOUS", "PAGED", "DISABLED")

# tensorrt_llm/commands/build.py :: parse_arguments -- the flags the stage passes.
TRTLLM_BUILD = "trtllm-build"
TRTLLM_BUILD_FLAGS = ("--checkpoint_dir", "--build_config", "--model_cls_file", "--model_cls_name", "--output_dir",
                      "--workers")

# Where the engine path runs: the image table's Triton image carrying 1.2.1 (recipe/images.py).
SUPPORTED_LINE = (1, 2)
CONTAINER_IMAGE = TRITON_TRTLLM_1_2  # on NGC; recipe/containers.py names every backend's image
_ROW = lookup(CONTAINER_IMAGE)
CONTAINER = (f"NVIDIA's Triton {_ROW.tag} container ({_ROW.ref}: TensorRT-LLM {_ROW.trtllm}, "
             f"TensorRT {_ROW.tensorrt})")

