"""Memory planner formulas, checked against hand arithmetic from the model cards."""

import math
from pathlib import Path

import pytest

from trtllm_dflash.recipe import RecipeError, load_recipe
from trtllm_dflash.recipe.hardware import GiB
from trtllm_dflash.recipe.models import catalog_facts
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.plan.planner import plan

RECIPES = Path(__file__).resolve().parents[3] / "recipes"
LLAMA_H100 = RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"
FP8_KV = "quantization.kv_cache=fp8"  # the hand arithmetic below counts an FP8 KV cache (1 byte per element)
GPT_OSS_B300 = RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"


def row(p, name):
    return next(r for r in p.rows if r.component == name).bytes


def test_param_counts_match_published_sizes():
    llama = catalog_facts("llama-3.1-8b-instruct", "t")
    # docs/design/performance-anchors.md: linear = 32 * (2*4096^2 + 2*4096*1024 + 3*4096*14336) = 6.979B
    assert llama.linear_params == 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert llama.total_params == pytest.approx(8.03e9, rel=2e-3)
    oss = catalog_facts("gpt-oss-120b", "t")
    assert oss.total_params == pytest.approx(116.8e9, rel=5e-3)  # published 116.8B
    assert catalog_facts("qwen3-8b-dflash-b16", "t").total_params == pytest.approx(1.05e9, rel=1e-2)
    assert catalog_facts("gpt-oss-120b-dflash", "t").total_params == pytest.approx(0.78e9, rel=1e-2)


def test_llama_fp8_h100_plan_by_hand():
    p = plan(load_recipe(LLAMA_H100, [FP8_KV, "build.max_num_tokens=8192"]))  # the sums below are at 8192
    # Target: 6.979B linear params at 1 byte (FP8) + embedding and LM head (2 x 128256 x 4096) in BF16.
    linear = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert row(p, "target weights") == linear * 1 + 2 * 128256 * 4096 * 2
    # KV per sequence: 32 layers x (4096 + block 10) tokens x K,V x 8 heads x 128 x 1 byte.
    assert row(p, "target KV cache") == 32 * 4106 * 2 * 8 * 128 * 1
    # The engine backend keeps the drafter context in FP8 when the KV cache is FP8; its arena holds
    # the engine's max_seq_len rows: 4096 + max_draft_len 9.
    assert row(p, "drafter context cache") == 5 * 4105 * 2 * 8 * 128 * 1
    # The engines' tensors (recipe/plan/engine_memory.py): the Executor's logits [64, V] fp32 and its
    # buffers of dflash_ctx [H], dflash_tail [10, H] (bf16) and dflash_argmax [10] for 8192 tokens;
    # the bf16 tail logits of 64 x 10 rows; dflash_logits' fp32 rows per sequence.
    V = 128256
    assert row(p, "target output buffers") == 64 * V * 4 + 8192 * (4096 * 2 + 10 * 4096 * 2 + 10 * 4)
    assert row(p, "verify logits") == 64 * 10 * V * 2
    assert row(p, "verify logits output") == 10 * V * 4
    # Drafter engine at its profile's largest shapes: 64 sequences x 2048 new context rows, block 10;
    # K/V widths 8 x 128, q 32 x 128, ffn 12288; 9 mask slots' logits.
    assert row(p, "drafter engine activations") == (64 * 2048 * 4 * 1024 + 64 * 10 * (2 * 4096 + 4096 + 2 * 1024
                                                     + 3 * 12288) + 64 * 9 * V) * 2
    io = (2 * 10 + 2048 + 2 + 9) * 4 + 2048 * 4096 * 2 + 9 * V * 2
    assert row(p, "drafter engine I/O") == io
    # Start-up memory (weights, activations, reserve, the engines' fixed tensors), then the KV pool
    # takes 0.8 of what is free and the drafter's arena and I/O come out of the other 0.2.
    kv, after = 32 * 4106 * 2 * 8 * 128, 5 * 4105 * 2 * 8 * 128 + io + 10 * V * 4
    fixed = p.fixed_bytes
    assert p.capacity_bytes == 80e9
    assert p.need_bytes == pytest.approx(fixed + max(64 * kv / 0.8, 64 * after / 0.2), rel=1e-12)
    assert p.fits and p.total_bytes == pytest.approx(fixed + 64 * p.per_sequence_bytes, rel=1e-12)
    # The fixed part grows with the batch the engines are built for; every term is linear in it, so
    # the largest batch has a closed form (the planner bisects).
    grow = (fixed - plan(load_recipe(LLAMA_H100, ["build.max_batch_size=1", "build.max_num_tokens=8192"],
                                     check_rules=False)).fixed_bytes) / 63
    assert p.max_concurrency == math.floor((80e9 - (fixed - 64 * grow)) / (grow + max(kv / 0.8, after / 0.2)))
    # Batch-1 bandwidth floor: 8.03 GB read per step at 3.35 TB/s = 2.40 ms (docs/design/performance-anchors.md).
    assert p.bandwidth_floor_ms == pytest.approx(2.40, abs=0.01)


