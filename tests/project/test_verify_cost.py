"""What an engine-backend verify round costs the target (recipe/plan/engine_layout.py verify_cost):
without KV block reuse each round is a context request that recomputes the whole sequence. The
shipped engine recipes never do that; where a recipe does, `check`, `plan`, `build --dry-run`
and `project` say the same line and the step model prices the round as a prefill."""

from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.engines.plan import make_plan
from trtllm_dflash.project.acceptance import resolve as resolve_profile
from trtllm_dflash.project.projection import AR, BANDS, project
from trtllm_dflash.project.stepmodel import Deployment, StepModel
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.plan.engine_layout import verify_cost
from trtllm_dflash.recipe.rules import check
from trtllm_dflash.recipe.support import backend as backend_spec

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"
TP8 = ["parallel.tp=8", "hardware.count=8"]
FP8_KV = "quantization.kv_cache=fp8"


def shipped_engine_recipes() -> list[Path]:
    out = []
    for path in sorted(ROOT.glob("recipes/*/*.yaml")):
        r = load_recipe(path, [], check_rules=False)
        if backend_spec(r.backend.name).builds_engines and not r.gpu.is_cpu:
            out.append(path)
    return out


def test_every_shipped_gpu_engine_recipe_verifies_only_its_new_tokens():
    paths = shipped_engine_recipes()
    assert len(paths) == 4  # h100 qwen3 / llama FP8, b200 llama / b300 qwen3 NVFP4
    for path in paths:
        cost = verify_cost(load_recipe(path))
        assert not cost.recomputes, f"{path.name}: {cost.describe()}"
        assert cost.tokens == cost.block


def test_an_fp8_kv_cache_recomputes_and_says_so_with_its_cost():
    r = load_recipe(H100, [FP8_KV])
    cost = verify_cost(r)
    assert cost.recomputes and cost.context == r.sweep.input_len + r.sweep.output_len // 2
    assert cost.tokens == cost.context + cost.block
    line = cost.describe()
    assert "NVIDIA/TensorRT-LLM/issues/2699" in line and f"{cost.tokens} target tokens per sequence" in line
    assert f"({cost.tokens / cost.block:.0f}x)" in line
    # Reuse asked off recomputes on any KV dtype.
    assert verify_cost(load_recipe(H100, ["build.kv_cache_reuse=false"])).recomputes
    # Other backends verify in each sequence's generation step.
    assert not verify_cost(load_recipe(ROOT / "recipes/cpu/tiny-pystd.yaml")).recomputes


def run_cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(map(str, args)))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("overrides", [[], [FP8_KV]], ids=["bf16-kv", "fp8-kv"])
def test_check_plan_build_and_project_say_the_same_verify_cost(overrides, capsys, tmp_path):
    r = load_recipe(H100, [*TP8, *overrides])
    want = verify_cost(r).describe()
    warnings = [i.message for i in check(r) if i.field == "build.kv_cache_reuse"]
    assert warnings == ([want] if overrides else [])
    sets = [a for o in [*TP8, *overrides] for a in ("--set", o)]
    rc, out, _ = run_cli(capsys, "plan", H100, *sets)
    assert rc == 0 and " ".join(want.split()) in " ".join(out.split())
    assert want in make_plan(r, None, tmp_path / "b").notes
    proj = project(r, resolve_profile(r, None), levels=[1])
    assert proj.verify == want and proj.context == verify_cost(r).context


def test_the_step_model_prices_a_recomputing_verify_as_a_prefill_of_the_sequence():
    reuse = load_recipe(H100, TP8)
    again = load_recipe(H100, [*TP8, FP8_KV])
    m = StepModel(Deployment.from_recipe(again))
    assert m.dep.verify_recomputes and not Deployment.from_recipe(reuse).verify_recomputes
    cost = verify_cost(again)
    v = m.verify_pass(4, cost.block, cost.context)
    prefill = m.target_pass(4, cost.tokens, 0, logits_per_seq=cost.block)
    assert v.seconds == pytest.approx(prefill.seconds) and v.gemm_flops == prefill.gemm_flops
    # Against the same deployment with reuse (same KV dtype, so only the verify design differs).
    with_reuse = StepModel(Deployment.from_recipe(load_recipe(H100, [*TP8, FP8_KV, "build.kv_cache_reuse=true"])))
    assert v.seconds > 10 * with_reuse.verify_pass(4, cost.block, cost.context).seconds
    # A round of 0 drafts on the DFlash server is a context request too; the AR step is the stock engine's.
    assert m.step(4, 0, 1.0, cost.context, plain=False).seconds > 10 * m.step(4, 0, 1.0, cost.context).seconds


def test_project_shows_what_recompute_does_to_the_h100_tp8_recipe():
    """At c = 64 a recomputing verify makes DFlash slower than AR; with reuse it is faster."""
    ratios = {}
    for name, overrides in {"reuse": TP8, "recompute": [*TP8, FP8_KV]}.items():
        r = load_recipe(H100, overrides)
        proj = project(r, resolve_profile(r, None), levels=[1, 64])
        ar, dfl = proj.curves[AR], proj.curves[BANDS]
        ratios[name] = [d.tok_s_user.p50 / a.tok_s_user.p50 for a, d in zip(ar, dfl)]
    assert all(x > 1.5 for x in ratios["reuse"])
    assert ratios["recompute"][1] < 1.0 < ratios["recompute"][0] < ratios["reuse"][0]


