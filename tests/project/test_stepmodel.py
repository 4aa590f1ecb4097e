"""The step-time model's formulas, checked by hand arithmetic on the shipped recipes."""

from dataclasses import replace
from pathlib import Path

import pytest

from trtllm_dflash.errors import UserError
from trtllm_dflash.project.rates import Assumptions, rates_for
from trtllm_dflash.project.stepmodel import Deployment, StepModel
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.hardware import Measured, hardware_catalog
from trtllm_dflash.recipe.plan.planner import plan

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
LLAMA_H100 = RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"
# The hand arithmetic below is written for an FP8 KV cache (1 byte per element) with KV block reuse
# opted in, so that verify runs only the new tokens (tests/project/test_verify_cost.py: without reuse).
FP8_KV = ("quantization.kv_cache=fp8", "build.kv_cache_reuse=true")
GPT_OSS = RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"


def model(path, overrides=(), **assume):
    r = load_recipe(path, [*(FP8_KV if path == LLAMA_H100 else ()), *overrides], check_rules=False)
    return r, StepModel(Deployment.from_recipe(r), Assumptions(**assume))


def test_ar_step_reads_what_the_planner_says_and_costs_what_the_formula_says():
    r, m = model(LLAMA_H100)
    a = m.a
    s = m.step(1, 0, 1.0, 1000)
    t = r.target_facts
    assert s.target.weight_bytes == pytest.approx(plan(r).weights_read_per_step_bytes)
    # GEMM FLOPs: 2 per parameter per token (linear layers + LM head).
    assert s.target.gemm_flops == pytest.approx(2 * (t.linear_params + t.vocab_size * t.hidden_size))
    # KV read: 32 layers x (1000 + 1) tokens x K,V x 8 heads x 128 x 1 byte (FP8).
    assert s.target.kv_bytes == 32 * 1001 * 2 * 8 * 128
    bw = 3.35e12
    expected = (s.target.weight_bytes / (bw * a.hbm_efficiency)
                + 2 * t.linear_params / (1979e12 * a.tensor_efficiency)  # FP8 GEMMs
                + 2 * t.vocab_size * t.hidden_size / (989e12 * a.tensor_efficiency)  # BF16 head
                + s.target.kv_bytes / (bw * a.attention_efficiency)
                + s.target.attention_flops / (989e12 * a.attention_efficiency)
                + (32 + 1) * a.layer_overhead_us * 1e-6 + a.step_overhead_ms * 1e-3 + a.seq_overhead_us * 1e-6)
    assert s.seconds == pytest.approx(expected, rel=1e-9)
    assert s.tok_s_user == pytest.approx(1 / s.seconds) and s.tok_s_gpu(1) == pytest.approx(1 / s.seconds)


def test_dflash_round_adds_a_drafter_pass_and_verifies_k_plus_one_tokens():
    r, m = model(LLAMA_H100)
    ar, dfl = m.step(8, 0, 1.0, 1000), m.step(8, 9, 4.0, 1000)
    t = r.target_facts
    # The verify pass: 8 sequences x 10 tokens through the same weights; 10x the GEMM FLOPs.
    assert dfl.target.weight_bytes == pytest.approx(ar.target.weight_bytes)
    assert dfl.target.gemm_flops == pytest.approx(10 * ar.target.gemm_flops)
    embedding = t.vocab_size * t.hidden_size
    assert dfl.drafter.weight_bytes == pytest.approx(r.drafter_facts.linear_params * 2 + embedding * 2)
    assert dfl.drafter.seconds > 0 and ar.drafter.seconds == 0
    # Two forward passes' launch costs in a round, one in an AR step; and the round is our loop's
    # (the engine backend): its measured host time, fixed and per request (rates.LOOP_COST)
    loop = m.a.loop_overhead_us * 1e-6 + 8 * m.a.loop_request_us * 1e-6
    assert dfl.t_overhead - ar.t_overhead == pytest.approx(m.a.step_overhead_ms * 1e-3 + loop)
    # tokens/s/GPU = c * tau / T; tokens/s/user = tau / T.
    assert dfl.tok_s_gpu(1) == pytest.approx(8 * 4.0 / dfl.seconds)
    assert dfl.tok_s_user == pytest.approx(4.0 / dfl.seconds)


def test_kv_and_context_cache_grow_with_sequences_and_context():
    _, m = model(LLAMA_H100)
    a, b, c = m.step(4, 5, 3.0, 1000), m.step(8, 5, 3.0, 1000), m.step(4, 5, 3.0, 2000)
    assert b.target.kv_bytes == pytest.approx(2 * a.target.kv_bytes)
    assert b.drafter.kv_bytes == pytest.approx(2 * a.drafter.kv_bytes)
    assert c.target.kv_bytes / a.target.kv_bytes == pytest.approx(2006 / 1006)


