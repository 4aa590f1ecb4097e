"""What the toolkit supports, in one place: backends, target architectures, drafter variants, and
the table of (target architecture, drafter, backend, GPU, precision) rows they give.

Everything that differs by backend or by architecture asks these tables (recipe rules, convert,
quantize, build, deploy, serve, sweep, the planner, the docs' support table and
`trtllm-dflash recipes --support`); nothing else compares a backend's or an architecture's name
(tests/recipe/test_support.py greps the package). Adding a target architecture is a row of
ARCHITECTURES; backends of the trtllm layout (reference, engine) also need its weight map
(formats/weight_maps.py WEIGHT_MAPS), and the engine backend its model class
(engines/trtllm_models.py); the pytorch backend's hf layout passes HF checkpoints through.
Every row support_rows() marks runnable goes through `run --until deploy` in
tests/test_support_rows.py; `check` refuses the others (recipe/rules.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trtllm_dflash.recipe import images
from trtllm_dflash.recipe.trtllm_api import PINNED

# The engine backend's image: the newest Triton image carrying TensorRT-LLM 1.2.1 (recipe/images.py).
_TRITON_121 = images.newest("triton-trtllm", "1.2.1")
_TRITON_121_TAGS = images.tags("triton-trtllm", "1.2.1")


@dataclass(frozen=True)
class Backend:
    """What one backend is and does."""

    name: str  # its key in BACKENDS
    what: str  # one line for the support table
    layout: Literal["trtllm", "hf"]  # what convert writes for it (and quantize quantizes)
    round_loop: bool  # our round loop decodes (per-request draft lengths, `draft_len: auto`)
    ddtree: bool  # decodes DDTree trees
    builds_engines: bool  # the build stage runs (trtllm-build)
    triton_model: Literal["dflash", "llmapi"]  # what deploy writes: our model, or TensorRT-LLM's LLM-API model
    default_runners: str | None  # ModelSettings.runners of a deployment (None: TensorRT-LLM's own model)
    needs_gpu: bool  # refuses hardware.gpu cpu (except `cpu_runs`)
    cpu_runs: str | None  # what runs of it on a CPU recipe, when anything does
    cpu_runners: str | None  # the runners that serve it on this machine (`run` sweeps them), when any do
    emulates_quantization: bool  # quantized weights are dequantized, activations stay high precision
    container: str  # where it runs, in words
    trtllm_lines: tuple[str, ...]  # the TensorRT-LLM release lines it runs on (() = none: it does not use it)
    trtllm_why: str  # why those lines
    default_trtllm_version: str | None
    kv_pool: bool  # TensorRT-LLM's KV pool (a fraction of free memory) holds the target's cache
    context_cache: Literal["recipe", "fp8-or-checkpoint", "bf16"]  # the drafter's context cache format
    drafter_head: bool  # the drafter carries its own embedding and LM head copy (the drafter engine)
    drafter_dummy_slot: bool  # TensorRT-LLM's DFlash arena has max_batch_size + 1 slots
    drafter_placement: Literal["rule", "split"]  # tp > 1: our placement rule, or split like the target
    drafter_formats: tuple[str, ...] | None  # drafter precisions it loads (None: any the GPU has)
    static_schedule: bool  # takes only a static draft_len_schedule (TensorRT-LLM's native DFlash)
    spans_nodes: bool  # one deployment may span several nodes
    dialect_models: bool  # deploy writes tensorrtllm_backend's ensemble / BLS / tensorrt_llm models too
    serving_api: Literal["triton", "openai"]  # how `run` serves and sweeps it
    image: str | None  # the container that serves it ({version}: TensorRT-LLM's; None: this machine, or none published)
    image_apis: tuple[str, ...]  # the APIs that image serves the backend through
    drafters: tuple[str, ...] = ("dflash", "dflash2", "laguna")  # the drafter variants (DRAFTERS) it runs
    drafter_gaps: tuple[tuple[str, str], ...] = ()  # (variant, why it does not run it yet) per missing variant
    tensorrt_lines: tuple[str, ...] = ()  # the TensorRT release lines its engines need (() = it builds none)

    def drafter_gap(self, variant: str) -> str:
        """Why this backend does not run drafter `variant` yet ('' when it does)."""
        return "" if variant in self.drafters else dict(self.drafter_gaps)[variant]


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("reference", "our PyTorch DFlash on CPU or any torch device: the oracle", "trtllm", round_loop=True,
            ddtree=True, builds_engines=False, triton_model="dflash", default_runners="reference", needs_gpu=False,
            cpu_runs="everything", cpu_runners="reference", emulates_quantization=True, container="this machine",
            trtllm_lines=(), trtllm_why="", default_trtllm_version=None, kv_pool=False, context_cache="recipe",
            drafter_head=False, drafter_placement="split", drafter_dummy_slot=False, drafter_formats=None,
            static_schedule=False, spans_nodes=False, dialect_models=True, serving_api="triton", image=None,
            image_apis=()),
    Backend("engine",
            f"TensorRT-LLM 1.2.x engines (trtllm-build) with our KV-injection plugin, Triton {_TRITON_121_TAGS}",
            "trtllm",
            round_loop=True, ddtree=False, builds_engines=True, triton_model="dflash", default_runners="tensorrt",
            needs_gpu=True,
            cpu_runs="build --dry-run only; served by the emulated engine runners (or --runners reference)",
            cpu_runners="emulated", emulates_quantization=False,
            container=f"Triton {_TRITON_121.tag} (TensorRT-LLM {_TRITON_121.trtllm}, TensorRT {_TRITON_121.tensorrt})",
            trtllm_lines=("1.2",), trtllm_why="the engine backend needs TensorRT-LLM 1.2.x (TensorRT 10.14), the last "
            "release with trtllm-build", default_trtllm_version="1.2.1", kv_pool=True,
            context_cache="fp8-or-checkpoint",
            drafter_head=True, drafter_placement="rule", drafter_dummy_slot=False, drafter_formats=None,
            static_schedule=False, spans_nodes=False, dialect_models=True, serving_api="triton",
            image=_TRITON_121.name, image_apis=("triton", "openai"),
            tensorrt_lines=("10.14",), drafters=("dflash",), drafter_gaps=(
                ("dflash2", "the TensorRT drafter engine has neither DFlash2's convolutions and selector nor the "
                 "logit scalars yet (engines/plan.py DFLASH2_ENGINE_NOTE)"),
                ("laguna", "the TensorRT drafter engine has no feature norms or head gates yet")),
            ),
    Backend("pytorch", "TensorRT-LLM >= 1.3's native DFlash (DFlashDecodingConfig), trtllm-serve or Triton", "hf",
            round_loop=False, ddtree=False, builds_engines=False, triton_model="llmapi", default_runners=None,
            needs_gpu=True, cpu_runs=None, cpu_runners=None, emulates_quantization=False,
            container="TensorRT-LLM >= 1.3", trtllm_lines=("1.3", "1.4"),
            trtllm_why="the pytorch backend needs TensorRT-LLM >= 1.3 (native DFlash)", default_trtllm_version=PINNED,
            kv_pool=True,
            context_cache="bf16", drafter_head=False, drafter_placement="split", drafter_dummy_slot=True,
            drafter_formats=("bf16",), static_schedule=True, spans_nodes=True, dialect_models=False,
            serving_api="openai", image="nvidia/tensorrt-llm/release:{version}", image_apis=("openai",),
            drafters=("dflash",), drafter_gaps=(
                ("dflash2", "TensorRT-LLM's DFlash has no DFlash2 or logit scalars (an open RFC only)"),
                ("laguna", "TensorRT-LLM >= 1.3.0rc20 runs Laguna drafters (DFlashLagunaForCausalLM, PR #15666); "
                 "the config we write for it is not checked against it yet")),
            ),
)}
BackendName = Literal[tuple(BACKENDS)]  # recipe backend.name: a backend is declared by its row above


def backend(name: str) -> Backend:
    return BACKENDS[name]


@dataclass(frozen=True)
class Architecture:
    """A target architecture (HF `model_type`)."""

    model_type: str
    backends: tuple[str, ...]  # the backends that serve it
    moe: bool  # mixture-of-experts MLP
    qk_norm: bool  # per-head q / k RMSNorm (Qwen3)
    trtllm_architecture: str | None  # TensorRT-LLM checkpoint `architecture` (trtllm layout); None: no weight map
    qwen_type: str | None  # TensorRT-LLM's `qwen_type` config key
    engine_class: str | None  # engines/trtllm_models.py class for trtllm-build --model_cls_name
    native_formats: tuple[str, ...] = ()  # weight formats its checkpoints ship in besides bf16 / fp16 / fp32


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("qwen3", ("reference", "engine", "pytorch"), moe=False, qk_norm=True,
                 trtllm_architecture="Qwen3ForCausalLM", qwen_type="qwen3", engine_class="DFlashQwen3Target"),
    Architecture("llama", ("reference", "engine", "pytorch"), moe=False, qk_norm=False,
                 trtllm_architecture="LlamaForCausalLM", qwen_type=None, engine_class="DFlashLlamaTarget"),
    Architecture("qwen3_moe", ("reference", "pytorch"), moe=True, qk_norm=True,
                 trtllm_architecture="Qwen3MoeForCausalLM", qwen_type="qwen3_moe", engine_class=None),
    Architecture("gpt_oss", ("pytorch",), moe=True, qk_norm=False, trtllm_architecture=None, qwen_type=None,
                 engine_class=None, native_formats=("mxfp4",)),
)}

# Drafter variants (z-lab checkpoints): DFlash, and DFlash2 (convolutions around each sublayer, a
# candidate selector; or a DFlash drafter with logit / embedding scalars, which only the reference
# model has too).
DRAFTERS = {"dflash": "DFlash (z-lab DFlashDraftModel)", "dflash2": "DFlash2, or DFlash with logit / embedding scalars",
            "laguna": "Laguna DFlash (poolside DFlashLagunaForCausalLM: feature norms, normed context, head gates)"}
# What marks a drafter's variant in its config.json (the reference reads the same: reference/config.py
# DraftConfig.variant). z-lab's DFlash2DraftModel sets all four DFLASH2_KEYS (in dflash_config, or at
# the top level); FEATURES_OFF is the value of each optional feature that means "off"; poolside's
# Laguna drafters name a Laguna class in `architectures` (TensorRT-LLM
# tensorrt_llm/_torch/models/modeling_dflash.py `_build_dflash_draft`, PR #15666).
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
FEATURES_OFF = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None,
                **dict.fromkeys(DFLASH2_KEYS)}
DFLASH2_ARCH = "DFlash2DraftModel"
LAGUNA_ARCH = "DFlashLagunaForCausalLM"  # written back with model_type "llama", as the published ones are


def drafter_variant(raw: dict) -> str:
    """The DRAFTERS variant a drafter config.json describes (what a backend must run)."""
    if any("Laguna" in a for a in raw.get("architectures") or []):
        return "laguna"
    dcfg = raw.get("dflash_config") or {}
    feature = lambda k: dcfg[k] if dcfg.get(k) is not None else raw.get(k, FEATURES_OFF[k])  # noqa: E731
    off = all(feature(k) == v or (k == "final_logit_softcapping" and not feature(k)) for k, v in FEATURES_OFF.items())
    return "dflash" if off and DFLASH2_ARCH not in (raw.get("architectures") or []) else "dflash2"


DRAFTER_ENGINE_CLASS = "DFlashDrafter"  # engines/trtllm_models.py, and the drafter's trtllm checkpoint architecture
# Weight formats only some architectures' checkpoints come in (Architecture.native_formats).
NATIVE_ONLY = ("mxfp4",)


def architecture(model_type: str) -> Architecture:
    return ARCHITECTURES[model_type]


def architectures_of(backend_name: str) -> tuple[str, ...]:
    """The target architectures (model types) backend `backend_name` serves."""
    return tuple(m for m, a in ARCHITECTURES.items() if backend_name in a.backends)


def backends_for(model_type: str) -> list[str]:
    """The backends that serve targets of `model_type`."""
    return list(ARCHITECTURES[model_type].backends)


def trtllm_line(version: str) -> str | None:
    """'1.3' for 1.3.0, 1.3.0rc27, 1.3.2 ...; None when the text is not a version."""
    head = version.split("rc")[0].split("+")[0].rstrip(".")
    try:
        vt = tuple(int(x) for x in head.split("."))
    except ValueError:
        return None
    return None if len(vt) < 2 else f"{vt[0]}.{vt[1]}"


def trtllm_version_problem(spec: Backend, version: str) -> str | None:
    """Why TensorRT-LLM `version` does not suit backend `spec` (None: it does)."""
    line = trtllm_line(version)
    if line is None:
        return f"{version!r} is not a version like 1.2.1"
    if line in spec.trtllm_lines:
        return None
    key = lambda text: tuple(int(x) for x in text.split("."))  # noqa: E731
    if len(spec.trtllm_lines) == 1 or key(line) < key(spec.trtllm_lines[0]):
        return f"{version}: {spec.trtllm_why}"
    # a newer line than those whose DFlashDecodingConfig fields deploy knows (deploy/llmapi.py)
    known = ", ".join(f"{x}.x" for x in spec.trtllm_lines)
    return f"{version}: no DFlashDecodingConfig field table for TensorRT-LLM {line}; known: {known}"


QUANTIZED = ("fp8", "nvfp4")  # target weight formats the quantize stage writes


def format_gap(model_type: str, backend_name: str, fmt: str) -> str:
    """Why target weights in `fmt` do not run for `model_type` on `backend_name` ('' when they do,
    GPU support aside: hardware.py)."""
    arch, spec = ARCHITECTURES[model_type], BACKENDS[backend_name]
    if fmt in NATIVE_ONLY and fmt not in arch.native_formats:
        return (f"{fmt} is only the native format of "
                f"{', '.join(m for m, a in ARCHITECTURES.items() if fmt in a.native_formats)} checkpoints")
    if fmt in QUANTIZED and arch.moe and spec.layout == "trtllm":  # quantize/transform.py QuantTransform.validate
        return (f"{fmt} MoE experts are not written in the TensorRT-LLM checkpoint layout the {backend_name} backend "
                f"loads; the {', '.join(n for n, b in BACKENDS.items() if b.layout == 'hf')} backend quantizes them "
                "(ModelOpt HF export)")
    return ""


@dataclass(frozen=True)
class SupportRow:
    """One (target architecture, drafter variant, backend) and where it runs: per GPU of the
    hardware catalog, the target weight precisions (empty: not on that GPU), or why nothing runs."""

    target: str
    drafter: str
    backend: str
    gpus: dict[str, tuple[str, ...]]
    why_not: str = ""  # why the combination does not run at all
    cpu_note: str = ""  # what of it runs on a cpu recipe, when that is not everything


def support_rows() -> list[SupportRow]:
    """Every (target architecture, drafter variant, backend), from the tables above and the
    hardware catalog's formats: what `recipes --support` prints and docs/support.md's table."""
    from trtllm_dflash.recipe.hardware import hardware_catalog

    gpus = hardware_catalog()
    rows = []
    for model_type, arch in ARCHITECTURES.items():
        for drafter in DRAFTERS:
            for name, spec in BACKENDS.items():
                why = ""
                if name not in arch.backends:
                    why = f"{name} serves {', '.join(architectures_of(name))} targets"
                elif drafter not in spec.drafters:
                    why = spec.drafter_gap(drafter)
                formats = {}
                for gpu_name, gpu in gpus.items() if not why else ():
                    if gpu.is_cpu and spec.needs_gpu and spec.cpu_runs is None:
                        continue
                    ok = [f for f in gpu.formats if not format_gap(model_type, name, f)]
                    formats[gpu_name] = tuple(ok)
                cpu = spec.cpu_runs if spec.needs_gpu and spec.cpu_runs and not why else ""
                rows.append(SupportRow(model_type, drafter, name, formats, why, cpu))
    return rows


def where_it_runs(row: SupportRow) -> str:
    """'h100-sxm, h200: bf16 fp16 fp8; b200, b300: ...' (GPUs with the same precisions together)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for gpu, formats in row.gpus.items():
        groups.setdefault(formats, []).append(gpu)
    return "; ".join(f"{', '.join(g)}: {' '.join(f)}" for f, g in groups.items()) or "-"


def support_markdown() -> str:
    """docs/support.md's table (tests/test_docs.py checks it is current)."""
    lines = ["| target | drafter | backend | GPUs: target weight precisions | notes |", "|---|---|---|---|---|"]
    for r in support_rows():
        lines.append(f"| {r.target} | {r.drafter} | {r.backend} | {where_it_runs(r)} | "
                     f"{r.why_not or (f'cpu: {r.cpu_note}' if r.cpu_note else '')} |")
    return "\n".join(lines) + "\n"
