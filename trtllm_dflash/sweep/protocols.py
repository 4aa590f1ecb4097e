"""One sweep request's conversation with the server, per protocol: the request sent and its
stream of responses as dicts of the dflash model's outputs, which loadgen.py consumes.

- protocol "grpc": a gRPC bidirectional stream (decoupled model); "http": Triton's HTTP
  generate_stream (server-sent events). A request is complete at the response whose
  `finish_reason` is set (the asyncio client cannot ask for Triton's empty final response:
  that parameter is reserved there).
- protocol "openai": POST /v1/completions with stream and stream_options.include_usage
  (server-sent events up to `data: [DONE]`). Each text chunk counts one token, the last one
  corrected by the final `usage`; verify passes from `avg_decoded_tokens_per_iter` where the
  server sends it, acceptance from the final choice's `speculative_decoding` object (ours,
  serve/openai.py, and trtllm-serve's with TensorRT-LLM PR #19311: the same fields; absent where
  the request drafted nothing), else passes from the object, else they are unknown (tau is then
  reported as unknown, never guessed).
  Behind NVIDIA Dynamo's frontend (`is_dynamo`: its /health names dyn:// endpoints) the same
  values come in `nvext.engine_data` (serve/dynamo.py), which each request asks for
  (`"nvext": {"extra_fields": ["engine_data"]}`), and a curve's mode and draft length go out as
  `nvext.annotations` (serve/dynamo_request.py): Dynamo refuses the extension `dflash`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from trtllm_dflash.sweep.metrics import RequestRecord

ENGINE_DATA = "nvext.engine_data"  # the acceptance source of requests behind Dynamo's frontend

OUTPUTS = ("text_output", "output_token_count", "rounds", "total_draft_tokens", "finish_reason",
           "total_accepted_draft_tokens", "acceptance_histogram")  # the last two: where the model has them


@dataclass(frozen=True)
class ModelIO:
    """What the Triton model takes and answers, as far as the load generator cares."""

    batched: bool = False  # batch-first (max_batch_size > 0): [1, 1] inputs (`_inputs`)
    outputs: tuple[str, ...] = OUTPUTS  # those of OUTPUTS it has (asked for by name over gRPC)
    perf_metrics: bool = False  # it takes tensorrtllm_backend's return_perf_metrics: sent true
    dynamo: bool = False  # OpenAI: Dynamo's frontend (nvext.annotations out, nvext.engine_data back)


def _inputs(prompt: str, max_tokens: int, seed: int, temperature: float, settings: dict | None = None,
            io: ModelIO = ModelIO()):
    """The request's inputs; `io.batched`: batch-first [1, 1] tensors, for a model with max_batch_size > 0
    (tensorrtllm_backend's `ensemble` and `tensorrt_llm_bls`, ours or upstream's: same input names)."""
    import tritonclient.grpc.aio as grpcclient

    def tensor(name, dtype, value):
        arr = np.array([[value]] if io.batched else [value], dtype=object if dtype == "BYTES" else None)
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    return [
        tensor("text_input", "BYTES", prompt.encode()),
        tensor("max_tokens", "INT32", np.int32(max_tokens)),
        tensor("stream", "BOOL", True),
        tensor("temperature", "FP32", np.float32(temperature)),
        tensor("seed", "UINT64", np.uint64(seed)),
    ] + ([tensor("mode", "BYTES", settings["mode"].encode())] if "mode" in (settings or {}) else []) \
      + ([tensor("draft_len", "INT32", np.int32(settings["draft_len"]))] if "draft_len" in (settings or {}) else []) \
      + ([tensor("return_perf_metrics", "BOOL", True)] if io.perf_metrics else [])


async def grpc_events(client, model: str, record: RequestRecord, prompt: str, max_tokens: int, seed: int,
                       temperature: float, settings: dict | None = None, io: ModelIO = ModelIO()):
    """Responses of one gRPC streaming request, as dicts of the dflash model's outputs."""
    import tritonclient.grpc.aio as grpcclient

    request = {
        "model_name": model,
        "inputs": _inputs(prompt, max_tokens, seed, temperature, settings, io),
        "outputs": [grpcclient.InferRequestedOutput(name) for name in io.outputs],
        "request_id": str(record.request_id),
    }

    async def requests():
        yield request

    async for result, error in client.stream_infer(inputs_iterator=requests()):
        if error is not None:
            yield {"error": str(error)}
            return
        if result.get_response().outputs:
            yield _grpc_values(result)


