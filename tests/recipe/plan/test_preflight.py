"""Pre-flight for multi-GPU deployments: the tp rules (recipe/plan/sharding.py), the per-rank memory
`check` prints, the smallest tp per GPU type, and a recipe that cannot fit failing `check`.

The expected numbers are computed here from the architecture facts (literal model-card numbers),
not by calling the planner's own functions. GiB values `check` prints are rounded to 2 decimals,
so they are compared within 0.006 GiB (half a unit of the last digit, plus float slack)."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import RecipeError, load_recipe
from trtllm_dflash.recipe.hardware import hardware_catalog
from trtllm_dflash.recipe.plan.planner import plan, smallest_tp
from trtllm_dflash.recipe.plan.sharding import ModelDims, allowed_tps, kv_heads_per_rank, problem, vocab_rows_per_rank

RECIPES = Path(__file__).resolve().parents[3] / "recipes"
GPT_OSS = RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"
LLAMA_H100 = RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"
GiB = 2**30
F = 0.8  # the free-memory fraction deploy writes for the KV pool


def gpt_oss_need(tp: int, batch: int = 256, seq: int = 8192) -> dict:
    """Per-rank bytes of the gpt-oss recipe (pytorch backend: NVFP4 target, FP8 KV, BF16 drafter,
    block 10, max_num_tokens 32768) by hand from the model cards (openai/gpt-oss-120b,
    z-lab/gpt-oss-120b-DFlash config.json)."""
    h, heads, kv, hd, layers, experts, top_k, moe_i, vocab = 2880, 64, 8, 64, 36, 128, 4, 2880, 201088
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    linear = layers * (attn + experts * 3 * h * moe_i + h * experts)
    rows = -(-vocab // tp)  # TensorRT-LLM pads the vocabulary to a multiple of tp
    kv_rank = -(-kv // tp)  # KV heads replicated past 8 ranks
    d_layers, d_inter, fc = 8, 7680, 5 * h * h
    d_linear = d_layers * (attn + 3 * h * d_inter)
    block = 10
    r = {
        "target weights": linear * 0.5625 / tp + 2 * rows * h * 2,  # NVFP4 = 4.5 bits; embed + head bf16
        "drafter weights": d_linear * 2 / tp + fc * 2,  # TensorRT-LLM's DFlash replicates fc
        "activations": 32768 * (5 * h + 4 * h + 2 * top_k * moe_i / tp) * 2,
        "runtime reserve": 2 * GiB,
        "verify logits": batch * block * rows * 4,
        # 18 full layers hold seq + block tokens, 18 sliding layers 128 + block.
        "target KV cache": batch * (18 * (seq + block) + 18 * (128 + block)) * 2 * kv_rank * hd * 1,
        "drafter context cache": batch * d_layers * (seq + block) * 2 * kv_rank * hd * 2,
    }
    r["drafter dummy slot"] = r["drafter context cache"] / batch
    startup = sum(r[k]
                  for k in ("target weights", "drafter weights", "activations", "runtime reserve", "verify logits"))
    arena = r["drafter context cache"] + r["drafter dummy slot"]
    r["need"] = startup + max(r["target KV cache"] / F, arena / (1 - F))
    r["startup"] = startup
    return r


def table(out: str) -> dict[str, list[str]]:
    """The first line of every row of a rich table in `out`: name -> cells."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] and cells[0] not in rows:
            rows[cells[0]] = cells
    return rows


def run_cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- tp rules, one per dimension


def test_heads_kv_heads_ffn_and_vocab_rules():
    llama = ModelDims("target", 32, 8, intermediate_size=14336, vocab_size=128256)
    assert problem(llama, 3, "engine").startswith("3 does not divide target num_attention_heads 32")
    assert allowed_tps([llama], "engine", 16) == [1, 2, 4, 8, 16]
    # 8 KV heads at tp 16: TensorRT-LLM repeats each KV head on 2 ranks (layers/linear.py
    # Linear.postprocess asserts tp % num_kv_heads == 0), so the split itself is allowed.
    assert problem(llama, 16, "engine") is None and kv_heads_per_rank(8, 16) == 1
    # 12 KV heads at tp 8: neither divides the other.
    assert "num_kv_heads 12: one must divide the other" in problem(ModelDims("target", 48, 12), 8, "pytorch")
    wide = ModelDims("target", 32, 8, intermediate_size=14340)  # 14340 = 4 x 3585
    assert problem(wide, 8, "pytorch") == "8 does not divide target intermediate_size 14340"
    assert problem(wide, 4, "pytorch") is None


def test_vocab_is_padded_by_tensorrt_llm_but_not_by_our_converter():
    odd = ModelDims("target", 32, 8, vocab_size=151937)
    assert problem(odd, 8, "pytorch") is None  # TensorRT-LLM's LMHead / Embedding pad to a multiple of tp
    assert vocab_rows_per_rank(151937, 8) == 18993 and 18993 * 8 == 151944
    msg = problem(odd, 8, "engine")
    assert msg.startswith("8 does not divide target vocab_size 151937 (convert splits the embedding and LM head")
    assert "pad it to 151944" in msg and problem(odd, 8, "reference") == msg


