"""OpenAI-compatible HTTP server for the reference backend (FastAPI + uvicorn).

    trtllm-dflash serve RECIPE --from DEPLOY_DIR --api openai      (127.0.0.1 by default)

Serves the deployed checkpoint through the same loader and in-flight batching engine as the
Triton model (serve/deployed.py, serve/batcher.py), so concurrent requests are decoded together
and a greedy completion is token for token `generate --checkpoint` of that checkpoint.

Routes
  GET  /v1/models              the one served model (the recipe's serve.model_name)
  POST /v1/completions         prompt: a string, a list of one string, or a list of token ids
  POST /v1/chat/completions    messages rendered with the target tokenizer's chat template, or
                               FALLBACK_CHAT_TEMPLATE when the tokenizer has none (the embedded
                               tiny pair's has none): one "role: content" line per message, then
                               "assistant:" (the fallback in use is logged and shown in /v1/models)
  GET  /metrics                Prometheus text: the speculative-decoding counters and histograms
                               of serve/metrics.py (drafted, accepted, per position, rounds, draft
                               length, verify batch, draft / verify time)
  GET  /health                 200 once the engine is loaded, with the engine's running and
                               queued requests and how many requests ended, by finish reason;
                               503 with the reason once the model cannot serve (a dead tp rank)
Both generation routes take stream (server-sent events ending with `data: [DONE]`),
stream_options.include_usage, max_tokens (chat: also max_completion_tokens; default 16 for
completions, the rest of build.max_seq_len for chat), temperature (default 1, as OpenAI's;
0 = greedy), top_p, top_k (extension), seed, stop, and the request extension
`"dflash": {"mode": "ar" | "dflash" | "ddtree", "draft_len": N}` (both optional: this request's
decoding and drafts per round, as the Triton model's `mode` / `draft_len` inputs; ddtree needs
the deployment's ddtree_budget). Every response carries `usage` (streams: in a last chunk when
include_usage is set). The request's speculative decoding is reported per choice, in the shape
of TensorRT-LLM PR #19311 (trtllm-serve's), on a whole response's choice and on a stream's
final chunk (the one with finish_reason):
  "speculative_decoding": {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                           "num_spec_steps", "acceptance_histogram", "num_spec_tokens"}
num_spec_steps = target verify passes (the prefill excluded); acceptance_histogram[j] = passes
that accepted exactly j drafts ([max drafts + 1], so sum = num_spec_steps); acceptance_rate =
accepted / drafted (0 when nothing was drafted); num_spec_tokens = the most drafts a pass of
this request verifies: its own draft_len, 0 for AR, null while the server's draft-length policy
chooses per pass. DDTree counts drafted tree nodes in total_draft_tokens (PR #19311 counts the
tree's path depth), as /metrics does. The same response carries, top level, `dflash`: {"mode",
"draft_len"}, the request extension as decoded (mode = how the request was decoded, draft_len =
the drafts per round it asked for, null for the server's policy), so a client can tell that the
server honoured it. A stop token ends the request with finish_reason "stop" and is not part of
the text.

Bad input gets an OpenAI error object {"error": {"message", "type", "param", "code"}} with
status 400 (404 for an unknown model), one line naming the field; a client that disconnects
mid-stream frees its slot at the next round (the engine drops cancelled requests). The
server keeps serving either way.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.serve.requests import (  # noqa: F401  (FALLBACK_CHAT_TEMPLATE: this server's, defined there)
    FALLBACK_CHAT_TEMPLATE,
    MODES,
    RequestError,
    chat_prompt_ids,
    check_lengths,
    check_mode,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class OpenAIError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ----------------------------------------------------------------------------- request bodies


class DFlashOptions(BaseModel):
    """The request extension `dflash`: this request's decoding (the Triton model's mode / draft_len)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal[MODES] | None = None
    draft_len: int | None = Field(default=None, ge=0)


class _Body(BaseModel):
    # OpenAI clients send fields this server does not use (user, metadata, ...): allowed and ignored,
    # except the ones below that would change the result, which are refused when set.
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None
    dflash: DFlashOptions | None = None


class CompletionBody(_Body):
    prompt: str | list[str] | list[int]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    tools: list[Any] | None = None
    top_logprobs: int | None = None


def _validation_error(e: ValidationError) -> OpenAIError:
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "list[", "str", "int"))]
    param = ".".join(loc) or None
    msg = err["msg"]
    if err["type"] == "missing":
        msg = "required"
    shown = err.get("input")
    got = "" if err["type"] == "missing" or isinstance(shown, (dict, list)) else f" (got {shown!r})"
    return OpenAIError(f"{param}: {msg}{got}" if param else f"{msg}{got}", param)