def test_max_concurrency_is_the_exact_fit_boundary():
    p = plan(load_recipe(LLAMA_H100, [FP8_KV, "build.max_num_tokens=8192"]))  # the sums below are at 8192
    n = p.max_concurrency
    # Same max_num_tokens (it sizes the fixed activation buffers), only the batch changes.
    at = plan(load_recipe(LLAMA_H100, [FP8_KV, "build.max_num_tokens=8192", f"build.max_batch_size={n}"],
                          check_rules=False))
    over = plan(load_recipe(LLAMA_H100, [FP8_KV, "build.max_num_tokens=8192", f"build.max_batch_size={n + 1}"],
                            check_rules=False))
    assert at.fits and not over.fits


def test_gpt_oss_b300_tp8_plan():
    p = plan(load_recipe(GPT_OSS_B300))
    t = catalog_facts("gpt-oss-120b", "t")
    # NVFP4 = 4.5 bits per weight; embedding + LM head in BF16; all split over 8 ranks.
    assert row(p, "target weights") == pytest.approx((t.linear_params * 0.5625 + 2 * 201088 * 2880 * 2) / 8)
    # 8 KV heads over 8 ranks = 1 per rank; 18 full layers hold 8192+10 tokens, 18 sliding layers 128+10.
    assert row(p, "target KV cache") == (18 * 8202 + 18 * 138) * 2 * 1 * 64 * 1
    # pytorch backend: BF16 draft context for 8 drafter layers, plus one dummy slot.
    assert row(p, "drafter context cache") == 8 * 8202 * 2 * 1 * 64 * 2
    assert row(p, "drafter dummy slot") == row(p, "drafter context cache")
    assert p.fits and p.max_concurrency >= 256
    assert p.rows[0].bytes / GiB == pytest.approx(7.8, abs=0.2)


def test_tp_splits_weights_and_kv():
    one = plan(load_recipe(None))
    two = plan(load_recipe(None, ["parallel.tp=2"]))
    assert row(two, "target weights") == pytest.approx(row(one, "target weights") / 2)
    assert row(two, "target KV cache") == pytest.approx(row(one, "target KV cache") / 2)


def test_kv_heads_are_replicated_beyond_their_count():
    # Qwen3-Coder-30B-A3B has 4 KV heads: at tp=8 each rank still holds one whole head.
    base = load_recipe(RECIPES / "hopper" / "h200-qwen3-coder-30b-a3b-fp8.yaml")
    eight = plan(load_recipe(base.file, ["hardware.count=8", "parallel.tp=8"]))
    assert row(eight, "target KV cache") == 48 * (8192 + 16) * 2 * 1 * 128 * 1


QWEN_H100 = RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"
QWEN_LAYER = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 12288  # q + kv + o + gated MLP (Qwen3-8B and its drafter)
COPIES = 2 * 151936 * 4096 * 2  # the engine drafter's own embedding + LM head, bf16


def _qwen(tp: int, *more: str):
    return load_recipe(QWEN_H100, [f"parallel.tp={tp}", f"hardware.count={tp}", FP8_KV, *more], check_rules=False)


def test_engine_drafter_weights_count_its_own_embedding_and_lm_head():
    """The engine backend's drafter engine holds copies of the target's embedding and LM head
    (convert's DRAFTER_MAP reads both from the target); the reference drafter shares the target's."""
    linear = 5 * QWEN_LAYER + 5 * 4096**2  # 5 layers + fc (5 taps x H -> H)
    assert row(plan(_qwen(1)), "drafter weights") == linear * 2 + COPIES
    ref = load_recipe(QWEN_H100, ["backend.name=reference"], check_rules=False)
    assert row(plan(ref), "drafter weights") == linear * 2