def test_moe_is_expert_parallel_on_pytorch_and_split_per_expert_by_our_converter():
    moe = ModelDims("target", 32, 4, num_experts=20, moe_intermediate_size=768)
    assert problem(moe, 8, "pytorch").startswith("8 does not divide target num_experts 20")
    assert problem(moe, 8, "reference") is None  # 768 / 8 = 96 per expert and rank
    assert problem(moe, 4, "pytorch") is None  # 5 whole experts per rank


def test_the_drafter_fc_is_split_by_our_converter_only():
    drafter = ModelDims("drafter", 32, 8, intermediate_size=12288, fc_out=4100)
    assert problem(drafter, 8, "engine").startswith("8 does not divide drafter hidden_size 4100")
    assert problem(drafter, 8, "pytorch") is None  # TensorRT-LLM's DFlash replicates fc


def test_recipe_tp_error_is_one_line_with_the_tps_that_work(tmp_path):
    with pytest.raises(RecipeError) as e:
        load_recipe(LLAMA_H100, ["parallel.tp=3", "hardware.count=4"])
    msg = str(e.value)
    assert msg == (f"{LLAMA_H100} (--set parallel.tp=3): parallel.tp: 3 does not divide target num_attention_heads 32; "
                   "allowed: [1, 2, 4, 8]")


def test_tp16_replicates_kv_heads_but_one_node_has_eight_gpus():
    with pytest.raises(RecipeError) as e:
        load_recipe(LLAMA_H100, ["parallel.tp=16", "hardware.count=16", "build.max_batch_size=8",
                                 "sweep.concurrency=[1, 8]"])
    (line,) = str(e.value).splitlines()  # the KV heads pass; the layout (recipe/plan/placement.py) does not
    assert line.startswith(f"{LLAMA_H100} (--set hardware.count=16): hardware.count: 16 > 8 h100-sxm per node: only "
                           "the pytorch backend spans")


def test_convert_refuses_what_the_recipe_rules_refuse():
    """convert reads config.json and applies the same rules (our converter's layout)."""
    from trtllm_dflash.convert.shard_plan import check_tp

    t = SimpleNamespace(num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=1001, moe=None)
    d = SimpleNamespace(num_heads=4, num_kv_heads=2, intermediate_size=128, hidden_size=64)
    check_tp(1, t, d)
    with pytest.raises(UserError, match=r"^parallel.tp: 2 does not divide target vocab_size 1001 .*pad it to 1002\)"
                                        r"; allowed: \[1\]$"):
        check_tp(2, t, d)


# ---------------------------------------------------------------- memory per rank


def test_check_prints_the_per_rank_table_of_the_headline_recipe(capsys):
    rc, out, _ = run_cli(capsys, "check", str(GPT_OSS))
    assert rc == 0 and out.startswith("ok: ")
    rows, hand = table(out), gpt_oss_need(8)
    for name in ("target weights", "drafter weights", "activations", "runtime reserve", "verify logits",
                 "target KV cache", "drafter context cache", "drafter dummy slot"):
        assert float(rows[name][2]) == pytest.approx(hand[name] / GiB, abs=0.006), name
    assert rows["target KV cache"][1] == "KV pool" and rows["drafter context cache"][1] == "after pool"
    assert float(rows["need per rank"][2]) == pytest.approx(hand["need"] / GiB, abs=0.006)
    assert float(rows["KV pool"][2]) == pytest.approx(F * (288e9 - hand["startup"]) / GiB, abs=0.006)
    assert float(rows["device memory"][2]) == pytest.approx(288e9 / GiB, abs=0.006)
    # Largest batch: every term is linear in it (the arena has one extra slot), so a closed form.
    per = {k: hand[k] / 256 for k in ("verify logits", "target KV cache", "drafter context cache")}
    s0 = hand["startup"] - hand["verify logits"]
    by_kv = (288e9 - s0) / (per["verify logits"] + per["target KV cache"] / F)
    by_arena = (288e9 - s0 - per["drafter context cache"] / (1 - F)) / (per["verify logits"]
                                                                      + per["drafter context cache"] / (1 - F))
    assert f"max concurrency that fits = {math.floor(min(by_kv, by_arena))} sequences" in out