def test_moe_verify_reads_the_expected_distinct_experts():
    """docs/design/performance-anchors.md, "Mixture-of-experts verify": under uniform top-4 routing over 128 experts, 16
    tokens touch 51.0 experts per layer on average; a 1-token step touches 4."""
    r, m = model(GPT_OSS, ["parallel.tp=1", "hardware.count=1"])
    t = r.target_facts
    expert_bytes = 3 * t.hidden_size * t.moe_intermediate_size * 0.5625 * t.num_layers
    one, sixteen = m.target_pass(1, 1, 100), m.target_pass(1, 16, 100)
    assert (sixteen.weight_bytes - one.weight_bytes) / expert_bytes == pytest.approx(51.0 - 4.0, abs=0.05)
    # ... while the GEMM FLOPs follow the 4 active experts per token.
    assert sixteen.gemm_flops / one.gemm_flops == pytest.approx(16, rel=1e-9)


def test_tensor_parallel_splits_weights_and_adds_all_reduces():
    _, m1 = model(GPT_OSS, ["parallel.tp=1", "hardware.count=1"])
    _, m8 = model(GPT_OSS)
    p1, p8 = m1.target_pass(4, 1, 1000), m8.target_pass(4, 1, 1000)
    assert p8.weight_bytes == pytest.approx(p1.weight_bytes / 8)
    assert p1.t_allreduce == 0 and p8.t_allreduce > 0
    a = m8.a
    # 2 all-reduces per layer of 4 tokens x 2880 BF16 values, ring over 8 ranks at 900 GB/s one way.
    per = a.allreduce_latency_us * 1e-6 + 2 * 7 / 8 * 4 * 2880 * 2 / (900e9 * a.nvlink_efficiency)
    assert p8.t_allreduce == pytest.approx(2 * 36 * per)


def test_quantized_formats_use_their_tensor_rates():
    _, fp4 = model(GPT_OSS)
    assert fp4.rates.gemm_flops("nvfp4") == pytest.approx(13125e12 * fp4.a.tensor_efficiency)
    assert fp4.dep.gemm_format == "nvfp4" and fp4.dep.head_format == "bf16"
    _, h100 = model(LLAMA_H100)
    with pytest.raises(UserError, match="no dense tensor rate for nvfp4"):
        h100.rates.gemm_flops("nvfp4")


def test_prefill_share_is_paid_by_the_steps_of_a_request():
    _, m = model(LLAMA_H100)
    with_prompts = m.step(16, 9, 4.0, 1500, prompt_len=1024, output_len=1024)
    without = m.step(16, 9, 4.0, 1500)
    t_pre = m.prefill(1024) + m.a.step_overhead_ms * 1e-3  # the pass and its launch
    assert with_prompts.t_prefill == pytest.approx(t_pre)
    # 16 prompt passes spread over the (1024 - 1) / 4 rounds of a request.
    assert with_prompts.seconds - without.seconds == pytest.approx(16 * t_pre / (1023 / 4))
    # A request waits for the round in progress, then its prompt pass; E2E adds its rounds.
    assert with_prompts.ttft == pytest.approx(t_pre + with_prompts.seconds)
    assert with_prompts.e2e == pytest.approx(with_prompts.ttft + 1023 * with_prompts.seconds / 4)
    assert with_prompts.tok_s_gpu(2) == pytest.approx(16 * 1024 / with_prompts.e2e / 2)


def test_measured_rates_replace_peaks_and_assumptions():
    gpu = hardware_catalog()["h100-sxm"].model_copy(update={"measured": Measured(
        source="test", attention_fraction=0.8, step_overhead_ms=1.5)})
    r = rates_for(gpu, Assumptions())
    assert r.attention_bps == pytest.approx(3.35e12 * 0.8) and r.step_s == pytest.approx(1.5e-3)
    assert r.memory_bps == pytest.approx(3.35e12 * 0.8)  # hbm_efficiency default 0.80, not measured
    assert r.seq_s == pytest.approx(30e-6) and "measured: test" in r.source
    cpu = hardware_catalog()["cpu"].model_copy(update={"measured": None})
    with pytest.raises(UserError, match="no memory bandwidth"):
        rates_for(cpu, Assumptions())


def test_bad_draft_lengths_and_missing_interconnect_are_user_errors():
    _, m = model(LLAMA_H100)
    with pytest.raises(UserError, match="draft length 10: must be in 0..9"):
        m.step(1, 10, 3.0, 100)
    r = load_recipe(None, ["parallel.tp=2"], check_rules=False)
    with pytest.raises(UserError, match="no interconnect bandwidth"):
        StepModel(Deployment.from_recipe(r))