def test_drafter_placement_rule_by_hand():
    """Qwen3-8B FP8, H100, 64 sequences of 4096 + 16 tokens. Whole drafter: bf16 weights with
    their embedding / LM-head copies + an FP8 context cache of 5 layers x 8 KV heads. A rank's
    target share: FP8 linears + bf16 embedding / head over tp, + the FP8 KV cache of its heads."""
    whole = (5 * QWEN_LAYER + 5 * 4096**2) * 2 + COPIES + 64 * 5 * 4111 * 2 * 8 * 128 * 1  # arena: 4096 + 15 rows

    def share(tp):
        return (36 * QWEN_LAYER * 1 + COPIES) / tp + 64 * 36 * 4112 * 2 * (8 // tp) * 128 * 1

    two, four = drafter_placement(_qwen(2)), drafter_placement(_qwen(4))
    assert two.whole_bytes == whole == four.whole_bytes
    assert (two.target_share_bytes, four.target_share_bytes) == (share(2), share(4))
    assert share(2) > whole > share(4)  # 6.78 GiB between 13.43 and 6.71 GiB
    assert (two.mode, two.tp, four.mode, four.tp) == ("rank0", 1, "split", 4)
    assert four.split_bytes == pytest.approx(whole / 4)
    assert two.exchange_rank0_bytes == 0 < two.exchange_split_bytes and two.split_collectives == 1 + 2 * 5 + 2
    # The plan follows the placement: rank 0 holds the whole drafter at tp 2, a quarter of it at tp 4.
    p2, p4 = plan(_qwen(2)), plan(_qwen(4))
    assert p2.drafter_tp == 1 and row(p2, "drafter weights") == whole - 64 * row(p2, "drafter context cache")
    assert p4.drafter_tp == 4 and row(p4, "drafter weights") == pytest.approx(row(p2, "drafter weights") / 4)


def test_a_drafter_that_does_not_fit_beside_rank_0_is_split():
    """Past the largest batch rank 0 holds with the whole drafter, the drafter is split, and the
    split plan fits up to its own largest batch."""
    whole = plan(_qwen(2, "build.max_batch_size=2"), dtp=1).max_concurrency
    split = plan(_qwen(2, "build.max_batch_size=2"), dtp=2).max_concurrency
    assert whole < split
    p = drafter_placement(_qwen(2, f"build.max_batch_size={whole + 1}"))
    assert not p.rank0_fits and p.mode == "split" and "cannot hold the whole drafter" in p.why
    assert plan(_qwen(2, f"build.max_batch_size={split}")).fits
    assert drafter_placement(_qwen(2, f"build.max_batch_size={whole}")).rank0_fits


def test_only_the_engine_backend_places_its_drafter():
    assert drafter_placement(load_recipe(QWEN_H100)).mode == "rank0"  # tp 1: the one GPU
    for backend in ("reference", "pytorch"):
        p = drafter_placement(_qwen(2, f"backend.name={backend}"))
        assert (p.mode, p.tp) == ("split", 2)


def test_parallel_drafter_overrides_the_rule_on_the_engine_backend_only():
    """tp 2 puts Qwen3-8B's drafter on rank 0 by the rule; `parallel.drafter: split` splits it
    (the first-GPU check of a split drafter on two GPUs), `rank0` keeps it whole at tp 8."""
    assert drafter_placement(_qwen(2)).mode == "rank0"
    split = drafter_placement(_qwen(2, "parallel.drafter=split"))
    assert (split.mode, split.tp) == ("split", 2) and "parallel.drafter" in split.why
    assert (drafter_placement(_qwen(8, "parallel.drafter=rank0")).mode, drafter_placement(_qwen(8)).mode) == (
        "rank0", "split")
    with pytest.raises(RecipeError, match="parallel.drafter: split: only the engine backend places its drafter"):
        load_recipe(QWEN_H100,
                    ["parallel.tp=2", "hardware.count=2", "backend.name=reference", "parallel.drafter=split"])
