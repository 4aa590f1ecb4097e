"""The OpenAI semantics over a deployment, apart from HTTP: a request body parsed and checked,
its prompt token ids and max_tokens, the request submitted to the in-flight engine, the stop
text removed, and how its responses are rendered (a `Reply`, openai_responses.py). openai.py's
routes call it; a Stream carries one request's updates from the engine thread to the event loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trtllm_dflash.serve.openai_bodies import (
    Body,
    ChatBody,
    DFlashOptions,
    OpenAIError,
    refuse_unsupported,
    validation_error,
)
from trtllm_dflash.serve.openai_responses import Reply
from trtllm_dflash.serve.requests import (
    FALLBACK_CHAT_TEMPLATE,
    RequestError,
    chat_prompt_ids,
    check_decodable,
    check_lengths,
    check_mode,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class Stream:
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

    def parse(self, raw: bytes, kind: type[Body]) -> Body:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OpenAIError(f"request body: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise OpenAIError("request body: expected a JSON object")
        try:
            body = kind.model_validate(data)
        except ValidationError as e:
            raise validation_error(e) from None
        if body.model != self.model_name:
            raise OpenAIError(f"model: {body.model!r} does not exist; this server serves {self.model_name!r}",
                              "model", status=404, code="model_not_found")
        refuse_unsupported(body)
        try:
            check_decodable(self.deployed.model.capabilities, temperature=body.temperature or 0.0)
        except RequestError as e:
            raise OpenAIError(str(e), "temperature") from None
        if body.dflash is not None:
            try:
                check_mode(body.dflash.mode, self.deployed.engine.ddtree_budget, "dflash.mode")
            except RequestError as e:
                raise OpenAIError(str(e), "dflash.mode") from None
        return body

    def prompt_ids(self, body: Body) -> tuple[list[int], str]:
        """(token ids, the field they came from)."""
        tok = self.tokenizer
        if isinstance(body, ChatBody):
            messages = []
            for i, m in enumerate(body.messages):
                content = m.content
                if isinstance(content, list):
                    parts = [p.get("text") for p in content]
                    if any(p.get("type") != "text" or not isinstance(t, str) for p, t in zip(content, parts)):
                        raise OpenAIError(f"messages.{i}.content: only text parts are supported",
                                          f"messages.{i}.content")
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

    def max_tokens(self, body: Body, prompt_tokens: int, prompt_field: str) -> int:
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

    def submit(self, body: Body, ids: list[int], max_tokens: int, stream: Stream) -> None:
        from trtllm_dflash.reference.verify import SamplingParams
        from trtllm_dflash.serve.record import Request

        sampling = SamplingParams(temperature=self.temperature(body), top_p=body.top_p, top_k=body.top_k,
                                  seed=body.seed if body.seed is not None else 0)
        stops = [body.stop] if isinstance(body.stop, str) else [w for w in body.stop or [] if w]
        ext = body.dflash or DFlashOptions()
        stream.mode, stream.draft_len = ext.mode or self.deployed.engine.mode, ext.draft_len
        self.deployed.engine.submit(Request(ids, max_tokens, stream.emit, sampling, stop_words=stops,
                                            cancelled=stream.gone.is_set, draft_len=ext.draft_len, mode=ext.mode))

    def temperature(self, body: Body) -> float:
        """The request's temperature; unset, OpenAI's default 1 where the runners sample, else 0
        (an argmax-only engine deployment decodes greedily: runtime/capabilities.py)."""
        if body.temperature is not None:
            return body.temperature
        return 1.0 if self.deployed.model.capabilities.full_logits else 0.0

    def finish_text(self, text: str, reason: str | None) -> str:
        if reason == "stop":
            for s in self.stop_texts:
                if text.endswith(s):
                    return text[: -len(s)]
        return text

    def reply(self, chat: bool, prompt_tokens: int, stream: Stream) -> Reply:
        """How the responses of a submitted request are rendered (openai_responses.py)."""
        from trtllm_dflash.serve.record import draft_bound

        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        return Reply(chat, rid, int(time.time()), self.model_name, prompt_tokens, stream.mode, stream.draft_len,
                     draft_bound(self.deployed.engine, stream.mode))
