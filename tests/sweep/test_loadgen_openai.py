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
    spec = {**SPEC, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0, "acceptance_histogram": [2]}
    s = _Session(200, [{**chunk("abc", "length", speculative_decoding=spec), "dflash": {"mode": "ar", "draft_len": 0}},
                       "data: [DONE]"])
    r = record(s, {"mode": "ar", "draft_len": 0})
    assert s.sent[1]["dflash"] == {"mode": "ar", "draft_len": 0} and r.error is None and r.rounds == 2
    assert r.drafted == 0 and r.accepted == 0
    # A server that ignores the extension (another OpenAI-compatible server) fails the request, named.
    r = record(_Session(200, [chunk("abc", "length"), "data: [DONE]"]), {"mode": "ar"})
    assert "did not decode mode 'ar'" in r.error and not r.ok
    # `sweep --tune`'s fixed lengths: a server that decodes with its own schedule fails them, named.
    r = record(_Session(200, [{**chunk("abc", "length"), "dflash": {"mode": "dflash", "draft_len": None}},
                              "data: [DONE]"]), {"draft_len": 3})
    assert "did not take draft_len 3" in r.error and not r.ok


def test_plain_servers_count_chunks_and_take_the_usage_total():
    # e.g. vLLM: one chunk of text may carry several tokens; only usage says how many.
    r = record(_Session(200, [chunk("ab"), chunk("c"), chunk("", "stop"), {"choices": [], "usage": {"completion_tokens": 5}},
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