# Options that would change the result, refused when set to anything but their neutral value
# (None, 0, False or empty); fields a route does not have are never set.
_REFUSED = (
    ("frequency_penalty", "not supported (only 0)"),
    ("presence_penalty", "not supported (only 0)"),
    ("logprobs", "not supported"),
    ("top_logprobs", "not supported"),
    ("logit_bias", "not supported"),
    ("echo", "not supported (the prompt is never echoed)"),
    ("suffix", "not supported"),
    ("tools", "not supported"),
)


def _unsupported(body: _Body) -> None:
    """Refuse the options that would change the result, naming the field."""
    if body.n > 1:
        raise OpenAIError(f"n: {body.n} > 1: this server returns one choice per request", "n")
    if getattr(body, "best_of", None) not in (None, 1):
        raise OpenAIError("best_of: only 1 is supported", "best_of")
    for name, why in _REFUSED:
        if getattr(body, name, None):
            raise OpenAIError(f"{name}: {why}", name)


# ----------------------------------------------------------------------------- the service


@dataclass
class _Stream:
    """One request's updates, handed from the engine thread to the event loop."""

    loop: asyncio.AbstractEventLoop
    ended: Any  # Counter of finish reasons (the service's)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    gone: threading.Event = field(default_factory=threading.Event)  # the client left
    mode: str = "dflash"  # how the engine decodes this request
    draft_len: int | None = None  # the drafts per round it asked for (None: the server's policy)

    def emit(self, update) -> None:  # engine thread
        if update.finish_reason is not None:
            self.ended[update.finish_reason.split(":")[0]] += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait, update)