def test_more_efficient_kernels_never_slow_a_step_down():
    _, m = model(GPT_OSS)
    base = m.step(32, 7, 4.0, 1500, 1024, 1024).seconds
    for field, value in (("hbm_efficiency", 0.95), ("tensor_efficiency", 0.9), ("attention_efficiency", 0.9),
                         ("nvlink_efficiency", 0.95), ("layer_overhead_us", 0.0), ("seq_overhead_us", 0.0)):
        assert m.with_assumptions(**{field: value}).step(32, 7, 4.0, 1500, 1024, 1024).seconds < base, field
    assert replace(m.a, step_overhead_ms=0.0) != m.a


def test_the_drafter_pass_runs_where_the_placement_rule_puts_it():
    """Llama-3.1-8B FP8 engine recipe: at tp 2 rank 0 holds the whole drafter (one GPU streams all
    of it, no all-reduce), at tp 4 it is split (a quarter each, two all-reduces per layer)."""
    _, one = model(LLAMA_H100)
    _, two = model(LLAMA_H100, ["parallel.tp=2", "hardware.count=2"])
    _, four = model(LLAMA_H100, ["parallel.tp=4", "hardware.count=4"])
    assert (two.dep.drafter_tp, four.dep.drafter_tp) == (1, 4)
    p1, p2, p4 = (m.drafter_pass(8, 9, 1000, 4.0) for m in (one, two, four))
    assert p2.weight_bytes == p1.weight_bytes and p2.t_allreduce == 0.0
    assert p4.weight_bytes == pytest.approx(p1.weight_bytes / 4) and p4.t_allreduce > 0.0
    assert two.target_pass(8, 10, 1000).t_allreduce > 0.0  # the target is split either way


GPT_OSS_2x8 = ["parallel.tp=16", "hardware.count=16"]


def test_tp_across_nvlink_domains_all_reduces_over_the_fabric():
    """tp 16 on two 8-GPU B300 nodes: the NVLink ring inside each node plus each GPU's 1/8 shard
    all-reduced between the two nodes over its 100 GB/s ConnectX-8 share (catalog fabric_gbs)."""
    _, eight = model(GPT_OSS, ["parallel.tp=8"])
    _, sixteen = model(GPT_OSS, GPT_OSS_2x8)
    r, a = sixteen.rates, sixteen.a
    assert (r.domain, r.fabric_bps) == (8, 100e9 * a.fabric_efficiency) and r.fabric_latency_s == pytest.approx(20e-6)
    layers, n, hidden = 36, 64, 2880
    size = n * hidden * 2
    nvl = a.allreduce_latency_us * 1e-6 + 2 * 7 / 8 * size / r.link_bps
    fabric = r.fabric_latency_s + 2 * 1 / 2 * (size / 8) / r.fabric_bps
    assert sixteen._allreduce(layers, n, hidden) == pytest.approx(2 * layers * (nvl + fabric))
    assert eight._allreduce(layers, n, hidden) == pytest.approx(2 * layers * nvl)
    # Per user, tp 16 across two nodes is slower than tp 8 on one at batch 1 (it used to look faster).
    assert sixteen.step(1, 0, 1.0, 1536).seconds > eight.step(1, 0, 1.0, 1536).seconds


def test_a_gpu_without_a_fabric_cannot_project_tp_across_nodes():
    r = load_recipe(GPT_OSS, GPT_OSS_2x8, check_rules=False)
    dep = Deployment.from_recipe(r)
    gpu = dep.gpu.model_copy(update={"fabric_gbs": None})
    with pytest.raises(UserError, match="spans NVLink domains of 8 GPUs, and the catalog has no inter-node fabric"):
        StepModel(replace(dep, gpu=gpu))


def test_the_loops_host_time_comes_from_the_bench_and_only_our_loop_pays_it():
    """Assumptions' loop terms are what `bench loop --record` measured (project/loop_cost.json, with
    the machine it ran on); a round of our loop pays them, TensorRT-LLM's native DFlash (the
    pytorch backend, its own loop) and the stock engine's AR step do not."""
    from trtllm_dflash.project.rates import LOOP_COST

    a = Assumptions()
    assert (a.loop_overhead_us, a.loop_request_us) == (LOOP_COST["fixed_us"], LOOP_COST["per_request_us"]) != (0, 0)
    assert LOOP_COST["machine"]["cpus"] >= 1 and "bench loop --record" in LOOP_COST["command"]
    _, engine = model(LLAMA_H100)
    assert engine.dep.round_loop
    assert engine.step(16, 0, 1.0, 1000).t_overhead < engine.step(16, 0, 1.0, 1000, plain=False).t_overhead
    r = load_recipe(RECIPES / "hopper" / "h200-qwen3-coder-30b-a3b-fp8.yaml", check_rules=False)
    native = StepModel(Deployment.from_recipe(r))
    assert not native.dep.round_loop
    assert native.step(16, 3, 2.5, 1000).t_overhead == pytest.approx(2 * native.rates.step_s + 16 * native.rates.seq_s)
