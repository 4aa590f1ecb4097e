"""The quantize stage's acceptance guardrail (quantize/guard.py) on the shipped tiny pair, FP8:
a damaged quantization (the drafter's FP8 weight scales 4x too large, the kind of error a wrong
amax makes) fails in one line with both numbers and leaves no output behind. That the shipped
FP8 quantization passes, with its numbers in the manifest, is checked where the pipeline runs it
(tests/test_pipeline.py), at no extra cost."""

import re
from pathlib import Path

import pytest

from trtllm_dflash.convert.convert import convert
from trtllm_dflash.errors import UserError
from trtllm_dflash.quantize.stage import quantize
from trtllm_dflash.quantize.transform import QuantTransform
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.runtime.acceptance import checkpoint_tau

FP8 = Path(__file__).resolve().parents[2] / "recipes/cpu/tiny-pystd-fp8.yaml"
CALIB = dict(samples=4, length=64, progress=False)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    # The drafter alone in FP8: no ModelOpt calibration of the target (seconds), and the damage is
    # the drafter's.
    recipe = load_recipe(FP8, ["quantization.target_weights=fp32"])
    return recipe, convert(recipe, tmp_path_factory.mktemp("guard") / "convert", progress=False)


def test_a_damaged_quantization_fails_with_both_numbers_and_writes_nothing(converted, tmp_path, monkeypatch):
    recipe, conv = converted
    apply = QuantTransform.apply

    def damaged(self, role, t, x):
        out = apply(self, role, t, x)
        scale = t.name.removesuffix(".weight") + ".weights_scaling_factor"
        if role == "drafter" and scale in out:
            out[scale] = out[scale] * 4
        return out

    monkeypatch.setattr(QuantTransform, "apply", damaged)
    with pytest.raises(UserError) as e:
        quantize(recipe, conv, tmp_path / "q", measure=checkpoint_tau, **CALIB)
    msg = str(e.value)
    m = re.search(r"tau fell from (\d+\.\d+) \(unquantized\) to (\d+\.\d+) \(quantized\), a (\d+\.\d)% drop > 10%", msg)
    assert m and "\n" not in msg, msg
    before, after = float(m[1]), float(m[2])
    assert (before - after) / before > 0.10
    assert not (tmp_path / "q").exists() and list(tmp_path.iterdir()) == []  # no output, no leftover


def test_the_threshold_is_a_recipe_field_and_the_drop_is_relative(tmp_path):
    from trtllm_dflash.quantize import guard

    def measure(path, prompts, new_tokens, block):
        assert (len(prompts), new_tokens, block) == (2, guard.GUARD_NEW_TOKENS, 16)
        return 2.0 if path == tmp_path / "before" else 1.0

    args = (measure, tmp_path / "before", tmp_path / "after", [[1, 2], [3]], 16)
    loose = guard.check(*args, max_drop=load_recipe(FP8, ["quantization.max_acceptance_drop=0.5"])
                        .quantization.max_acceptance_drop, source="test prompts")
    assert loose.passed and loose.drop == 0.5 and loose.to_json()["tau_after"] == 1.0
    strict = guard.check(*args, max_drop=load_recipe(FP8).quantization.max_acceptance_drop, source="test prompts")
    assert not strict.passed
    assert "tau fell from 2.000 (unquantized) to 1.000 (quantized), a 50.0% drop > 10%" in strict.message()
    with pytest.raises(UserError, match="quantization.max_acceptance_drop"):
        load_recipe(FP8, ["quantization.max_acceptance_drop=1.5"])
