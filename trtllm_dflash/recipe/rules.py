"""Recipe rules: cross-field checks that save a wasted GPU hour.

Formats the hardware supports, tp against every dimension it splits (recipe/plan/sharding.py),
drafter/target agreement, backend and version support, build limits, and the memory plan
fitting each rank's GPU (recipe/plan/planner.py).
`check` returns every violation (errors) and note (warnings) of a parsed recipe.
"""

from __future__ import annotations

from trtllm_dflash.recipe import images, trtllm_api
from trtllm_dflash.recipe.containers import backend_image
from trtllm_dflash.recipe.engine_rules import engine_issues
from trtllm_dflash.recipe.issues import Issue, Issues
from trtllm_dflash.recipe.models_root import stand_in_of
from trtllm_dflash.recipe.plan.placement import scale_out, span_problem
from trtllm_dflash.recipe.plan.planner import plan, smallest_tp
from trtllm_dflash.recipe.plan.sharding import model_dims, tp_message
from trtllm_dflash.recipe.schema import FLOAT_FORMATS, ModelSource, Recipe
from trtllm_dflash.recipe.support import (
    BACKENDS,
    DRAFTERS,
    NATIVE_ONLY,
    architectures_of,
    format_gap,
    trtllm_version_problem,
)
from trtllm_dflash.recipe.support import (
    backend as backend_spec,
)
from trtllm_dflash.recipe.trtllm_api import drafter_attention

# Derived from the support table (recipe/support.py), for the modules that ask by these names.
BACKEND_FAMILIES: dict[str, set[str]] = {b: set(architectures_of(b)) for b in BACKENDS}
DEFAULT_TRTLLM_VERSION = {n: b.default_trtllm_version for n, b in BACKENDS.items() if b.default_trtllm_version}
# TensorRT-LLM release lines whose DFlashDecodingConfig fields deploy knows (deploy/llmapi.py
# holds one field table per line, read from upstream; a version outside them is refused).
PYTORCH_TRTLLM_LINES = next(b.trtllm_lines for b in BACKENDS.values() if b.static_schedule)


# TensorRT-LLM's draft_len_schedule turns drafting off (0) above its largest key, and
# `max_concurrency` becomes such a schedule; so does a band of draft length 0. On the one-model
# path DFlash's drafter state (draft KV, context buffers) is then not refreshed, and once the
# batch shrinks and drafting resumes, acceptance silently collapses for the rest of every
# affected request: NVIDIA/TensorRT-LLM PR #16888 (open as of 2026-07), which floors scheduled
# lengths at min_runtime_draft_len = 1. What we generate already keeps that floor.
MIN_RUNTIME_DRAFT_LEN = 1


def pytorch_draft_len_schedule(recipe: Recipe) -> dict[int, int]:
    """The recipe's bands as TensorRT-LLM's draft_len_schedule ({largest batch size: draft length},
    upstream's get_draft_len_for_batch_size), never drafting 0: lengths floored at
    MIN_RUNTIME_DRAFT_LEN, and a last key at build.max_batch_size so no batch falls past it
    (PR #16888 above). Empty when the recipe has no bands (a static max_draft_len)."""
    spec = recipe.speculative
    schedule = {b.max_concurrency: max(spec.draft_len_at(b.max_concurrency), MIN_RUNTIME_DRAFT_LEN) for b in spec.bands}
    if schedule and max(schedule) < recipe.build.max_batch_size:
        schedule[recipe.build.max_batch_size] = MIN_RUNTIME_DRAFT_LEN
    return schedule


def _split_issues(recipe: Recipe) -> list[Issue]:
    """tp against every dimension it splits in both models (recipe/plan/sharding.py: one rule each)."""
    models, tp = model_dims(recipe), recipe.parallel.tp
    why = tp_message(models, tp, recipe.backend.name)
    if why:
        return [Issue("error", "parallel.tp", why)]
    return [Issue("warning", "parallel.tp", f"tp {tp} > {m.who} num_kv_heads {m.num_kv_heads}: each KV head is "
                  f"replicated on {tp // m.num_kv_heads} ranks") for m in models if tp > m.num_kv_heads]


