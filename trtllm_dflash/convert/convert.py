"""`convert`: an HF target and a z-lab DFlash drafter -> the checkpoint layout a backend loads.

Layouts (one output directory, written atomically, with a manifest of checksums):
  trtllm  TensorRT-LLM 1.2.x unified checkpoints for the engine backend (and the reference
          backend's tensor-parallel runs): `target/` and `drafter/`, each a `config.json`
          (architecture, dtype, mapping, quantization, ...) plus `rank{r}.safetensors` per TP
          rank with TensorRT-LLM names, fused QKV and column / row / vocab splits
          (formats/weight_maps.py); `tokenizer/` holds the target's tokenizer files. The drafter is
          split over recipe/planner.py drafter_placement(recipe).tp ranks: the target's tp, or
          1 where rank 0 holds the whole drafter (the target engine's tap then takes its rank's
          columns of the drafter's fc: formats/engine_io.py tap_weights).
  hf      the HF layout TensorRT-LLM >= 1.3 loads for the pytorch backend: `target/` (HF names,
          tokenizer files) and `drafter/` (z-lab names), the checkpoints passed through with no
          weight map: weight files linked unchanged, config.json in the recipe dtype
          (passthrough.py). TP happens at load time there. Quantized HF checkpoints come from
          ModelOpt's export in `quantize`.

Everything is validated before anything is written: the recipe (NVFP4 on Hopper is a recipe
rule), both configs and their pairing, every source tensor's presence and shape (from the
safetensors headers; for a target passed through, its embedding and LM head), tp against
heads / KV heads / FFN width / vocabulary (trtllm layout), and the output directory
(`artifacts.atomic_stage_dir` refuses one holding a different checkpoint).

Tensors stream: each rank's shard file is planned from the headers, then filled one tensor
at a time, reading only the rows / columns that rank needs. Finished shard files are kept in
a hidden resume directory next to the output (`.NAME.resume/`, never complete-looking: no
manifest); `--resume` skips the ones whose inputs and settings match, and the resume
directory goes away once the output directory is in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Protocol

import torch

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir, changed_source, sha256_file, source_record
from trtllm_dflash.convert import passthrough
from trtllm_dflash.convert.passthrough import link_or_copy
from trtllm_dflash.convert.safetensors_stream import CODE_DTYPES, Checkpoint, StreamWriter
from trtllm_dflash.formats.weight_maps import (
    DRAFTER_MAP,
    WEIGHT_MAPS,
    ArchMap,
    Entry,
    Heads,
    Read,
    combine,
    model_entries,
    plan_reads,
    planned_shape,
)
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.support import BACKENDS, architecture
from trtllm_dflash.recipe.planner import drafter_placement
from trtllm_dflash.recipe.sharding import ModelDims, tp_message
from trtllm_dflash.reference.config import DFLASH2_KEYS, FEATURES_OFF, LAGUNA_ARCH, read_json

Layout = Literal["trtllm", "hf"]
Role = Literal["target", "drafter"]
LAYOUTS: tuple[str, ...] = ("trtllm", "hf")
BACKEND_LAYOUT: dict[str, Layout] = {name: b.layout for name, b in BACKENDS.items()}
FORMAT_VERSION = 1
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor of one rank, before any transform (cast / quantization)."""

    name: str
    entry: Entry
    layer: int | None
    reads: list[list[Read]]
    shape: tuple[int, ...]
    source_dtype: torch.dtype
    group: tuple[str, ...]  # source modules whose scales this tensor shares (linear entries)
    experts: int = 0


@dataclass
class ModelPlan:
    role: Role
    arch_map: ArchMap
    tp: int
    heads: Heads
    ranks: list[list[PlannedTensor]]  # per rank, in file order
    num_layers: int


class Transform(Protocol):
    """What happens to each planned tensor on its way to the file (cast, or quantize)."""

    def validate(self, plan: ModelPlan) -> None: ...
    def dtype(self, role: Role) -> torch.dtype: ...
    def outputs(self, role: Role, t: PlannedTensor) -> list[tuple[str, tuple[int, ...], torch.dtype]]: ...
    def apply(self, role: Role, t: PlannedTensor, x: torch.Tensor) -> dict[str, torch.Tensor]: ...
    def extras(self, role: Role, layer: int, rank: int) -> dict[str, torch.Tensor]: ...
    def quantization(self, role: Role) -> dict: ...
    def describe(self) -> dict: ...