def _grpc_values(result) -> dict:
    """A response's outputs: scalars, the histogram whole."""
    out = {}
    for o in result.get_response().outputs:
        arr = result.as_numpy(o.name).reshape(-1)
        out[o.name] = arr.tolist() if o.name == "acceptance_histogram" else arr[0]
    return out


async def http_events(session, url: str, model: str, prompt: str, max_tokens: int, seed: int, temperature: float,
                       settings: dict | None = None, perf_metrics: bool = False):
    """Responses of one HTTP generate_stream request (server-sent events, one `data:` line each)."""
    body = {"text_input": prompt, "max_tokens": max_tokens, "stream": True, "seed": seed, "temperature": temperature,
            **(settings or {}), **({"return_perf_metrics": True} if perf_metrics else {})}
    async with session.post(f"http://{url}/v2/models/{model}/generate_stream", json=body) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data:"):
                yield json.loads(line[5:])


def openai_base(url: str) -> str:
    """http://HOST:PORT from HOST:PORT, http://HOST:PORT or http://HOST:PORT/v1."""
    url = url.rstrip("/").removesuffix("/v1")
    return url if url.startswith(("http://", "https://")) else f"http://{url}"


def openai_model(url: str, wanted: str) -> str:
    """The model id to request: `wanted` when the server lists it, else the server's only model
    (trtllm-serve names its model by the path it was started with)."""
    import urllib.request

    from trtllm_dflash.errors import UserError

    try:
        with urllib.request.urlopen(f"{openai_base(url)}/v1/models", timeout=10) as r:
            ids = [m["id"] for m in json.loads(r.read())["data"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--url {url}: no OpenAI-compatible server answers GET /v1/models ({e})") from None
    if wanted in ids or len(ids) != 1:
        if wanted not in ids:
            raise UserError(f"--url {url}: serves {ids}, not {wanted!r}; pass --model NAME")
        return wanted
    return ids[0]


def dynamo_annotations(settings: dict) -> list[str]:
    """A curve's settings as the nvext.annotations our Dynamo worker reads (serve/dynamo_request.py
    decoding): "dflash.mode=ar", "dflash.draft_len=3"."""
    return [f"dflash.{k}={settings[k]}" for k in ("mode", "draft_len") if settings.get(k) is not None]


def is_dynamo(url: str) -> bool:
    """Whether NVIDIA Dynamo's frontend answers at `url`: its GET /health lists the dyn:// endpoints
    it routes to (ai-dynamo 1.6.1: {"status", "endpoints": ["dyn://NAMESPACE.COMPONENT.ENDPOINT"],
    "instances"}); ours, trtllm-serve's and vLLM's say no such thing."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{openai_base(url)}/health", timeout=10) as r:
            body = json.loads(r.read())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and any(str(e).startswith("dyn://") for e in body.get("endpoints") or ())


def _openai_rounds(tokens: int, avg_decoded_tokens_per_iter) -> int:
    """Verify passes from trtllm-serve's per-request acceptance length: it counts tokens per
    iteration with the context (prefill) iteration included, so passes = tokens / AL - 1 [I]."""
    if not avg_decoded_tokens_per_iter or tokens < 1:
        return 0
    return max(0, round(tokens / float(avg_decoded_tokens_per_iter)) - 1)


async def openai_events(session, url: str, model: str, prompt: str, max_tokens: int, seed: int, temperature: float,
                         settings: dict | None = None, dynamo: bool = False):
    """Chunks of one streamed /v1/completions request, as the dflash model's response dicts;
    the last one (finish_reason set) comes after `data: [DONE]`, with the final token count and
    the request's acceptance (`_spec_event`). `settings` (mode, draft_len) go out as our OpenAI
    server's request extension `dflash`, which it echoes (top level, final chunk) as decoded;
    `dynamo`: as nvext.annotations, echoed in nvext.engine_data with the acceptance."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    if dynamo:
        body["nvext"] = {"extra_fields": ["engine_data"],
                         **({"annotations": dynamo_annotations(settings)} if settings else {})}
    elif settings:
        body["dflash"] = dict(settings)
    tokens, reason, usage, avg, spec, decoded = 0, None, None, None, None, None
    async with session.post(f"{openai_base(url)}/v1/completions", json=body) as resp:
        if resp.status != 200:
            yield {"error": await _http_error(resp)}
            return
        async for chunk in _sse_chunks(resp):
            if "error" in chunk:
                yield {"error": chunk["error"].get("message", chunk["error"])}
                return
            data = (chunk.get("nvext") or {}).get("engine_data") or {}
            usage, decoded = chunk.get("usage") or usage, chunk.get("dflash") or data.get("dflash") or decoded
            spec = data.get("speculative_decoding") or spec
            avg = data.get("avg_decoded_tokens_per_iter", avg)
            for choice in chunk.get("choices") or []:
                reason = choice.get("finish_reason") or reason
                avg = choice.get("avg_decoded_tokens_per_iter", avg)
                spec = choice.get("speculative_decoding") or spec
                if choice.get("text"):
                    tokens += 1
                    yield {"text_output": choice["text"], "output_token_count": 1}
    refused = _refused(settings, decoded)
    if refused:
        yield {"error": refused}
        return
    final = (usage or {}).get("completion_tokens", tokens)
    # Tokens the chunks did not account for (a text chunk may carry several) belong to the last chunk.
    yield {"extra_tokens": max(0, final - tokens), **_spec_event(spec, final, avg, decoded),
           "finish_reason": reason or "stop", "acceptance_source": ENGINE_DATA if dynamo else "response"}


async def _http_error(resp) -> str:
    text = await resp.text()
    try:
        text = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return f"HTTP {resp.status}: {text}"


async def _sse_chunks(resp):
    """The JSON chunks of a server-sent event stream, up to `data: [DONE]`."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _refused(settings: dict | None, decoded: dict | None) -> str | None:
    """Why the server did not decode the curve's settings (it did not echo them in `dflash`)."""
    decoded = decoded or {}
    if settings and "mode" in settings and decoded.get("mode") != settings["mode"]:
        return (f"the server did not decode mode {settings['mode']!r} (it ignores the request extension `dflash`: "
                "only trtllm-dflash's OpenAI server and Dynamo worker take it); sweep it with --modes naming its own "
                "mode only")
    if settings and "draft_len" in settings and decoded.get("draft_len") != settings["draft_len"]:
        return (f"the server did not take draft_len {settings['draft_len']} (it ignores the request extension "
                "`dflash`: only trtllm-dflash's OpenAI server takes it)")
    return None


def _spec_event(spec: dict | None, tokens: int, avg, decoded: dict | None = None) -> dict:
    """A request's verify passes and acceptance. Passes from `avg_decoded_tokens_per_iter` where the
    server sends it (every pass, those that drafted nothing too), else the object's num_spec_steps.
    Acceptance from the `speculative_decoding` object (ours, and trtllm-serve's with TensorRT-LLM
    PR #19311: the same fields); no object, no acceptance for the request (upstream leaves it out
    where nothing was drafted). Drafts verified: a DDTree request's tree nodes where our servers
    say them (`dflash.tree_draft_tokens`, what /metrics counts), else the object's count."""
    rounds = _openai_rounds(tokens, avg) if avg else int((spec or {}).get("num_spec_steps") or 0)
    if not spec or spec.get("num_spec_steps") is None:
        return {"rounds": rounds}
    drafted = (decoded or {}).get("tree_draft_tokens") or spec.get("total_draft_tokens") or 0
    return {"rounds": rounds, "total_draft_tokens": int(drafted),
            "total_accepted_draft_tokens": int(spec.get("total_accepted_draft_tokens") or 0),
            "acceptance_histogram": list(spec.get("acceptance_histogram") or [])}
