"""The convert stage's inputs: the target and drafter directories a recipe names, read and checked
before anything is written (both configs and their pairing, every tensor header's presence, shape
and dtype, the drafter variant against the backend), and the layout each backend loads.

The quantize stage re-reads through here the sources a convert output recorded
(recorded_sources), so it quantizes exactly what convert validated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from trtllm_dflash.artifacts import Manifest, changed_source
from trtllm_dflash.convert import passthrough
from trtllm_dflash.convert.safetensors_stream import CODE_DTYPES, Checkpoint
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats.weight_maps import WEIGHT_MAPS
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.models_root import download_hint
from trtllm_dflash.recipe.support import BACKENDS
from trtllm_dflash.reference.config import DFLASH2_KEYS, FEATURES_OFF, LAGUNA_ARCH, read_json

Layout = Literal["trtllm", "hf"]
Role = Literal["target", "drafter"]
LAYOUTS: tuple[str, ...] = ("trtllm", "hf")
BACKEND_LAYOUT: dict[str, Layout] = {name: b.layout for name, b in BACKENDS.items()}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


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


def _local_dir(src, field: str) -> Path:
    path = src.path
    if path is None:
        raise UserError(f"{field}.source: {src.source!r} is neither a local directory nor downloaded: "
                        f"{download_hint(src.source, field)}")
    if not (path / "config.json").is_file():
        raise UserError(f"{field}.source: {path} has no config.json")
    return path


def expected_shapes(role: Role, cfg) -> dict[str, tuple[int, ...]]:
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
            raise UserError(f"{who} {info.file.name}: tensor {name} has shape {list(info.shape)}, expected "
                            f"{list(shape)}")
        if info.dtype not in CODE_DTYPES or CODE_DTYPES[info.dtype] not in DTYPE_NAMES:
            raise UserError(f"{who} {info.file.name}: tensor {name} has dtype {info.dtype}; expected F32, BF16 or F16")


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
        _check_sources(target, expected_shapes("target", tcfg), "target")
    else:
        passthrough.check_target(target, tcfg)
    _check_sources(drafter, expected_shapes("drafter", dcfg), "drafter")
    return Sources(tdir, ddir, tcfg, dcfg, traw, draw, gen, target, drafter)


def recorded_sources(convert_dir: Path, m: Manifest) -> Sources:
    """The sources a convert output was made from (its manifest's `sources`), checked unchanged
    since convert read them: the quantize stage quantizes exactly what convert validated."""
    problem = changed_source(m)
    if problem:
        raise UserError(f"{convert_dir}: {problem} since convert read it; re-run convert")
    return read_sources(Path(m.extra["target_dir"]), Path(m.extra["drafter_dir"]), m.extra.get("layout", "trtllm"))


def check_drafter_backend(dcfg, backend: str, ddir: Path) -> None:
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
