"""perf/bench_engine_policy: its closed loop submits every request once, as a DFlash chain with the
curve's draft length, and measures tokens per second per user from the first token to the last."""

import itertools

from trtllm_dflash.perf.bench_engine_policy import closed_loop


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
    p50 = closed_loop(engine, [[1, 2]] * 5, [9] * 5, c=1, draft_len=3)
    assert sorted(len(j.prompt_ids) for j in engine.jobs) == [2] * 5
    assert all(j.draft_len == 3 and j.mode == "dflash" and j.max_tokens == 9 for j in engine.jobs)
    assert abs(p50 - 8 / 8e-3) < 1e-6  # 8 tokens after the first, 8 ms apart from it
