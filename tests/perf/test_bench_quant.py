"""Weight-only emulation equals the quantized checkpoints; the quantization benchmark runs."""

import json

import pytest
import torch

from checkpoints import converted, write_recipe
from trtllm_dflash.perf import bench_quant
from trtllm_dflash.quantize.emulate import fake_quantize_
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.reference import load_pair
from trtllm_dflash.runtime.checkpoint import load_rank, read_checkpoint
from trtllm_dflash.runtime.tp_layers import Comm


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_emulation_equals_the_quantized_checkpoint(tmp_path, tiny_pair, fmt):
    pytest.importorskip("modelopt.torch.quantization",
                        reason="nvidia-modelopt not installed (pip install 'trtllm_dflash[quant]')")
    from trtllm_dflash.quantize.stage import quantize

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=1, fmt=fmt, drafter_fmt=fmt))
    out = quantize(recipe, converted(recipe, tmp_path / "c"), tmp_path / "q", samples=2, length=16, progress=False)
    loaded_t, loaded_d = load_rank(read_checkpoint(out), Comm())
    emu_t, emu_d = load_pair(*tiny_pair)
    fake_quantize_(emu_t, fmt)
    fake_quantize_(emu_d, fmt, drafter=True)
    for emu, loaded in ((emu_t, loaded_t), (emu_d, loaded_d)):
        got = dict(loaded.named_parameters())
        for name, p in emu.named_parameters():
            assert torch.equal(p, got[name]), name


def test_bench_quant_rows(tmp_path, tiny_pair, capsys):
    rc = bench_quant.main(["--target", str(tiny_pair[0]), "--drafter", str(tiny_pair[1]), "--prompts", "2",
                           "--prompt-len", "8", "--max-new-tokens", "8", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["source"].startswith("given pair") and res["prompts"]["from"] == "random token ids"
    rows = {(r["target"], r["drafter"]): r for r in res["rows"]}
    assert list(rows) == bench_quant.ROWS
    assert all(r["lossless"] for r in rows.values())  # DFlash stays lossless for every weight format (fp32 compute)
    for d in ("fp8", "nvfp4"):  # a quantized drafter never changes the output, only tau
        assert rows[("bf16", d)]["token_agree"] == 1.0 and rows[("bf16", d)]["prefix_agree"] == 1.0
    assert rows[("bf16", "bf16")]["d_tau"] == 0.0 and rows[("bf16", "bf16")]["tau"] >= 1.0
