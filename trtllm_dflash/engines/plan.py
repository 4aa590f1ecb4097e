"""The build plan: per engine, the `build_config.json`, the stock `trtllm-build` command, the
plugins and the I/O tensors, all derived from the recipe (pure functions, no TensorRT).

Two engines (design C, docs/design/engine-path.md):

target   `DFlashQwen3Target` / `DFlashLlamaTarget` (engines/trtllm_models.py): the stock
         `QWenForCausalLM` / `LLaMAForCausalLM` with the DFlash tap. No speculative decoding
         mode: each verify round is a context request (committed tokens + drafts as prompt
         tokens, max_tokens=1) served by the C++ Executor, with KV block reuse where the engine
         has paged context FMHA (recipe/engine_layout.py: not for fp32, nor for bf16 / fp16
         weights over an FP8 KV cache), so its engine needs `max_input_len` = `max_seq_len` - 1
         and `max_seq_len` = the recipe's plus one block of drafts. Extra outputs `dflash_ctx`,
         `dflash_tail`, `dflash_argmax`.
drafter  `DFlashDrafter`: our model class; its attention is the AOT TensorRT Python plugin
         `trtllm_dflash::kv_inject_attention` (plugins/kv_inject_attention/trt_plugin.py) over a
         context arena the runner owns; `max_draft_len` = block - 1 sizes its block.

`max_draft_len` is the largest draft length of the recipe (block_size - 1, or the largest
`speculative.draft_len` band); the block is max_draft_len + 1 rows (anchor + drafts).

The KV-cache dtype is not a BuildConfig field: TensorRT-LLM takes it from the checkpoint's
`quantization.kv_cache_quant_algo` (builder.py `build()`: FP8 KV forces `strongly_typed`); the
plan records what the recipe's `quantization.kv_cache` asks for, and the stage checks the
checkpoint says the same. The attention flags in build_config.json are the ones build() would
resolve them to (recipe/engine_layout.py target_attention), so the file says what the engine
gets; the plan says whether the Executor can then reuse KV blocks (`kv_block_reuse`).

Paths: every path in the plan, its commands and build_config.json is relative to the build
output directory, and the commands run there (`cd BUILD_DIR`), so a run directory moved as a
whole still holds a plan that builds: the checkpoints as `../convert/target` (the --from
directory relative to the output), `--model_cls_file trtllm_models.py` (the stage copies the
installed engines/trtllm_models.py beside plan.json: the classes the engines were built with),
`--output_dir target/engines`. TensorRT-LLM opens each of them relative to its working
directory (commands/build.py: SourceFileLoader, BuildConfig.from_json_file, os.makedirs).

The TensorRT timing cache: build() writes it to `output_timing_cache`, whose default
('model.cache') is relative, i.e. trtllm-build's working directory; with `--build_config` the
command-line flags are not read (commands/build.py main), so build_config.json names a file in
the engine's own directory, relative like the rest (`target/timing.cache`).

Tensor parallelism: one target engine per rank from the per-rank checkpoints
(`rank{r}.safetensors`) convert writes; `trtllm-build --workers N` or `mpirun -n N
trtllm-build` (commands/build.py `parallel_build`). The drafter engine follows the placement
rule (recipe/planner.py drafter_placement, docs/engine-tp.md): one engine for rank 0's GPU
(rank0), or one per rank like the target (split, with the NCCL plugin and the all-reduce
workspace input).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from trtllm_dflash.formats import engine_io
from trtllm_dflash.engines.upstream import (
    BUILD_CONFIG_FIELDS,
    CONTAINER,
    KV_CACHE_TYPES,
    PLUGIN_CONFIG_FIELDS,
    SPECULATIVE_DECODING_MODE,
    TRTLLM_BUILD,
)
from trtllm_dflash.artifacts import relative_to
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.engine_layout import (
    DTYPE_NAMES,
    default_opt_num_tokens,
    kv_block_reuse,
    max_draft_len,
    target_attention,
    target_seq_len,
    verify_cost,
)
from trtllm_dflash.recipe.planner import drafter_placement
from trtllm_dflash.recipe.support import ARCHITECTURES, DRAFTER_ENGINE_CLASS, backend as backend_spec, backends_for
from trtllm_dflash.recipe.stages import input_stage

Role = Literal["target", "drafter"]
ROLES: tuple[Role, ...] = ("target", "drafter")

# What the TensorRT side still needs before a DFlash2 drafter (z-lab's DFlash2DraftModel) builds
# and serves on the engine backend; convert refuses such recipes for backend engine until then.
# The torch network (runtime/networks.py over ops_torch.TorchOps) already runs it, checked against
# the reference drafter (tests/build/test_networks.py), and convert/quantize carry its tensors.
DFLASH2_ENGINE_NOTE = """\
DFlash2 (and the logit / embedding scalars of z-lab's later drafters) on the engine backend
(TensorRT-LLM 1.2.x drafter engine), still to do:
1. TrtllmOps (engines/ops_trtllm.py): scale, softcap (tanh), conv_prepare / conv_finish: a
   replicated linear (kernel_projection, 2*K*H/g outputs), a view to [B, T, 2, K, G], for tap o
   a slice of the block axis shifted by o with o zero rows in front (slice + concat), times
   (base_kernel[side, o] + the tap weight broadcast over the group's g channels), summed over
   the K taps; all in the drafter's dtype (never quantized).
2. select_path: topk(k) over the vocabulary of each slot's logits (TensorRT TopK, k <= 3840),
   then T-1 unrolled steps: gather the predecessor's codebook row (an embedding lookup by the
   previous step's token), times hidden_projection(h_j), dot with the k candidates' successor
   rows, plus the unary logits, argmax (TopK k=1), gather the chosen id. Under tp > 1 the
   logits are all-gathered first (lm_head is vocab-parallel), as for the argmax today.
3. Engine I/O: draft_ids = the selector's path instead of the per-slot argmax; for sampling,
   the selector samples each slot from softmax(scores / T) over its k candidates, so the
   engine needs a random input (or the runner samples from exported [B, T-1, k] scores and
   candidate ids step by step) and must return the q of each chosen slot for rejection
   sampling (PathDrafterRunner.draft_path's contract).
4. The engine runners (runtime/engine_runners.py, drafter_runner.py, trt_runners.py) expose
   selects_path / draft_path from those outputs; then lift the refusal in
   convert/sources.py check_drafter_backend for backend engine.
5. The KV-injection plugin limits sliding-window keys behind the query only: a non-causal
   sliding layer whose window is shorter than the block is not expressible (z-lab's DFlash2
   uses 2048 >= block 16, so it is not hit in practice)."""

# Model classes in engines/trtllm_models.py (trtllm-build --model_cls_name), from the support table.
TARGET_CLASSES = {m: a.engine_class for m, a in ARCHITECTURES.items() if a.engine_class}
DRAFTER_CLASS = DRAFTER_ENGINE_CLASS
MODELS_FILE = "trtllm_models.py"
# The checkpoint architectures convert writes (formats/weight_maps.py), which the classes load.
CHECKPOINT_ARCHITECTURES = {**{m: ARCHITECTURES[m].trtllm_architecture for m in TARGET_CLASSES},
                            "drafter": DRAFTER_ENGINE_CLASS}

TOKENS_PER_BLOCK = 32  # 32 or 64 serve the paged context FMHA; PluginConfig's default
FROM_PLACEHOLDER = "FROM_DIR"  # --checkpoint_dir when the plan is made without --from
TIMING_CACHE = "timing.cache"  # per engine, beside its build_config.json

@dataclass(frozen=True)
class Tensor:
    """One engine input or output. Shapes use the symbolic dims of EnginePlan.dims; a name with
    `{l}` stands for one tensor per drafter layer (l = 0 .. num_layers-1)."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]
    note: str = ""


@dataclass
class EnginePlan:
    role: Role
    model_cls: str
    checkpoint_dir: str
    build_config_path: str
    output_dir: str
    build_config: dict
    kv_cache_dtype: str
    attention: dict  # the resolved attention flags and why (recipe/engine_layout.py)
    plugins: list[dict]
    dims: dict[str, int]
    inputs: list[Tensor]
    outputs: list[Tensor]
    command: list[str]
    mpi_command: list[str] | None
    dim_ranges: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # the profile's (min, opt, max)


@dataclass
class BuildPlan:
    recipe: str
    trtllm_version: str
    container: str
    tp: int
    pp: int
    world_size: int
    max_draft_len: int
    block: int
    from_dir: str | None
    models_file: str
    engines: list[EnginePlan]
    drafter_parallelism: dict
    launch: dict
    kv_block_reuse: bool  # the target Executor reuses KV blocks across verify rounds
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def engine(self, role: Role) -> EnginePlan:
        return next(e for e in self.engines if e.role == role)


def models_file() -> Path:
    """engines/trtllm_models.py of the installed package (trtllm-build --model_cls_file)."""
    return Path(__file__).resolve().with_name(MODELS_FILE)


def check_buildable(recipe: Recipe) -> None:
    """The recipe problems that make an engine build impossible; one UserError line each.
    (load_recipe's rules catch most of them already; build checks again for recipes loaded
    without rules and to name the build-specific reason.)"""
    file = recipe.file or recipe.name
    backend = recipe.backend.name
    if not backend_spec(backend).builds_engines:
        raise UserError(f"{file}: backend.name is {backend!r}: `build` compiles TensorRT-LLM 1.2.x engines for the "
                        f"engine backend only; the {backend} backend has no build stage (deploy takes its "
                        f"{input_stage(recipe, 'deploy')} output)")
    t, d = recipe.target_facts, recipe.drafter_facts
    if t.family not in TARGET_CLASSES or t.is_moe:
        what = f"MoE ({t.num_experts} experts)" if t.is_moe else t.family
        raise UserError(f"{file}: target.arch: {what} targets are not on the engine path (TensorRT-LLM 1.2.x engines "
                        f"here: dense {', '.join(sorted(TARGET_CLASSES))}); use backend "
                        f"{' or '.join(b for b in backends_for(t.family) if b != backend) or 'reference'}")
    draft = max_draft_len(recipe)
    trained = d.block_size
    if trained is not None and draft + 1 > trained:
        bands = recipe.speculative.bands
        field_name = (f"speculative.draft_len.{max(range(len(bands)), key=lambda i: bands[i].draft_len)}.draft_len"
                      if bands else "speculative.block_size")
        raise UserError(f"{file}: {field_name}: max_draft_len {draft} needs a block of {draft + 1}, but the drafter "
                        f"was trained with block_size {trained}; allowed: max_draft_len <= {trained - 1}")


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


def _kv_dtype(recipe: Recipe, role: Role) -> str:
    q = recipe.quantization
    return "fp8" if q.kv_cache == "fp8" else DTYPE_NAMES[q.checkpoint_dtype(role)]


def _target_io(recipe: Recipe, cfg: dict, block: int) -> tuple[dict, list[Tensor], list[Tensor]]:
    """Inputs: the stock ones of GenerationMixin.prepare_basic_inputs (tensorrt_llm/models/
    generation_mixin.py) for gpt_attention_plugin + packed input + paged KV, fed by the Executor;
    outputs: logits plus the DFlash tap (docs/design/engine-path.md)."""
    t = recipe.target_facts
    act = DTYPE_NAMES[recipe.quantization.checkpoint_dtype("target")]
    layers = math.ceil(t.num_layers / recipe.parallel.pp)
    dims = {
        "num_tokens": cfg["max_num_tokens"], "num_seq": cfg["max_batch_size"], "max_seq_len": cfg["max_seq_len"],
        "max_blocks_per_seq": math.ceil(cfg["max_seq_len"] / TOKENS_PER_BLOCK), "num_layers": layers,
        "hidden": t.hidden_size, "vocab": t.vocab_size, "block": block,
    }
    stock = "stock (prepare_basic_inputs)"
    inputs = [
        Tensor("input_ids", "int32", ("num_tokens",), "packed tokens: context chunks, prompts + drafts of verify rounds"),
        Tensor("position_ids", "int32", ("num_tokens",), stock),
        Tensor("last_token_ids", "int32", ("num_seq",), "inclusive end offset of each sequence; the tail gather reads it"),
        Tensor("sequence_length", "int32", ("num_seq",), stock),
        Tensor("context_lengths", "int32", ("num_seq",), stock),
        Tensor("host_context_lengths", "int32", ("num_seq",), stock),
        Tensor("host_request_types", "int32", ("num_seq",), stock),
        Tensor("host_past_key_value_lengths", "int32", ("num_seq",), stock),
        Tensor("host_max_attention_window_sizes", "int32", ("num_layers",), stock),
        Tensor("host_sink_token_length", "int32", (1,), stock),
        Tensor("cache_indirection", "int32", ("num_seq", 1, "max_seq_len"), stock),
        Tensor("kv_cache_block_offsets", "int32", (1, "num_seq", 2, "max_blocks_per_seq"), stock),
        Tensor("host_kv_cache_block_offsets", "int32", (1, "num_seq", 2, "max_blocks_per_seq"), stock),
        Tensor("host_kv_cache_pool_pointers", "int64", (1, 2), stock),
        Tensor("host_kv_cache_pool_mapping", "int32", ("num_layers", 2), stock),
        Tensor("host_runtime_perf_knobs", "int64", (16,), stock),
        Tensor("host_context_progress", "int64", (1,), stock),
    ]
    if recipe.parallel.tp > 1:
        inputs.append(Tensor("all_reduce_workspace", "int64", ("all_reduce_size",), stock + ", tp > 1"))
    outputs = [
        Tensor("logits", "float32", ("num_seq", "vocab"), "last token of each sequence (stock; the AR baseline uses it)"),
        Tensor("dflash_ctx", act, ("num_tokens", "hidden"),
               "hidden_norm(fc(concat of target_layer_ids taps)); gatherContext=true, requested on the prefill round"),
        Tensor("dflash_tail", act, ("num_seq", "block", "hidden"),
               "dflash_ctx rows of each sequence's last `block` tokens (clamped at its start); gatherContext=false"),
        Tensor("dflash_logits", "float32", ("num_seq", "block", "vocab"),
               "logits of those rows (lm_head); gatherContext=false, requested by sampling decoders"),
        Tensor("dflash_argmax", "int32", ("num_seq", "block"), "greedy token after each of those rows (lm_head + top-1)"),
    ]
    return dims, inputs, outputs


def _drafter_io(recipe: Recipe, cfg: dict, block: int) -> tuple[dict, list[Tensor], list[Tensor]]:
    """The drafter engine's own interface (docs/design/engine-path.md, "Drafter engine"; in the
    shapes of runtime/networks.py `drafter_forward` and the plugin's contract: plugins/kv_inject_attention/
    README.md). engines/trtllm_models.py declares these in `prepare_inputs`; the TensorRT drafter
    runner feeds them."""
    d = recipe.drafter_facts
    tp = drafter_placement(recipe).tp
    act = DTYPE_NAMES[recipe.quantization.checkpoint_dtype("drafter")]
    kv = _kv_dtype(recipe, "drafter")
    ranges = engine_io.drafter_dim_ranges(cfg["max_batch_size"], cfg["max_input_len"], cfg["max_seq_len"], block)
    dims = {
        **{name: hi for name, (_, _, hi) in ranges.items() if name != "block"},
        "hidden": d.hidden_size, "kv_heads": max(1, d.num_kv_heads // tp), "head_dim": d.head_dim,
        "num_layers": d.num_layers, "block": block, "drafts": block - 1, "vocab": recipe.target_facts.vocab_size,
    }
    arena = "context arena of drafter layer {l}: rows < cache_lens valid; this step's rows are appended in place"
    present = ("the arena after this step's append (trtllm_dflash::kv_append): the runner binds it to the "
               "{kv}_cache_{l} buffer, so only the new rows are written")
    inputs = [
        Tensor("block_ids", "int32", ("batch", "block"), "[anchor = last accepted token, mask_token_id x drafts]"),
        Tensor("block_positions", "int32", ("batch", "block"), "cache_lens + new_ctx_lens + 0..block-1"),
        Tensor("ctx_rows", act, ("batch", "new_ctx", "hidden"), "new fused context rows (dflash_ctx / dflash_tail)"),
        Tensor("ctx_positions", "int32", ("batch", "new_ctx"), "absolute position of each new row (its RoPE)"),
        Tensor("new_ctx_lens", "int32", ("batch",), "valid new rows per sequence (the rest is padding)"),
        Tensor("cache_lens", "int32", ("batch",), "rows already in the arena before this step"),
        Tensor("k_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"), arena),
        Tensor("v_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"), arena),
    ]
    if tp > 1:
        inputs.append(Tensor("all_reduce_workspace", "int64", ("all_reduce_size",), "tp > 1 (prepare_basic_inputs' form)"))
    outputs = [
        Tensor("draft_ids", "int32", ("batch", "drafts"), "the target's lm_head + top-1 on the mask slots"),
        Tensor("draft_logits", act, ("batch", "drafts", "vocab"), "their logits (the DrafterRunner result)"),
        Tensor("present_k_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"), present.format(kv="k", l="{l}")),
        Tensor("present_v_cache_{l}", kv, ("batch", "max_seq_len", "kv_heads", "head_dim"), present.format(kv="v", l="{l}")),
    ]
    return dims, inputs, outputs


def _plugins(recipe: Recipe, role: Role, cfg: dict) -> list[dict]:
    """The plugins an engine is built with: TensorRT-LLM's own (cpp/tensorrt_llm/plugins, chosen by
    PluginConfig) and, in the drafter, our AOT TensorRT Python plugin."""
    from trtllm_dflash.plugins.kv_inject_attention.trt_plugin import (
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
                    "use": f"every drafter layer ({d.num_layers}): this step's context K/V rows into the layer's arena, "
                           "in place (outputs present_*_cache_{l} bound to the k_cache_{l} / v_cache_{l} buffers)"})
        out.append({"name": PLUGIN_ID, "from": "plugins/kv_inject_attention/trt_plugin.py", "kind": kind,
                    "inputs": list(INPUT_NAMES), "attributes": attrs, "use": use})
    if pc["gemm_plugin"]:
        what = "NVFP4 GEMMs" if pc["gemm_plugin"] == "nvfp4" else "unquantized GEMMs (lm_head; all GEMMs of a float model)"
        out.append({"name": "gemm_plugin", "from": "tensorrt_llm", "dtype": dtype(pc["gemm_plugin"]), "use": what})
    if pc["nccl_plugin"]:
        out.append({"name": "nccl_plugin", "from": "tensorrt_llm", "dtype": dtype(pc["nccl_plugin"]),
                    "use": f"all-reduce / all-gather across the {engine_world(recipe, role)} tensor-parallel ranks"})
    return out