def test_smallest_tp_for_gpt_oss_nvfp4_needs_more_than_one_h100(capsys):
    recipe = load_recipe(GPT_OSS)
    catalog = hardware_catalog()
    # By hand: the least tp in 1, 2, 4, 8 (what splits 64 heads, 8 KV heads, 128 experts and the
    # drafter) whose need fits the GPU.
    expected = {g: next((tp for tp in (1, 2, 4, 8) if gpt_oss_need(tp)["need"] <= catalog[g].memory_bytes), None)
                for g in ("h100-sxm", "h200", "b200", "b300")}
    assert gpt_oss_need(1)["target weights"] > 65e9  # NVFP4 weights alone fill most of an 80 GB H100
    assert expected["h100-sxm"] > 1
    for g, tp in expected.items():
        fit = smallest_tp(recipe, catalog[g])
        assert fit.tp == tp and fit.need_bytes == pytest.approx(gpt_oss_need(tp)["need"], rel=1e-9), g
    assert smallest_tp(recipe, catalog["h100-sxm"]).unsupported == ["nvfp4"]
    rc, out, _ = run_cli(capsys, "check", str(GPT_OSS))
    h100 = table(out)["h100-sxm"]
    assert h100[2] == str(expected["h100-sxm"]) and "memory only: nvfp4 not supported" in h100[4]


def test_a_recipe_that_does_not_fit_its_tp_fails_check_with_the_numbers(capsys):
    args = ["--set", "hardware.gpu=b200", "--set", "hardware.count=1", "--set", "parallel.tp=1"]
    rc, out, err = run_cli(capsys, "check", str(GPT_OSS), *args)
    need = gpt_oss_need(1)["need"]
    assert need > 180e9 >= gpt_oss_need(2)["need"]  # by hand: tp 1 does not fit a B200, tp 2 does
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {GPT_OSS}:11:9: build.max_batch_size: 256 sequences of 8192 tokens need "
                          f"{need / GiB:.1f} GiB per rank at tp 1 (KV pool: free_gpu_memory_fraction 0.8); "
                          f"b200 has {180e9 / GiB:.1f} GiB; largest that fits: ")
    assert err.endswith("at tp 1; smallest tp that fits on b200: 2\n")


def test_weights_that_fit_no_batch_name_parallel_tp(capsys):
    bf16 = ["quantization.target_weights=bf16", "quantization.activations=bf16", "quantization.kv_cache=bf16"]
    overrides = bf16 + ["hardware.gpu=h200", "hardware.count=1", "parallel.tp=1"]
    with pytest.raises(RecipeError) as e:
        load_recipe(GPT_OSS, overrides)
    assert f"{GPT_OSS} (--set parallel.tp=1): parallel.tp: 256 sequences of 8192 tokens need " in str(e.value)
    assert "largest that fits: 0 at tp 1" in str(e.value)  # 117B BF16 weights alone exceed 141 GB


def test_the_drafter_arena_after_the_kv_pool_is_checked_issue_16005():
    """TensorRT-LLM's DFlash allocates its dense context arena after the KV pool took 0.8 of the
    free memory; an arena that does not fit the rest starves admission or fails to allocate
    (https://github.com/NVIDIA/TensorRT-LLM/issues/16005, open). At 131072 tokens the target's KV
    cache fits its pool on 8 B300s but the arena does not fit what the pool leaves, so check
    refuses the recipe, and no tp on one node fits."""
    long = ["build.max_seq_len=131072"]
    hand = gpt_oss_need(8, seq=131072)
    room = 288e9 - hand["startup"]
    assert hand["target KV cache"] <= F * room  # the pool alone would hold the KV cache
    assert hand["drafter context cache"] + hand["drafter dummy slot"] > (1 - F) * room
    with pytest.raises(RecipeError) as e:
        load_recipe(GPT_OSS, long)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and f"need {hand['need'] / GiB:.1f} GiB per rank at tp 8" in msg
    assert msg.endswith("smallest tp that fits on b300: none up to 8 per node")


def test_the_plan_uses_the_fraction_deploy_writes(tmp_path):
    from trtllm_dflash.deploy.llmapi import extra_llm_api_options

    recipe = load_recipe(GPT_OSS)
    options = extra_llm_api_options(recipe, tmp_path, tmp_path / "trtllm_serve")
    written = options["kv_cache_config"]["free_gpu_memory_fraction"]
    assert plan(recipe).kv_fraction == written == F
    ref = plan(load_recipe(None))  # the reference backend has no KV pool: it needs every row
    assert ref.kv_fraction is None and ref.kv_pool_bytes is None
    assert ref.need_bytes == pytest.approx(sum(r.bytes * (16 if r.per_sequence else 1) for r in ref.rows), rel=1e-12)
    assert {r.where for r in ref.rows if r.per_sequence} == {"start-up", "on demand"}


def test_drafter_context_per_token_matches_the_upstream_figure():
    """Issue #16005: "10 KB/token/rank" at TP2 for a 5-layer, 8-KV-head BF16 drafter (head dim
    128): 5 x K,V x 4 heads x 128 x 2 bytes = 10240 bytes per token on each of 2 ranks."""
    from trtllm_dflash.recipe.models import catalog_facts
    from trtllm_dflash.recipe.plan.rows import drafter_ctx_bytes_per_seq

    d = catalog_facts("qwen3-8b-dflash-b16", "test")
    assert drafter_ctx_bytes_per_seq(d, 2, 1, 0, 2.0) == 10240