def memory_issues(recipe: Recipe) -> list[Issue]:
    """The memory plan at the recipe's tp against its GPU; when it does not fit, one line with the
    per-rank need, the GPU's memory, the largest batch that fits and the smallest tp that does."""
    p, b, gpu = plan(recipe), recipe.build, recipe.gpu
    if p.fits:
        return []
    best = smallest_tp(recipe, gpu)
    pool = f" (KV pool: free_gpu_memory_fraction {p.kv_fraction})" if p.kv_fraction else ""
    field = "build.max_batch_size" if p.max_concurrency else "parallel.tp"
    return [Issue("error", field, f"{b.max_batch_size} sequences of {b.max_seq_len} tokens need {p.need_gib:.1f} GiB "
                  f"per rank at tp {p.tp}{pool}; {gpu.name} has {p.capacity_gib:.1f} GiB; largest that fits: "
                  f"{p.max_concurrency} at tp {p.tp}; smallest tp that fits on {gpu.name}: {best.describe()}")]


def check(recipe: Recipe, *, memory: bool = True) -> list[Issue]:
    """All rule violations (errors) and notes (warnings) of a loaded recipe; `memory=False` leaves
    out whether the memory plan fits (`plan` shows a plan that does not)."""
    issues: list[Issue] = []
    for rules in (_format_issues, _parallel_issues, _drafter_issues, _speculative_issues, _backend_issues,
                  _pytorch_issues, _limit_issues, engine_issues, _serving_issues):
        issues += rules(recipe)
    if memory and not any(i.level == "error" for i in issues):
        issues += memory_issues(recipe)
    return issues


def _format_issues(recipe: Recipe) -> list[Issue]:
    """Hardware and number formats."""
    out, gpu, q, t = Issues(), recipe.gpu, recipe.quantization, recipe.target_facts
    span = span_problem(recipe)
    if span is not None:
        out.err(*span)
    for field, fmt in q.formats.items():
        if not gpu.supports(fmt):
            why = " (NVFP4 needs Blackwell: b200 or b300)" if fmt == "nvfp4" else ""
            out.err(f"quantization.{field}",
                    f"{fmt} is not supported on {gpu.name}{why}; allowed: {', '.join(gpu.formats)}")
    if q.activations == "nvfp4" and q.target_weights != "nvfp4":
        out.err("quantization.activations", "nvfp4 activations need nvfp4 target_weights")
    if q.activations == "fp8" and q.target_weights not in ("fp8", "nvfp4"):
        out.err("quantization.activations", f"fp8 activations need fp8 or nvfp4 target_weights, got {q.target_weights}")
    # Only for a backend that serves the architecture at all (else _backend_issues says so, alone).
    served = t.family in architectures_of(recipe.backend.name)
    gap = format_gap(t.family, recipe.backend.name, q.target_weights) if served else ""
    if gap:  # a precision the support table does not list for this architecture and backend
        out.err("quantization.target_weights", gap)
    # quantize would re-export the target from dequantized weights
    elif q.target_weights in NATIVE_ONLY and q.quantizes:
        what = [f"{k} {getattr(q, k)}" for k in ("kv_cache", "drafter") if getattr(q, k) not in FLOAT_FORMATS]
        out.err("quantization.target_weights",
                f"{q.target_weights} serves the checkpoint's own weights as shipped, but "
                f"{' and '.join(what)} needs the quantize stage, which exports the whole target again; keep "
                f"{' and '.join(w.split()[0] for w in what)} bf16, or quantize the target (nvfp4 / fp8)")
    return out


def _parallel_issues(recipe: Recipe) -> list[Issue]:
    out, par = Issues(), recipe.parallel
    gpus = recipe.world_size * par.replicas
    if not recipe.gpu.is_cpu and gpus > recipe.hardware.count:
        what = f"tp*pp = {recipe.world_size}" + (f" x parallel.replicas {par.replicas} = {gpus}" if par.replicas > 1
                                                  else "")
        out.err("parallel.tp", f"{what} > hardware.count {recipe.hardware.count}")
    if recipe.gpu.is_cpu and par.replicas > 1:
        out.err("parallel.replicas", f"{par.replicas}: replicas are servers on GPUs of their own; a cpu recipe serves "
                "one copy from this machine")
    if par.pp != 1:
        out.err("parallel.pp", "pipeline parallelism is not supported with speculative decoding (use tp); allowed: 1")
    if par.drafter != "auto" and backend_spec(recipe.backend.name).drafter_placement != "rule":
        out.err("parallel.drafter", f"{par.drafter}: only the engine backend places its drafter; the "
                f"{recipe.backend.name} backend splits it like the target (remove it or set auto)")
    return out + _split_issues(recipe) + _scale_out_issues(recipe)