def _attention(recipe: Recipe, role: Role) -> dict:
    """The engine's gpt_attention_plugin features as build() resolves them, and why."""
    if role == "drafter":
        return {"context_fmha": False, "paged_context_fmha": False, "fp8_context_fmha": False,
                "why": ["no gpt_attention_plugin: the drafter's attention is the KV-injection plugin over its arena"]}
    flags = target_attention(recipe)
    return {"context_fmha": flags.context_fmha, "paged_context_fmha": flags.paged_context_fmha,
            "fp8_context_fmha": flags.fp8_context_fmha, "why": list(flags.why)}


def _reuse_note(recipe: Recipe) -> str:
    """What a verify round costs the target (engine_layout.verify_cost: KV block reuse or not)."""
    return verify_cost(recipe).describe()


def _command(checkpoint: str, config: str, cls: str, output: str, workers: int) -> list[str]:
    """trtllm-build's command line, run in the build directory (every path relative to it)."""
    return [TRTLLM_BUILD, "--checkpoint_dir", checkpoint, "--build_config", config, "--model_cls_file",
            MODELS_FILE, "--model_cls_name", cls, "--output_dir", output, "--workers", str(workers)]


def make_plan(recipe: Recipe, from_dir: Path | None, out: Path) -> BuildPlan:
    """The whole plan for `recipe` built into `out`, its paths relative to `out`; `from_dir` None
    (a plan before any weights) puts FROM_DIR in the commands. Raises UserError for a recipe that
    cannot be built (check_buildable)."""
    check_buildable(recipe)
    src = relative_to(from_dir, out) if from_dir is not None else FROM_PLACEHOLDER
    draft = max_draft_len(recipe)
    block = draft + 1
    placement = drafter_placement(recipe)
    ws = recipe.world_size
    engines = []
    for role in ROLES:
        cfg = build_config(recipe, role)
        assert cfg["kv_cache_type"] in KV_CACHE_TYPES
        dims, inputs, outputs = (_target_io if role == "target" else _drafter_io)(recipe, cfg, block)
        cls = TARGET_CLASSES[recipe.target_facts.family] if role == "target" else DRAFTER_CLASS
        paths = (f"{src}/{role}", f"{role}/build_config.json", f"{role}/engines")
        n = engine_world(recipe, role)
        command = _command(paths[0], paths[1], cls, paths[2], n)
        mpi = ["mpirun", "-n", str(n), "--allow-run-as-root", *_command(paths[0], paths[1], cls, paths[2], 1)] \
            if n > 1 else None
        ranges = (engine_io.drafter_dim_ranges(cfg["max_batch_size"], cfg["max_input_len"], cfg["max_seq_len"], block)
                  if role == "drafter" else {})
        engines.append(EnginePlan(role, cls, paths[0], paths[1], paths[2], cfg, _kv_dtype(recipe, role),
                                  _attention(recipe, role), _plugins(recipe, role, cfg), dims, inputs, outputs,
                                  command, mpi, ranges))
    inp = input_stage(recipe, "build")
    launch = {
        "build": ("one process: trtllm-build builds rank0 on one GPU" if ws == 1 else
                  f"one process: trtllm-build --workers {ws} builds the target's rank0..rank{ws - 1} (a spawn pool, one "
                  f"GPU each), the drafter's {'rank0 alone' if placement.tp == 1 else 'per rank the same way'}"
                  + (f"; or under MPI: mpirun -n {ws} trtllm-build ... --workers 1 (each MPI rank builds its engine "
                     "ranks, commands/build.py parallel_build)" if ws > 1 else "")),
        "serve": ("tritonserver with the decoupled Python model `dflash` (serve/triton_model.py): it holds the target "
                  "Executor and the drafter runner"
                  + (f"; {ws} ranks under mpirun, one tritonserver each, the target Executor in leader mode "
                     "(ParallelConfig LEADER): rank 0 serves and runs the round loop, every rank runs its target shard"
                     + (" and its drafter shard" if placement.mode == "split" else ", the drafter runs on rank 0's GPU")
                     + " (docs/engine-tp.md)" if ws > 1 else "")),
    }
    notes = [
        f"FROM_DIR: the {inp} output of this recipe (trtllm-dflash {inp} RECIPE ... --out FROM_DIR)"
        if from_dir is None else f"checkpoints: the {inp} output {src}",
        "paths are relative to the build directory (plan.json's own): run the commands there",
        f"the target's KV cache dtype ({_kv_dtype(recipe, 'target')}) comes from the checkpoint's "
        "quantization.kv_cache_quant_algo, not from build_config.json",
        "target max_input_len = max_seq_len - 1: a verify round is a context request of the whole sequence; "
        f"prompts stay limited to build.max_input_len = {recipe.build.max_input_len} by the server",
        _reuse_note(recipe),
    ]
    return BuildPlan(
        recipe=recipe.name, trtllm_version=recipe.backend.trtllm_version or backend_spec(recipe.backend.name).default_trtllm_version,
        container=CONTAINER, tp=recipe.parallel.tp, pp=recipe.parallel.pp, world_size=ws, max_draft_len=draft,
        block=block, from_dir=None if from_dir is None else src, models_file=MODELS_FILE, engines=engines,
        drafter_parallelism=_drafter_parallelism(placement, recipe.parallel.tp),
        launch=launch, kv_block_reuse=kv_block_reuse(recipe), notes=notes,
    )


