"""The memory plan's engine rows (recipe/plan/engine_memory.py) derived from plan.json's engine tensors
and dims, as `build --dry-run` writes them: the plan and the build plan cannot drift."""

import json
import math
from pathlib import Path

import pytest

from trtllm_dflash.engines.stage import build
from trtllm_dflash.formats import engine_io
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.plan.engine_memory import EXECUTOR_OUTPUTS
from trtllm_dflash.recipe.plan.planner import plan

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QWEN_H100 = RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"
LLAMA_B200 = RECIPES / "blackwell" / "b200-llama-3.1-8b-nvfp4.yaml"
TINY = RECIPES / "cpu" / "tiny-pystd-engine.yaml"
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int32": 4, "int64": 8}
# Stock inputs of a few int32 per sequence or token: the runtime reserve covers them.
STOCK = {"input_ids", "position_ids", "last_token_ids", "sequence_length", "context_lengths", "host_context_lengths",
         "host_request_types", "host_past_key_value_lengths", "host_max_attention_window_sizes",
         "host_sink_token_length", "cache_indirection", "kv_cache_block_offsets", "host_kv_cache_block_offsets",
         "host_kv_cache_pool_pointers", "host_kv_cache_pool_mapping", "host_runtime_perf_knobs",
         "host_context_progress", "all_reduce_workspace"}


def _plan_json(recipe, tmp_path) -> dict:
    build(recipe, None, tmp_path / "build", dry_run=True, say=lambda _: None)
    return json.loads((tmp_path / "build" / "plan.json").read_text())


def _size(t: dict, dims: dict, first: int | None = None, dtype: str | None = None) -> float:
    """Bytes of a plan.json tensor at its largest shape (`first` replaces its first dim)."""
    shape = [dims[s] if isinstance(s, str) else s for s in t["shape"]]
    if first is not None:
        shape[0] = first
    return math.prod(shape) * BYTES[dtype or t["dtype"]]


def rows_from_plan_json(pj: dict, recipe) -> dict[str, float]:
    """The engine rows of the memory plan, from plan.json (the rules: recipe/plan/engine_memory.py)."""
    (t,), (d,) = ([e for e in pj["engines"] if e["role"] == r] for r in ("target", "drafter"))
    td, dd = t["dims"], d["dims"]
    out, ins = {o["name"]: o for o in t["outputs"]}, {i["name"]: i for i in d["inputs"] + d["outputs"]}
    act = ins["ctx_rows"]["dtype"]
    tp, dtp = pj["tp"], pj["drafter_parallelism"]["tp"]
    logits = out["dflash_logits"]
    io = [n for n in ins if "cache_{l}" not in n and n != "all_reduce_workspace"]
    arena = [n for n in ins if n in ("k_cache_{l}", "v_cache_{l}")]
    B, C, T, V = dd["batch"], dd["new_ctx"], dd["block"], dd["vocab"]
    kv, f = dd["kv_heads"] * dd["head_dim"], recipe.drafter_facts
    q, ffn = math.ceil(f.num_attention_heads / dtp) * f.head_dim, f.intermediate_size / dtp
    drafter_act = (B * C * 4 * kv + B * T * (2 * dd["hidden"] + q + 2 * kv + 3 * ffn)
                   + B * (T - 1) * V * (1 / dtp + (dtp > 1))) * BYTES[act]
    return {
        "target output buffers": _size(out["logits"], td)
        + sum(_size(out[n], td, first=td["num_tokens"]) for n in EXECUTOR_OUTPUTS),
        "verify logits": _size(logits, td, dtype=act) * (1 + ((1 / tp + 1) if tp > 1 else 0)),
        "verify logits output": 0.0 if "dflash_logits" in EXECUTOR_OUTPUTS else _size(logits, td) / td["num_seq"],
        "drafter engine activations": drafter_act,
        "drafter engine I/O": sum(_size(ins[n], dd) for n in io) / B,
        "drafter context cache": dd["num_layers"] * sum(_size(ins[n], dd) for n in arena) / B,
    }


def _check(recipe, tmp_path) -> None:
    got = {r.component: r.bytes for r in plan(recipe).rows}
    want = rows_from_plan_json(_plan_json(recipe, tmp_path), recipe)
    assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("path,overrides", [
    (TINY, []),
    (TINY, ["build.max_input_len=100", "build.max_batch_size=5", "build.max_num_tokens=700"]),
    (TINY, ["speculative.draft_len=[{max_concurrency: 4, draft_len: 7}, {max_concurrency: 16, draft_len: 3}]"]),
    (QWEN_H100, []),
    (QWEN_H100, ["parallel.tp=8", "hardware.count=8"]),  # split drafter
    (QWEN_H100, ["parallel.tp=2", "hardware.count=2"]),  # the whole drafter on rank 0
    (LLAMA_B200, ["build.max_num_tokens=4200"]),
])
def test_plan_rows_are_plan_json_tensors_at_their_largest(path, overrides, tmp_path):
    _check(load_recipe(path, overrides, check_rules=False), tmp_path)


def test_a_changed_dim_range_the_plan_does_not_follow_is_caught(tmp_path, monkeypatch):
    """Cap the drafter profile's new_ctx (the audit's idea: max_num_tokens // batch rows per
    sequence): plan.json follows the profile, the planner does not know of it, and the check fails."""
    stock = engine_io.drafter_dim_ranges

    def capped(batch, max_input_len, max_seq_len, block):
        r = stock(batch, max_input_len, max_seq_len, block)
        return {**r, "new_ctx": (1, 1, max(1, max_input_len // 4))}

    monkeypatch.setattr(engine_io, "drafter_dim_ranges", capped)
    recipe = load_recipe(TINY)
    ranges = _plan_json(recipe, tmp_path)["engines"][1]["dim_ranges"]
    assert ranges["new_ctx"] == [1, 1, recipe.build.max_input_len // 4]
    with pytest.raises(AssertionError):
        _check(recipe, tmp_path / "again")


def test_every_engine_tensor_is_counted_or_stock(tmp_path):
    """Each plan.json tensor is in a row above or a small stock input the runtime reserve covers."""
    pj = _plan_json(load_recipe(QWEN_H100, check_rules=False), tmp_path)
    counted = {"logits", *engine_io.TARGET_OUTPUTS, *engine_io.DRAFTER_INPUTS, *engine_io.DRAFTER_OUTPUTS,
               "k_cache_{l}", "v_cache_{l}", "present_k_cache_{l}", "present_v_cache_{l}"}
    stock = 0.0
    for e in pj["engines"]:
        for t in e["inputs"] + e["outputs"]:
            assert t["name"] in counted | STOCK, t["name"]
            stock += _size(t, {**e["dims"], "all_reduce_size": 1}) if t["name"] in STOCK else 0
    assert stock < 16 * 2**20  # of the 2 GiB runtime reserve


def test_the_executor_registers_exactly_the_outputs_the_plan_counts():
    from tests.helpers import fake_bindings
    from trtllm_dflash.runtime import trt_runners

    cfg = trt_runners.executor_config(1, bindings=fake_bindings.module())
    assert [o.name for o in cfg.additional_model_outputs] == list(EXECUTOR_OUTPUTS)
    assert "dflash_logits" not in EXECUTOR_OUTPUTS  # N x block x vocab fp32: 75 GiB per rank for Qwen3-8B at N 8192
