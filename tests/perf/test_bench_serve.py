"""`bench serve`'s logic on synthetic timestamps (no server): the per-round split lines the
server's trace up with the client's chunks, the JSON object has its ratios, and bad arguments
are one line."""

from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.perf.bench_serve import PATHS, SPLIT, split, summarize, user_rate

MS = 1_000_000
GPU_RECIPE = str(Path(__file__).resolve().parents[2] / "recipes/hopper/h100-qwen3-8b-fp8.yaml")


def test_user_rate_is_the_sweeps():
    assert user_rate([0, 10 * MS, 30 * MS], 7) == pytest.approx(6 / 0.030)
    assert user_rate([5 * MS], 3) is None and user_rate([0, MS], 1) is None


def test_split_lines_the_server_trace_up_with_the_client_chunks():
    # One request "0": prefill (admit) then two rounds; each response sent, then seen by the client.
    rows = [
        ["admit", ["0"], 100 * MS, 104 * MS, 105 * MS],
        ["send", "0", 104 * MS, 105 * MS],
        ["round", ["0"], 106 * MS, 116 * MS, 117 * MS],  # 1 ms after the admit's delivery
        ["send", "0", 116 * MS, 117 * MS],
        ["round", ["0"], 118 * MS, 128 * MS, 130 * MS],
        ["send", "0", 128 * MS, 129 * MS],
        ["round", ["1"], 300 * MS, 310 * MS, 311 * MS],  # another request: not this one's
    ]
    arrivals = [107 * MS, 119 * MS, 132 * MS]
    s = split(rows, [("0", 99 * MS, 133 * MS, arrivals)])
    assert set(s) == set(SPLIT)
    assert s["decode"] == pytest.approx(10) and s["backend"] == pytest.approx(1.5)
    assert s["loop"] == pytest.approx(1) and s["send"] == pytest.approx(1)
    assert s["round"] == pytest.approx(12) and s["chunk_gap"] == pytest.approx(13)
    assert s["response"] == pytest.approx((2 + 2 + 3) / 3)
    # A server without trace rows (an older one) leaves the server-side parts unknown.
    assert split([], [("0", 0, 10 * MS, [MS, 2 * MS, 4 * MS])]) == {**{k: None for k in SPLIT}, "chunk_gap": 2.0}


def test_summary_ratios_are_medians_over_the_repeats():
    repeats = [{"served": 90, "engine": 95, "inprocess": 100}, {"served": 80, "engine": 100, "inprocess": 100},
               {"served": 99, "engine": 99, "inprocess": 110}]
    res = summarize(repeats, {p: {} for p in PATHS}, {"recipe": "r"})
    assert res["served_tok_s_user"] == 90 and res["inprocess_tok_s_user"] == 100 and res["recipe"] == "r"
    assert res["served_over_inprocess"] == pytest.approx(0.9)  # median of 0.9, 0.8, 0.9
    assert res["served_over_engine"] == pytest.approx(0.947, abs=1e-3)
    assert res["engine_over_inprocess"] == pytest.approx(0.95)
    assert res["repeats"] == repeats and set(res["split_ms_per_round"]) == set(PATHS)


@pytest.mark.parametrize("args,message", [
    (["--repeats", "0"], "--repeats is 0, expected >= 1"),
    (["--torch-threads", "0"], "--torch-threads is 0, expected >= 1"),
    ([GPU_RECIPE], "bench serve measures the reference backend's server"),
    (["--max-new-tokens", "1000"],
     "--max-new-tokens 1000: the sweep's 64-token prompts + 1000 > build.max_seq_len 512"),
])
def test_bad_arguments_are_one_line(args, message, capsys):
    assert main(["bench", "serve", *args]) == 2
    assert message in capsys.readouterr().err
