"""Timestamps of the serving path, round by round, for the serving-overhead benchmark
(perf/bench_serve.py). Off unless the server's environment names a file in TRACE_ENV.

Rows (JSON lines), times are time.perf_counter_ns() (CLOCK_MONOTONIC on Linux: comparable
between the server's processes and the client on one machine):
  ["admit", [tags], t0, t1, t2]   prefill of new requests: before, after the decoder, after delivery
  ["round", [tags], t0, t1, t2]   one round: before decoder.step, after it, after delivery
  ["send", tag, s0, s1]           one response: before building it, after the sender returned
Tags are the requests' own ids (Triton's request id). Rows are kept in memory and written when
a request ends, off the rounds being timed.
"""

from __future__ import annotations

import json
import os
import threading
import time

TRACE_ENV = "TRTLLM_DFLASH_TRACE"
now = time.perf_counter_ns


class Trace:
    def __init__(self, path: str):
        self.path, self.rows, self.lock = path, [], threading.Lock()

    def add(self, *row) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        with self.lock:
            rows, self.rows = self.rows, []
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)


def from_env() -> Trace | None:
    path = os.environ.get(TRACE_ENV)
    return Trace(path) if path else None


def read(path) -> list[list]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