class Service:
    """The OpenAI semantics over a `Deployed` (serve/deployed.py); FastAPI routes call it."""

    def __init__(self, deployed, model_name: str):
        self.deployed = deployed
        self.model_name = model_name
        # Requests are tokenized on the event loop; the engine thread detokenizes with a copy of
        # its own (serve/deployed.py), so the deployed tokenizer is this side's.
        self.tokenizer = tok = deployed.tokenizer
        self.chat_template = getattr(tok, "chat_template", None) or FALLBACK_CHAT_TEMPLATE
        self.fallback_template = self.chat_template is FALLBACK_CHAT_TEMPLATE
        # Text of the stop tokens: a completion that stops on one ends before it.
        self.stop_texts = sorted({tok.decode([i]) for i in deployed.model.eos_token_ids} - {""}, key=len, reverse=True)
        self.created = int(time.time())
        self.ended: Counter = Counter()

    # -- parsing

    def parse(self, raw: bytes, kind: type[_Body]) -> _Body:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OpenAIError(f"request body: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise OpenAIError("request body: expected a JSON object")
        try:
            body = kind.model_validate(data)
        except ValidationError as e:
            raise _validation_error(e) from None
        if body.model != self.model_name:
            raise OpenAIError(f"model: {body.model!r} does not exist; this server serves {self.model_name!r}",
                              "model", status=404, code="model_not_found")
        _unsupported(body)
        if body.dflash is not None:
            try:
                check_mode(body.dflash.mode, self.deployed.engine.ddtree_budget, "dflash.mode")
            except RequestError as e:
                raise OpenAIError(str(e), "dflash.mode") from None
        return body

    def prompt_ids(self, body: _Body) -> tuple[list[int], str]:
        """(token ids, the field they came from)."""
        tok = self.tokenizer
        if isinstance(body, ChatBody):
            messages = []
            for i, m in enumerate(body.messages):
                content = m.content
                if isinstance(content, list):
                    parts = [p.get("text") for p in content]
                    if any(p.get("type") != "text" or not isinstance(t, str) for p, t in zip(content, parts)):
                        raise OpenAIError(f"messages.{i}.content: only text parts are supported", f"messages.{i}.content")
                    content = "".join(parts)
                messages.append({"role": m.role, "content": content or ""})
            if not any(m["content"] for m in messages):
                raise OpenAIError("messages: every message is empty", "messages")
            return chat_prompt_ids(tok, messages, self.chat_template), "messages"
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
            vocab = len(tok)
            if any(not 0 <= x < vocab for x in prompt):
                raise OpenAIError(f"prompt: token ids must be in 0..{vocab - 1}", "prompt")
            return list(prompt), "prompt"
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise OpenAIError(f"prompt: one prompt per request, got {len(prompt)}", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise OpenAIError("prompt: empty prompt", "prompt")
        return tok(prompt)["input_ids"], "prompt"

    def max_tokens(self, body: _Body, prompt_tokens: int, prompt_field: str) -> int:
        want = body.max_tokens
        if isinstance(body, ChatBody):
            want = body.max_completion_tokens or want
            default = self.deployed.limits.max_seq_len - prompt_tokens
        else:
            default = COMPLETIONS_DEFAULT_MAX_TOKENS
        n = want if want is not None else max(1, default)
        field = "max_completion_tokens" if isinstance(body, ChatBody) and body.max_completion_tokens else "max_tokens"
        try:
            check_lengths(prompt_tokens, n, self.deployed.limits, prompt_field=prompt_field, max_tokens_field=field)
        except RequestError as e:
            raise OpenAIError(str(e), str(e).split(":")[0]) from None
        return n

    # -- running

    def submit(self, body: _Body, ids: list[int], max_tokens: int, stream: _Stream) -> None:
        from trtllm_dflash.reference.verify import SamplingParams
        from trtllm_dflash.serve.batcher import Job

        sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                  seed=body.seed if body.seed is not None else 0)
        stops = [body.stop] if isinstance(body.stop, str) else [w for w in body.stop or [] if w]
        ext = body.dflash or DFlashOptions()
        stream.mode, stream.draft_len = ext.mode or self.deployed.engine.mode, ext.draft_len
        self.deployed.engine.submit(Job(ids, max_tokens, stream.emit, sampling, stop_words=stops,
                                        cancelled=stream.gone.is_set, draft_len=ext.draft_len, mode=ext.mode))

    def finish_text(self, text: str, reason: str | None) -> str:
        if reason == "stop":
            for s in self.stop_texts:
                if text.endswith(s):
                    return text[: -len(s)]
        return text

    def speculative_decoding(self, update, stream: _Stream) -> dict:
        """A choice's `speculative_decoding` object (TensorRT-LLM PR #19311's field names)."""
        return {"acceptance_rate": update.acceptance_rate, "total_accepted_draft_tokens": update.accepted,
                "total_draft_tokens": update.drafted, "num_spec_steps": update.rounds,
                "acceptance_histogram": list(update.histogram), "num_spec_tokens": self.spec_tokens(stream)}

    def spec_tokens(self, stream: _Stream) -> int | None:
        """The most drafts one verify pass of this request verifies; None where the server's draft
        length policy chooses per pass."""
        engine = self.deployed.engine
        if stream.draft_len is not None:
            return stream.draft_len
        if stream.mode == "ar":
            return 0
        if engine.policy is not None and stream.mode in engine.policy.modes:
            return None
        return engine.histogram_len - 1

    @staticmethod
    def decoded(stream: _Stream) -> dict:
        """The top-level `dflash` object: the request extension as the engine decoded it."""
        return {"mode": stream.mode, "draft_len": stream.draft_len}

    @staticmethod
    def usage(prompt_tokens: int, update) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": update.total_tokens,
                "total_tokens": prompt_tokens + update.total_tokens}


def _engine_failure(reason: str) -> OpenAIError:
    return OpenAIError(f"generation failed: {reason.removeprefix('error: ')}", None, status=500, kind="server_error")


def create_app(deployed, model_name: str):
    """The FastAPI application serving `deployed` (a serve.deployed.Deployed) as `model_name`."""
    from fastapi.responses import Response

    from trtllm_dflash.serve.metrics import PrometheusInstruments, SpecMetrics

    service = Service(deployed, model_name)
    app = FastAPI(title="trtllm_dflash", docs_url=None, redoc_url=None)
    app.state.service = service
    instruments = PrometheusInstruments()
    deployed.engine.metrics = SpecMetrics(instruments, model_name)

    @app.get("/metrics")
    async def metrics():
        body, content_type = instruments.exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_request, e: OpenAIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.get("/health")
    async def health():
        return await _health(deployed, service)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": service.created, "owned_by": "trtllm_dflash",
            "chat_template": "fallback" if service.fallback_template else "tokenizer",
        }]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(service, request, CompletionBody)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(service, request, ChatBody)

    return app


async def _health(deployed, service: "Service"):
    if deployed.model.failed:  # a dead tensor-parallel rank: this server cannot serve
        return JSONResponse({"status": "failed", "reason": deployed.model.failed}, status_code=503)
    engine = deployed.engine
    for _ in range(10):  # the engine thread may resize its groups while we count them
        try:
            running = engine.running
            break
        except RuntimeError:
            await asyncio.sleep(0.01)
    else:
        running = None
    return {"status": "ok", "running": running, "queued": engine.inbox.qsize(), "ended": dict(service.ended)}


