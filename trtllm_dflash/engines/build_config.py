"""What each engine is built with: its build_config.json (TensorRT-LLM 1.2.x BuildConfig and
PluginConfig fields, in upstream's order), the plugins that gives it, the attention features
build() resolves, its KV cache dtype and the ranks it is built for. Pure functions of the recipe.
"""

from __future__ import annotations

from typing import Literal

from trtllm_dflash.engines.upstream import BUILD_CONFIG_FIELDS, PLUGIN_CONFIG_FIELDS, SPECULATIVE_DECODING_MODE
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.plan.engine_layout import (
    DTYPE_NAMES,
    default_opt_num_tokens,
    max_draft_len,
    target_attention,
    target_seq_len,
)

Role = Literal["target", "drafter"]

TOKENS_PER_BLOCK = 32  # 32 or 64 serve the paged context FMHA; PluginConfig's default
TIMING_CACHE = "timing.cache"  # per engine, beside its build_config.json


def engine_world(recipe: Recipe, role: Role) -> int:
    """The ranks an engine is built for: the target's world size; the drafter's placement tp."""
    return recipe.world_size if role == "target" else drafter_placement(recipe).tp * recipe.parallel.pp


def _plugin_config(recipe: Recipe, role: Role) -> dict:
    """PluginConfig values (upstream.PLUGIN_CONFIG_FIELDS); "auto" = the model dtype. The target's
    attention flags are what build() resolves them to (target_attention), not a wish it overrides."""
    q = recipe.quantization
    tp_nccl = "auto" if engine_world(recipe, role) > 1 else None
    weights = q.target_weights if role == "target" else q.drafter
    # builder.py build(): NVFP4 checkpoints get gemm_plugin "nvfp4" unless explicitly disabled; say so here.
    gemm = "nvfp4" if weights == "nvfp4" else "auto"
    if role == "target":
        flags = target_attention(recipe)
        return {
            "dtype": DTYPE_NAMES[q.checkpoint_dtype("target")],
            "gpt_attention_plugin": "auto",
            "gemm_plugin": gemm,
            "nccl_plugin": tp_nccl,
            "context_fmha": flags.context_fmha,
            "paged_kv_cache": True,
            "remove_input_padding": True,
            "tokens_per_block": TOKENS_PER_BLOCK,
            "use_paged_context_fmha": flags.paged_context_fmha,  # what KV block reuse across verify rounds needs
            "use_fp8_context_fmha": flags.fp8_context_fmha,
        }
    return {
        "dtype": DTYPE_NAMES[q.checkpoint_dtype("drafter")],
        "gpt_attention_plugin": None,  # the drafter's attention is trtllm_dflash::kv_inject_attention
        "gemm_plugin": gemm,
        "nccl_plugin": tp_nccl,
        "context_fmha": False,
        "paged_kv_cache": False,  # the context arena is the plugin's [batch, S_max, Hkv, D] layout
        "remove_input_padding": True,  # context rows are packed
        "tokens_per_block": TOKENS_PER_BLOCK,
        "use_paged_context_fmha": False,
        "use_fp8_context_fmha": False,
    }


def build_config(recipe: Recipe, role: Role) -> dict:
    """The build_config.json of one engine: TensorRT-LLM 1.2.x BuildConfig fields only, in
    upstream's declaration order."""
    cfg = _build_config(recipe, role)
    cfg["plugin_config"] = {k: cfg["plugin_config"][k] for k in PLUGIN_CONFIG_FIELDS if k in cfg["plugin_config"]}
    return {k: cfg[k] for k in BUILD_CONFIG_FIELDS if k in cfg}


def _build_config(recipe: Recipe, role: Role) -> dict:
    b = recipe.build
    common = {
        "max_batch_size": b.max_batch_size,
        "max_seq_len": target_seq_len(recipe),  # the last verify block may reach draft tokens past max_seq_len
        "max_num_tokens": b.max_num_tokens,
        # What check_max_num_tokens makes of an unset one, written out: older from_dict pops it without a default.
        "opt_num_tokens": default_opt_num_tokens(b.max_batch_size, 1, b.max_num_tokens),
        "max_beam_width": 1,
        "speculative_decoding_mode": SPECULATIVE_DECODING_MODE["NONE"],
        "gather_context_logits": False,
        "gather_generation_logits": False,
        "strongly_typed": True,
        "input_timing_cache": None,  # a fresh cache: create_builder_config only warns about a missing file
        "output_timing_cache": f"{role}/{TIMING_CACHE}",  # relative to the build directory, trtllm-build's cwd
    }
    if role == "target":
        return {
            **common,
            # A verify round is a context request of the whole sequence (max_tokens=1): the
            # Executor checks its length against its max input length (engine_layout.runtime_max_input_len).
            "max_input_len": common["max_seq_len"] - 1,
            "max_draft_len": 0,  # drafts are prompt tokens; no spec-decoding inputs in the engine
            "kv_cache_type": "PAGED",
            "plugin_config": _plugin_config(recipe, role),
        }
    return {
        **common,
        "max_input_len": b.max_input_len,  # the most context rows one sequence adds in a step (prefill)
        "max_draft_len": max_draft_len(recipe),  # block = max_draft_len + 1 rows: anchor + drafts
        "kv_cache_type": "CONTINUOUS",  # no TensorRT-LLM KV cache: the runner-owned arena is engine I/O
        "plugin_config": _plugin_config(recipe, role),
    }


