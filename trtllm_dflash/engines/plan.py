"""The build plan: per engine, the `build_config.json`, the stock `trtllm-build` command, the
plugins and the I/O tensors, all derived from the recipe (pure functions, no TensorRT).
build_config.py gives each engine's build_config.json and plugins, interfaces.py its I/O tensors;
this module puts them together with the commands (make_plan) and prints them (render).

Two engines (design C, docs/design/engine-path.md):

target   `DFlashQwen3Target` / `DFlashLlamaTarget` (engines/trtllm_models.py): the stock
         `QWenForCausalLM` / `LLaMAForCausalLM` with the DFlash tap. No speculative decoding
         mode: each verify round is a context request (committed tokens + drafts as prompt
         tokens, max_tokens=1) served by the C++ Executor, with KV block reuse where the engine
         has paged context FMHA (recipe/plan/engine_layout.py: not for fp32, nor for bf16 / fp16
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
resolve them to (recipe/plan/engine_layout.py target_attention), so the file says what the engine
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
rule (recipe/plan/drafter.py drafter_placement, docs/engine-tp.md): one engine for rank 0's GPU
(rank0), or one per rank like the target (split, with the NCCL plugin and the all-reduce
workspace input).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_dflash.artifacts import relative_to
from trtllm_dflash.engines.build_config import (
    Role,
    build_config,
    engine_attention,
    engine_plugins,
    engine_world,
    kv_dtype,
)
from trtllm_dflash.engines.interfaces import Tensor, drafter_io, target_io
from trtllm_dflash.engines.upstream import CONTAINER, KV_CACHE_TYPES, TRTLLM_BUILD
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats import engine_io
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.plan.engine_layout import kv_block_reuse, max_draft_len, verify_cost
from trtllm_dflash.recipe.stages import input_stage
from trtllm_dflash.recipe.support import ARCHITECTURES, DRAFTER_ENGINE_CLASS, backends_for
from trtllm_dflash.recipe.support import backend as backend_spec

ROLES: tuple[Role, ...] = ("target", "drafter")

# What the TensorRT side still needs before a DFlash2 drafter (z-lab's DFlash2DraftModel) builds
# and serves on the engine backend; convert refuses such recipes for backend engine until then.
# The torch network (runtime/networks.py over ops_torch.TorchOps) already runs it, checked against
# the reference drafter (tests/runtime/test_networks.py), and convert/quantize carry its tensors.
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

FROM_PLACEHOLDER = "FROM_DIR"  # --checkpoint_dir when the plan is made without --from


@dataclass
class EnginePlan:
    role: Role
    model_cls: str
    checkpoint_dir: str
    build_config_path: str
    output_dir: str
    build_config: dict
    kv_cache_dtype: str
    attention: dict  # the resolved attention flags and why (recipe/plan/engine_layout.py)
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
    at = recipe.field_at  # where each field was written (its YAML line and column, or the --set)
    backend = recipe.backend.name
    if not backend_spec(backend).builds_engines:
        raise UserError(f"{at('backend.name')} is {backend!r}: `build` compiles TensorRT-LLM 1.2.x engines for the "
                        f"engine backend only; the {backend} backend has no build stage (deploy takes its "
                        f"{input_stage(recipe, 'deploy')} output)")
    t, d = recipe.target_facts, recipe.drafter_facts
    if t.family not in TARGET_CLASSES or t.is_moe:
        what = f"MoE ({t.num_experts} experts)" if t.is_moe else t.family
        raise UserError(f"{at('target.arch')}: {what} targets are not on the engine path (TensorRT-LLM 1.2.x engines "
                        f"here: dense {', '.join(sorted(TARGET_CLASSES))}); use backend "
                        f"{' or '.join(b for b in backends_for(t.family) if b != backend) or 'reference'}")
    draft = max_draft_len(recipe)
    trained = d.block_size
    if trained is not None and draft + 1 > trained:
        bands = recipe.speculative.bands
        field_name = (f"speculative.draft_len.{max(range(len(bands)), key=lambda i: bands[i].draft_len)}.draft_len"
                      if bands else "speculative.block_size")
        raise UserError(f"{at(field_name)}: max_draft_len {draft} needs a block of {draft + 1}, but the drafter "
                        f"was trained with block_size {trained}; allowed: max_draft_len <= {trained - 1}")


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
        dims, inputs, outputs = (target_io if role == "target" else drafter_io)(recipe, cfg, block)
        cls = TARGET_CLASSES[recipe.target_facts.family] if role == "target" else DRAFTER_CLASS
        paths = (f"{src}/{role}", f"{role}/build_config.json", f"{role}/engines")
        n = engine_world(recipe, role)
        command = _command(paths[0], paths[1], cls, paths[2], n)
        mpi = ["mpirun", "-n", str(n), "--allow-run-as-root", *_command(paths[0], paths[1], cls, paths[2], 1)] \
            if n > 1 else None
        ranges = (engine_io.drafter_dim_ranges(cfg["max_batch_size"], cfg["max_input_len"], cfg["max_seq_len"], block)
                  if role == "drafter" else {})
        engines.append(EnginePlan(role, cls, paths[0], paths[1], paths[2], cfg, kv_dtype(recipe, role),
                                  engine_attention(recipe, role), engine_plugins(recipe, role, cfg), dims, inputs,
                                  outputs, command, mpi, ranges))
    inp = input_stage(recipe, "build")
    launch = {
        "build": ("one process: trtllm-build builds rank0 on one GPU" if ws == 1 else
                  f"one process: trtllm-build --workers {ws} builds the target's rank0..rank{ws - 1} (a spawn pool, "
                  f"one GPU each), the drafter's {'rank0 alone' if placement.tp == 1 else 'per rank the same way'}"
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
        f"the target's KV cache dtype ({kv_dtype(recipe, 'target')}) comes from the checkpoint's "
        "quantization.kv_cache_quant_algo, not from build_config.json",
        "target max_input_len = max_seq_len - 1: a verify round is a context request of the whole sequence; "
        f"prompts stay limited to build.max_input_len = {recipe.build.max_input_len} by the server",
        _reuse_note(recipe),
    ]
    return BuildPlan(
        recipe=recipe.name, trtllm_version=recipe.backend.trtllm_version
        or backend_spec(recipe.backend.name).default_trtllm_version,
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
             f"{plan.world_size} (tp {plan.tp} x pp {plan.pp}), max_draft_len {plan.max_draft_len} (block "
             f"{plan.block})",
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
