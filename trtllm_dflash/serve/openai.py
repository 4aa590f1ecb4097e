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
completions, the rest of build.max_seq_len for chat), temperature (default 1, as OpenAI's,
where the runners sample; 0 on an argmax-only engine deployment, which refuses temperature > 0;
0 = greedy), top_p, top_k (extension), seed, stop, and the request extension
`"dflash": {"mode": "ar" | "dflash" | "ddtree", "draft_len": N}` (both optional: this request's
decoding and drafts per round, as the Triton model's `mode` / `draft_len` inputs; ddtree needs
the deployment's ddtree_budget). Every response carries `usage` (streams: in a last chunk when
include_usage is set). The request's speculative decoding is reported per choice, TensorRT-LLM
PR #19311's object with its semantics (trtllm-serve's), on a whole response's choice and on a
stream's final chunk (the one with finish_reason), and left out where the request drafted nothing
(AR):
  "speculative_decoding": {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                           "num_spec_steps", "acceptance_histogram", "num_spec_tokens"}
num_spec_steps = verify passes that verified drafts; total_draft_tokens counts along the draft
path (DDTree: the tree's depth); num_spec_tokens = the server's most drafts per step (block size
- 1), null under a draft-length policy; acceptance_histogram[j] = steps that accepted exactly j
drafts, num_spec_tokens + 1 long (the deepest acceptance + 1 when null); every choice also carries
`avg_decoded_tokens_per_iter` (output tokens per iteration, the prefill counting as one). The
rules and their upstream lines: openai_responses.speculative_decoding. The same response carries,
top level, our own `dflash`: {"mode", "draft_len", "tree_draft_tokens"}, the request extension as
decoded (mode = how the request was decoded, draft_len = the drafts per round it asked for, null
for the server's policy; DDTree: the tree nodes verified), so a client can tell that the server
honoured it. A stop token ends the request with finish_reason "stop" and is not part of
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

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from trtllm_dflash.serve.openai_bodies import Body, ChatBody, CompletionBody, OpenAIError
from trtllm_dflash.serve.openai_responses import ModelCard, ModelList, Reply
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
        return JSONResponse(e.response().model_dump(), status_code=e.status)

    @app.get("/health")
    async def health():
        return await _health(deployed, service)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=model_name, created=service.created, chat_template="fallback"
                                         if service.fallback_template else "tokenizer")]).model_dump()

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
    stream = Stream(asyncio.get_running_loop(), service.ended)
    service.submit(body, ids, max_tokens, stream)
    reply = service.reply(kind is ChatBody, len(ids), stream)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse(service, stream, reply, include_usage), media_type="text/event-stream")
    return JSONResponse(await _whole(service, request, stream, reply))


async def _whole(service: Service, request, stream: Stream, reply: Reply) -> dict:
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
    return reply.whole(service.finish_text("".join(parts), reason), update).model_dump()


async def _sse(service: Service, stream: Stream, reply: Reply, include_usage: bool):
    """Server-sent events of one request; the client leaving (the task is cancelled) frees its slot."""

    def event(response) -> str:
        return f"data: {json.dumps(response.model_dump())}\n\n"

    done = False
    try:
        if reply.chat:  # OpenAI's first chat chunk carries the role
            yield event(reply.first_chunk())
        while True:
            update = await stream.queue.get()
            reason = update.finish_reason
            if reason is not None and reason.startswith("error"):
                done = True
                yield event(_engine_failure(reason).response())
                break
            if reason == "cancelled":
                done = True
                break
            text = service.finish_text(update.text, reason)
            if text or reason is not None:  # the final chunk: the request's speculative decoding, per choice
                yield event(reply.chunk(text, update))
            if reason is not None:
                done = True
                if include_usage:  # OpenAI's usage chunk: no choices
                    yield event(reply.usage_chunk(update))
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
