"""The pytorch backend's TensorRT-LLM versions (recipe/trtllm_api.py): check refuses a release
that lacks a field the deployment writes, warns about fixes it lacks; the shipped recipes pin a
release with every fix; FA4 only when asked; TRTLLM attention only on Blackwell."""

from pathlib import Path

import pytest

from trtllm_dflash.recipe import RecipeError, load_recipe
from trtllm_dflash.recipe.rules import check
from trtllm_dflash.recipe.trtllm_api import FIELDS, FIXES, PINNED, drafter_attention, has, parse

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"  # Blackwell: TRTLLM drafter attention
QWEN_CODER = ROOT / "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"  # Hopper: VANILLA


def test_versions_order_release_candidates_and_releases():
    assert has("1.3.0rc24", "speculative_config.attention_backend")
    assert not has("1.3.0rc20", "speculative_config.attention_backend")
    assert has("1.3.0", "speculative_config.attention_backend=FA4") and has("1.4.0rc1", "trtllm-serve --config")
    assert not has("1.3.0rc27", "speculative_config.context_recompute_tail")
    assert has("1.3.0rc25", "per_request_acceptance", FIXES) and not has("1.3.0rc24", "per_request_acceptance", FIXES)
    assert parse("1.3.x") is None


def test_the_shipped_pytorch_recipes_pin_a_release_with_every_fix():
    for path in (GPT_OSS, QWEN_CODER):
        r = load_recipe(path)
        assert r.backend.trtllm_version == PINNED
        assert all(has(PINNED, k, FIXES) for k in FIXES)
        assert not [i for i in check(r) if i.field == "backend.trtllm_version"]


def test_check_refuses_1_3_0rc20_for_the_attention_backend_blackwell_needs():
    with pytest.raises(RecipeError, match=r"backend.trtllm_version: 1.3.0rc20 has no speculative_config."
                                          r"attention_backend .*needs TensorRT-LLM >= 1.3.0rc24 \(PR #16914\)"):
        load_recipe(GPT_OSS, ["backend.trtllm_version=1.3.0rc20"])
    # VANILLA (Hopper's default) is not written, so that release takes it, with warnings for the fixes it lacks.
    notes = [i.message for i in check(load_recipe(QWEN_CODER, ["backend.trtllm_version=1.3.0rc20"]))
             if i.field == "backend.trtllm_version"]
    assert [n.split(" (")[0] for n in notes] == [f"1.3.0rc20 predates PR {f.pr}" for f in FIXES.values()]


def test_fa4_only_when_asked_and_where_the_release_has_it():
    assert drafter_attention("auto", blackwell=False) == "VANILLA"
    assert drafter_attention("auto", blackwell=True) == "TRTLLM"
    r = load_recipe(QWEN_CODER, ["backend.drafter_attention=FA4"])
    assert not [i for i in check(r) if i.level == "error"]
    with pytest.raises(RecipeError,
                       match=f"needs TensorRT-LLM >= {FIELDS['speculative_config.attention_backend=FA4'].version}"):
        load_recipe(QWEN_CODER, ["backend.drafter_attention=FA4", "backend.trtllm_version=1.3.0rc26"])
    with pytest.raises(RecipeError, match="TRTLLM runs FlashInfer's trtllm-gen kernels, Blackwell only"):
        load_recipe(QWEN_CODER, ["backend.drafter_attention=TRTLLM"])
    with pytest.raises(RecipeError, match="backend.drafter_attention: the engine backend's drafter attention is ours"):
        load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml", ["backend.drafter_attention=FA4"])
