"""The policy stays a set of small named models: no class of trtllm_dflash/policy/ holds more
than 12 fields (dataclass fields, or the attributes its __init__ sets), no module runs past 450
lines, and `auto`'s hyperparameters are a frozen value apart from what it learns."""

import ast
import dataclasses
from pathlib import Path

import pytest

from trtllm_dflash.policy.auto import AutoConfig, AutoDraftLength
from trtllm_dflash.policy.cost import VerifyCost

POLICY = Path(__file__).resolve().parents[2] / "trtllm_dflash" / "policy"


def class_fields(tree: ast.Module) -> dict[str, set[str]]:
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    names |= {t.attr for s in ast.walk(f) if isinstance(s, (ast.Assign, ast.AnnAssign))
                              for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                              for t in (t.elts if isinstance(t, ast.Tuple) else [t])
                              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                              and t.value.id == "self"}
            out[node.name] = names
    return out


@pytest.mark.parametrize("path", sorted(POLICY.glob("*.py")), ids=lambda p: p.name)
def test_small_classes_and_modules(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 450, f"{path.name}: over 450 lines"
    for name, fields in class_fields(ast.parse(text)).items():
        assert len(fields) <= 12, f"{path.name}: {name} has {len(fields)} fields: {sorted(fields)}"


def test_hyperparameters_are_frozen_and_apart_from_the_learnt_state():
    auto = AutoDraftLength(8, VerifyCost(1e-3, 1e-4, 2e-4), prior=0.6, trim_batch=0, probe_every=3)
    assert auto.config == AutoConfig.of(prior=0.6, trim_batch=0, probe_every=3)
    assert auto.config.acceptance.prior == 0.6 and auto.config.trim.batch == 0 and auto.config.probe_every == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        auto.config.probe_every = 0
    with pytest.raises(TypeError, match="unknown setting 'prior_wieght'"):
        AutoConfig.of(prior_wieght=2.0)
    auto.slots.observe(1, 7, 2)
    assert auto.config == AutoConfig.of(prior=0.6, trim_batch=0, probe_every=3)  # learning leaves it alone