class Cast:
    """No quantization: every tensor in the model's dtype (or the entry's forced dtype)."""

    def __init__(self, dtypes: dict[str, torch.dtype]):
        self.dtypes = dtypes  # role -> dtype

    def validate(self, plan: ModelPlan) -> None:
        pass

    def dtype(self, role: Role) -> torch.dtype:
        return self.dtypes[role]

    def _dtype(self, role: Role, t: PlannedTensor) -> torch.dtype:
        return getattr(torch, t.entry.dtype) if t.entry.dtype else self.dtypes[role]

    def outputs(self, role, t):
        return [(t.name, t.shape, self._dtype(role, t))]

    def apply(self, role, t, x):
        return {t.name: x.to(self._dtype(role, t))}

    def extras(self, role, layer, rank):
        return {}

    def quantization(self, role):
        return {"quant_algo": None, "kv_cache_quant_algo": None}

    def describe(self):
        return {"transform": "cast", "dtypes": {k: DTYPE_NAMES[v] for k, v in self.dtypes.items()}}


def default_dtypes(recipe: Recipe) -> dict[str, torch.dtype]:
    """Unquantized tensors keep each model's checkpoint dtype (Quantization.checkpoint_dtype)."""
    q = recipe.quantization
    return {role: TORCH_DTYPES[q.checkpoint_dtype(role)] for role in ("target", "drafter")}


def _local_dir(src, field: str) -> Path:
    path = src.path
    if path is None:
        raise UserError(
            f"{field}.source: {src.source!r} is neither a local directory nor downloaded: "
            f"`huggingface-cli download {src.source} --local-dir MODELS/{src.source}`, then pass --models MODELS "
            f"(or set $TRTLLM_DFLASH_MODELS) to every stage, or set {field}.source to the directory"
        )
    if not (path / "config.json").is_file():
        raise UserError(f"{field}.source: {path} has no config.json")
    return path


def check_tp(tp: int, t, d, drafter_tp: int | None = None) -> None:
    """tp against every dimension it splits in the target, and drafter_tp (default tp; 1 when rank
    0 holds the whole drafter) in the drafter, read from their config.json (the recipe rules'
    definition: recipe/sharding.py, our converter's layout)."""
    target = ModelDims("target", t.num_heads, t.num_kv_heads,
                       t.intermediate_size if t.moe is None or not all(t.moe.sparse_layers) else 0, t.vocab_size,
                       num_experts=t.moe.num_experts if t.moe else 0,
                       moe_intermediate_size=t.moe.intermediate_size if t.moe else 0)
    # The drafter checkpoint holds its own copy of the target's embedding and LM head rows.
    drafter = ModelDims("drafter", d.num_heads, d.num_kv_heads, d.intermediate_size, t.vocab_size, fc_out=d.hidden_size)
    for models, n in (([target], tp), ([drafter], tp if drafter_tp is None else drafter_tp)):
        why = tp_message(models, n, "engine")
        if why:
            raise UserError(f"parallel.tp: {why}")


def _expected_shapes(role: Role, cfg) -> dict[str, tuple[int, ...]]:
    """Every source tensor and its shape, from the reference model built on the meta device."""
    from trtllm_dflash.reference.draft import DFlashDraft
    from trtllm_dflash.reference.target import Target

    with torch.device("meta"):
        model = Target(cfg) if role == "target" else DFlashDraft(cfg)
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if role == "drafter":
        return state
    out = {(k if k.startswith("lm_head.") else f"model.{k}"): s for k, s in state.items()}
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight")
    return out


