"""`serve --api dynamo` behind NVIDIA Dynamo 1.6.1's real frontend (`python -m dynamo.frontend`,
file discovery, round-robin), two workers over the shared default deployment, all of it in a
loopback-only network namespace (tests/helpers/dynamo_helpers.py); the tests speak plain HTTP to
the frontend from outside it.

Greedy output through Dynamo's /v1/completions and /v1/chat/completions is `generate --checkpoint`'s
of the deployed checkpoint, streamed or whole; per-request decoding through nvext.annotations;
nvext.engine_data is our OpenAI server's object for the same request; both workers take requests;
bad requests get one line each and nothing hangs; a client leaving stops its decoding; a killed
worker's in-flight request ends with an error while the other keeps serving (the last test: it
leaves one worker); `sweep --api openai` through the frontend measures AR beside DFlash.
All run in the default suite (a second worker joins the same cluster after the first test) but
the client that leaves, which waits for the workers' counters to settle: slow.
"""

import io
import json
import os
import signal
import time
import urllib.error
import urllib.request
from contextlib import redirect_stdout

import pytest

from dynamo_helpers import DynamoCluster, skip_reason
from trtllm_dflash.cli import main

REASON = skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PROMPT = "def parse_args(argv):\n    "
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def main():"}]
ENGINE_DATA = {"extra_fields": ["engine_data", "worker_id"]}
LONG = 480  # tokens of a request still running when the test acts (the deployment's max_seq_len, 512, allows it)


@pytest.fixture(scope="module")
def one_worker(default_served, tmp_path_factory):
    """The frontend and one worker (the first test's; a second joins for the rest)."""
    recipe, server = default_served
    cluster = DynamoCluster(server.repository.parent, tmp_path_factory.mktemp("dynamo"), [str(recipe.file)], workers=1)
    yield recipe, server.repository.parent, cluster
    cluster.stop()
    logs = [p for p in sorted(cluster.work.glob("worker-*.log")) if p.name != cluster.killed]
    assert logs and all("stopped" in p.read_text() for p in logs), "a worker did not stop cleanly"


@pytest.fixture(scope="module")
def dynamo(one_worker):
    """The same cluster with a second worker added (routing over two workers)."""
    cluster = one_worker[2]
    while len(cluster.workers) < 2:
        cluster.add_worker()
    return one_worker


@pytest.fixture(scope="module")
def ours(dynamo):
    """Our OpenAI server's app over the same deployment, in this process."""
    from fastapi.testclient import TestClient

    from trtllm_dflash.serve.deployed import open_deployed, repository_model
    from trtllm_dflash.serve.openai import create_app

    deployed = open_deployed(*repository_model(dynamo[1], "dflash"))
    with TestClient(create_app(deployed, "dflash")) as client:
        yield client
    deployed.close()


def post(url: str, body: dict, path: str = "/v1/completions", timeout: float = 120) -> tuple[int, dict | str]:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, text if body.get("stream") else json.loads(text)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def events(text: str) -> list[dict]:
    """The JSON events of a server-sent event stream, which must end with `data: [DONE]`."""
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    assert data[-1] == "[DONE]", text[-500:]
    return [json.loads(d) for d in data[:-1]]


def generate(checkpoint, n: int, prompt: str | None = None, ids: list[int] | None = None) -> str:
    buf = io.StringIO()
    args = ["--prompt", prompt] if prompt is not None else ["--prompt-ids", ",".join(map(str, ids))]
    with redirect_stdout(buf):
        assert main(["generate", "--checkpoint", str(checkpoint), *args, "--max-new-tokens", str(n), "--json"]) == 0
    return json.loads(buf.getvalue())["text"]