async def _generate(service: "Service", request: Request, kind: type[_Body]):
    """One completion or chat completion: streamed (server-sent events) or whole."""
    body = service.parse(await request.body(), kind)
    ids, prompt_field = service.prompt_ids(body)
    max_tokens = service.max_tokens(body, len(ids), prompt_field)
    chat = kind is ChatBody
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    obj = "chat.completion" if chat else "text_completion"
    stream = _Stream(asyncio.get_running_loop(), service.ended)
    service.submit(body, ids, max_tokens, stream)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse(service, stream, rid, obj + ".chunk" if chat else obj, chat, len(ids),
                                      include_usage), media_type="text/event-stream")
    return JSONResponse(await _whole(service, request, stream, rid, obj, chat, len(ids)))


def _choice(chat: bool, text: str, reason: str | None, delta: bool, spec: dict | None = None) -> dict:
    """One choice; `spec`: its speculative_decoding object (a whole response, a stream's final chunk)."""
    extra = {"speculative_decoding": spec} if spec is not None else {}
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, **extra}
    key = "delta" if delta else "message"
    message = {"content": text} if delta else {"role": "assistant", "content": text}
    return {"index": 0, key: message, "logprobs": None, "finish_reason": reason, **extra}


async def _whole(service: Service, request, stream: _Stream, rid: str, obj: str, chat: bool, prompt_tokens: int) -> dict:
    parts, update = [], None
    try:
        while True:
            try:
                update = await asyncio.wait_for(stream.queue.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    stream.gone.set()
                continue
            parts.append(update.text)
            if update.finish_reason is not None:
                break
    finally:
        if update is None or update.finish_reason is None:
            stream.gone.set()
    reason = update.finish_reason
    if reason.startswith("error"):
        raise _engine_failure(reason)
    text = service.finish_text("".join(parts), reason)
    return {"id": rid, "object": obj, "created": int(time.time()), "model": service.model_name,
            "choices": [_choice(chat, text, reason, delta=False, spec=service.speculative_decoding(update, stream))],
            "usage": service.usage(prompt_tokens, update), "dflash": service.decoded(stream)}


async def _sse(service: Service, stream: _Stream, rid: str, obj: str, chat: bool, prompt_tokens: int,
               include_usage: bool):
    """Server-sent events of one request; the client leaving (the task is cancelled) frees its slot."""
    created = int(time.time())

    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    def chunk(choices: list, final: bool) -> str:
        return event({"id": rid, "object": obj, "created": created, "model": service.model_name,
                      "choices": choices, **({"dflash": service.decoded(stream)} if final else {})})

    done = False
    try:
        if chat:  # OpenAI's first chat chunk carries the role
            yield event({"id": rid, "object": obj, "created": created, "model": service.model_name,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}]})
        while True:
            update = await stream.queue.get()
            reason = update.finish_reason
            if reason is not None and reason.startswith("error"):
                done = True
                yield event(_engine_failure(reason).body())
                break
            if reason == "cancelled":
                done = True
                break
            text = service.finish_text(update.text, reason)
            if reason is not None:  # the final chunk: the request's speculative decoding, per choice
                yield chunk([_choice(chat, text, reason, True, service.speculative_decoding(update, stream))], True)
            elif text:
                yield chunk([_choice(chat, text, reason, delta=True)], False)
            if reason is not None:
                done = True
                if include_usage:  # OpenAI's usage chunk: no choices
                    yield event({"id": rid, "object": obj, "created": created, "model": service.model_name,
                                 "choices": [], "usage": service.usage(prompt_tokens, update)})
                break
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            stream.gone.set()  # the engine drops the request at its next round


# ----------------------------------------------------------------------------- running a server


def run_server(deployed, model_name: str, host: str, port: int, on_ready=None) -> None:
    """Serve until SIGINT / SIGTERM, then return (a graceful stop); `on_ready()` runs once the
    socket is bound. uvicorn stops on those signals and re-raises them once stopped, to the
    handlers it found: ours ignore them, so the caller can release the model and exit 0."""
    import signal

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(deployed, model_name), host=host, port=port,
                                           log_level="warning", access_log=False, timeout_graceful_shutdown=5))

    def announce():
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started and on_ready is not None:
            on_ready()

    threading.Thread(target=announce, daemon=True).start()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    server.run()
