"""The engine I/O contract (formats/engine_io.py): the plan's tensor names are the contract's, the
in-graph tail-row rule equals the CPU target engine's rows on packed batches, the 1.2.1
additional-output naming, and the tap weights the target engine copies from the drafter."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from trtllm_dflash.engines.plan import make_plan
from trtllm_dflash.errors import UserError
from trtllm_dflash.formats import engine_io
from trtllm_dflash.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tp", [1, 2, 4])  # the drafter kept whole at tp 2, split at tp 4 (the placement rule)
def test_plan_names_are_the_contracts(tp, tmp_path):
    recipe = load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml", [f"parallel.tp={tp}", f"hardware.count={tp}"])
    plan = make_plan(recipe, None, tmp_path)
    target, drafter = plan.engine("target"), plan.engine("drafter")
    assert [t.name for t in target.outputs] == ["logits", *engine_io.TARGET_OUTPUTS]
    assert set(engine_io.GATHER_CONTEXT) == set(engine_io.TARGET_OUTPUTS)
    arena = engine_io.arena_names(1)
    names = [t.name.replace("{l}", "0") for t in drafter.inputs]
    assert names[: len(engine_io.DRAFTER_INPUTS)] == list(engine_io.DRAFTER_INPUTS)
    split = plan.drafter_parallelism["tp"] > 1
    assert names[len(engine_io.DRAFTER_INPUTS):] == [i for i, _ in arena] + (["all_reduce_workspace"] if split else [])
    outs = [t.name.replace("{l}", "0") for t in drafter.outputs]
    assert outs == [*engine_io.DRAFTER_OUTPUTS, *[o for _, o in arena]]
    assert {p["name"] for p in drafter.plugins} >= {"trtllm_dflash::kv_append", "trtllm_dflash::kv_inject_attention"}
    ranges = engine_io.drafter_dim_ranges(drafter.build_config["max_batch_size"], drafter.build_config["max_input_len"],
                                          drafter.build_config["max_seq_len"], plan.block)
    for dim, (lo, opt, hi) in ranges.items():
        assert lo <= opt <= hi == drafter.dims[dim], dim


def test_tail_rows_are_the_cpu_engines_rows_on_packed_sequences():
    """TapEngine (runtime/engine_runners.py) takes, per sequence of n rows, rows n - tail .. n - 1
    clamped at 0; packed, that is the same rows offset by the sequence's start."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(1, 40, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen)
        tail = int(torch.randint(1, 20, (1,), generator=gen))
        ends = lengths.cumsum(0).to(torch.int32)
        got = engine_io.tail_rows(ends, tail)
        starts = ends.long() - lengths
        per_seq = (torch.arange(tail)[None, :] + lengths[:, None] - tail).clamp(min=0)
        assert torch.equal(got, per_seq + starts[:, None]), (lengths.tolist(), tail)


def test_executor_outputs_follow_the_1_2_1_names():
    out = lambda name, t: SimpleNamespace(name=name, output=t)  # noqa: E731
    ctx, tail = torch.arange(12.0).view(6, 2), torch.arange(8.0).view(1, 1, 4, 2)
    given = [out("context_dflash_ctx", ctx), out("generation_dflash_ctx", torch.zeros(1, 1, 2)),
             out("generation_dflash_tail", tail)]
    got = engine_io.executor_outputs(given, {"dflash_ctx": True, "dflash_tail": False})
    assert torch.equal(got["dflash_ctx"], ctx) and torch.equal(got["dflash_tail"], tail[0, 0])
    assert got["dflash_ctx"].data_ptr() != ctx.data_ptr()  # copied out of the executor's buffer
    with pytest.raises(RuntimeError, match="no 'generation_dflash_argmax'.*additional_model_outputs"):
        engine_io.executor_outputs(given, {"dflash_argmax": False})


def _drafter_dir(root: Path, tensors: dict) -> Path:
    (root / "drafter").mkdir(parents=True)
    (root / "target").mkdir()
    save_file(tensors, str(root / "drafter" / "rank0.safetensors"))
    (root / "drafter" / "config.json").write_text(json.dumps({"dflash": {"block_size": 16, "target_layer_ids": [1]}}))
    (root / "target" / "config.json").write_text(json.dumps({"mapping": {"world_size": 1, "tp_size": 1}}))
    return root / "target"


def test_tap_weights_come_from_the_drafter_beside_the_target(tmp_path):
    from trtllm_dflash.formats.quant import fp8_scale, quantize_fp8

    fc, norm = torch.randn(8, 24), torch.rand(8) + 0.5
    target = _drafter_dir(tmp_path / "a", {"dflash.fc.weight": fc, "dflash.hidden_norm.weight": norm})
    got = engine_io.tap_weights(target, 0, torch.bfloat16)
    assert torch.equal(got["dflash.fc.weight"], fc.bfloat16())
    assert got["dflash.hidden_norm.weight"].dtype == torch.bfloat16
    assert engine_io.read_drafter_config(target)["dflash"]["target_layer_ids"] == [1]
    q = quantize_fp8(fc, fp8_scale(fc.abs().max()))  # an FP8 drafter: the tap gets the dequantized fc
    target = _drafter_dir(tmp_path / "b",
                          {"dflash.fc.weight": q.data, "dflash.fc.weights_scaling_factor": q.scale.reshape(1),
                                           "dflash.hidden_norm.weight": norm})
    got = engine_io.tap_weights(target, 0, torch.float32)["dflash.fc.weight"]
    torch.testing.assert_close(got, q.data.float() * q.scale, atol=0, rtol=0)
    with pytest.raises(UserError, match="rank1.safetensors: missing"):
        engine_io.tap_weights(target, 1, torch.float32)
    with pytest.raises(UserError, match=r"drafter/config.json: missing; the DFlash target engine"):
        engine_io.read_drafter_config(tmp_path / "c" / "target")


def test_the_tap_of_a_whole_drafter_is_each_target_rank_s_columns(tmp_path, tiny_pair):
    """At tp 2 the engine backend keeps the tiny bf16 drafter whole (placement rank0: one rank file,
    mapping tp 1) where the reference backend splits it; either way target rank r's tap is
    the same fc columns and hidden_norm, bit for bit."""
    from checkpoints import write_recipe
    from trtllm_dflash.convert.convert import convert

    def converted(backend):
        recipe = load_recipe(write_recipe(tmp_path / f"{backend}.yaml", *tiny_pair, tp=2, backend=backend,
                                          drafter_fmt="bf16"))
        return convert(recipe, tmp_path / backend, progress=False)

    whole, split = converted("engine"), converted("reference")
    assert json.loads((whole / "drafter/config.json").read_text())["mapping"]["tp_size"] == 1
    assert sorted(p.name for p in (whole / "drafter").glob("rank*")) == ["rank0.safetensors"]
    assert json.loads((split / "drafter/config.json").read_text())["mapping"]["tp_size"] == 2
    for rank in (0, 1):
        a = engine_io.tap_weights(whole / "target", rank, torch.float32)
        b = engine_io.tap_weights(split / "target", rank, torch.float32)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert a["dflash.fc.weight"].shape[0] == 64 // 2  # hidden 64: rank r's half of fc's outputs