def _image_issues(recipe: Recipe) -> list[Issue]:
    """backend.image against the image table (recipe/images.py): an image that was never built or
    carries a TensorRT-LLM the backend does not run on is refused, naming what it carries."""
    out, b, spec = Issues(), recipe.backend, backend_spec(recipe.backend.name)
    if b.image is None:
        return out
    if not spec.trtllm_lines:
        out.err("backend.image", f"the {spec.name} backend runs on this machine, in no container; remove it")
        return out
    default = backend_image(spec.name, spec.serving_api, b.trtllm_version)
    why = images.refusal(b.image, lambda v: trtllm_version_problem(spec, v))
    found = images.lookup(b.image)
    if why:
        out.err("backend.image", f"{why}; use {images.REGISTRY}/{default}" if default else why)
    elif found is None:
        out.warn("backend.image", f"{b.image} is not in recipe/catalog/images.yaml, so what it carries is not known "
                 "here; `trtllm-dflash doctor` checks its TensorRT-LLM on the GPU box")
    elif b.trtllm_version and found.trtllm and found.trtllm != b.trtllm_version:
        out.err("backend.trtllm_version", f"{b.trtllm_version}, but backend.image {found.ref} carries TensorRT-LLM "
                f"{found.trtllm}")
    return out


def _llm_api_issues(recipe: Recipe) -> list[Issue]:
    """The pytorch backend: the fields its deployment writes against the TensorRT-LLM version's
    (recipe/trtllm_api.py), the drafter attention against the GPU, the fixes it lacks."""
    out, version = Issues(), recipe.backend.trtllm_version or DEFAULT_TRTLLM_VERSION[recipe.backend.name]
    attention = drafter_attention(recipe.backend.drafter_attention, recipe.gpu.is_blackwell)
    if attention == "TRTLLM" and not recipe.gpu.is_blackwell and not recipe.gpu.is_cpu:
        out.err("backend.drafter_attention", f"TRTLLM runs FlashInfer's trtllm-gen kernels, Blackwell only "
                f"(SM100 / SM103); {recipe.gpu.name} is sm {recipe.gpu.sm}: use VANILLA or FA4")
    if trtllm_api.parse(version) is None:
        return out
    known = trtllm_api.release_problem(version)
    if known:
        (out.err if known[0] == "error" else out.warn)("backend.trtllm_version", known[1])
    for name in trtllm_api.missing(version, trtllm_api.fields_needed(attention, recompute_tail(recipe, version))):
        out.err("backend.trtllm_version", trtllm_api.needs_message(version, name))
    for key, fix in trtllm_api.FIXES.items():
        if not trtllm_api.has(version, key, trtllm_api.FIXES):
            out.warn("backend.trtllm_version", f"{version} predates PR {fix.pr} ({fix.what}, TensorRT-LLM >= "
                     f"{fix.version})")
    return out


def recompute_tail(recipe: Recipe, version: str) -> bool:
    """Prefix-cache reuse keeps the drafter's context only where TensorRT-LLM recomputes a tail of
    the reused prompt (context_recompute_tail) and applies it: not for targets with sliding-window
    layers (deploy/llmapi.py)."""
    return (trtllm_api.has(version, "speculative_config.context_recompute_tail")
            and not recipe.target_facts.sliding_layers)


def _scale_out_issues(recipe: Recipe) -> list[Issue]:
    """Beyond one node: tp across NVLink domains where replicas would do, GPUs left idle."""
    gpu, par = recipe.gpu, recipe.parallel
    if gpu.is_cpu:
        return []
    out = []
    if par.tp > gpu.domain:
        fits = smallest_tp(recipe, gpu).tp
        if fits is not None and fits <= gpu.domain:
            out.append(Issue("warning", "parallel.tp", scale_out(recipe, fits)))
    used = recipe.world_size * par.replicas
    if recipe.hardware.count > used:
        out.append(Issue("warning", "hardware.count", f"{recipe.hardware.count} GPUs, {used} used (tp*pp "
                         f"{recipe.world_size} x parallel.replicas {par.replicas}); more replicas would use the rest"))
    return out


