"""The OpenAI routes' responses as pydantic models, the OpenAI server's renderer of the response
record (serve/record.py), and docs/serving.md's response table (`response_table`).

Field names, order and nulls are the wire format: a field made with `omitted()` is left out
while it is None (the others are sent as null), and responses go out as `model_dump()` (openai.py).
The speculative-decoding object is TensorRT-LLM PR #19311's (trtllm-serve's), placed per choice.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

if TYPE_CHECKING:
    from trtllm_dflash.serve.record import SpecStats, Update

_OMITTED = "omitted"


def omitted(description: str):
    """A field left out of the response while it is None."""
    return Field(default=None, description=description, json_schema_extra={_OMITTED: True})


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _leave_out(self, handler):
        data = handler(self)
        fields = type(self).model_fields
        return {k: v for k, v in data.items()
                if v is not None or not (fields[k].json_schema_extra or {}).get(_OMITTED)}


class SpeculativeDecoding(_Response):
    """The request's speculative decoding (TensorRT-LLM PR #19311's object): left out where it drafted nothing."""

    acceptance_rate: float = Field(description="accepted / drafted draft tokens")
    total_accepted_draft_tokens: int = Field(description="draft tokens accepted (the bonus token not counted)")
    total_draft_tokens: int = Field(
        description="draft tokens verified, counted along the draft path (DDTree: the tree's depth, not its nodes: "
                    "`dflash.tree_draft_tokens` has those)")
    num_spec_steps: int = Field(description="verify passes that verified drafts (the prefill excluded)")
    acceptance_histogram: list[int] = Field(
        description="entry j = steps that accepted exactly j drafts (sum = num_spec_steps); `num_spec_tokens + 1` "
                    "long (longer if a step accepted more), the deepest acceptance + 1 while it is null")
    num_spec_tokens: int | None = Field(
        description="the server's most drafts per step (the drafter's block size - 1); null where its draft-length "
                    "policy chooses per step")


def speculative_decoding(spec: SpecStats, num_spec_tokens: int | None) -> SpeculativeDecoding | None:
    """A finished request's object by TensorRT-LLM PR #19311's rules (NVIDIA/TensorRT-LLM@59de05be
    tensorrt_llm/serve/postprocess_handlers.py _build_spec_decode_stats, openai_protocol.py
    SpeculativeDecodingStats): None, the field left out, where no step drafted; the steps are the
    verify passes that verified drafts; drafts count along the draft path (a tree's depth, the
    getMaxDraftPathLen clamp); the histogram is max(deepest acceptance, num_spec_tokens) + 1 long,
    deepest + 1 where num_spec_tokens is None (a draft-length policy: upstream's draft_len_schedule)."""
    steps, drafted = spec.rounds - spec.plain, spec.path_drafted
    if drafted <= 0 or steps <= 0:
        return None
    hist = list(spec.histogram) or [0]
    hist[0] -= spec.plain  # the passes without drafts are no steps
    deepest = max((j for j, n in enumerate(hist) if n), default=0)
    width = deepest if num_spec_tokens is None else max(deepest, num_spec_tokens)
    return SpeculativeDecoding(acceptance_rate=spec.accepted / drafted, total_accepted_draft_tokens=spec.accepted,
                               total_draft_tokens=drafted, num_spec_steps=steps,
                               acceptance_histogram=(hist + [0] * width)[: width + 1], num_spec_tokens=num_spec_tokens)


# trtllm-serve's choices carry it (tensorrt_llm/serve/openai_protocol.py CompletionResponseChoice and the
# chat and stream choices, NVIDIA/TensorRT-LLM main at 0076e939), on every chunk of a stream
AVG = "output tokens per iteration so far, the prefill counting as one (trtllm-serve's)"


class CompletionChoice(_Response):
    """A choice of /v1/completions, whole or a chunk of a stream."""

    index: int = Field(0, description="always 0: one choice per request")
    text: str = Field(description="whole: the completion; streamed: the new text")
    logprobs: None = Field(None, description="always null (logprobs are refused)")
    finish_reason: str | None = Field(None, description="`stop` / `length` on the last choice, null before")
    speculative_decoding: SpeculativeDecoding | None = omitted("whole, and a stream's final chunk: the request's")
    avg_decoded_tokens_per_iter: float | None = omitted(AVG)


class ChatMessage(_Response):
    """The reply of a whole chat completion."""

    role: Literal["assistant"] = Field("assistant")
    content: str = Field(description="the reply")


class ChatDelta(_Response):
    """The new part of a streamed chat reply."""

    role: Literal["assistant"] | None = omitted("`assistant`, on the first chunk only")
    content: str = Field(description="the new text (the first chunk: empty)")


class ChatChoice(_Response):
    """A choice of a whole /v1/chat/completions response."""

    index: int = Field(0, description="always 0: one choice per request")
    message: ChatMessage = Field(description="the reply")
    logprobs: None = Field(None, description="always null (logprobs are refused)")
    finish_reason: str | None = Field(None, description="`stop` / `length`")
    speculative_decoding: SpeculativeDecoding | None = omitted("the request's")
    avg_decoded_tokens_per_iter: float | None = omitted(AVG)


class ChatChunkChoice(_Response):
    """A choice of a streamed /v1/chat/completions chunk."""

    index: int = Field(0, description="always 0: one choice per request")
    delta: ChatDelta = Field(description="the new part of the reply")
    logprobs: None = Field(None, description="always null (logprobs are refused)")
    finish_reason: str | None = Field(None, description="`stop` / `length` on the final chunk, null before")
    speculative_decoding: SpeculativeDecoding | None = omitted("the final chunk: the request's")
    avg_decoded_tokens_per_iter: float | None = omitted(AVG)


class Usage(_Response):
    """Token counts of the request."""

    prompt_tokens: int = Field(description="prompt tokens")
    completion_tokens: int = Field(description="generated tokens")
    total_tokens: int = Field(description="their sum")


class Decoded(_Response):
    """The request extension `dflash` as the server decoded it (a client can tell it was honoured)."""

    mode: str = Field(description="how the request was decoded: `ar`, `dflash` or `ddtree`")
    draft_len: int | None = Field(description="the drafts per round it asked for; null: the server's policy")
    tree_draft_tokens: int | None = omitted(
        "DDTree, once it drafted: the tree nodes the target verified (what /metrics counts; "
        "speculative_decoding.total_draft_tokens counts the depth)")


class _Head(_Response):
    id: str = Field(description="`cmpl-...` / `chatcmpl-...`, the same on every chunk of a stream")
    object: str
    created: int = Field(description="Unix time (s) the request arrived")
    model: str = Field(description="the served model (the recipe's serve.model_name)")


class Completion(_Head):
    """POST /v1/completions, whole."""

    object: Literal["text_completion"] = Field("text_completion")
    choices: list[CompletionChoice] = Field(description="one choice")
    usage: Usage = Field(description="token counts")
    dflash: Decoded = Field(description="how the request was decoded")


class ChatCompletion(_Head):
    """POST /v1/chat/completions, whole."""

    object: Literal["chat.completion"] = Field("chat.completion")
    choices: list[ChatChoice] = Field(description="one choice")
    usage: Usage = Field(description="token counts")
    dflash: Decoded = Field(description="how the request was decoded")


class CompletionChunk(_Head):
    """A server-sent event of a streamed /v1/completions."""

    object: Literal["text_completion"] = Field("text_completion")
    choices: list[CompletionChoice] = Field(description="one choice; none in the usage chunk")
    usage: Usage | None = omitted("the last chunk, with stream_options.include_usage (it has no choices)")
    dflash: Decoded | None = omitted("the final chunk (the one with finish_reason)")


class ChatCompletionChunk(_Head):
    """A server-sent event of a streamed /v1/chat/completions."""

    object: Literal["chat.completion.chunk"] = Field("chat.completion.chunk")
    choices: list[ChatChunkChoice] = Field(description="one choice; none in the usage chunk")
    usage: Usage | None = omitted("the last chunk, with stream_options.include_usage (it has no choices)")
    dflash: Decoded | None = omitted("the final chunk (the one with finish_reason)")


class ErrorDetail(_Response):
    """What went wrong."""

    message: str = Field(description="one line naming the field")
    type: str = Field(description="`invalid_request_error` (400, 404) or `server_error` (500)")
    param: str | None = Field(description="the field at fault, null when none")
    code: str | None = Field(description="`model_not_found` for an unknown model, else null")


class ErrorResponse(_Response):
    """Any route's error (a stream's as its last event, before `[DONE]`)."""

    error: ErrorDetail = Field(description="what went wrong")


class ModelCard(_Response):
    """The served model."""

    id: str = Field(description="the served model (the recipe's serve.model_name)")
    object: Literal["model"] = Field("model")
    created: int = Field(description="Unix time (s) the server started")
    owned_by: Literal["trtllm_dflash"] = Field("trtllm_dflash")
    chat_template: Literal["tokenizer", "fallback"] = Field(
        description="what renders chat messages: the tokenizer's template or the fallback")


class ModelList(_Response):
    """GET /v1/models."""

    object: Literal["list"] = Field("list")
    data: list[ModelCard] = Field(description="the one served model")


def decoded(mode: str, draft_len: int | None, spec: SpecStats) -> Decoded:
    """Our extension `dflash` of a request: how it was decoded, and a DDTree request's tree nodes."""
    return Decoded(mode=mode, draft_len=draft_len, tree_draft_tokens=spec.drafted if mode == "ddtree" and spec.drafted
                   else None)


# ----------------------------------------------------------------------------- the renderer


@dataclass(frozen=True)
class Reply:
    """How one request's responses are rendered from its updates (serve/record.py): what every
    response of it shares, and where each value of the record goes."""

    chat: bool
    id: str
    created: int
    model: str
    prompt_tokens: int
    mode: str  # how the engine decodes it: "ar" | "dflash" | "ddtree"
    draft_len: int | None  # the drafts per round it asked for; None: the server's policy
    num_spec_tokens: int | None  # the server's most drafts per step; None: its policy chooses (record.draft_bound)

    def whole(self, text: str, update: Update) -> Completion | ChatCompletion:
        """The response of a request that was not streamed: `text` is its whole output."""
        kind = ChatCompletion if self.chat else Completion
        return kind(id=self.id, created=self.created, model=self.model, choices=[self._choice(text, update, False)],
                    usage=self.usage(update), dflash=self.decoded(update))

    def chunk(self, text: str, update: Update) -> CompletionChunk | ChatCompletionChunk:
        """A stream's chunk of `text` (new since the last one); the final one (finish_reason set)
        carries the request's speculative decoding and the top-level `dflash`."""
        final = update.finish_reason is not None
        return self._chunk([self._choice(text, update, True)], dflash=self.decoded(update) if final else None)

    def first_chunk(self) -> ChatCompletionChunk:
        """OpenAI's first chat chunk: the role, no text."""
        return self._chunk([ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])

    def usage_chunk(self, update: Update) -> CompletionChunk | ChatCompletionChunk:
        """OpenAI's last chunk with stream_options.include_usage: no choices."""
        return self._chunk([], usage=self.usage(update))

    def usage(self, update: Update) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=update.total_tokens,
                     total_tokens=self.prompt_tokens + update.total_tokens)

    def decoded(self, update: Update) -> Decoded:
        return decoded(self.mode, self.draft_len, update.spec)

    def speculative_decoding(self, update: Update) -> SpeculativeDecoding | None:
        """The finished request's object (None: left out); None before it finishes."""
        if update.finish_reason is None:
            return None
        return speculative_decoding(update.spec, self.num_spec_tokens)

    def _chunk(self, choices: list, **extra) -> CompletionChunk | ChatCompletionChunk:
        kind = ChatCompletionChunk if self.chat else CompletionChunk
        return kind(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def _choice(self, text: str, update: Update, streamed: bool):
        """One choice; whole responses and a stream's final chunk carry the speculative decoding."""
        reason = update.finish_reason
        stats = dict(finish_reason=reason,
                     speculative_decoding=self.speculative_decoding(update),
                     avg_decoded_tokens_per_iter=update.avg_decoded_tokens_per_iter)
        if not self.chat:
            return CompletionChoice(text=text, **stats)
        if streamed:
            return ChatChunkChoice(delta=ChatDelta(content=text), **stats)
        return ChatChoice(message=ChatMessage(content=text), **stats)


# ----------------------------------------------------------------------------- docs/serving.md's table

TABLE = (Completion, ChatCompletion, CompletionChunk, ChatCompletionChunk, CompletionChoice, ChatChoice,
         ChatChunkChoice, ChatMessage, ChatDelta, SpeculativeDecoding, Usage, Decoded, ErrorResponse, ErrorDetail,
         ModelList, ModelCard)


def _type(t) -> str:
    """A field's JSON type, in words."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Literal:
        return " or ".join(f"`{a!r}`".replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is list:
        return f"array of {_type(args[0])}"
    if isinstance(t, type) and issubclass(t, BaseModel):
        return f"`{t.__name__}`"
    return {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}[t]


def response_table() -> str:
    """docs/serving.md's table of the OpenAI responses: every object, field by field, from the models."""
    rows = ["| object | field | type | what |", "|---|---|---|---|"]
    for model in TABLE:
        doc = model.__doc__.strip().rstrip(".")
        title = f"`{model.__name__}`: {doc[0].lower() + doc[1:] if doc[1:2].islower() else doc}"
        for i, (name, f) in enumerate(model.model_fields.items()):
            kind = _type(f.annotation) + (", left out while null" if (f.json_schema_extra or {}).get(_OMITTED) else "")
            rows.append(f"| {title if i == 0 else ''} | `{name}` | {kind} | {f.description or ''} |")
    return "\n".join(rows)
