"""The OpenAI protocol of the load generator against scripted event streams (no server).

Servers differ in what a stream tells: ours (and trtllm-serve with TensorRT-LLM PR #19311) a
per-choice `speculative_decoding` object on the final chunk, older trtllm-serve an acceptance
length per choice, vLLM / SGLang only text and a final `usage`. Tokens always come out right;
tau is known exactly, derived, or unknown.
"""

import asyncio
import json

from trtllm_dflash.sweep.loadgen import _consume
from trtllm_dflash.sweep.metrics import RequestRecord, request_tau, summarize_level
from trtllm_dflash.sweep.protocols import _openai_rounds, openai_base, openai_events


class _Response:
    def __init__(self, status: int, lines: list[str]):
        self.status, self._lines = status, lines

    @property
    def content(self):
        async def it():
            for line in self._lines:
                yield (line + "\n").encode()
        return it()

    async def text(self):
        return "".join(self._lines)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


class _Session:
    def __init__(self, status: int, events: list):
        self.status = status
        self.lines = [e if isinstance(e, str) else "data: " + json.dumps(e) for e in events]
        self.sent = None

    def post(self, url, json):
        self.sent = (url, json)
        return _Response(self.status, self.lines)


def record(session, settings=None) -> RequestRecord:
    rec = RequestRecord(request_id=0, concurrency=1, start_ns=0)
    return asyncio.run(_consume(rec, openai_events(session, "127.0.0.1:9", "m", "p", 8, 3, 0.0, settings)))


def chunk(text, reason=None, **extra):
    return {"choices": [{"index": 0, "text": text, "finish_reason": reason, **extra}]}


SPEC = {"acceptance_rate": 0.5, "total_accepted_draft_tokens": 3, "total_draft_tokens": 6, "num_spec_steps": 2,
        "acceptance_histogram": [0, 0, 1, 1], "num_spec_tokens": 3}


def test_speculative_decoding_gives_rounds_and_the_requests_acceptance():
    s = _Session(200, [chunk("a"), chunk("bcd"), chunk("ef", "length", speculative_decoding=SPEC),
                       {"choices": [], "usage": {"completion_tokens": 6}}, "data: [DONE]"])
    r = record(s)
    assert r.chunk_tokens == [1, 1, 4] and r.rounds == 2 and r.text == "abcdef" and r.error is None
    assert (r.drafted, r.accepted, r.acceptance_histogram, r.acceptance_source) == (6, 3, [0, 0, 1, 1], "response")
    assert request_tau(r) == (6 - 1) / 2
    url, body = s.sent
    assert url == "http://127.0.0.1:9/v1/completions" and body["stream"] and body["stream_options"]["include_usage"]
    assert (body["model"], body["max_tokens"], body["seed"], body["temperature"]) == ("m", 8, 3, 0.0)


def test_a_curves_mode_and_draft_len_go_out_as_our_extension_and_must_come_back():
    # AR: nothing drafted, so no speculative_decoding object (PR #19311); passes from the acceptance length
    s = _Session(200, [{**chunk("abc", "length", avg_decoded_tokens_per_iter=1.0),
                        "dflash": {"mode": "ar", "draft_len": 0}},
                       {"choices": [], "usage": {"completion_tokens": 3}}, "data: [DONE]"])
    r = record(s, {"mode": "ar", "draft_len": 0})
    assert s.sent[1]["dflash"] == {"mode": "ar", "draft_len": 0} and r.error is None and r.rounds == 2
    assert r.drafted == 0 and r.accepted is None and r.acceptance_source is None and request_tau(r) == 1.0
    # A server that ignores the extension (another OpenAI-compatible server) fails the request, named.
    r = record(_Session(200, [chunk("abc", "length"), "data: [DONE]"]), {"mode": "ar"})
    assert "did not decode mode 'ar'" in r.error and not r.ok
    # `sweep --tune`'s fixed lengths: a server that decodes with its own schedule fails them, named.
    r = record(_Session(200, [{**chunk("abc", "length"), "dflash": {"mode": "dflash", "draft_len": None}},
                              "data: [DONE]"]), {"draft_len": 3})
    assert "did not take draft_len 3" in r.error and not r.ok


def test_plain_servers_count_chunks_and_take_the_usage_total():
    # e.g. vLLM: one chunk of text may carry several tokens; only usage says how many.
    r = record(_Session(200,
                        [chunk("ab"), chunk("c"), chunk("", "stop"), {"choices": [], "usage": {"completion_tokens": 5}},
                              "data: [DONE]"]))
    assert r.output_tokens == 5 and len(r.chunk_ns) == 2 and r.chunk_tokens[-1] == 4
    assert r.rounds == 0 and request_tau(r) is None and r.accepted is None and r.acceptance_source is None
    assert summarize_level([r], 1, 1).tau is None  # reported as unknown, never guessed


