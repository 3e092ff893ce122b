"""The OpenAI request and response bodies the server speaks.

Requests follow the OpenAI API reference for ``/v1/completions`` and ``/v1/chat/completions``
(https://platform.openai.com/docs/api-reference). Unknown fields are rejected
(``extra="forbid"``) and a field sent as null takes its default, as OpenAI's API does. The
fields the official client commonly sends are accepted, and those we do not implement are
accepted only at their no-op value (``n=1``, penalties 0, no logprobs), anything else is a
400 that names the field. ``top_k`` is accepted as vLLM does. ``metadata`` (OpenAI's: up to 16
strings) is accepted on both endpoints; ``metadata.domain`` labels the request (records and
per-domain metrics) and ``metadata.draftkit_record: "off"`` keeps it out of ``--record``.

Responses are plain dicts built here, with one extra field per choice-level response:
``"draftkit": {"drafted", "accepted", "tau", "k", ...}`` (speculation stats of the request).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo,
                      field_validator, model_validator)

from draftkit.traffic.record import RECORD_KEY, recorded, request_label




def _whole_characters(v: str) -> str:
    # JSON may carry half of a UTF-16 surrogate pair ("\ud800": a client that cut an emoji in
    # two); valid JSON, but no tokenizer can encode it
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text holds a lone UTF-16 surrogate (half of a character such as "
                         "an emoji); send whole characters") from None
    return v


Text = Annotated[str, AfterValidator(_whole_characters)]


def _refuse_unsupported(name: str, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{name} is not supported")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        # clients send null for a field they leave unset ("n": null, "stop": null)
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's; accepted, usage comes at the end


class _Sampling(_Body):
    """Fields shared by both endpoints. Strict: ``"stream": "yes"`` or ``"max_tokens": "4"``
    is a 400, not a guess (OpenAI rejects them too)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM extension; -1 or 0 = off
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # what a torch.Generator takes
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only n = 1 is supported")
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None  # OpenAI's: up to 16 strings; see label()

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v):
        if v is None:
            return v
        if len(v) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in v.items()):
            raise ValueError("metadata takes up to 16 pairs, keys up to 64 characters, values "
                             "up to 512")
        if v.get(RECORD_KEY, "on") not in ("on", "off"):
            raise ValueError(f'metadata.{RECORD_KEY} is "on" or "off"')
        return v

    def label(self, route: str | None = None) -> str:
        """The request's domain label, as records and /metrics keep it: ``metadata.domain``,
        else ``user``, else the label of the route it came by, else "unlabeled"."""
        return request_label(self.metadata, self.user, route)

    @property
    def recorded(self) -> bool:
        """False when the request opts out of ``--record``: ``metadata.draftkit_record`` "off"."""
        return recorded(self.metadata)

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError("penalties are not supported; leave them at 0")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, v, info: ValidationInfo):
        if not info.data.get("stream"):  # stream is declared first, so it is validated
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def max_tokens_field(self) -> str:
        """The field that holds the completion's token limit, named as the client sent it."""
        return "max_tokens"


class CompletionRequest(_Sampling):
    prompt: Text | list[Text] | list[int]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("one prompt per request is supported; send a string")
            return v[0]
        if isinstance(v, list) and not v:
            raise ValueError("empty prompt")
        return v

    @field_validator("echo", "logprobs", "best_of", "suffix")
    @classmethod
    def _unsupported(cls, v, info: ValidationInfo):
        # a field validator, so the 400's param names the field
        no_op = {"echo": v is False, "best_of": v == 1}.get(info.field_name, v is None)
        _refuse_unsupported(info.field_name, no_op)
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: Text


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(
            p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("logprobs", "top_logprobs", "response_format", "tools", "tool_choice")
    @classmethod
    def _unsupported(cls, v, info: ValidationInfo):
        no_op = {"response_format": v == {"type": "text"},
                 "tool_choice": v == "none"}.get(info.field_name, not v)
        _refuse_unsupported(info.field_name, no_op)
        return v

    @property
    def max_tokens_field(self) -> str:
        # max_completion_tokens is the newer name for max_tokens; max_tokens wins if both come
        if self.max_tokens is None and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return "max_tokens"

    def chat(self) -> list[dict[str, str]]:
        # "developer" is the newer name for "system"; chat templates know the latter
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


# --- responses ------------------------------------------------------------------------------

# Every field name a request body may hold: an error's location mixes them with pydantic's
# tags for the member of a union it tried ("prompt", "list[int]", 0).
_FIELDS = frozenset(name for model in (CompletionRequest, ChatCompletionRequest, Message,
                                       TextPart, StreamOptions) for name in model.model_fields)


def error_param(loc: tuple, unknown: bool = False) -> str | None:
    """The ``param`` of a validation error: the field's path as the client wrote it
    (``messages.1.content``, not ``messages.1.content.str``). ``unknown``: the location ends
    with a field the request may not hold, which is the one to name."""
    last = len(loc) - 1
    path = [str(x) for i, x in enumerate(loc)
            if isinstance(x, int) or x in _FIELDS or (unknown and i == last)]
    return ".".join(path) or None


def main_error(errors: list[dict]) -> dict:
    """The error to report of a body's validation errors. A field that takes one of several
    types (``content``: a string or a list of parts) gets one error per type; the one whose
    location reaches deepest into the body is about the type the client sent."""
    def depth(e: dict) -> int:
        return sum(isinstance(x, int) or x in _FIELDS for x in e.get("loc", ()))
    return max(errors, key=depth) if errors else {}  # the first of equals


def error_body(message: str, param: str | None = None, type_: str = "invalid_request_error",
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, created: int, model: str, text: str, finish: str | None,
                    use: dict | None, spec: dict | None) -> dict:
    """A response, or a streamed chunk; ``created`` is the request's, the same in every
    chunk."""
    body = {"id": rid, "object": "text_completion", "created": created,
            "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                         "finish_reason": finish}]}
    return _extras(body, use, spec)


def chat_body(rid: str, created: int, model: str, text: str | None, finish: str | None,
              use: dict | None, spec: dict | None, chunk: bool = False,
              first: bool = False) -> dict:
    if chunk:
        delta: dict = {"role": "assistant", "content": ""} if first else (
            {} if text is None else {"content": text})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    body = {"id": rid, "object": obj, "created": created, "model": model,
            "choices": [choice]}
    return _extras(body, use, spec)


def usage_chunk(rid: str, created: int, model: str, obj: str, use: dict, spec: dict) -> dict:
    """The last streamed chunk when ``stream_options.include_usage`` is set: no choices."""
    return {"id": rid, "object": obj, "created": created, "model": model,
            "choices": [], "usage": use, "draftkit": spec}


def _extras(body: dict, use: dict | None, spec: dict | None) -> dict:
    if use is not None:
        body["usage"] = use
    if spec is not None:
        body["draftkit"] = spec
    return body
