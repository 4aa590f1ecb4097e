"""`serve --api openai` on the embedded default, a real server on a free loopback port, driven
by the official `openai` client (and raw HTTP for malformed requests).

Greedy output must be `generate --checkpoint <the deployed convert output>`'s, token for token;
every bad input gets an OpenAI error object naming the field and the server keeps serving.
"""

import asyncio
import io
import json
import time
import urllib.error
import urllib.request
from contextlib import redirect_stdout
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="needs the openai client (the dev extra)")
pytest.importorskip("fastapi", reason="needs fastapi + uvicorn (the serve extra)")

from serve_helpers import start_openai_server, stop_server  # noqa: E402
from trtllm_dflash.cli import main  # noqa: E402
from trtllm_dflash.launch.server import free_port  # noqa: E402
from trtllm_dflash.sweep.protocols import _openai_rounds  # noqa: E402

PROMPT = "def parse_args(argv):\n    "


@pytest.fixture(scope="module")
def server(embedded_run):
    root = embedded_run
    port = free_port()
    proc = start_openai_server([], root / "deploy", port)
    yield f"http://127.0.0.1:{port}", root, proc
    rc, out = stop_server(proc)
    assert rc == 0 and "stopped" in out, f"unclean stop: rc {rc}, {out!r}"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)


def generate_text(checkpoint: Path, prompt: str, n: int) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", prompt, "--max-new-tokens", str(n),
                     "--json"]) == 0
    return json.loads(buf.getvalue())["text"]


def post(url: str, body, path="/v1/completions") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.loads(r.read())


def check_speculative_decoding(spec: dict) -> None:
    """A choice's speculative_decoding object: TensorRT-LLM PR #19311's fields and types, and its
    identities (the histogram sums to the steps and, weighted, to the accepted drafts)."""
    assert set(spec) == {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_spec_steps",
                         "acceptance_histogram", "num_spec_tokens"}
    ints = ("total_accepted_draft_tokens", "total_draft_tokens", "num_spec_steps")
    assert all(type(spec[k]) is int for k in ints) and type(spec["acceptance_rate"]) is float
    assert spec["num_spec_tokens"] is None or type(spec["num_spec_tokens"]) is int
    hist = spec["acceptance_histogram"]
    assert isinstance(hist, list) and all(type(n) is int for n in hist) and len(hist) >= 1
    assert sum(hist) == spec["num_spec_steps"] >= 1
    assert sum(j * n for j, n in enumerate(hist)) == spec["total_accepted_draft_tokens"] <= spec["total_draft_tokens"]
    drafted = spec["total_draft_tokens"]
    assert spec["acceptance_rate"] == pytest.approx(spec["total_accepted_draft_tokens"] / drafted if drafted else 0.0)


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["dflash"]


