"""The reference backend at tp=2 (two gloo rank processes, each holding only its shard) behind a real
tritonserver: tp=1's greedy text token for token on 12 prompts, 16 concurrent streams, and a
killed rank: every in-flight and later request gets an error naming it, and the model, then the
server, stop reporting ready (triton_model.mark_unavailable), instead of hanging."""

import asyncio
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import pytest

from serve_helpers import served_pair

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
# Two rank processes behind tritonserver: with the slow tests (tp = 2 in the default run:
# tests/runtime/test_engine_runners.py's emulated engine).
pytestmark = pytest.mark.slow

from test_server import reference_text, request, stream  # noqa: E402

PROMPTS = [f"def f{i}(x):\n    return x * {i} + {'xyz'[i % 3]}" for i in range(12)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_pair(tmp_path_factory.mktemp("served-tp2"), ["parallel.tp=2"]) as pair:
        yield pair


def _status(server, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.endpoints.http_url}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_tp2_serves_tp1s_greedy_text(served):
    recipe, server = served
    assert "rank processes (rank order)" in server.log_path.read_text()  # really two ranks

    async def each():
        return [await stream(server.endpoints.grpc_url, request(p.encode(), 16)) for p in PROMPTS]

    for prompt, (deltas, last, error) in zip(PROMPTS, asyncio.run(each())):
        assert error is None
        assert "".join(deltas) == reference_text(recipe, prompt, 16), prompt


def test_sixteen_concurrent_streams_finish_exact(served):
    recipe, server = served
    prompts = [PROMPTS[i % 12] + "\n" * (i // 12) for i in range(16)]

    async def many():
        return await asyncio.gather(*(stream(server.endpoints.grpc_url, request(p.encode(), 12)) for p in prompts))

    results = asyncio.run(many())
    assert all(error is None and last["finish_reason"] in (b"length", b"stop") for _, last, error in results)
    for p, (deltas, _, _) in zip(prompts, results):
        assert "".join(deltas) == reference_text(recipe, p, 12)


def test_a_killed_rank_fails_requests_clearly_and_the_server_goes_unready(served):
    """Runs last in this module: it takes the deployment down. Requests keep arriving while the
    rank dies and the model unloads: each ends with an error (ours naming the rank while the model
    is loaded, Triton's "no available versions" after), none hangs and the server stays up."""
    _, server = served
    pids = json.loads(re.search(r"rank processes \(rank order\): (\[[0-9, ]+\])", server.log_path.read_text())[1])
    assert len(pids) == 2 and _status(server, "/v2/health/ready") == 200

    async def in_flight_then_kill():
        first = asyncio.create_task(stream(server.endpoints.grpc_url, request(b"def g(x):\n", 120)))
        await asyncio.sleep(0.3)  # the request is decoding
        os.kill(pids[1], signal.SIGKILL)

        async def later(delay):
            await asyncio.sleep(delay)
            return await stream(server.endpoints.grpc_url, request())

        rest = [asyncio.create_task(later(0.05 * i)) for i in range(24)]  # through the unload
        return await asyncio.wait_for(asyncio.gather(first, *rest), 60)  # no hang, no lost connection

    (_, last, error), *rest = asyncio.run(in_flight_then_kill())
    reason = error or last.get("finish_reason", b"").decode()
    assert "rank 1 was killed by SIGKILL" in reason and "cannot serve" in reason
    for _, _, later_error in rest:
        assert later_error is not None and ("rank 1 was killed by SIGKILL" in later_error
                                            or "has no available versions" in later_error), later_error
    deadline = time.monotonic() + 60
    while _status(server, "/v2/health/ready") == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _status(server, "/v2/health/ready") != 200 and _status(server, "/v2/models/dflash/ready") != 200
    assert _status(server, "/v2/health/live") == 200 and server.proc.poll() is None  # up, saying why in its log
    assert "dflash: tensor-parallel rank 1 was killed by SIGKILL" in server.log_path.read_text()
