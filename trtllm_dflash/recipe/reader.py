"""The recipe reader: a YAML file (or the embedded default) -> a schema-checked Recipe with its
architecture facts resolved. `section.key=value` overrides apply before the schema; pydantic's
errors become one RecipeError line per problem naming the file, the YAML line and column (or the
override) and the dotted field (positions.py); facts come from the model catalog, inline, or the
checkpoint's config.json (and must agree with it). A stand-in checkpoint (recipe/stand_ins.py)
cannot agree with the catalog: the stages take its own facts, the planning commands (check, plan,
project) the recipe's. No cross-field rules here: rules.py, and `load.load_recipe` runs both.
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from trtllm_dflash.recipe.hardware import hardware_catalog
from trtllm_dflash.recipe.models import ArchFacts, catalog_facts, facts_from_config
from trtllm_dflash.recipe.models_root import download_hint, stand_in_of
from trtllm_dflash.recipe.positions import Positions
from trtllm_dflash.recipe.schema import ModelSource, Recipe, RecipeError

DEFAULT_RECIPE = "cpu/tiny-pystd.yaml"


def recipes_root() -> Path:
    return Path(str(resources.files("trtllm_dflash.recipes")))


def default_recipe_path() -> Path:
    return recipes_root() / DEFAULT_RECIPE


def list_recipes() -> list[Path]:
    return sorted(recipes_root().glob("*/*.yaml"))


def apply_overrides(raw: dict, overrides: list[str], file: str) -> dict:
    """Apply `section.key=value` overrides (value parsed as YAML) to a raw recipe dict."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"{file}: override {item!r}: expected KEY=VALUE, e.g. parallel.tp=2")
        key, value = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise RecipeError(f"{file}: override {key}: {p!r} is not a section")
            node = nxt
        node[parts[-1]] = yaml.safe_load(value)
    return out


def _allowed_keys(loc: tuple) -> list[str] | None:
    """Field names allowed at the parent of `loc` (for 'unknown key' messages)."""
    model: Any = Recipe
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *get_args(ann)]
        if get_origin(ann) is list:
            candidates = list(get_args(ann))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return list(getattr(model, "model_fields", {}))


def _schema_error(where: Positions, e: ValidationError) -> RecipeError:
    lines = []
    for err in e.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # Unions (str | ArchFacts) add the member type name to the location; drop it.
        loc = tuple(p for p in loc if p not in ("str", "ArchFacts", "none", "literal['reference','engine','pytorch']"))
        field = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc)
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            lines.append(f"{where.at(field)}: unknown key{hint}")
        elif err["type"] == "missing":
            lines.append(f"{where.at(field)}: required field is missing")
        else:
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" (got {value!r})"
            # Our own validators' ValueErrors read as written, without pydantic's "Value error, ".
            msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
            lines.append(f"{where.at(field)}: {msg}{shown}")
    # The same location can fail several union members; keep each line once.
    return RecipeError("\n".join(dict.fromkeys(lines)))


# Facts that must agree between a recipe's `arch` and the checkpoint on disk.
CHECKED_FACTS = ("family", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                 "vocab_size", "num_experts", "block_size", "target_layer_ids", "mask_token_id")


def _resolve_facts(src: ModelSource, field: str, where: Positions, planning: bool) -> ArchFacts:
    path = src.path
    config = path / "config.json" if path is not None and (path / "config.json").exists() else None
    if src.arch is None:
        if config is None:
            raise RecipeError(
                f"{where.at(field + '.arch')}: required when {field}.source ({src.source!r}) is not a local "
                "directory with config.json; give a catalog name (see `trtllm-dflash recipes --models`) "
                f"or inline facts, or download it: {download_hint(src.source, field)}"
            )
        return facts_from_config(config)
    facts = src.arch if isinstance(src.arch, ArchFacts) else catalog_facts(src.arch, where.at(f"{field}.arch"))
    stand_in = config is not None and stand_in_of(path) is not None
    if config is None or (stand_in and planning):
        return facts
    on_disk = facts_from_config(config)
    if stand_in:
        return on_disk
    for key in CHECKED_FACTS:
        want, have = getattr(facts, key), getattr(on_disk, key)
        if want != have and want is not None:
            raise RecipeError(
                f"{where.at(field + '.arch')}: {key} is {want!r} but {config} says {have!r}; "
                f"fix the recipe or omit {field}.arch to read the checkpoint's facts"
            )
    return facts


def yaml_error_line(e: yaml.YAMLError) -> str:
    """PyYAML's error as one line: where (line and column, 1-based) and what."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{what}" + (f" ({context})" if context else "")


def parse_recipe(path: str | Path | None = None, overrides: list[str] | None = None, planning: bool = False) -> Recipe:
    """Read and schema-check a recipe and resolve its architecture facts; no rules (rules.py).
    `path=None` reads the embedded default. `planning`: facts for the model the recipe names
    (check, plan, project), a stand-in download notwithstanding."""
    p = Path(path) if path is not None else default_recipe_path()
    file = str(path) if path is not None else f"(default) {DEFAULT_RECIPE}"
    try:
        text = p.read_bytes().decode("utf-8")
        raw = yaml.safe_load(text)
    except FileNotFoundError:
        raise RecipeError(f"{file}: recipe file not found") from None
    except IsADirectoryError:
        raise RecipeError(f"{file}: is a directory, expected a recipe YAML file") from None
    except UnicodeDecodeError as e:
        raise RecipeError(f"{file}: not a text file (byte {e.start} is not UTF-8); expected a recipe YAML "
                          "file") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{file}: not valid YAML: {yaml_error_line(e)}") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{file}: expected a mapping of sections at the top level")
    raw = apply_overrides(raw, overrides or [], file)
    where = Positions(file, text, overrides)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        raise _schema_error(where, e) from None

    base = p.resolve().parent
    recipe._file = p
    recipe._positions = where
    recipe.target._base_dir = base
    recipe.drafter._base_dir = base
    if recipe.hardware.gpu not in hardware_catalog():
        raise RecipeError(
            f"{where.at('hardware.gpu')}: unknown device {recipe.hardware.gpu!r}; "
            f"allowed: {', '.join(hardware_catalog())}"
        )
    recipe._target_facts = _resolve_facts(recipe.target, "target", where, planning)
    recipe._drafter_facts = _resolve_facts(recipe.drafter, "drafter", where, planning)
    return recipe
