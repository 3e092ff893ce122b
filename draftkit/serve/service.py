"""The completions endpoints' work: an OpenAI request becomes a scheduler job, its events an answer.

A request is checked against the server's model name, context and token limit, encoded
(token ids, a prompt string, or chat messages rendered with the target's template), and
submitted as a :class:`~draftkit.serve.scheduler.Job`. Its answer is either one body once the
job is done, or server-sent events in the OpenAI chunk format ending with ``data: [DONE]``.
A client that disconnects, streaming or not, has its slot freed before the next round.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from draftkit.chat import encode_prompt
from draftkit.decode.sampling_params import TOKEN, SamplingParams
from draftkit.errors import DraftkitError
from draftkit.serve.detok import TextStream
from draftkit.serve.http import (DISCONNECT_POLL_S, RequestError, Stream, check_model,
                                 check_route, error_response, sse)
from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.protocol import (ChatCompletionRequest, chat_body, completion_body,
                                     error_body, new_id, usage, usage_chunk)
from draftkit.serve.scheduler import Job, Scheduler

@dataclass
class Completions:
    """What ``/v1/completions`` and ``/v1/chat/completions`` share: the model they serve and
    the scheduler their jobs run on."""

    model_name: str
    tokenizer: object
    scheduler: Scheduler
    metrics: ServeMetrics
    max_tokens_limit: int = 2048
    route_labels: tuple[str, ...] = ()  # --route-labels: served as /<label>/v1/...
    verify: str = TOKEN  # --verify: how sampled requests' drafts are verified

    async def answer(self, request: Request, req, chat: bool,
                     route: str | None = None) -> Response:
        """The whole request: check, encode, submit, then answer (one body or a stream).
        ``route``: the label of the ``/<label>/v1`` route it came by."""
        if route is not None:
            check_route(route, self.route_labels)
        check_model(req.model, self.model_name)
        if chat:
            job = self.job(req, self.encode(req.chat(), raw=False), default_max=None)
        else:
            job = self.job(req, self.encode(req.prompt, raw=True), default_max=16)
        job.domain, job.record = req.label(route), req.recorded
        rid, created = new_id("chatcmpl" if chat else "cmpl"), int(time.time())
        try:
            self.scheduler.submit(job)
        except RuntimeError as e:
            raise RequestError(str(e), status=503) from None
        if req.stream:
            return Stream(self.stream(rid, created, req, job, chat),
                          on_exit=lambda: self.scheduler.cancel(job))
        return await self.wait(request, rid, created, job, chat)

    def encode(self, prompt, raw: bool) -> list[int]:
        """Token ids of a completion prompt (``raw``: a string or ids) or of chat messages."""
        if raw and isinstance(prompt, list):  # token ids
            vocab = self.scheduler.engine.describe().vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise RequestError(f"prompt token ids must lie in [0, {vocab})", "prompt")
            return list(prompt)
        try:
            return encode_prompt(self.tokenizer, prompt, raw=raw)
        except DraftkitError as e:  # a template that refuses the messages too
            raise RequestError(str(e), "messages" if not raw else "prompt") from None

    def job(self, req, prompt_ids: list[int], default_max: int | None) -> Job:
        """The request as a job: its token budget checked against the context and the limit."""
        n, context, limit = len(prompt_ids), self.scheduler.context, self.max_tokens_limit
        room = context - n
        if room < 1:
            raise RequestError(f"the prompt has {n} tokens; this server's context is "
                               f"{context} tokens; shorten the prompt", "messages"
                               if isinstance(req, ChatCompletionRequest) else "prompt")
        field = req.max_tokens_field
        max_tokens = getattr(req, field)
        if max_tokens is None:
            max_tokens = min(default_max or limit, limit, room)
        if max_tokens > limit:
            raise RequestError(f"{field} is {max_tokens}; this server's limit is {limit}", field)
        if n + max_tokens > context:
            raise RequestError(f"this server's context is {context} tokens; you requested "
                               f"{n + max_tokens} ({n} in the prompt, {max_tokens} for the "
                               f"completion); lower {field} or shorten the prompt", field)
        temperature = 1.0 if req.temperature is None else req.temperature
        try:  # a temperature below MIN_TEMPERATURE decodes as greedy
            params = SamplingParams(temperature, max(req.top_k or 0, 0),
                                    1.0 if req.top_p is None else req.top_p, verify=self.verify)
        except DraftkitError as e:
            raise RequestError(str(e)) from None
        return Job(prompt_ids, params, max_tokens, req.seed,
                   TextStream(self.tokenizer, req.stop, prompt_ids), asyncio.get_running_loop())

    async def wait(self, request: Request, rid: str, created: int, job: Job,
                   chat: bool) -> Response:
        """One body once the job is done; a client that left frees its slot (499)."""
        parts: list[str] = []
        checked = time.monotonic()
        try:
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    event = None
                if time.monotonic() - checked >= DISCONNECT_POLL_S:
                    checked = time.monotonic()
                    if await request.is_disconnected():  # nobody to answer: free the slot
                        self.scheduler.cancel(job)
                        return Response(status_code=499)
                if event is None:
                    continue
                if event[0] == "text":
                    parts.append(event[1])
                elif event[0] == "error":
                    status = 503 if "shutting down" in event[1] else 500
                    return error_response(self.metrics, status, event[1])
                else:
                    _, reason, n_out, spec = event
                    build = chat_body if chat else completion_body
                    return build(rid, created, self.model_name, "".join(parts), reason,
                                 usage(len(job.prompt), n_out), spec)
        finally:  # no-op for a finished job; frees the slot of an abandoned one
            self.scheduler.cancel(job)

    async def stream(self, rid: str, created: int, req, job: Job, chat: bool):
        """Server-sent events: the role (chat), text chunks, the finish chunk, usage when asked
        for (in a chunk of its own, as OpenAI), then ``[DONE]``."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        name = self.model_name

        def chunk(text: str | None, finish: str | None = None, spec: dict | None = None,
                  first: bool = False) -> str:
            if chat:
                return sse(chat_body(rid, created, name, text, finish, None, spec,
                                     chunk=True, first=first))
            return sse(completion_body(rid, created, name, text or "", finish, None, spec))

        try:
            if chat:
                yield chunk(None, first=True)  # the role
            while True:
                event = await job.events.get()
                if event[0] == "text":
                    yield chunk(event[1])
                elif event[0] == "error":
                    yield sse(error_body(event[1], None, "server_error"))
                    break
                else:
                    _, reason, n_out, spec = event
                    yield chunk(None, reason, spec)
                    if req.include_usage:
                        yield sse(usage_chunk(rid, created, name, obj,
                                              usage(len(job.prompt), n_out), spec))
                    break
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the response task is cancelled) or we are done
            self.scheduler.cancel(job)
