"""perf/bench_kv_inject.py: traffic model, hardware lookup, the no-GPU skip, and its timing loop
run on CPU under the Triton interpreter with a stand-in timer (real timings need a GPU)."""

import json

import pytest
import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.perf import bench_kv_inject as bench


def test_bytes_moved():
    # 2 sequences x 100 cached positions x 2 KV heads x D 64, bf16, K and V: 2*2*100*2*64*2 = 102400
    # block: 2 x 4 x (2*8 + 2*2) heads x 64 x 2 bytes = 20480; cache_lens: 8
    assert bench.bytes_moved(2, 100, 4, 8, 2, 64, "bfloat16", "bfloat16") == 102400 + 20480 + 8
    # FP8 cache halves the cache term; a window of 10 with T=4 reads at most 13 cached positions
    assert bench.bytes_moved(2, 100, 4, 8, 2, 64, "bfloat16", "float8_e4m3fn") == 51200 + 20480 + 8
    assert bench.bytes_moved(2, 100, 4, 8, 2, 64, "bfloat16", "bfloat16", window=10) == 2 * 2 * 13 * 2 * 64 * 2 + 20488


def test_hbm_bandwidth_from_catalog():
    assert bench.hbm_bandwidth_gbs("h100-sxm") == pytest.approx(3350)
    assert bench.hbm_bandwidth_gbs("b200") == pytest.approx(8000)
    with pytest.raises(UserError, match="'a100' is not in the hardware catalog"):
        bench.hbm_bandwidth_gbs("a100")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_main_skips_without_gpu(capsys):
    assert bench.main(["--hardware", "h200"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "skipped: needs a CUDA GPU" in lines[0]
    assert json.loads(lines[-1])["skipped"].startswith("needs a CUDA GPU")
    assert bench.main(["--hardware", "nope"]) == 2


def test_run_loop_on_cpu(kernel, capsys):
    if torch.cuda.is_available():
        pytest.skip("the GPU runs the real benchmark")
    args = bench.parse_args(["--batch", "2", "--cache-len", "40", "--num-q-heads", "4", "--num-kv-heads", "2",
                             "--head-dim", "32", "--block-len", "4", "--dtype", "fp32", "--window", "16"])
    timed = []

    def fake_bench(fn):  # runs the call once (so a broken call fails here) and reports 1 ms
        timed.append(fn())
        return 1.0

    rows = bench.run(args, device="cpu", bench=fake_bench)
    assert len(timed) == 2  # kernel, then torch reference, on the same tensors
    torch.testing.assert_close(timed[0], timed[1], atol=1e-5, rtol=1e-5)
    (row,) = rows
    assert row["bytes"] == bench.bytes_moved(2, 40, 4, 4, 2, 32, "float32", "float32", 16)
    assert row["gbs"] == pytest.approx(row["bytes"] / 1e-3 / 1e9)
    assert row["hbm_fraction"] == pytest.approx(row["gbs"] / 3350)
    assert "% HBM" in capsys.readouterr().out