def _drafter_issues(recipe: Recipe) -> list[Issue]:
    """The drafter against its target."""
    out, t, d = Issues(), recipe.target_facts, recipe.drafter_facts
    if d.hidden_size != t.hidden_size:
        out.err("drafter", f"hidden_size {d.hidden_size} != target hidden_size {t.hidden_size}")
    if d.vocab_size != t.vocab_size:
        out.err("drafter", f"vocab_size {d.vocab_size} != target vocab_size {t.vocab_size}")
    bad_ids = [i for i in d.target_layer_ids or [] if not 0 <= i < t.num_layers]
    if bad_ids:
        out.err("drafter", f"target_layer_ids {bad_ids} outside the target's layers 0..{t.num_layers - 1}")
    if d.mask_token_id is not None and d.mask_token_id >= t.vocab_size:
        out.err("drafter", f"mask_token_id {d.mask_token_id} outside the target vocabulary (size {t.vocab_size})")
    if d.mask_token_id is None:
        out.warn("drafter",
                 "mask_token_id unknown in the catalog: read from the checkpoint's dflash_config at convert time")
    spec = backend_spec(recipe.backend.name)
    if spec.drafter_gap(d.variant):  # a support row that does not run (recipe/support.py support_rows)
        able = [n for n, b in BACKENDS.items() if d.variant in b.drafters]
        out.err("drafter",
                f"a {DRAFTERS[d.variant]} drafter on the {spec.name} backend: {spec.drafter_gap(d.variant)}; "
                f"the {', '.join(able)} backend runs it")
    return out


def _speculative_issues(recipe: Recipe) -> list[Issue]:
    out, spec, d = Issues(), recipe.speculative, recipe.drafter_facts
    if d.block_size is not None and spec.block_size > d.block_size:
        out.err("speculative.block_size",
                f"{spec.block_size} > {d.block_size}, the block size the drafter was trained with; allowed: "
                f"2..{d.block_size}")
    prev = 0
    for i, band in enumerate(spec.bands):
        if band.max_concurrency <= prev:
            out.err(f"speculative.draft_len.{i}.max_concurrency",
                    f"{band.max_concurrency} must be greater than the previous band's {prev}")
        if band.draft_len > spec.block_size - 1:
            out.err(f"speculative.draft_len.{i}.draft_len", f"{band.draft_len} > block_size-1 = {spec.block_size - 1}")
        prev = band.max_concurrency
    trees = [n for n, b in BACKENDS.items() if b.ddtree]
    if spec.ddtree_budget is not None and recipe.backend.name not in trees:
        out.err("speculative.ddtree_budget",
                f"DDTree runs only on the {', '.join(trees)} backend, not {recipe.backend.name}")
    return out


def _backend_issues(recipe: Recipe) -> list[Issue]:
    """Backend support, TensorRT-LLM versions, and what runs on CPU."""
    out, t, name, gpu = Issues(), recipe.target_facts, recipe.backend.name, recipe.gpu
    spec = backend_spec(name)
    if t.family not in BACKEND_FAMILIES[name]:
        ok = [k for k, fams in BACKEND_FAMILIES.items() if t.family in fams]
        out.err("backend", f"{name} does not support {t.family} targets; use one of: {', '.join(ok)}")
    version = recipe.backend.trtllm_version
    if not spec.trtllm_lines:
        if version is not None:
            out.err("backend.trtllm_version", f"the {name} backend does not use TensorRT-LLM; remove it")
        if recipe.quantization.activations not in ("bf16", "fp16", "fp32"):
            out.warn("quantization.activations",
                     f"the {name} backend emulates quantized weights; activations stay in high precision")
    elif version is not None:
        problem = trtllm_version_problem(spec, version)
        if problem:
            out.err("backend.trtllm_version", problem)
    out.extend(_image_issues(recipe))
    if spec.static_schedule:
        out.extend(_llm_api_issues(recipe))
    elif recipe.backend.drafter_attention != "auto":
        out.err("backend.drafter_attention", f"the {name} backend's drafter attention is ours, not TensorRT-LLM's "
                "DFlash attention_backend; remove it")
    if spec.needs_gpu and gpu.is_cpu:
        if spec.cpu_runs:  # e.g. the engine path's plan (build --dry-run), deploy and emulated serving
            out.warn("backend", f"{name} on cpu: {spec.cpu_runs}")
        else:
            cpu = [n for n, b in BACKENDS.items() if not b.needs_gpu]
            out.err("backend", f"{name} needs NVIDIA GPUs; hardware.gpu is cpu (use the {', '.join(cpu)} backend)")
    return out


