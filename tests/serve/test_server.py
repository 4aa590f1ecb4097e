"""End to end against a real tritonserver (bundled with nvidia-pytriton) on loopback ports.

The server runs the deployed `dflash` model (reference backend) on a tiny random pair with a
tokenizer. Responses are compared with the reference's single-request output.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from serve_helpers import deployed, loaded_pair, make_pair, write_recipe

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
grpcclient = pytest.importorskip("tritonclient.grpc.aio")

from trtllm_dflash.errors import UserError  # noqa: E402
from trtllm_dflash.launch.server import Endpoints, TritonServer, free_ports  # noqa: E402
from trtllm_dflash.recipe import load_recipe  # noqa: E402


@pytest.fixture(scope="module")
def served(default_served):
    return default_served


def reference_text(recipe, prompt: str, max_tokens: int) -> str:
    from trtllm_dflash.reference import generate

    tok, target, drafter = loaded_pair(recipe.target.path, recipe.drafter.path)
    ids = tok(prompt)["input_ids"]
    return tok.decode(generate(target, drafter, [ids], max_tokens, block_size=recipe.speculative.block_size)[0].tokens)


def tensor(name, value, dtype):
    t = grpcclient.InferInput(name, [len(value)], dtype)
    t.set_data_from_numpy(np.array(value, dtype=object if dtype == "BYTES" else None))
    return t


async def stream(url, inputs, cancel_after=None):
    """Send one request; return (deltas, last response outputs, error)."""
    client = grpcclient.InferenceServerClient(url)

    async def requests():
        yield {"model_name": "dflash", "inputs": inputs}

    deltas, last, error = [], {}, None
    try:
        it = client.stream_infer(inputs_iterator=requests())
        async for result, err in it:
            if err is not None:
                error = str(err)
                break
            resp = result.get_response()
            if resp.outputs:
                deltas.append(result.as_numpy("text_output")[0].decode())
                last = {o.name: result.as_numpy(o.name) if o.name == "acceptance_histogram"
                        else result.as_numpy(o.name)[0]
                        for o in resp.outputs}
                if cancel_after is not None and len(deltas) >= cancel_after:
                    it.cancel()
                    break
                if last["finish_reason"]:  # the response that completes the request
                    break
    finally:
        await client.close()
    return deltas, last, error


def request(prompt=b"def area(r):\n    return", max_tokens=24, **extra):
    inputs = [tensor("text_input", [prompt], "BYTES"), tensor("max_tokens", [np.int32(max_tokens)], "INT32"),
              tensor("stream", [True], "BOOL")]
    for name, (value, dtype) in extra.items():
        inputs.append(tensor(name, [value], dtype))
    return inputs


def test_streaming_deltas_concatenate_to_the_reference_completion(served):
    recipe, server = served
    # return_perf_metrics: tensorrtllm_backend's flag, answered with upstream's acceptance_rate and our histogram
    deltas, last, error = asyncio.run(stream(server.endpoints.grpc_url, request(return_perf_metrics=(True, "BOOL"))))
    assert error is None and len(deltas) > 1
    assert "".join(deltas) == reference_text(recipe, "def area(r):\n    return", 24)
    assert last["finish_reason"] in (b"length", b"stop")
    assert last["rounds"] >= 1 and last["total_accepted_draft_tokens"] <= last["total_draft_tokens"]
    assert last["acceptance_length"] >= 1.0
    # trtllm-serve's avg_decoded_tokens_per_iter: output tokens per iteration, the prefill one of them
    assert last["avg_decoded_tokens_per_iter"] == pytest.approx(last["total_output_tokens"] / (last["rounds"] + 1))
    hist, accepted = last["acceptance_histogram"].tolist(), last["total_accepted_draft_tokens"]
    assert len(hist) == recipe.speculative.block_size and sum(hist) == last["rounds"]
    assert sum(j * n for j, n in enumerate(hist)) == accepted
    assert last["acceptance_rate"] == pytest.approx(accepted / last["total_draft_tokens"])


def test_non_streaming_gives_one_response(served):
    recipe, server = served
    inputs = request(max_tokens=10)
    inputs[2].set_data_from_numpy(np.array([False]))
    deltas, last, error = asyncio.run(stream(server.endpoints.grpc_url, inputs))
    assert error is None and len(deltas) == 1 and last["total_output_tokens"] == last["output_token_count"]
    assert deltas[0] == reference_text(recipe, "def area(r):\n    return", 10)


def test_http_generate_stream(served):
    recipe, server = served
    body = json.dumps({"text_input": "import os\n", "max_tokens": 12, "stream": True}).encode()
    url = f"http://{server.endpoints.http_url}/v2/models/dflash/generate_stream"
    with urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=60) as r:
        events = [json.loads(line[5:]) for line in r.read().decode().splitlines() if line.startswith("data:")]
    assert "".join(e["text_output"] for e in events) == reference_text(recipe, "import os\n", 12)


@pytest.mark.parametrize(
    "inputs,message",
    [
        (lambda: request(prompt=b""), "text_input: empty prompt"),
        (lambda: request(prompt=b"x = 1\n" * 200), "longer than the build limit max_input_len 96"),
        (lambda: request(max_tokens=0), "max_tokens: must be > 0"),
        (lambda: request(max_tokens=500), "max_tokens: 500 >"),
        (lambda: request(temperature=(np.float32(-1), "FP32")), "temperature: must be >= 0"),
        (lambda: request(top_p=(np.float32(1.5), "FP32")), "top_p: must be in (0, 1]"),
        (lambda: request(prompt=b"\xff\xfe bad"), "text_input: not valid UTF-8"),
        (lambda: [tensor("text_input", [b"x"], "BYTES"), tensor("max_tokens", [np.float32(3)], "FP32")],
         "max_tokens"),
    ],
)
def test_bad_requests_get_named_errors_and_the_server_keeps_serving(served, inputs, message):
    recipe, server = served
    _, _, error = asyncio.run(stream(server.endpoints.grpc_url, inputs()))
    assert error is not None and message in error
    deltas, _, error = asyncio.run(stream(server.endpoints.grpc_url, request(max_tokens=4)))
    assert error is None and deltas


def test_cancelled_stream_frees_its_slot(served):
    recipe, server = served
    deltas, _, _ = asyncio.run(stream(server.endpoints.grpc_url, request(max_tokens=60), cancel_after=1))
    assert len(deltas) == 1
    t0 = time.monotonic()
    deltas, last, error = asyncio.run(stream(server.endpoints.grpc_url, request(max_tokens=8)))
    assert error is None and "".join(deltas) == reference_text(recipe, "def area(r):\n    return", 8)
    assert time.monotonic() - t0 < 30


def test_concurrent_requests_are_batched_and_exact(served):
    recipe, server = served
    prompts = [f"def f{i}(x):\n    return x + {i}".encode() for i in range(6)]

    async def many():
        return await asyncio.gather(*(stream(server.endpoints.grpc_url, request(p, 16)) for p in prompts))

    results = asyncio.run(many())
    for p, (deltas, last, error) in zip(prompts, results):
        assert error is None
        assert "".join(deltas) == reference_text(recipe, p.decode(), 16)


def test_draft_len_zero_is_the_ar_baseline_on_the_same_server(served):
    recipe, server = served
    deltas, last, error = asyncio.run(stream(server.endpoints.grpc_url,
                                             request(max_tokens=16, draft_len=(np.int32(0), "INT32"))))
    assert error is None and "".join(deltas) == reference_text(recipe, "def area(r):\n    return", 16)
    assert last["total_draft_tokens"] == 0 and last["acceptance_length"] == 1.0  # one token per verify pass
    _, _, error = asyncio.run(stream(server.endpoints.grpc_url, request(draft_len=(np.int32(-1), "INT32"))))
    assert error is not None and "draft_len: must be >= 0" in error


def test_startup_failures_exit_with_the_reason(served, tmp_path):
    recipe, server = served
    busy = Endpoints("127.0.0.1", server.endpoints.http_port, *free_ports(2))
    with pytest.raises(UserError, match=r"serve.http_port: 127.0.0.1:\d+ is already in use"):
        TritonServer(server.repository, busy).start()
    bad = tmp_path / "repo" / "m"
    bad.mkdir(parents=True)
    (bad / "config.pbtxt").write_text('name: "m"\nbogus: 1\n')
    with pytest.raises(UserError, match="failed to read text proto"):
        TritonServer(tmp_path / "repo", Endpoints.free()).start()


@pytest.mark.slow
def test_serve_command_prints_ready_and_stops_cleanly_on_sigterm(tmp_path):
    make_pair(tmp_path)
    ports = free_ports(3)
    recipe = write_recipe(tmp_path, ports)
    out = deployed(load_recipe(recipe), tmp_path / "pipeline")
    proc = subprocess.Popen([sys.executable, "-m", "trtllm_dflash", "serve", str(recipe), "--from", str(out)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready: model 'dflash' on http://127.0.0.1:"), line + proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    leftovers = subprocess.run(["pgrep", "-f", f"--http-port={ports[0]}"], capture_output=True, text=True).stdout
    assert leftovers.strip() == "", "tritonserver left running"


@pytest.mark.parametrize("http", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["grpc", "http"])
def test_sweep_command_against_the_server(served, tmp_path, http, capsys):
    recipe, server = served
    from trtllm_dflash.cli import main
    from trtllm_dflash.sweep.server_metrics import settled, totals

    url = server.endpoints.http_url if http else server.endpoints.grpc_url
    metrics = f"http://127.0.0.1:{server.endpoints.metrics_port}/metrics"
    before = totals(settled(metrics, "dflash"), "dflash")
    # gRPC: the default curves (AR beside DFlash, each request naming its mode); HTTP: DFlash only.
    # In this process: a subprocess would add its imports (about 5 s), not a check.
    capsys.readouterr()
    rc = main(["sweep", str(recipe.file), "--url", url, "--out", str(tmp_path), "--levels", "1,2", "--json"]
              + (["--http", "--modes", "dflash"] if http else []))
    out, err = capsys.readouterr()
    assert rc == 0, (err + out)[-2000:] + f"\nserver log: {server.failure_reason()}"
    grew = totals(settled(metrics, "dflash"), "dflash").minus(before)
    summary = json.loads(out[out.index("{"):])
    curves = {}
    for lv in summary["levels"]:
        curves.setdefault(lv["curve"], []).append(lv)
    assert list(curves) == (["dflash"] if http else ["ar", "dflash"])
    for name, levels in curves.items():
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        assert all(lv["failed"] == 0 and lv["requests"] == max(4, 5 * lv["concurrency"]) for lv in levels)
        assert all(lv["tau"] >= 1.0 and lv["output_tok_s_per_gpu"] > 0 for lv in levels)
        assert all((lv["tau"] == 1.0 and lv["draft_per_round"] == 0) == (name == "ar") for lv in levels)
    assert ("dflash_vs_ar" in summary["headline"]) != http
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {row["curve"] for row in rows} == set(curves) and all(row["mode"] == row["curve"] for row in rows)
    # Per-request acceptance (warm-up requests too) adds up to the server's counters' growth over the sweep.
    assert all(row["acceptance_source"] == "response" and sum(row["acceptance_histogram"]) == row["rounds"]
               for row in rows)
    assert (sum(row["rounds"] for row in rows), sum(row["drafted"] for row in rows),
            sum(row["accepted"] for row in rows)) == (grew.rounds, grew.drafted, grew.accepted)
    assert grew.drafted > 0 and all(lv["tau_request"]["n"] == lv["requests"] for lv in summary["levels"])
    measured = [row for row in rows if not row["warmup"]]
    prompts = {row["request_id"]: row_prompt(recipe, row) for row in measured}
    expected = {p: reference_text(recipe, p, recipe.sweep.output_len) for p in set(prompts.values())}
    assert all(row["text"] == expected[prompts[row["request_id"]]] for row in measured)
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "summary.csv").exists()


def row_prompt(recipe, row):
    from trtllm_dflash.prompts.sources import load_prompts

    sw = recipe.sweep
    n = max(sw.requests_at(c) for c in (1, 2)) + sw.warmup_requests
    prompts = load_prompts(sw.dataset, n, sw.input_len, sw.seed)  # what the sweep command sent
    return prompts[row["request_id"] % len(prompts)]


@pytest.mark.slow
def test_server_dies_with_a_killed_launcher(served):
    recipe, server = served
    port, grpc_port, metrics_port = free_ports(3)
    code = (
        "import sys, time\n"
        "from trtllm_dflash.launch.server import Endpoints, TritonServer\n"
        f"s = TritonServer(__import__('pathlib').Path({str(server.repository)!r}), "
        f"Endpoints('127.0.0.1', {port}, {grpc_port}, {metrics_port})).start()\n"
        "print('up', flush=True)\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    proc.kill()  # no cleanup code runs in the launcher
    proc.wait()

    def alive():
        return subprocess.run(["pgrep", "-f", f"--http-port={port}"], capture_output=True).stdout

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive():
        time.sleep(0.5)
    assert not alive(), "server outlived its launcher"


def test_metrics_port_counts_drafted_and_accepted_tokens(served):
    """Triton's metrics port carries serve/metrics.py's counters (Python-backend custom metrics),
    and they grow with the requests served: accepted <= drafted, rounds as the responses said."""
    from trtllm_dflash.sweep.server_metrics import scrape, totals

    recipe, server = served
    url = f"http://127.0.0.1:{server.endpoints.metrics_port}/metrics"
    before = totals(scrape(url) or {}, "dflash", "dflash")
    rounds = 0
    for max_tokens in (12, 16):
        _, last, error = asyncio.run(stream(server.endpoints.grpc_url, request(max_tokens=max_tokens)))
        assert error is None, f"{error}\nserver log: {server.failure_reason()}"
        rounds += int(last["rounds"])
    deadline = time.monotonic() + 10  # the model hands updates to Triton from a thread of its own
    while True:
        grew = totals(scrape(url) or {}, "dflash", "dflash").minus(before)
        if grew.rounds >= rounds or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert grew.rounds == rounds and grew.drafted > 0
    assert 0 <= grew.accepted <= grew.drafted
    assert all(0.0 <= a <= 1.0 for a in grew.per_position()) and 0 < grew.drafted_per_pos[1] <= rounds