def test_greedy_completions_equal_generate_whole_and_streamed(one_worker):
    """Greedy text through the real frontend is the deployment's, whole and streamed, and the
    streamed request's final chunk carries its acceptance in nvext.engine_data."""
    recipe, deploy, cluster = one_worker
    want = generate(deploy.parent / "convert", 24, PROMPT)
    body = {"model": "dflash", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    status, whole = post(cluster.url, body)
    assert status == 200 and whole["choices"][0]["text"] == want and whole["usage"]["completion_tokens"] == 24
    status, text = post(cluster.url, {**body, "stream": True, "stream_options": {"include_usage": True},
                                      "nvext": ENGINE_DATA})
    chunks = events(text)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert status == 200 and len([t for t in texts if t]) > 1 and "".join(texts) == want
    assert [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    data = [c["nvext"]["engine_data"] for c in chunks if (c.get("nvext") or {}).get("engine_data")]
    assert len(data) == 1 and data[0]["dflash"]["mode"] == "dflash"
    assert data[0]["speculative_decoding"]["total_draft_tokens"] > 0


def test_greedy_chat_equals_generate_of_the_fallback_template(dynamo):
    """The deployment's tokenizer has no chat template: the worker registers FALLBACK_CHAT_TEMPLATE,
    so Dynamo renders the messages as our OpenAI server does."""
    from transformers import AutoTokenizer

    from trtllm_dflash.serve.requests import chat_prompt_ids

    recipe, deploy, cluster = dynamo
    ids = chat_prompt_ids(AutoTokenizer.from_pretrained(deploy.parent / "convert" / "tokenizer"), MESSAGES)
    want = generate(deploy.parent / "convert", 16, ids=ids)
    body = {"model": "dflash", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    status, whole = post(cluster.url, body, "/v1/chat/completions")
    assert status == 200 and whole["choices"][0]["message"]["content"] == want
    assert whole["usage"]["prompt_tokens"] == len(ids)
    status, text = post(cluster.url, {**body, "stream": True}, "/v1/chat/completions")
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in events(text) if c["choices"]]
    assert status == 200 and "".join(deltas) == want


def test_annotations_pick_the_mode_and_engine_data_says_which(dynamo):
    """AR and DFlash at its own draft length from one worker, the same greedy text; AR drafted
    nothing, so its engine_data has no speculative_decoding (TensorRT-LLM PR #19311)."""
    cluster = dynamo[2]
    out = {}
    for notes in ([], ["dflash.mode=ar"], ["dflash.mode=dflash", "dflash.draft_len=3"]):
        status, r = post(cluster.url, {"model": "dflash", "prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                       "nvext": {**ENGINE_DATA, "annotations": notes}})
        data = r["nvext"]["engine_data"]
        out[(data["dflash"]["mode"], data["dflash"]["draft_len"])] = (r["choices"][0]["text"], data)
    assert set(out) == {("dflash", None), ("ar", None), ("dflash", 3)} and len({t for t, _ in out.values()}) == 1
    ar, three = out[("ar", None)][1], out[("dflash", 3)][1]
    assert "speculative_decoding" not in ar and ar["avg_decoded_tokens_per_iter"] == 1.0
    spec = three["speculative_decoding"]
    # at most 3 a step (fewer where the output's end is nearer); num_spec_tokens is the server's bound
    assert 0 < spec["total_draft_tokens"] <= 3 * spec["num_spec_steps"] and spec["num_spec_tokens"] == 7


def test_engine_data_is_our_openai_servers_object_for_the_same_request(dynamo, ours):
    cluster = dynamo[2]
    for extension in ({}, {"mode": "dflash", "draft_len": 2}):
        body = {"model": "dflash", "prompt": PROMPT, "max_tokens": 20, "temperature": 0}
        mine = ours.post("/v1/completions", json={**body, **({"dflash": extension} if extension else {})}).json()
        notes = [f"dflash.{k}={v}" for k, v in extension.items()]
        status, r = post(cluster.url, {**body, "nvext": {**ENGINE_DATA, "annotations": notes}})
        data, choice = r["nvext"]["engine_data"], mine["choices"][0]
        assert status == 200 and r["choices"][0]["text"] == choice["text"]
        assert data["speculative_decoding"] == choice["speculative_decoding"]
        assert data["avg_decoded_tokens_per_iter"] == choice["avg_decoded_tokens_per_iter"]
        assert data["dflash"] == mine["dflash"]
    status, text = post(cluster.url, {**body, "stream": True, "nvext": ENGINE_DATA})
    finals = [c for c in events(text) if (c.get("nvext") or {}).get("engine_data")]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"  # on the final chunk only


def test_both_workers_take_requests(dynamo):
    cluster = dynamo[2]
    seen = [post(cluster.url, {"model": "dflash", "prompt": PROMPT, "max_tokens": 2, "nvext": ENGINE_DATA})[1]
            ["nvext"]["worker_id"]["decode_worker_id"] for _ in range(6)]
    assert set(seen) == {w["worker_id"] for w in cluster.workers}  # round-robin: each in turn
    from trtllm_dflash.spec_metrics import DRAFT_TOKENS

    metrics = cluster.get_inside(cluster.workers[0]["metrics"])  # our counters on Dynamo's worker /metrics
    assert DRAFT_TOKENS.name in metrics and "dynamo_component_requests_total" in metrics


@pytest.mark.parametrize("body,path,status,message", [
    ({"presence_penalty": 0.5}, "/v1/completions", 400, "presence_penalty: not supported (only 0)"),
    ({"n": 2}, "/v1/completions", 400, "n: 2 > 1: this worker returns one choice per request"),
    ({"max_tokens": 5000}, "/v1/completions", 400, "max_tokens: 5000 > "),
    ({"nvext": {"annotations": ["dflash.mode=fast"]}}, "/v1/completions", 400, "nvext.annotations: dflash.mode=fast"),
    ({"nvext": {"annotations": ["dflash.mode=ddtree"]}}, "/v1/completions", 400,
     "nvext.annotations: dflash.mode: ddtree"),
    ({"dflash": {"mode": "ar"}}, "/v1/completions", 400, "Validation: Unsupported parameter(s): `dflash`"),  # Dynamo's
    ({"model": "nope"}, "/v1/completions", 404, "Model not found"),  # Dynamo's
    ({"presence_penalty": 0.5, "messages": MESSAGES}, "/v1/chat/completions", 400, "presence_penalty: not supported"),
])
def test_bad_requests_get_one_line_and_the_workers_keep_serving(dynamo, body, path, status, message):
    cluster = dynamo[2]
    base = {"model": "dflash", "max_tokens": 4, **({} if path.endswith("chat/completions") else {"prompt": PROMPT})}
    t0 = time.monotonic()
    got, err = post(cluster.url, {**base, **body}, path, timeout=60)
    assert (got, err["message"][: len(message)]) == (status, message) and "\n" not in err["message"]
    got, text = post(cluster.url, {**base, **body, "stream": True}, path, timeout=60)
    if got == 200:  # refused by our worker once streaming: an error event, then [DONE]
        assert events(text)[-1]["error"]["message"].startswith(message)
    assert time.monotonic() - t0 < 30
    assert post(cluster.url, {"model": "dflash", "prompt": PROMPT, "max_tokens": 2})[0] == 200


def _rounds(cluster) -> float:
    from trtllm_dflash.sweep.server_metrics import parse, totals

    return sum(totals(parse(cluster.get_inside(w["metrics"])), "dflash").rounds for w in cluster.workers)


@pytest.mark.slow
def test_a_client_leaving_stops_its_decoding(dynamo):
    """The stream closes after two chunks: Dynamo aborts the request and our engine drops it. The
    random drafter accepts next to nothing, so 480 tokens would take about 480 rounds; the workers'
    /metrics show fewer than half, and no more once it settles. The request is as long as the
    deployment allows because the abort crosses the frontend and the request plane: a loaded CI
    machine decoded 84 of 140 before it arrived (docs/results/suite-time.md)."""
    cluster = dynamo[2]
    before = _rounds(cluster)
    req = urllib.request.Request(cluster.url + "/v1/completions", json.dumps({
        "model": "dflash", "prompt": PROMPT, "max_tokens": LONG, "temperature": 0, "stream": True}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = [line for line, _ in zip((x for x in r if x.startswith(b"data:")), range(2))]
        assert all(b'"text"' in line for line in lines), lines
    deadline, last = time.monotonic() + 30, None
    while time.monotonic() < deadline and (now := _rounds(cluster)) != last:
        last = now
        time.sleep(1.0)
    assert now == last and now - before < LONG / 2, f"{now - before} rounds for a client that left"


def test_sweep_through_dynamo_measures_ar_beside_dflash(dynamo, tmp_path):
    recipe, _, cluster = dynamo
    out = tmp_path / "sweep"
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["sweep", str(recipe.file), "--url", cluster.url, "--api", "openai", "--levels", "1,2",
                   "--modes", "ar,dflash", "--out", str(out), "--set", "sweep.output_len=12"])
    assert rc == 0, buf.getvalue()
    rows = json.loads((out / "summary.json").read_text())
    rows = rows["levels"] if isinstance(rows, dict) else rows
    curves = {(r["curve"], r["concurrency"]): r for r in rows}
    assert set(curves) == {("ar", 1), ("ar", 2), ("dflash", 1), ("dflash", 2)}
    assert all(r["failed"] == 0 and r["tau"] for r in rows)
    assert all(curves[("dflash", c)]["acceptance_source"] == "nvext.engine_data" for c in (1, 2))
    assert all(curves[("ar", c)]["acceptance_source"] is None for c in (1, 2))  # nothing drafted, nothing reported
    assert json.loads((out / "manifest.json").read_text())["extra"]["server_acceptance"] == "nvext.engine_data"
    assert "nvext.engine_data" in buf.getvalue()


def test_a_killed_workers_request_fails_and_the_other_keeps_serving(dynamo):
    """SIGKILL the worker decoding a stream: the stream ends with an error event (Dynamo's frontend
    does not migrate it: --migration-limit 0), and the frontend drops the dead instance after at most
    a request or two of HTTP 503. Last in this module: the cluster keeps one worker."""
    cluster = dynamo[2]
    req = urllib.request.Request(cluster.url + "/v1/completions", json.dumps({
        "model": "dflash", "prompt": PROMPT, "max_tokens": LONG, "temperature": 0, "stream": True,
        "nvext": ENGINE_DATA}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        first = json.loads(next(line for line in r if line.startswith(b"data:"))[5:])
        victim = next(w for w in cluster.workers if w["worker_id"] == first["nvext"]["worker_id"]["decode_worker_id"])
        os.kill(victim["pid"], signal.SIGKILL)
        cluster.killed = f"worker-{cluster.workers.index(victim)}.log"
        rest = r.read().decode()
    tail = events(rest)
    assert "error" in tail[-1] and not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in tail)
    survivor = next(w for w in cluster.workers if w is not victim)["worker_id"]
    short = {"model": "dflash", "prompt": PROMPT, "max_tokens": 2, "nvext": ENGINE_DATA}
    answers = [post(cluster.url, short, timeout=60) for _ in range(8)]
    failed = [a for a in answers if a[0] != 200]
    assert len(failed) <= 2 and all(a[0] == 503 and "\n" not in a[1]["message"] for a in failed), failed
    assert {a[1]["nvext"]["worker_id"]["decode_worker_id"] for a in answers[-4:]} == {survivor}
