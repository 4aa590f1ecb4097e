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

This module holds the routes, the responses (whole or streamed) and the server; the request
bodies are in openai_bodies.py, the semantics over the engine in openai_service.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from trtllm_dflash.serve.openai_bodies import Body, ChatBody, CompletionBody, OpenAIError
from trtllm_dflash.serve.openai_service import Service, Stream


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


async def _generate(service: "Service", request: Request, kind: type[Body]):
    """One completion or chat completion: streamed (server-sent events) or whole."""
    body = service.parse(await request.body(), kind)
    ids, prompt_field = service.prompt_ids(body)
    max_tokens = service.max_tokens(body, len(ids), prompt_field)
    chat = kind is ChatBody
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    obj = "chat.completion" if chat else "text_completion"
    stream = Stream(asyncio.get_running_loop(), service.ended)
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


async def _whole(service: Service, request, stream: Stream, rid: str, obj: str, chat: bool, prompt_tokens: int) -> dict:
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


async def _sse(service: Service, stream: Stream, rid: str, obj: str, chat: bool, prompt_tokens: int,
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
