"""The support table (recipe/support.py) is the one place that knows backends and architectures.

The package compares no backend or architecture name outside it (at most 3 comparisons left,
each commented); the weight maps and engine classes it names exist; `recipes --support` prints it
(docs/support.md's table: tests/test_docs.py)."""

import json
import re
from pathlib import Path

from trtllm_dflash.cli import main
from trtllm_dflash.recipe.support import ARCHITECTURES, BACKENDS, DRAFTER_ENGINE_CLASS, DRAFTERS, support_rows

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted({*BACKENDS, *ARCHITECTURES})
QUOTED = "|".join(NAMES)
# `x == "engine"`, `"qwen3" != x`, `x in ("llama", ...)`, `"pytorch" in x`
COMPARISON = re.compile(rf"""(?:==|!=)\s*["'](?:{QUOTED})["']|["'](?:{QUOTED})["']\s*(?:==|!=|(?:not\s+)?in\b)"""
                        rf"""|\bin\s*[(\[{{]\s*["'](?:{QUOTED})["']""")


def comparisons() -> list[str]:
    out = []
    for top in ("trtllm_dflash", "plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name == "support.py" and path.parent.name == "recipe":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if COMPARISON.search(line.split("#")[0]):
                    out.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def test_no_backend_or_architecture_name_is_compared_outside_the_table():
    found = comparisons()
    assert len(found) <= 3, "ask recipe/support.py instead:\n" + "\n".join(found)


def test_the_pattern_finds_comparisons():
    for line in ('if backend == "engine":', 'x = "qwen3" != arch', 'if a in ("llama", "qwen3"):',
                 'if "pytorch" in names:'):
        assert COMPARISON.search(line), line
    assert not COMPARISON.search('spec = BACKENDS["engine"]')


def test_the_maps_and_classes_the_table_names_exist():
    from trtllm_dflash.formats.weight_maps import DRAFTER_MAP, WEIGHT_MAPS

    mapped = {m: a.trtllm_architecture for m, a in ARCHITECTURES.items() if a.trtllm_architecture}
    assert {m: WEIGHT_MAPS[m].architecture for m in WEIGHT_MAPS} == mapped
    assert DRAFTER_MAP.architecture == DRAFTER_ENGINE_CLASS
    models = (ROOT / "trtllm_dflash" / "engines" / "trtllm_models.py").read_text()
    for cls in [a.engine_class for a in ARCHITECTURES.values() if a.engine_class] + [DRAFTER_ENGINE_CLASS]:
        assert re.search(rf"^class {cls}\b", models, re.M), cls
    # an engine class only for an architecture the engine backend serves, with a weight map
    for m, a in ARCHITECTURES.items():
        assert bool(a.engine_class) == (any(BACKENDS[b].builds_engines for b in a.backends) and m in WEIGHT_MAPS), m


def test_every_backend_says_why_for_each_drafter_variant_it_does_not_run():
    for name, spec in BACKENDS.items():
        assert set(spec.drafters) <= set(DRAFTERS), name
        for variant in DRAFTERS:
            assert bool(spec.drafter_gap(variant)) == (variant not in spec.drafters), (name, variant)


def test_rows_follow_the_backends_and_the_hardware(capsys):
    rows = {(r.target, r.drafter, r.backend): r for r in support_rows()}
    assert len(rows) == len(ARCHITECTURES) * len(DRAFTERS) * len(BACKENDS)
    assert rows[("gpt_oss", "dflash", "engine")].why_not and not rows[("gpt_oss", "dflash", "engine")].gpus
    assert "mxfp4" in rows[("gpt_oss", "dflash", "pytorch")].gpus["b200"]
    assert "mxfp4" not in rows[("qwen3", "dflash", "pytorch")].gpus["b200"]
    assert "nvfp4" not in rows[("qwen3", "dflash", "pytorch")].gpus["h100-sxm"]
    assert "cpu" not in rows[("qwen3", "dflash", "pytorch")].gpus
    assert "cpu" in rows[("qwen3", "dflash", "reference")].gpus
    assert rows[("qwen3", "dflash2", "engine")].why_not and not rows[("qwen3", "dflash2", "reference")].why_not
    assert "PR #15666" in rows[("qwen3", "laguna", "pytorch")].why_not
    assert not rows[("llama", "laguna", "reference")].why_not
    assert main(["recipes", "--support", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed) == len(rows) and printed[0]["target"] == next(iter(rows))[0]


def test_no_hand_kept_literal_repeats_the_table():
    """A type naming backends or architectures is built from the table (recipe/models.py Family,
    reference/config.py Arch, recipe/support.py BackendName), so a new one is declared once."""
    literal = re.compile(rf"""Literal\[[^\]]*["'](?:{QUOTED})["']""")
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for top in ("trtllm_dflash", "plugins", "perf")
           for p in sorted((ROOT / top).rglob("*.py"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not bad, "derive it from recipe/support.py's tables:\n" + "\n".join(bad)
    from typing import get_args

    from trtllm_dflash.recipe.models import Family
    from trtllm_dflash.recipe.schema import BackendName
    from trtllm_dflash.reference.config import Arch
    assert get_args(Family) == (*ARCHITECTURES, "dflash") and get_args(BackendName) == tuple(BACKENDS)
    assert set(get_args(Arch)) == {m for m, a in ARCHITECTURES.items() if "reference" in a.backends}