def kv_dtype(recipe: Recipe, role: Role) -> str:
    q = recipe.quantization
    return "fp8" if q.kv_cache == "fp8" else DTYPE_NAMES[q.checkpoint_dtype(role)]


def engine_plugins(recipe: Recipe, role: Role, cfg: dict) -> list[dict]:
    """The plugins an engine is built with: TensorRT-LLM's own (cpp/tensorrt_llm/plugins, chosen by
    PluginConfig) and, in the drafter, our AOT TensorRT Python plugin."""
    from trtllm_dflash.plugins.kv_inject_attention.plugin_spec import (
        APPEND_INPUT_NAMES,
        APPEND_OUTPUT_NAMES,
        APPEND_PLUGIN_ID,
        INPUT_NAMES,
        PLUGIN_ID,
    )

    pc = cfg["plugin_config"]
    dtype = lambda v: pc["dtype"] if v == "auto" else v  # noqa: E731
    out: list[dict] = []
    if pc["gpt_attention_plugin"]:
        features = ["paged KV cache", "context FMHA" if pc["context_fmha"] else "unfused context attention"]
        if pc["use_paged_context_fmha"]:
            features.append("paged context FMHA (KV block reuse)")
        if pc["use_fp8_context_fmha"]:
            features.append("FP8 context FMHA")
        out.append({"name": "gpt_attention_plugin", "from": "tensorrt_llm", "dtype": dtype(pc["gpt_attention_plugin"]),
                    "use": "every decoder layer's attention: " + ", ".join(features)})
    if role == "drafter":
        d = recipe.drafter_facts
        sliding = d.sliding_layers
        attrs = {"scale": f"1/sqrt({d.head_dim})", "causal_block": False, "window": 0}
        use = f"the attention of every drafter layer ({d.num_layers}): block queries over the context arena + the block"
        if sliding:
            use += f" ({sliding} sliding layers: causal_block=true, window={d.sliding_window})"
        kind = ("TensorRT Python plugin (tensorrt.plugin), AOT: PTX compiled by triton at build time and embedded in "
                "the engine; no Python at inference")
        out.append({"name": APPEND_PLUGIN_ID, "from": "plugins/kv_inject_attention/trt_plugin.py", "kind": kind,
                    "inputs": list(APPEND_INPUT_NAMES), "outputs": list(APPEND_OUTPUT_NAMES), "attributes": {},
                    "use": f"every drafter layer ({d.num_layers}): this step's context K/V rows into the layer's "
                           "arena, in place (outputs present_*_cache_{l} bound to the k_cache_{l} / v_cache_{l} "
                           "buffers)"})
        out.append({"name": PLUGIN_ID, "from": "plugins/kv_inject_attention/trt_plugin.py", "kind": kind,
                    "inputs": list(INPUT_NAMES), "attributes": attrs, "use": use})
    if pc["gemm_plugin"]:
        what = ("NVFP4 GEMMs" if pc["gemm_plugin"] == "nvfp4"
                else "unquantized GEMMs (lm_head; all GEMMs of a float model)")
        out.append({"name": "gemm_plugin", "from": "tensorrt_llm", "dtype": dtype(pc["gemm_plugin"]), "use": what})
    if pc["nccl_plugin"]:
        out.append({"name": "nccl_plugin", "from": "tensorrt_llm", "dtype": dtype(pc["nccl_plugin"]),
                    "use": f"all-reduce / all-gather across the {engine_world(recipe, role)} tensor-parallel ranks"})
    return out


def engine_attention(recipe: Recipe, role: Role) -> dict:
    """The engine's gpt_attention_plugin features as build() resolves them, and why."""
    if role == "drafter":
        return {"context_fmha": False, "paged_context_fmha": False, "fp8_context_fmha": False,
                "why": ["no gpt_attention_plugin: the drafter's attention is the KV-injection plugin over its arena"]}
    flags = target_attention(recipe)
    return {"context_fmha": flags.context_fmha, "paged_context_fmha": flags.paged_context_fmha,
            "fp8_context_fmha": flags.fp8_context_fmha, "why": list(flags.why)}