def test_streamed_greedy_completion_equals_generate(server, client):
    url, root, _ = server
    chunks = list(client.completions.create(model="dflash", prompt=PROMPT, max_tokens=48, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1, "expected several chunks"
    assert text == generate_text(root / "convert", PROMPT, 48)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("length", "stop")
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 48
    # speculative_decoding: on the final chunk's choice only (TensorRT-LLM PR #19311's placement)
    assert [c for c in chunks if c.choices and "speculative_decoding" in c.choices[0].model_extra] == finals
    spec = finals[0].choices[0].model_extra["speculative_decoding"]
    check_speculative_decoding(spec)
    # trtllm-serve's avg_decoded_tokens_per_iter on every text chunk; sweep reads every verify pass back from
    # it (num_spec_steps leaves out the passes that drafted nothing: PR #19311)
    avgs = [c.choices[0].model_extra.get("avg_decoded_tokens_per_iter") for c in chunks
            if c.choices and (c.choices[0].text or c.choices[0].finish_reason)]
    passes = _openai_rounds(usage.completion_tokens, avgs[-1])
    assert None not in avgs and avgs[-1] == pytest.approx(usage.completion_tokens / (passes + 1))
    assert passes == usage.completion_tokens - 1 - spec["total_accepted_draft_tokens"] >= spec["num_spec_steps"]


def test_request_extension_picks_the_mode_and_the_response_says_which(client):
    """`"dflash": {"mode", "draft_len"}`: AR, DFlash and the deployment's DDTree from one server, the same
    greedy text; the response's dflash.mode says how the request was decoded."""
    texts = {}
    for ext in ({"mode": "ar"}, {"mode": "dflash", "draft_len": 3}, {}):
        r = client.completions.create(model="dflash", prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"dflash": ext} if ext else None)
        decoded, choice = r.model_extra["dflash"], r.choices[0].model_extra
        assert {k: decoded.get(k) for k in ("mode", "draft_len")} == {"mode": ext.get("mode", "ddtree"),
                                                                       "draft_len": ext.get("draft_len")}
        texts[decoded["mode"]] = r.choices[0].text
        if ext.get("mode") == "ar":  # nothing drafted: the object is left out (PR #19311), one token per pass
            assert "speculative_decoding" not in choice and choice["avg_decoded_tokens_per_iter"] == 1.0
            assert "tree_draft_tokens" not in decoded
            continue
        spec = choice["speculative_decoding"]
        check_speculative_decoding(spec)
        assert spec["num_spec_tokens"] is None  # the server's own: its draft-length policy (draft_len: auto)
        if "draft_len" in ext:  # the histogram: the deepest acceptance + 1, at most 3 + 1
            assert spec["total_draft_tokens"] <= 3 * spec["num_spec_steps"] and len(spec["acceptance_histogram"]) <= 4
        else:  # DDTree: the path's depth in the object, the nodes in our extension
            assert decoded["tree_draft_tokens"] >= spec["total_draft_tokens"]
    assert sorted(texts) == ["ar", "ddtree", "dflash"] and len(set(texts.values())) == 1


def test_non_streaming_completion(server, client):
    _, root, _ = server
    r = client.completions.create(model="dflash", prompt=PROMPT, max_tokens=20, temperature=0)
    assert r.choices[0].text == generate_text(root / "convert", PROMPT, 20)
    spec = r.choices[0].model_extra["speculative_decoding"]
    check_speculative_decoding(spec)
    passes = _openai_rounds(r.usage.completion_tokens, r.choices[0].model_extra["avg_decoded_tokens_per_iter"])
    assert r.usage.completion_tokens == 1 + passes + spec["total_accepted_draft_tokens"] <= 20
    assert passes >= spec["num_spec_steps"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_completions_use_the_documented_fallback_template(client):
    from trtllm_dflash.serve.requests import FALLBACK_CHAT_TEMPLATE  # noqa: F401  (the tiny tokenizer has no template)

    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "import os"}]
    r = client.chat.completions.create(model="dflash", messages=messages, max_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    # The fallback renders "role: content" lines, then "assistant:".
    same = client.completions.create(model="dflash", prompt="system: You write Python.\nuser: import os\nassistant:",
                                     max_tokens=16, temperature=0)
    assert r.choices[0].message.content == same.choices[0].text
    streamed = client.chat.completions.create(model="dflash", messages=messages, max_tokens=16, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == same.choices[0].text
    assert client.models.list().data[0].model_extra["chat_template"] == "fallback"


def test_sampling_with_a_seed_is_reproducible(client):
    """With the request's draft length fixed: under the recipe's `auto` the rounds' lengths follow
    the server's state, which decides how the seeded stream is consumed (docs/serving.md, OpenAI-compatible
    endpoint)."""
    kw = dict(model="dflash", prompt=PROMPT, max_tokens=16, temperature=0.8, top_p=0.9, seed=7,
              extra_body={"dflash": {"draft_len": 7}})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens > 0


BAD = [
    (b'{"model": "dflash", "prompt": ', 400, None, "request body: not valid JSON"),
    ({"model": "dflash"}, 400, "prompt", "prompt: required"),
    ({"model": "dflash", "prompt": ""}, 400, "prompt", "prompt: empty prompt"),
    ({"model": "dflash", "prompt": ["a", "b"]}, 400, "prompt", "prompt: one prompt per request"),
    ({"model": "dflash", "prompt": "x", "max_tokens": 0}, 400, "max_tokens",
     "max_tokens: Input should be greater than 0"),
    ({"model": "dflash", "prompt": "x", "max_tokens": 100000}, 400, "max_tokens",
     "max_tokens: 100000 > 511 (build limit max_seq_len 512"),
    ({"model": "dflash", "prompt": "x = 1\n" * 200}, 400, "prompt", "longer than the build limit max_input_len 256"),
    ({"model": "dflash", "prompt": "x", "temperature": -0.5}, 400, "temperature",
     "temperature: Input should be greater than or equal to 0"),
    ({"model": "dflash", "prompt": "x", "top_p": 0}, 400, "top_p", "top_p: Input should be greater than 0"),
    ({"model": "dflash", "prompt": "x", "top_p": 1.5}, 400, "top_p", "top_p: Input should be less than or equal to 1"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model", "model: 'gpt-4' does not exist"),
    ({"model": "dflash", "prompt": "x", "n": 2}, 400, "n", "n: 2 > 1"),
    ({"model": "dflash", "prompt": "x", "echo": True}, 400, "echo", "echo: not supported"),
    ({"model": "dflash", "prompt": "x", "dflash": {"mode": "tree"}}, 400, "dflash.mode",
     "dflash.mode: Input should be"),
    ({"model": "dflash", "prompt": "x", "dflash": {"draft_len": -1}}, 400, "dflash.draft_len",
     "dflash.draft_len: Input should be greater than or equal to 0"),
]


@pytest.mark.parametrize("body,status,param,message", BAD,
                         ids=[m.split(":")[0] + str(i) for i, (_, _, _, m) in enumerate(BAD)])
def test_bad_completions_get_openai_errors_and_the_server_keeps_serving(server, client, body, status, param, message):
    code, answer = post(server[0], body)
    assert code == status, answer
    err = answer["error"]
    assert message in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"
    done = client.completions.create(model="dflash", prompt="x", max_tokens=2, temperature=0)
    assert done.usage.completion_tokens >= 1


@pytest.mark.parametrize("body,param,message", [
    ({"model": "dflash", "messages": []}, "messages", "messages: List should have at least 1 item"),
    ({"model": "dflash", "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role", "messages.0.role"),
    ({"model": "dflash", "messages": [{"role": "user", "content": ""}]}, "messages", "every message is empty"),
    ({"model": "dflash", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1},
     "max_completion_tokens", "max_completion_tokens: Input should be greater than 0"),
])
def test_bad_chat_requests(server, client, body, param, message):
    code, answer = post(server[0], body, "/v1/chat/completions")
    assert code == 400 and message in answer["error"]["message"] and answer["error"]["param"] == param
    r = client.chat.completions.create(model="dflash", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_openai_client_raises_the_error_type(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="dflash", prompt="x", max_tokens=2, temperature=-1)


def test_a_client_leaving_mid_stream_frees_its_slot(server, client):
    url = server[0]
    before = health(url)["ended"].get("cancelled", 0)
    stream = client.completions.create(model="dflash", prompt=PROMPT, max_tokens=400, temperature=0, stream=True)
    first = next(iter(stream))
    assert first.choices[0].text is not None
    stream.close()  # drop the connection after one chunk
    deadline = time.monotonic() + 120
    while health(url)["ended"].get("cancelled", 0) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    state = health(url)
    assert state["ended"].get("cancelled", 0) == before + 1, "the engine never dropped the abandoned request"
    assert state["running"] == 0
    r = client.completions.create(model="dflash", prompt="import sys\n", max_tokens=8, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_sixteen_concurrent_streams_all_complete_and_are_exact(server):
    from transformers import AutoTokenizer

    from trtllm_dflash.runtime.checkpoint_runner import checkpoint_steps

    url, root, _ = server
    prompts = [f"def f{i}(x):\n    return x * {i} + " for i in range(16)]
    aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)

    async def one(prompt):
        stream = await aclient.completions.create(model="dflash", prompt=prompt, max_tokens=24, temperature=0,
                                                  stream=True)
        parts, reason = [], None
        async for c in stream:
            if c.choices:
                parts.append(c.choices[0].text)
                reason = c.choices[0].finish_reason or reason
        return "".join(parts), reason

    async def all_of():
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await aclient.close()

    results = asyncio.run(all_of())
    assert all(reason in ("length", "stop") for _, reason in results)
    tok = AutoTokenizer.from_pretrained(root / "convert" / "tokenizer")
    ids = [tok(p)["input_ids"] for p in prompts]
    tokens = [[] for _ in prompts]
    for rec in checkpoint_steps(root / "convert", ids, 24, mode="ddtree", block_size=16, ddtree_budget=32):
        for i, t in zip(rec.seq_ids, rec.tokens):
            tokens[i] += t
    expected = [tok.decode(t, skip_special_tokens=True) for t in tokens]
    assert [text for text, _ in results] == expected


def test_a_busy_port_is_refused_with_the_field(server, capsys):
    from trtllm_dflash.cli import main

    url, root, _ = server
    port = url.rsplit(":", 1)[1]
    capsys.readouterr()
    assert main(["serve", "--from", str(root / "deploy"), "--api", "openai", "--http-port", port]) == 2
    err = capsys.readouterr().err
    assert f"serve.http_port: 127.0.0.1:{port} is already in use" in err and err.count("\n") == 1


def test_metrics_count_drafted_and_accepted_tokens(server, client):
    """/metrics (prometheus_client) carries serve/metrics.py's counters, grown by the requests."""
    from trtllm_dflash.sweep.server_metrics import scrape, totals

    url = server[0] + "/metrics"
    deadline = time.monotonic() + 30  # requests of earlier tests (a client that left) still in the engine
    while (h := health(server[0]))["running"] or h["queued"]:
        assert time.monotonic() < deadline, h
        time.sleep(0.1)
    before = totals(scrape(url), "dflash")  # every mode: the embedded default decodes ddtree
    responses = [client.completions.create(model="dflash", prompt=PROMPT, max_tokens=n, temperature=0)
                 for n in (12, 20)]
    stats = [r.choices[0].model_extra["speculative_decoding"] for r in responses]
    after = scrape(url)
    grew = totals(after, "dflash").minus(before)
    assert totals(after, "dflash", responses[0].model_extra["dflash"]["mode"]).rounds >= grew.rounds  # labelled by mode
    # every verify pass (from avg_decoded_tokens_per_iter); drafts as /metrics counts them (DDTree: nodes)
    assert grew.rounds == sum(_openai_rounds(r.usage.completion_tokens, r.choices[0].model_extra[
        "avg_decoded_tokens_per_iter"]) for r in responses)
    assert grew.drafted == sum(r.model_extra["dflash"].get("tree_draft_tokens") or s["total_draft_tokens"]
                               for r, s in zip(responses, stats))
    assert 0 < grew.accepted == sum(s["total_accepted_draft_tokens"] for s in stats) <= grew.drafted
    assert grew.tau == pytest.approx(1 + grew.accepted / grew.rounds) and grew.tau > 1


def test_a_sweeps_per_request_acceptance_adds_up_to_the_servers_counters(server):
    """`sweep` over the OpenAI endpoint records each request's speculative_decoding; summed over the
    sweep (warm-up requests too) they are the growth of /metrics' counters over the same sweep, and
    each level reports the per-request tau's p10 / p50 / p90 beside the server's own tau."""
    from trtllm_dflash.sweep.loadgen import Variant, run_sweep
    from trtllm_dflash.sweep.server_metrics import scrape, totals

    url = server[0]
    deadline = time.monotonic() + 30
    while (h := health(url))["running"] or h["queued"]:
        assert time.monotonic() < deadline, h
        time.sleep(0.1)
    before = totals(scrape(url + "/metrics"), "dflash")
    result = run_sweep(url, "dflash", [1, 2], lambda c: 3, 1, [PROMPT, "import os\n", "class A:\n"], 12, gpus=1,
                       protocol="openai", variants=[Variant("ddtree"), Variant("dflash", "dflash")],
                       metrics_url=url + "/metrics")
    grew = totals(scrape(url + "/metrics"), "dflash").minus(before)
    recs = result.records
    assert len(recs) == 2 * (3 + 1) * 2 and all(r.ok and r.acceptance_source == "response" for r in recs)
    assert all(sum(r.acceptance_histogram) <= r.rounds for r in recs)  # steps that drafted, of all passes
    assert (sum(r.rounds for r in recs), sum(r.drafted for r in recs), sum(r.accepted for r in recs)) == (
        grew.rounds, grew.drafted, grew.accepted)
    assert grew.accepted > 0
    for row in result.levels:
        t = row.tau_request
        assert t.n == row.requests == 3 and 1.0 <= t.p10 <= t.p50 <= t.p90 and row.server_tau is not None
        assert row.acceptance_source == "response"


def test_every_dashboard_panel_has_a_live_series_after_ddtree_and_dflash_requests(server, client):
    """The served deployment's /metrics after real requests in its own mode (DDTree, the embedded
    default's) and in DFlash: each panel of docs/grafana-dflash.json has, for each mode, a query all
    of whose series are in the exposition with that mode (per-position acceptance included: DDTree
    counts it along the accepted path), and every series a panel names is exported."""
    import re

    from trtllm_dflash.sweep.server_metrics import parse

    url = server[0]
    for ext in (None, {"mode": "dflash"}):
        for n in (12, 20):
            client.completions.create(model="dflash", prompt=PROMPT, max_tokens=n, temperature=0,
                                      extra_body={"dflash": ext} if ext else None)
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        samples = parse(r.read().decode())
    dash = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dflash.json").read_text())

    def live(expr: str, mode: str) -> bool:
        names = set(re.findall(r"\bdflash_[a-z_]+", expr))
        return all(any(lab.get("mode") == mode for lab, _ in samples.get(name, [])) for name in names)

    for panel in dash["panels"]:
        exprs = [t["expr"] for t in panel["targets"]]
        for mode in ("ddtree", "dflash"):
            assert any(live(e, mode) for e in exprs), f"panel {panel['title']!r}: no live series for mode {mode}"
        for name in {n for e in exprs for n in re.findall(r"\bdflash_[a-z_]+", e)}:
            assert name in samples, f"panel {panel['title']!r} queries {name}, which /metrics does not export"
    positions = {lab["position"] for lab, _ in samples["dflash_spec_decode_draft_tokens_per_pos_total"]
                 if lab["mode"] == "ddtree"}
    assert "1" in positions
