"""perf/bench_loop (`trtllm-dflash bench loop`): the real serving loop over zero-cost runners decodes
exactly its scripts at the acceptance it was given, and the command prints its table and JSON."""

import json

import pytest
import torch

from trtllm_dflash.cli import main
from trtllm_dflash.perf.bench_loop import loop_cost
from trtllm_dflash.perf.loop_costs import engine_host
from trtllm_dflash.perf.zero_cost import ContextRows, Scripts, ZeroCostModel
from trtllm_dflash.reference.verify import SamplingParams


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_zero_cost_runners_accept_the_drawn_prefix_and_commit_the_script():
    script = list(range(10, 90))
    scripts = Scripts({(1, 2, 3): script}, (0.8,) * 7, vocab=1000, seed=0)
    model = ZeroCostModel(scripts, vocab=1000, hidden=4096, block=8, max_batch=2)
    dec = model.decoder(sampling=SamplingParams(), block_size=8, max_len=128)
    got = dec.admit([0], [[1, 2, 3]], [60], [[]]).tokens[0]
    accepted = []
    while dec.running:
        rec = dec.step()
        got += rec.tokens[0]
        accepted.append(len(rec.tokens[0]) - 1)
    assert got == script[:60]  # greedy: the target's argmax is the script
    assert 2 < sum(accepted) / len(accepted) < 6  # 0.8 a slot over 7 slots: tau 1 + 3.2 (seeded)
    assert model.target.rows.shape == (2, 8, 4096) and isinstance(model.target.rows, ContextRows)


def test_the_engine_runners_host_side_is_timed_per_row():
    r = engine_host(4, vocab=1000, hidden=1, block=8, prompt_len=16, rounds=3, conditional=(0.8,) * 7)
    assert r["c"] == 4 and r["us_row"] > 0 and r["us_round"] == pytest.approx(4 * r["us_row"])


def test_loop_cost_is_a_line_through_the_fixed_draft_rows():
    rows = [{"draft": "15", "c": c, "host_us_round": 300 + 40 * c} for c in (1, 4, 16)] + \
           [{"draft": "auto", "c": 1, "host_us_round": 9999}]
    fit = loop_cost({"rows": rows, "recipe": "r", "output_len": 512, "tokenizer": "t", "cpus": 2,
                     "load_average": (1.0, 1.0, 1.0)})
    assert (fit["fixed_us"], fit["per_request_us"], fit["levels"]) == (300.0, 40.0, [1, 4, 16])
    assert fit["machine"]["cpus"] == 2 and "bench loop --record" in fit["command"]


def test_bench_loop_command_prints_its_table_and_json(capsys, tmp_path):
    record = tmp_path / "loop_cost.json"
    assert main(["bench", "loop", "--levels", "1,2", "--drafts", "15,auto", "--rounds", "4", "--warm", "2",
                 "--repeats", "1", "--output-len", "24", "--engine-rounds", "2", "--json",
                 "--record", str(record)]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out.strip().splitlines()[-1])
    assert res["bench"] == "loop_host_cost" and res["recipe"] == "h100-qwen3-8b-fp8"
    assert {(r["draft"], r["c"]) for r in res["rows"]} == {("15", 1), ("15", 2), ("auto", 1), ("auto", 2)}
    assert all(r["host_us_round"] > 0 and 0 < r["share"] for r in res["rows"])
    assert [e["c"] for e in res["engine"]] == [1, 2] and "host µs/req" in out.err
    assert res["machine_speed"]["torch_op_us"] > 0
    assert json.loads(record.read_text())["levels"] == [1, 2]
    # the overlap rows: each round at least the device step it sleeps (serial and overlapped)
    assert [o["c"] for o in res["overlap"]] == [1, 2] and "serial/overlapped" in out.err
    assert all(min(o["serial_us"], o["overlap_us"]) > o["device_us"] for o in res["overlap"])
