"""`convert`: an HF target and a z-lab DFlash drafter -> the checkpoint layout a backend loads.

Layouts (one output directory, written atomically, with a manifest of checksums):
  trtllm  TensorRT-LLM 1.2.x unified checkpoints for the engine backend (and the reference
          backend's tensor-parallel runs): `target/` and `drafter/`, each a `config.json`
          (architecture, dtype, mapping, quantization, ...) plus `rank{r}.safetensors` per TP
          rank with TensorRT-LLM names, fused QKV and column / row / vocab splits
          (formats/weight_maps.py); `tokenizer/` holds the target's tokenizer files. The drafter is
          split over recipe/plan/drafter.py drafter_placement(recipe).tp ranks: the target's tp, or
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
(`artifacts.atomic_stage_dir` refuses one holding a different checkpoint). The inputs are read
and checked in sources.py, each rank's tensors planned in shard_plan.py, the trtllm layout's
config.json files built in configs.py; this module writes the directory.

Tensors stream: each rank's shard file is planned from the headers, then filled one tensor
at a time, reading only the rows / columns that rank needs. Finished shard files are kept in
a hidden resume directory next to the output (`.NAME.resume/`, never complete-looking: no
manifest); `--resume` skips the ones whose inputs and settings match, and the resume
directory goes away once the output directory is in place.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Iterator

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir, sha256_file, source_record
from trtllm_dflash.convert import passthrough
from trtllm_dflash.convert.configs import drafter_config, target_config
from trtllm_dflash.convert.passthrough import link_or_copy
from trtllm_dflash.convert.safetensors_stream import Checkpoint, StreamWriter
from trtllm_dflash.convert.shard_plan import Cast, PlannedTensor, Transform, default_dtypes, plan_trtllm
from trtllm_dflash.convert.sources import (
    BACKEND_LAYOUT,
    DTYPE_NAMES,
    LAYOUTS,
    Layout,
    Role,
    Sources,
    check_drafter_backend,
    load_sources,
)
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats.weight_maps import combine
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.drafter import drafter_placement

FORMAT_VERSION = 1
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


def _fingerprint(fields_sha: str, layout: str, sources: list[dict], transform: Transform, tp: int,
                 drafter_tp: int) -> str:
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

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), transient=False)

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
        if (p.is_file() and p.name != "config.json" and not p.name.endswith(_WEIGHT_SUFFIXES)
                and not p.name.endswith(".index.json")):
            yield p


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
    check_drafter_backend(src.drafter_cfg, recipe.backend.name, src.drafter_dir)
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
        raise UserError("the hf layout is passed through unquantized here; quantized HF checkpoints come from "
                        "`quantize` (ModelOpt export)")
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
            raise UserError(f"{work}: resume data was written for other inputs or settings; run without --resume to "
                            "start over")
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
