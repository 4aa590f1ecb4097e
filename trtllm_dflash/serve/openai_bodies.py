"""The OpenAI request bodies as pydantic models, and the OpenAI error object a bad request gets.

The fields this server takes, the ones OpenAI clients send that it ignores, and the ones it
refuses because they would change the result (`refuse_unsupported`); `validation_error` turns
pydantic's first error into one line naming the field. openai_service.py parses requests into
these bodies.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.serve.openai_responses import ErrorDetail, ErrorResponse
from trtllm_dflash.serve.requests import MODES


class OpenAIError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.kind, param=self.param, code=self.code))



class DFlashOptions(BaseModel):
    """The request extension `dflash`: this request's decoding (the Triton model's mode / draft_len)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal[MODES] | None = None
    draft_len: int | None = Field(default=None, ge=0)


class Body(BaseModel):
    # OpenAI clients send fields this server does not use (user, metadata, ...): allowed and ignored,
    # except the ones below that would change the result, which are refused when set.
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0.0)  # None: the deployment's default (openai_service)
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


class CompletionBody(Body):
    prompt: str | list[str] | list[int]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    tools: list[Any] | None = None
    top_logprobs: int | None = None


def validation_error(e: ValidationError) -> OpenAIError:
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


def refuse_unsupported(body: Body) -> None:
    """Refuse the options that would change the result, naming the field."""
    if body.n > 1:
        raise OpenAIError(f"n: {body.n} > 1: this server returns one choice per request", "n")
    if getattr(body, "best_of", None) not in (None, 1):
        raise OpenAIError("best_of: only 1 is supported", "best_of")
    for name, why in _REFUSED:
        if getattr(body, name, None):
            raise OpenAIError(f"{name}: {why}", name)