def test_replicas_serve_the_endpoints_concurrency_split_between_them():
    """Two replicas of tp 8 at endpoint concurrency 64: each server runs 32 (bands and step time
    at 32), tokens/s per GPU over all 16 GPUs; the same as one tp 8 copy at 32 per GPU."""
    gpt_oss = ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"
    one = load_recipe(gpt_oss, check_rules=False)
    two = load_recipe(gpt_oss, ["parallel.replicas=2", "hardware.count=16"], check_rules=False)
    p1 = project(one, resolve_profile(one, None), levels=[32])
    p2 = project(two, resolve_profile(two, None), levels=[64])
    for name in (AR, BANDS):
        a, b = p1.curves[name][0], p2.curves[name][0]
        assert b.concurrency == 64 and b.tok_s_user.p50 == pytest.approx(a.tok_s_user.p50)
        assert b.output_tok_s_per_gpu == pytest.approx(a.output_tok_s_per_gpu)
    assert p2.layout == "layout: 2 replica(s) of tp 8 on 2 node(s) of 8 b300: every all-reduce stays on NVLink"


def test_check_says_the_gpu_engines_verify_greedily():
    notes = [i.message for i in check(load_recipe(H100, ["build.max_num_tokens=8192"])) if i.field == "backend"]
    assert len(notes) == 1 and notes[0].startswith("the engines verify greedily on GPU")
    assert "74.2 GiB per rank" in notes[0]
    assert not [i for i in check(load_recipe(ROOT / "recipes/cpu/tiny-pystd-engine.yaml")) if "greedily" in i.message]


def test_a_verify_round_takes_as_many_executor_steps_as_max_num_tokens_holds_its_sequences():
    """TensorRT-LLM 1.2.1's scheduler charges each verify request its whole sequence
    (recipe/plan/engine_layout.py STEP_RULE): at 8192 tokens, 5 sequences of 1552 per step, 13 steps for
    64; check says so and names the budget the memory plan fits; the step model pays every step's
    weight read and launch; the FakeExecutor steps by the same rule."""
    from trtllm_dflash.project.stepmodel import Deployment, StepModel
    from trtllm_dflash.recipe.plan.engine_layout import requests_per_step, verify_cost
    from trtllm_dflash.runtime.fake_executor import EngineLimits

    small = load_recipe(H100, ["build.max_num_tokens=8192"])
    cost = verify_cost(small)
    assert cost.planned == 64 and cost.steps(64) == [5] * 12 + [4] and cost.steps(5) == [5]
    notes = [i.message for i in check(small) if i.field == "build.max_num_tokens"]
    assert len(notes) == 1 and "takes 13 Executor steps" in notes[0]
    assert "49664 fits the memory plan and takes 2" in notes[0]
    shipped = load_recipe(H100)
    assert shipped.build.max_num_tokens == 49664 and len(verify_cost(shipped).steps(64)) == 2
    m_small, m_big = StepModel(Deployment.from_recipe(small)), StepModel(Deployment.from_recipe(shipped))
    assert m_small.verify_steps(64, 16, cost.context) == cost.steps(64)
    one, many = m_small.step(5, 15, 8.0, cost.context), m_small.step(64, 15, 8.0, cost.context)
    assert many.target.weight_bytes == pytest.approx(13 * one.target.weight_bytes)  # a weight read per step
    assert m_big.step(64, 15, 8.0, cost.context).seconds < many.seconds
    assert EngineLimits(4096, 4095, 8192).step_size([1552] * 64) == requests_per_step([1552] * 64, 8192, 2048) == 5
    assert StepModel(Deployment.from_recipe(load_recipe(ROOT / "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"))
                     ).verify_steps(64, 8, 1536) == [64]  # the pytorch backend verifies in its generation step


def test_a_step_budget_past_tensorrts_tensor_volume_is_refused():
    """A prefill step packs max_num_tokens tokens; the widest per-token tensor times that passing
    2^31 - 1 elements fails every request in flight (NVIDIA/TensorRT-LLM#2422): check refuses it,
    and the budget it suggests for fewer verify steps stays under it."""
    from trtllm_dflash.recipe.plan.engine_layout import max_step_tokens, widest_per_token

    b200 = ROOT / "recipes/blackwell/b200-llama-3.1-8b-nvfp4.yaml"
    r = load_recipe(b200, check_rules=False)
    assert widest_per_token(r) == (2 * 14336, "the fused gate and up projection")  # Llama-3.1-8B at tp 1
    assert max_step_tokens(r) == (2**31 - 1) // 28672
    errors = [i for i in check(load_recipe(b200, ["build.max_num_tokens=197888"], check_rules=False))
              if i.level == "error" and i.field == "build.max_num_tokens"]
    assert len(errors) == 1 and "tensor volume" in errors[0].message and "issues/2422" in errors[0].message
    notes = [i.message for i in check(load_recipe(b200, ["build.max_num_tokens=16384"]))
             if i.field == "build.max_num_tokens"]
    assert "66560 fits the memory plan and takes 3" in notes[0] and "past TensorRT's tensor volume" in notes[0]
    assert r.build.max_num_tokens <= max_step_tokens(r)
