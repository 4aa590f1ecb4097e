"""perf/bench_engine_policy: its closed loop submits every request once, as a DFlash chain with the
curve's draft length, and measures tokens per second per user from the first token to the last."""

import itertools

import pytest

from trtllm_dflash.perf.bench_engine_policy import closed_loop, deciles


class Clocked:
    """A stand-in engine whose requests emit one update per token, 1 ms of a fake clock apart."""

    def __init__(self, monkeypatch):
        import trtllm_dflash.perf.bench_engine_policy as bench

        self.clock, self.jobs = itertools.count(), []
        monkeypatch.setattr(bench.time, "perf_counter", lambda: next(self.clock) * 1e-3)

    def submit(self, job):
        self.jobs.append(job)
        for k in range(job.max_tokens):
            job.emit(type("Update", (), {"finish_reason": "length" if k == job.max_tokens - 1 else None})())


def test_closed_loop_runs_each_request_once_with_the_curves_draft_length(monkeypatch):
    engine = Clocked(monkeypatch)
    rates = closed_loop(engine, [[1, 2]] * 5, [9] * 5, c=1, draft_len=3)
    assert sorted(len(j.prompt_ids) for j in engine.jobs) == [2] * 5
    assert all(j.draft_len == 3 and j.mode == "dflash" and j.max_tokens == 9 for j in engine.jobs)
    assert sorted(rates) == [0, 1, 2, 3, 4]  # by request
    assert all(abs(r - 8 / 8e-3) < 1e-6 for r in rates.values())  # 8 tokens after the first, 8 ms apart from it


def test_deciles_take_each_requests_median_over_repeats():
    """Request i's rate is its median over the repeats (a repeat's outlier does not move it), then
    the deciles and the mean are over requests: 1..10 here, whatever a repeat's noise."""
    runs = [{i: i + 1.0 for i in range(10)}, {i: i + 1.0 for i in range(10)}, {i: 100.0 * (i + 1) for i in range(10)}]
    d, mean = deciles(runs)
    assert d == pytest.approx([1.9, 2.8, 3.7, 4.6, 5.5, 6.4, 7.3, 8.2, 9.1]) and mean == pytest.approx(5.5)


def test_no_repeats_is_refused_by_name(capsys):
    from trtllm_dflash.perf.bench_engine_policy import main

    with pytest.raises(SystemExit) as exit_:
        main(["--repeats", "0"])
    assert exit_.value.code == 2 and "--repeats 0" in capsys.readouterr().err