def _check_sources(ckpt: Checkpoint, expected: dict[str, tuple[int, ...]], who: str) -> None:
    for name, shape in expected.items():
        info = ckpt.tensors.get(name)
        if info is None:
            raise UserError(f"{who} {ckpt.directory}: missing tensor {name} (expected shape {list(shape)})")
        if info.shape != shape:
            raise UserError(f"{who} {info.file.name}: tensor {name} has shape {list(info.shape)}, expected {list(shape)}")
        if info.dtype not in CODE_DTYPES or CODE_DTYPES[info.dtype] not in DTYPE_NAMES:
            raise UserError(f"{who} {info.file.name}: tensor {name} has dtype {info.dtype}; expected F32, BF16 or F16")


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _plan_model(
    role: Role,
    arch_map: ArchMap,
    cfg,
    tp: int,
    sources: dict[str, Checkpoint],
    tied_lm_head: bool,
) -> list[list[PlannedTensor]]:
    """Every rank's output tensors, in file order."""
    shapes = {n: i.shape for c in sources.values() for n, i in c.tensors.items()}
    dtypes = {n: CODE_DTYPES[i.dtype] for c in sources.values() for n, i in c.tensors.items()}
    heads = Heads(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    moe = getattr(cfg, "moe", None)
    entries = model_entries(arch_map, cfg, drafter=role == "drafter")
    ranks = []
    for rank in range(tp):
        planned = []
        for entry, layer in entries:
            if tied_lm_head and entry.src == ("lm_head.weight",):
                entry = dataclasses.replace(entry, src=("model.embed_tokens.weight",))
            experts = moe.num_experts if (moe is not None and entry.rule.startswith("experts_")) else 0
            reads = plan_reads(entry, layer, rank, tp, shapes, heads, experts)
            group: tuple[str, ...] = ()
            if entry.linear:
                members = [entry] if entry.share is None else [e for e, at in entries if at == layer and e.share == entry.share]
                group = tuple(_module(r.name) for m in members for piece in plan_reads(m, layer, 0, 1, shapes, heads, experts) for r in piece)
            planned.append(
                PlannedTensor(
                    name=entry.dst.replace("{}", str(layer)) if layer is not None else entry.dst,
                    entry=entry,
                    layer=layer,
                    reads=reads,
                    shape=planned_shape(entry, reads, shapes),
                    source_dtype=dtypes[reads[0][0].name],
                    group=group,
                    experts=experts,
                )
            )
        ranks.append(planned)
    return ranks


def _rope_config(rope) -> dict:
    out: dict = {"position_embedding_type": "rope_gpt_neox", "rotary_base": rope.theta, "rotary_scaling": None}
    if rope.scaling is not None:
        if rope.scaling[0] == "linear":
            out["rotary_scaling"] = {"type": "linear", "factor": rope.scaling[1]}
        else:
            _, factor, low, high, old = rope.scaling
            out["rotary_scaling"] = {
                "type": "llama3", "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": int(old),
            }
    return out


def _mapping(tp: int, moe: bool) -> dict:
    m = {"world_size": tp, "tp_size": tp, "pp_size": 1, "cp_size": 1}
    if moe:
        m.update(moe_tp_size=tp, moe_ep_size=1)
    return m


def target_config(cfg, raw: dict, arch_map: ArchMap, tp: int, dtype: torch.dtype, generation: dict | None) -> dict:
    """TensorRT-LLM 1.2.x PretrainedConfig fields of the target (plus our `hf_config`)."""
    out = {
        "architecture": arch_map.architecture,
        "dtype": DTYPE_NAMES[dtype],
        "logits_dtype": "float32",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_size": cfg.head_dim,
        "hidden_act": "silu",
        "intermediate_size": cfg.intermediate_size,
        "norm_epsilon": cfg.rms_norm_eps,
        **_rope_config(cfg.rope),
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attn_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "mapping": _mapping(tp, cfg.moe is not None),
    }
    qwen_type = architecture(cfg.arch).qwen_type
    if qwen_type is not None:
        out["qwen_type"] = qwen_type
    if cfg.moe is not None:
        out["moe_intermediate_size"] = cfg.moe.intermediate_size
        out["moe"] = {
            "num_experts": cfg.moe.num_experts,
            "top_k": cfg.moe.top_k,
            "normalization_mode": 1 if cfg.moe.norm_topk_prob else 0,  # RENORMALIZE : NONE
        }
        out["mlp_only_layers"] = [i for i, s in enumerate(cfg.moe.sparse_layers) if not s]
    out["hf_config"] = raw
    out["generation_config"] = generation
    return out


def drafter_config(dcfg, raw: dict, tcfg, tp: int, dtype: torch.dtype) -> dict:
    """Our drafter engine's config.json (TensorRT-LLM PretrainedConfig fields + DFlash keys)."""
    return {
        "architecture": DRAFTER_MAP.architecture,
        "dtype": DTYPE_NAMES[dtype],
        "logits_dtype": "float32",
        "vocab_size": tcfg.vocab_size,
        "max_position_embeddings": dcfg.max_position_embeddings,
        "hidden_size": dcfg.hidden_size,
        "num_hidden_layers": dcfg.num_layers,
        "num_attention_heads": dcfg.num_heads,
        "num_key_value_heads": dcfg.num_kv_heads,
        "head_size": dcfg.head_dim,
        "hidden_act": "silu",
        "intermediate_size": dcfg.intermediate_size,
        "norm_epsilon": dcfg.rms_norm_eps,
        **_rope_config(dcfg.rope),
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "attn_bias": dcfg.attention_bias,
        "mapping": _mapping(tp, False),
        "dflash": {
            "block_size": dcfg.block_size,
            "mask_token_id": dcfg.mask_token_id,
            "target_layer_ids": list(dcfg.target_layer_ids),
            "num_target_layers": dcfg.num_target_layers,
            "layer_types": list(dcfg.layer_types),
            "causal": list(dcfg.causal),
            "sliding_window": dcfg.sliding_window,
        },
        "hf_config": raw,
    }


# ----------------------------------------------------------------------------- the stage


@dataclass
class Sources:
    """Validated inputs of a conversion."""

    target_dir: Path
    drafter_dir: Path
    target_cfg: object
    drafter_cfg: object
    target_raw: dict
    drafter_raw: dict
    generation: dict | None
    target: Checkpoint
    drafter: Checkpoint

    def input_files(self) -> list[tuple[str, Path]]:
        files = [("target", p) for p in self.target.files] + [("drafter", p) for p in self.drafter.files]
        files += [("target", self.target_dir / "config.json"), ("drafter", self.drafter_dir / "config.json")]
        return files


def load_sources(recipe: Recipe, layout: Layout | None = None) -> Sources:
    """The recipe's local target and drafter directories, read and checked (read_sources) for
    `layout` (default: the recipe backend's)."""
    return read_sources(_local_dir(recipe.target, "target"), _local_dir(recipe.drafter, "drafter"),
                        layout or BACKEND_LAYOUT[recipe.backend.name])


def read_sources(tdir: Path, ddir: Path, layout: Layout = "trtllm") -> Sources:
    """Read and check both configs, their pairing and every tensor header. Reads no weights.
    The trtllm layout checks every target tensor against its weight map; the hf layout passes
    the target through (passthrough.py)."""
    from trtllm_dflash.reference.config import DraftConfig, TargetConfig
    from trtllm_dflash.reference.loading import check_pair

    traw, draw = read_json(tdir / "config.json"), read_json(ddir / "config.json")
    arch, where = traw.get("model_type"), f"target {tdir}/config.json"
    if layout == "trtllm" and arch not in WEIGHT_MAPS:
        raise UserError(
            f"{where}: model_type {arch!r} has no weight map for the trtllm layout; supported: "
            f"{', '.join(WEIGHT_MAPS)} (adding one is adding a map to formats/weight_maps.py)"
        )
    if layout == "hf" and arch not in passthrough.HF_ARCHS:
        raise UserError(f"{where}: model_type {arch!r} is not served from the hf layout; supported: "
                        f"{', '.join(passthrough.HF_ARCHS)} (recipe/support.py ARCHITECTURES)")
    tcfg = TargetConfig.from_dict(traw, where) if layout == "trtllm" else passthrough.HfTarget.from_dict(traw, where)
    dcfg = DraftConfig.from_dict(draw, f"drafter {ddir}/config.json")
    check_pair(dcfg, tcfg, f"drafter {ddir}/config.json")
    gen = read_json(tdir / "generation_config.json") if (tdir / "generation_config.json").is_file() else None
    target, drafter = Checkpoint(tdir, "target"), Checkpoint(ddir, "drafter")
    if layout == "trtllm":
        _check_sources(target, _expected_shapes("target", tcfg), "target")
    else:
        passthrough.check_target(target, tcfg)
    _check_sources(drafter, _expected_shapes("drafter", dcfg), "drafter")
    return Sources(tdir, ddir, tcfg, dcfg, traw, draw, gen, target, drafter)


def recorded_sources(convert_dir: Path, m: Manifest) -> Sources:
    """The sources a convert output was made from (its manifest's `sources`), checked unchanged
    since convert read them: the quantize stage quantizes exactly what convert validated."""
    problem = changed_source(m)
    if problem:
        raise UserError(f"{convert_dir}: {problem} since convert read it; re-run convert")
    return read_sources(Path(m.extra["target_dir"]), Path(m.extra["drafter_dir"]), m.extra.get("layout", "trtllm"))


def plan_trtllm(src: Sources, tp: int, drafter_tp: int | None = None) -> dict[Role, ModelPlan]:
    """Both models' per-rank plans: the target split over `tp` ranks, the drafter over
    `drafter_tp` (default tp; 1 where rank 0 holds the whole drafter: recipe/planner.py
    drafter_placement, whose `.tp` every caller passes)."""
    t, d = src.target_cfg, src.drafter_cfg
    dtp = tp if drafter_tp is None else drafter_tp
    check_tp(tp, t, d, dtp)
    arch_map = WEIGHT_MAPS[t.arch]
    tied = t.tie_word_embeddings and "lm_head.weight" not in src.target.tensors
    plans: dict[Role, ModelPlan] = {}
    plans["target"] = ModelPlan(
        "target", arch_map, tp, Heads(t.num_heads, t.num_kv_heads, t.head_dim),
        _plan_model("target", arch_map, t, tp, {"self": src.target}, tied),
        t.num_layers,
    )
    plans["drafter"] = ModelPlan(
        "drafter", DRAFTER_MAP, dtp, Heads(d.num_heads, d.num_kv_heads, d.head_dim),
        _plan_model("drafter", DRAFTER_MAP, d, dtp, {"self": src.drafter, "target": src.target}, tied),
        d.num_layers,
    )
    for role, plan in plans.items():  # every source tensor is consumed: the map is complete
        ckpt = src.target if role == "target" else src.drafter
        used = {r.name for t_ in plan.ranks[0] for piece in t_.reads for r in piece}
        unused = sorted(set(_expected_shapes(role, src.target_cfg if role == "target" else src.drafter_cfg)) - used)
        if unused:
            raise UserError(f"{role} {ckpt.directory}: the {plan.arch_map.architecture} weight map does not convert {', '.join(unused[:3])}")
    return plans


def _fingerprint(fields_sha: str, layout: str, sources: list[dict], transform: Transform, tp: int, drafter_tp: int) -> str:
    blob = json.dumps(
        {"v": FORMAT_VERSION, "recipe_fields": fields_sha, "layout": layout, "tp": tp, "drafter_tp": drafter_tp,
         "sources": [(r["role"], r["path"], r["sha256"]) for r in sources], "transform": transform.describe()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class _Progress:
    """A rich progress bar over shard files, or nothing."""

    def __init__(self, enabled: bool):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False)

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def task(self, description: str, total: int):
        if not self.bar:
            return lambda n=1: None
        tid = self.bar.add_task(description, total=total)
        return lambda n=1: self.bar.advance(tid, n)


def _write_rank(path: Path, role: Role, planned: list[PlannedTensor], rank: int, num_layers: int,
                sources: dict[str, Checkpoint], transform: Transform, advance) -> None:
    extras = {k: v for layer in range(num_layers) for k, v in transform.extras(role, layer, rank).items()}
    specs = [spec for t in planned for spec in transform.outputs(role, t)]
    specs += [(k, tuple(v.shape), v.dtype) for k, v in extras.items()]
    writer = StreamWriter(path, specs)
    try:
        for t in planned:
            ckpt = sources["target"] if t.entry.origin == "target" else sources["self"]
            x = combine(t.entry, [[ckpt.read(r.name, r.dim, r.start, r.stop) for r in piece] for piece in t.reads])
            for name, value in transform.apply(role, t, x).items():
                writer.write(name, value)
            advance()
        for k, v in extras.items():
            writer.write(k, v)
        writer.close()
    except BaseException:
        writer.abort()
        raise


def _aux_files(directory: Path) -> Iterator[Path]:
    """Tokenizer and generation files of a model directory (everything but weights and config.json)."""
    for p in sorted(directory.iterdir()):
        if p.is_file() and p.name != "config.json" and not p.name.endswith(_WEIGHT_SUFFIXES) and not p.name.endswith(".index.json"):
            yield p


def _check_drafter_backend(dcfg, backend: str, ddir: Path) -> None:
    """A drafter variant (DFlash2, logit / embedding scalars, Laguna) on a backend that cannot run it yet."""
    spec = BACKENDS[backend]
    if dcfg.variant in spec.drafters:
        return
    extras = sorted((k for k, off in FEATURES_OFF.items() if getattr(dcfg, k) != off),
                    key=lambda k: k not in DFLASH2_KEYS)  # a DFlash2 drafter is named as one
    what = f"architectures is [{LAGUNA_ARCH!r}]" if dcfg.laguna else f"{extras[0]} is set"
    able = ", ".join(n for n, b in BACKENDS.items() if dcfg.variant in b.drafters)
    raise UserError(f"drafter {ddir}/config.json: {what} and backend.name is {backend}: "
                    f"{spec.drafter_gap(dcfg.variant)}; backend {able} runs it")


def convert(
    recipe: Recipe,
    out: Path,
    *,
    layout: Layout | None = None,
    transform: Transform | None = None,
    stage: str = "convert",
    input_dir: Path | None = None,
    sources: Sources | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    extra: dict | None = None,
    extra_files: dict[str, Path] | None = None,
) -> Path:
    """Write the checkpoint directory `out` for `recipe`; see the module docstring.

    The quantize stage calls this too (stage="quantize", its QuantTransform, the convert output
    it was made from as input_dir, and the sources that convert output recorded)."""
    out = Path(out)
    layout = layout or BACKEND_LAYOUT[recipe.backend.name]
    if layout not in LAYOUTS:
        raise UserError(f"--layout {layout!r}: allowed: {', '.join(LAYOUTS)}")
    tp, dtp = recipe.parallel.tp, drafter_placement(recipe).tp
    src = sources or load_sources(recipe, layout)
    _check_drafter_backend(src.drafter_cfg, recipe.backend.name, src.drafter_dir)
    transform = transform or Cast(default_dtypes(recipe))
    plans = _plans(recipe, layout, src, transform, tp, dtp)
    if plans is None:  # the checkpoint's own quantization (gpt-oss: MXFP4 experts) travels with it
        extra = {"weights": "linked unchanged", "source_quantization": src.target_cfg.quant_method, **(extra or {})}

    records = [source_record(role, p) for role, p in src.input_files()]
    manifest = Manifest.for_stage(stage, recipe, input_dir, sources=records)
    manifest.extra = {"layout": layout, "tp": tp, "drafter_tp": dtp, "transform": transform.describe(),
                      "target_dir": str(src.target_dir.resolve()), "drafter_dir": str(src.drafter_dir.resolve()),
                      "fingerprint": _fingerprint(manifest.recipe_fields_sha256, layout, records, transform, tp, dtp),
                      **(extra or {})}
    fingerprint = manifest.extra["fingerprint"]
    work = out.parent / f".{out.name}.resume"
    try:
        with atomic_stage_dir(out, manifest, overwrite=overwrite) as tmp:
            if plans is None:
                _pass_through(tmp, src, transform)
            else:
                _write_shards(tmp, work, _resume_state(work, fingerprint, resume), src, plans, transform, progress)
                _write_configs(tmp, src, plans, transform)
            for name, path in (extra_files or {}).items():
                link_or_copy(path, tmp / name)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        src.target.close()
        src.drafter.close()
    return out


def _plans(recipe: Recipe, layout: str, src: Sources, transform: Transform, tp: int, dtp: int) -> dict | None:
    """The trtllm layout's per-rank plans, checked by the transform; None for the hf layout
    (passed through), whose target format is checked against the checkpoint's own."""
    if layout == "trtllm":
        plans = plan_trtllm(src, tp, dtp)
        for plan in plans.values():
            transform.validate(plan)
        return plans
    if not isinstance(transform, Cast):
        raise UserError("the hf layout is passed through unquantized here; quantized HF checkpoints come from `quantize` (ModelOpt export)")
    q = recipe.quantization
    passthrough.check_native(q.target_weights, q.quantizes, src.target_cfg, src.target_dir)
    return None


def _pass_through(tmp: Path, src: Sources, transform: Transform) -> None:
    """The hf layout (passthrough.py): both checkpoints linked, configs in the recipe's dtypes."""
    passthrough.write(tmp, "target", src.target, src.target_raw, DTYPE_NAMES[transform.dtype("target")],
                      list(_aux_files(src.target_dir)))
    passthrough.write(tmp, "drafter", src.drafter, src.drafter_raw, DTYPE_NAMES[transform.dtype("drafter")], [])


def _write_shards(tmp: Path, work: Path, state: dict, src: Sources, plans: dict, transform: Transform,
                  progress: bool) -> None:
    """Every rank's shard file into `tmp`: written in the resume directory `work` first (shards
    that an earlier run of the same inputs and settings finished are kept), then linked."""
    sources = {"target": {"self": src.target}, "drafter": {"self": src.drafter, "target": src.target}}
    with _Progress(progress) as bar:
        for role, plan in plans.items():
            for rank, planned in enumerate(plan.ranks):
                rel = f"{role}/rank{rank}.safetensors"
                done = state["done"].get(rel)
                if done is None or not (work / rel).is_file() or sha256_file(work / rel) != done:
                    (work / rel).parent.mkdir(parents=True, exist_ok=True)
                    partial = work / (rel + ".partial")
                    advance = bar.task(rel.removesuffix(".safetensors"), len(planned))
                    _write_rank(partial, role, planned, rank, plan.num_layers, sources[role], transform, advance)
                    partial.rename(work / rel)
                    state["done"][rel] = sha256_file(work / rel)
                    _write_json_atomic(work / "state.json", state)
                link_or_copy(work / rel, tmp / rel)


def _write_json_atomic(path: Path, data: dict) -> None:
    part = path.with_name(path.name + ".partial")
    part.write_text(json.dumps(data, indent=1))
    part.replace(path)


def _resume_state(work: Path, fingerprint: str, resume: bool) -> dict:
    """Shards finished by an earlier run with the same fingerprint (only with --resume)."""
    fresh = {"fingerprint": fingerprint, "done": {}}
    if resume and (work / "state.json").is_file():
        try:
            state = json.loads((work / "state.json").read_text())
        except json.JSONDecodeError:
            raise UserError(f"{work}/state.json: unreadable resume data; run without --resume to start over") from None
        if state.get("fingerprint") != fingerprint:
            raise UserError(f"{work}: resume data was written for other inputs or settings; run without --resume to start over")
        return state
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _write_json_atomic(work / "state.json", fresh)
    return fresh


def _write_configs(tmp: Path, src: Sources, plans: dict, transform: Transform) -> None:
    t, d = src.target_cfg, src.drafter_cfg
    tp = plans["target"].tp
    tdtype, ddtype = transform.dtype("target"), transform.dtype("drafter")
    tc = target_config(t, src.target_raw, plans["target"].arch_map, tp, tdtype, src.generation)
    tc["quantization"] = transform.quantization("target")
    dc = drafter_config(d, src.drafter_raw, t, plans["drafter"].tp, ddtype)
    dc["quantization"] = transform.quantization("drafter")
    (tmp / "target" / "config.json").write_text(json.dumps(tc, indent=2) + "\n")
    (tmp / "drafter" / "config.json").write_text(json.dumps(dc, indent=2) + "\n")
    for p in _aux_files(src.target_dir):
        link_or_copy(p, tmp / "tokenizer" / p.name)
