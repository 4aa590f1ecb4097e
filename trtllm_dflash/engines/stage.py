"""The `build` stage: `--from` a convert / quantize output (trtllm layout), write the plan and a
`build_config.json` per engine, and run the stock `trtllm-build` for each (plan.py).

Output (atomic, with a manifest; `extra.dry_run` says whether engines were built):

    OUT/plan.json                    commands, plugins, I/O tensors, launch, parallelism (paths
                                     relative to OUT, where the commands run)
    OUT/trtllm_models.py             the model classes the commands load (a copy of the package's)
    OUT/target/build_config.json     TensorRT-LLM 1.2.x BuildConfig fields (upstream.py)
    OUT/target/engines/              config.json + rank{r}.engine (not with --dry-run)
    OUT/target/timing.cache          TensorRT's timing cache (build_config output_timing_cache)
    OUT/drafter/build_config.json
    OUT/drafter/engines/

`--dry-run`, and any machine without TensorRT-LLM 1.2.x, writes everything but the engines: a
plan can be made before any weights exist (no `--from`). Without `--dry-run` where
TensorRT-LLM 1.2.x is missing, the plan is written and the stage then fails with one line
naming the container. A dry-run output is replaced by the next build of the same recipe
without `--overwrite` (it holds no engines).

The only GPU-side step is running `trtllm-build` (tensorrt_llm/commands/build.py) as a
subprocess; nothing here imports tensorrt or tensorrt_llm.

The door (`run`, the contract: recipe/stages.py) is what the pipeline calls: it builds where it
can and writes the dry-run plan elsewhere. Stale when: the recipe fields build depends on or its
input changed, or a dry-run plan meets a machine that can build (and the other way round).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

from trtllm_dflash.artifacts import MANIFEST, Manifest, atomic_stage_dir, check_out_dir, tool_versions, verify_input
from trtllm_dflash.engines.plan import (
    CHECKPOINT_ARCHITECTURES,
    MODELS_FILE,
    ROLES,
    BuildPlan,
    EnginePlan,
    check_buildable,
    make_plan,
    max_draft_len,
    models_file,
)
from trtllm_dflash.engines.upstream import CONTAINER, SUPPORTED_LINE, TRTLLM_BUILD
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.stages import StageOptions, build_command, input_stage

NAME = "build"
WRITES_OUTPUT = True


class NotBuiltHere(UserError):
    """The plan was written, but this machine cannot build the engines (one line: which container)."""

    def __init__(self, message: str, plan: BuildPlan):
        super().__init__(message)
        self.plan = plan


@dataclass
class BuildResult:
    out: Path
    plan: BuildPlan
    built: bool  # engines were built (False: the plan only)


def installed_trtllm() -> str | None:
    """The installed TensorRT-LLM version (package metadata; nothing is imported), or None."""
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cannot_build_here() -> str | None:
    """Why this machine cannot run trtllm-build for the engine path (None when it can)."""
    version = installed_trtllm()
    if version is None:
        return "TensorRT-LLM is not installed here"
    head = version.split("rc")[0].split("+")[0].split(".")
    if tuple(int(x) for x in head[:2] if x.isdigit()) != SUPPORTED_LINE:
        return (f"TensorRT-LLM {version} is installed here; the engine path needs 1.2.x (the last line with "
                "trtllm-build)")
    if shutil.which(TRTLLM_BUILD) is None:
        return f"TensorRT-LLM {version} is installed but {TRTLLM_BUILD} is not on PATH"
    return None


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: missing; not a TensorRT-LLM checkpoint written by trtllm-dflash convert")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: unreadable ({str(e).splitlines()[0]})") from None


def check_checkpoints(from_dir: Path, recipe: Recipe) -> None:
    """`from_dir` is this recipe's convert / quantize output in the trtllm layout, with the
    architectures, ranks, KV-cache format and drafter block the plan builds from."""
    want = input_stage(recipe, "build")
    m = verify_input(from_dir, (want,), recipe)
    if m.extra.get("layout") != "trtllm":
        raise UserError(f"{from_dir}: manifest field extra.layout is {m.extra.get('layout')!r}; the engine build "
                        "reads the trtllm layout (TensorRT-LLM checkpoints)")
    family = recipe.target_facts.family
    placement = drafter_placement(recipe)
    kv_want = "FP8" if recipe.quantization.kv_cache == "fp8" else None
    for role in ROLES:
        path = from_dir / role / "config.json"
        cfg = _read_config(path)
        arch = CHECKPOINT_ARCHITECTURES[family if role == "target" else "drafter"]
        if cfg.get("architecture") != arch:
            raise UserError(f"{path}: architecture is {cfg.get('architecture')!r}; the {role} engine builds from "
                            f"{arch}")
        tp = (cfg.get("mapping") or {}).get("tp_size")
        want = recipe.parallel.tp if role == "target" else placement.tp
        if tp != want:
            why = "recipe parallel.tp" if role == "target" else f"the drafter placement ({placement.mode}) needs"
            raise UserError(f"{path}: mapping.tp_size is {tp!r}, {why} {want}; convert again")
        ws = want * recipe.parallel.pp
        for r in range(ws):
            if not (from_dir / role / f"rank{r}.safetensors").is_file():
                raise UserError(f"{from_dir / role}: rank{r}.safetensors is missing (world size {ws})")
        kv = (cfg.get("quantization") or {}).get("kv_cache_quant_algo")
        if kv != kv_want:
            raise UserError(f"{path}: quantization.kv_cache_quant_algo is {kv!r}, recipe quantization.kv_cache "
                            f"{recipe.quantization.kv_cache} needs {kv_want!r} (the engine's KV-cache dtype comes from "
                            "it)")
    trained = (_read_config(from_dir / "drafter" / "config.json").get("dflash") or {}).get("block_size")
    draft = max_draft_len(recipe)
    if trained is not None and draft + 1 > trained:
        raise UserError(f"{from_dir / 'drafter' / 'config.json'}: dflash.block_size is {trained}; the recipe's "
                        f"max_draft_len {draft} needs {draft + 1} (speculative.block_size / draft_len)")


def _replaces_dry_run(out: Path, recipe: Recipe) -> bool:
    """A finished dry-run build of the same recipe may be replaced without --overwrite."""
    if not (out / MANIFEST).is_file():
        return False
    try:
        old = Manifest.read(out)
    except UserError:
        return False
    return old.stage == "build" and old.recipe == recipe.name and bool(old.extra.get("dry_run"))


def _run(engine: EnginePlan, out: Path, tmp: Path, say: Callable[[str], None]) -> None:
    """Run one engine's trtllm-build in tmp, the build directory until the stage renames it to
    out: the plan's paths are relative to it, and tmp is out's sibling, so the checkpoint's
    relative path is the same from either."""
    say(f"running in {tmp}: " + shlex.join(engine.command))
    rc = subprocess.run(engine.command, cwd=tmp).returncode
    if rc != 0:
        raise UserError(f"{TRTLLM_BUILD} exited with {rc} (its output is above); nothing was written to {out}")
    check_built_plugins(engine, tmp / engine.role / "engines" / "config.json",
                        out / engine.role / "engines" / "config.json")


def check_built_plugins(engine: EnginePlan, config_json: Path, shown: Path) -> None:
    """The engine's plugin settings as trtllm-build saved them (config.json build_config.plugin_config)
    against the plan's build_config.json: commands/build.py main hands BuildConfig.from_json_file
    the CLI's own PluginConfig too, and whether the 1.2 line's BuildConfig keeps the file's values
    over those defaults is not pinned down upstream; a planned value the engine lacks would silently
    change what the runners rely on (paged context FMHA for KV reuse, the drafter's absent
    attention plugin). A value planned as "auto" stands for the plugin dtype (tensorrt_llm/plugin/
    plugin.py PluginConfig resolves it so) and may be saved either way; anything else (e.g. None,
    a plugin switched off) is a mismatch."""
    if not config_json.is_file():
        raise UserError(f"{shown}: {TRTLLM_BUILD} exited 0 but wrote no config.json; nothing was written")
    built = json.loads(config_json.read_text()).get("build_config", {}).get("plugin_config", {})
    planned = engine.build_config["plugin_config"]
    for key, want in planned.items():
        got = built.get(key, "<absent>")
        if got != want and not (want == "auto" and got == planned.get("dtype")):
            raise UserError(f"{shown}: build_config.plugin_config.{key} is {got!r}, the "
                            f"plan's {engine.role}/build_config.json has {want!r}: trtllm-build did not build what was "
                            "planned (its command-line plugin defaults?); nothing was written")


def build(recipe: Recipe, from_dir: Path | None, out: Path, *, dry_run: bool = False, overwrite: bool = False,
          say: Callable[[str], None] = print) -> BuildResult:
    """The build stage; see the module docstring. Everything is checked before anything is written."""
    out = Path(out)
    check_buildable(recipe)
    if from_dir is None and not dry_run:
        raise UserError(f"--from is required to build engines: the {input_stage(recipe, 'build')} output of "
                        f"recipe {recipe.name!r} (or pass --dry-run for the plan alone)")
    if from_dir is not None:
        from_dir = Path(from_dir)
        check_checkpoints(from_dir, recipe)
    plan = make_plan(recipe, from_dir, out)
    why_not = None if dry_run else cannot_build_here()
    if not dry_run and why_not is None and not models_file().is_file():
        why_not = f"{models_file()} (the engines' model classes) is missing from this installation"
    building = not dry_run and why_not is None
    version = installed_trtllm()
    manifest = Manifest.for_stage("build", recipe, from_dir, tools=tool_versions("tensorrt_llm"), extra={
        "dry_run": not building, "trtllm_version": version,
        "engines": {e.role: {"model_cls": e.model_cls, "checkpoint_dir": e.checkpoint_dir} for e in plan.engines},
        "world_size": plan.world_size, "max_draft_len": plan.max_draft_len,
    })
    overwrite = overwrite or _replaces_dry_run(out, recipe)
    check_out_dir(out, manifest, overwrite)
    with atomic_stage_dir(out, manifest, overwrite=overwrite) as tmp:
        (tmp / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n")
        if models_file().is_file():  # the model classes the commands load (--model_cls_file, relative)
            shutil.copyfile(models_file(), tmp / MODELS_FILE)
        for e in plan.engines:
            (tmp / e.role).mkdir()
            (tmp / e.role / "build_config.json").write_text(json.dumps(e.build_config, indent=2) + "\n")
        if building:
            for e in plan.engines:
                _run(e, out, tmp, say)
    if why_not is not None:
        raise NotBuiltHere(f"{why_not}: wrote the build plan to {out} (plan.json, build_config.json per engine) but "
                        f"built no engines; build them inside {CONTAINER}: "
                        f"{build_command(recipe, from_dir, out)}", plan)
    return BuildResult(out, plan, building)


def fingerprint(recipe: Recipe, options: StageOptions) -> dict:
    return {"dry_run": cannot_build_here() is not None}


def run(recipe: Recipe, input_dir: Path | None, out: Path, options: StageOptions) -> BuildResult:
    """Build the engines of `input_dir` into `out`, or write the dry-run plan where TensorRT-LLM
    1.2.x is not installed (saying so)."""
    why_not = cannot_build_here()
    if why_not:
        options.say(f"build: {why_not}: writing the dry-run plan (plan.json, build_config.json per engine), no engines")
    return build(recipe, input_dir, out, dry_run=why_not is not None, overwrite=True, say=options.say)