def test_trtllm_serve_acceptance_length_gives_rounds():
    r = record(_Session(200, [chunk("abcdefgh"), chunk("", "length", avg_decoded_tokens_per_iter=3.0),
                              {"choices": [], "usage": {"completion_tokens": 9}}, "data: [DONE]"]))
    # 9 tokens at 3 per iteration: 3 iterations, the first of them the context step.
    assert r.output_tokens == 9 and r.rounds == 2
    assert _openai_rounds(0, 2.0) == 0 and _openai_rounds(5, None) == 0


def test_errors_fail_the_request_not_the_sweep():
    r = record(_Session(400, ['{"error": {"message": "max_tokens: too many", "type": "invalid_request_error"}}']))
    assert r.error == "HTTP 400: max_tokens: too many" and not r.ok
    r = record(_Session(200, [chunk("a"), {"error": {"message": "generation failed: boom"}}]))
    assert r.error == "generation failed: boom"


def test_url_forms():
    assert openai_base("127.0.0.1:8000") == openai_base("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"


def test_passes_come_from_the_acceptance_length_and_tree_nodes_from_our_extension():
    """PR #19311's num_spec_steps leaves out the passes that drafted nothing (a policy's 0);
    avg_decoded_tokens_per_iter counts every pass, so the sweep's tau divides by all of them.
    A DDTree request's drafts verified are its tree nodes (our `dflash.tree_draft_tokens`)."""
    spec = {**SPEC, "total_draft_tokens": 4}  # 2 steps drafted, along the tree's path: 4 deep
    final = {**chunk("ef", "length", speculative_decoding=spec, avg_decoded_tokens_per_iter=1.5),
             "dflash": {"mode": "ddtree", "draft_len": None, "tree_draft_tokens": 40}}
    usage = {"choices": [], "usage": {"completion_tokens": 6}}
    r = record(_Session(200, [chunk("abcd"), final, usage, "data: [DONE]"]))
    assert r.rounds == 3 and (r.drafted, r.accepted) == (40, 3) and request_tau(r) == 2.0


def test_behind_dynamo_the_curve_goes_in_annotations_and_acceptance_comes_in_engine_data():
    """Dynamo's frontend refuses the extension `dflash`: a curve's mode goes as nvext.annotations,
    and the worker's objects come back in nvext.engine_data on the final chunk (serve/dynamo.py)."""
    data = {"speculative_decoding": SPEC, "avg_decoded_tokens_per_iter": 2.0,
            "dflash": {"mode": "ar", "draft_len": None}}
    s = _Session(200, [chunk("ab"), {**chunk("cdef", "length"), "nvext": {"engine_data": data}},
                       {"choices": [], "usage": {"completion_tokens": 6}}, "data: [DONE]"])
    rec = RequestRecord(request_id=0, concurrency=1, start_ns=0)
    r = asyncio.run(_consume(rec, openai_events(s, "127.0.0.1:9", "m", "p", 8, 3, 0.0, {"mode": "ar"}, dynamo=True)))
    body = s.sent[1]
    assert "dflash" not in body
    assert body["nvext"] == {"extra_fields": ["engine_data"], "annotations": ["dflash.mode=ar"]}
    assert r.error is None and r.rounds == 2 and (r.drafted, r.accepted) == (6, 3)
    assert r.acceptance_source == "nvext.engine_data"


def test_dynamo_is_found_by_its_health_route(monkeypatch):
    import io as _io
    import urllib.request

    from trtllm_dflash.sweep.protocols import is_dynamo

    answers = {"dynamo": b'{"status": "healthy", "endpoints": ["dyn://dynamo.backend.generate"], "instances": []}',
               "ours": b'{"status": "ok", "running": 0, "queued": 0, "ended": {}}', "plain": b""}
    def urlopen(url, timeout):
        return _io.BytesIO(answers[url.split("//")[1].split(":")[0]])

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    assert [is_dynamo(f"{k}:8000") for k in answers] == [True, False, False]


def test_behind_dynamo_ar_beside_dflash_only_over_our_worker():
    """Our worker (reference backend) takes each request's mode through nvext.annotations, so a
    sweep behind Dynamo measures AR beside DFlash; Dynamo's stock TensorRT-LLM workers (pytorch
    backend) do not, so there the sweep measures the deployment's own mode, as for trtllm-serve."""
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.sweep.stage import default_modes

    ours, pytorch = load_recipe(None), load_recipe("recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml")
    assert default_modes(ours, "openai", dynamo=True)[:2] == ["ar", "dflash"]
    assert default_modes(ours, "openai", dynamo=False) == ["ddtree" if ours.speculative.ddtree_budget else "dflash"]
    assert default_modes(pytorch, "openai", dynamo=True) == ["dflash"]