def _pytorch_issues(recipe: Recipe) -> list[Issue]:
    """What TensorRT-LLM's native DFlash (the pytorch backend) can be given."""
    out, spec, backend = Issues(), recipe.speculative, backend_spec(recipe.backend.name)
    if backend.drafter_formats and recipe.quantization.drafter not in backend.drafter_formats:
        out.err("quantization.drafter", f"{recipe.quantization.drafter}: TensorRT-LLM's native DFlash loads only BF16 "
                "drafters (its fc is a plain nn.Linear and precompute_context_kv applies the raw qkv_proj weight: "
                f"modeling_dflash.py); allowed: {', '.join(backend.drafter_formats)}")
    if spec.auto and not backend.round_loop:
        loops = [n for n, b in BACKENDS.items() if b.round_loop]
        out.err("speculative.draft_len", "auto: TensorRT-LLM's native DFlash takes a static draft_len_schedule; 'auto' "
                f"runs on the {' and '.join(loops)} backends (our round loop); give bands instead")
    if not backend.static_schedule:
        return out
    # DecodingBaseConfig.validate_draft_len_schedule_and_sort: the smallest batch size maps to
    # max_draft_len and no length exceeds it, i.e. the first band has the longest draft.
    for i, band in enumerate(spec.bands[1:], start=1):
        if band.draft_len > spec.bands[0].draft_len:
            out.err(f"speculative.draft_len.{i}.draft_len", f"{band.draft_len} > the first band's "
                    f"{spec.bands[0].draft_len}: TensorRT-LLM's draft_len_schedule needs the lowest-concurrency "
                    "band to have the longest draft")
    off = [i for i, band in enumerate(spec.bands) if band.draft_len < MIN_RUNTIME_DRAFT_LEN]
    if off or (spec.bands and spec.bands[-1].max_concurrency < recipe.build.max_batch_size):
        where = f"speculative.draft_len.{off[0]}.draft_len" if off else "speculative.draft_len"
        out.warn(where, f"the pytorch backend never turns drafting off: TensorRT-LLM's DFlash then stops refreshing "
                 "its drafter state and acceptance collapses once drafting resumes (NVIDIA/TensorRT-LLM PR #16888); "
                 f"deployed schedule {pytorch_draft_len_schedule(recipe)} drafts at least {MIN_RUNTIME_DRAFT_LEN}")
    return out


def _limit_issues(recipe: Recipe) -> list[Issue]:
    """Build limits against the model and the sweep."""
    out, b, t, sw = Issues(), recipe.build, recipe.target_facts, recipe.sweep
    if b.max_input_len >= b.max_seq_len:
        out.err("build.max_input_len", f"{b.max_input_len} must be < max_seq_len {b.max_seq_len}")
    if t.max_position_embeddings and b.max_seq_len > t.max_position_embeddings:
        out.err("build.max_seq_len", f"{b.max_seq_len} > target max_position_embeddings {t.max_position_embeddings}")
    tokens_per_step = b.max_batch_size * recipe.speculative.block_size
    if b.max_num_tokens < tokens_per_step:
        out.err("build.max_num_tokens",
                f"{b.max_num_tokens} < max_batch_size x block_size = {tokens_per_step}: a full batch of verify blocks "
                "would not fit one step")
    if max(sw.concurrency) > b.max_batch_size:
        out.err("sweep.concurrency", f"level {max(sw.concurrency)} > build.max_batch_size {b.max_batch_size}")
    if sw.input_len + sw.max_output_len > b.max_seq_len:
        out.err("sweep.output_len", f"input_len + the longest output ({sw.max_output_len}: output_len, "
                f"output_len_range) = {sw.input_len + sw.max_output_len} > build.max_seq_len {b.max_seq_len}")
    return out


def _serving_issues(recipe: Recipe) -> list[Issue]:
    """Ports, and local sources that do not exist yet."""
    out = Issues()
    ports = [recipe.serve.http_port, recipe.serve.grpc_port, recipe.serve.metrics_port]
    if len(set(ports)) != 3:
        out.err("serve", f"http_port, grpc_port and metrics_port must differ, got {ports}")
    for who in ("target", "drafter"):
        src: ModelSource = getattr(recipe, who)
        if src.path is not None and not src.path.exists():
            out.warn(f"{who}.source", f"{src.source} does not exist yet; stages that load weights will need it")
        elif src.path is not None and stand_in_of(src.path):
            out.warn(f"{who}.source", f"{src.path} is a stand-in for {stand_in_of(src.path)} (tiny, random weights; "
                     "`trtllm-dflash models --stand-ins`): check, plan and project answer for the real model, "
                     "the stages run on the stand-in")
    return out