def _drafter_parallelism(placement, tp: int) -> dict:
    """plan.json's record of where the drafter runs (runtime/trt_runners.py reads `placement`)."""
    if tp == 1:
        mode = "tp1 (tp = 1)"
    elif placement.mode == "rank0":
        mode = "rank0: one engine, on rank 0's GPU"
    else:
        mode = f"split per rank ({placement.tp} engines)"
    return {**placement.to_json(), "placement": placement.mode, "mode": mode}


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def render(plan: BuildPlan, *, io: bool = True, where: Path | None = None) -> str:
    """The plan as the CLI prints it: per engine its command, plugins and (io=True) I/O tensors;
    `where`: the build directory the commands run in."""
    lines = [f"build plan: {plan.recipe} -> TensorRT-LLM {plan.trtllm_version} engines, world size "
             f"{plan.world_size} (tp {plan.tp} x pp {plan.pp}), max_draft_len {plan.max_draft_len} (block {plan.block})",
             f"commands run in {shlex.quote(str(where)) if where else 'the build directory'} (their paths are relative "
             "to it)"]
    for e in plan.engines:
        lines.append(f"{e.role}: {e.model_cls}, KV cache {e.kv_cache_dtype}")
        lines.append("  " + shlex.join(e.command))
        if e.mpi_command:
            lines.append("  or: " + shlex.join(e.mpi_command))
        for p in e.plugins:
            dtype = f" ({p['dtype']})" if "dtype" in p else ""
            lines.append(f"  plugin {p['name']}{dtype}: {p['use']}")
        lines.append(f"  timing cache: {e.build_config['output_timing_cache']}")
        if io:
            lines.append("  dims (largest values): " + ", ".join(f"{k}={v}" for k, v in e.dims.items()))
            for kind, tensors in (("in ", e.inputs), ("out", e.outputs)):
                for t in tensors:
                    lines.append(f"  {kind} {t.name} {t.dtype} {_shape(t.shape)}")
    lines.append(next(n for n in plan.notes if n.startswith("verify:")))
    lines.append(f"drafter engine: {plan.drafter_parallelism['mode']}")
    lines.append(f"launch: {plan.launch['build']}")
    return "\n".join(lines)
