"""The FastAPI app: OpenAI-compatible endpoints over a :class:`~draftkit.serve.scheduler.Scheduler`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events in the OpenAI chunk format, ending with ``data: [DONE]``),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format).

Every 4xx answer carries the OpenAI error body
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``; FastAPI's 422 for
a body that does not validate becomes a 400 in that shape, and an unexpected exception (a bug)
a 500 of type "server_error", its traceback logged. A client that disconnects,
streaming or not, has its slot freed before the next round.

fastapi is imported at the top: only ``draftkit serve`` imports this module. (FastAPI reads
the handlers' annotations, so ``Request`` must be a module-level name.)
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftkit.chat import encode_prompt
from draftkit.decode.sampling import SamplingParams
from draftkit.errors import DraftkitError
from draftkit.serve.detok import TextStream
from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.protocol import (ChatCompletionRequest, CompletionRequest, chat_body,
                                     completion_body, error_body, error_param, main_error, new_id,
                                     usage, usage_chunk)
from draftkit.serve.scheduler import Job, Scheduler

DISCONNECT_POLL_S = 0.25


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes gets a 413 with the OpenAI error body,
    by its Content-Length before anything is read, or by counting a chunked body."""

    def __init__(self, app, limit: int, on_reject=None):
        self.app, self.limit, self.on_reject = app, limit, on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._reject(send, int(length))
        seen = 0
        started = False

        async def counting_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        async def watching_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except _TooLarge:
            if not started:
                await self._reject(send, seen)

    async def _reject(self, send, size: int) -> None:
        if self.on_reject is not None:
            self.on_reject()
        body = json.dumps(error_body(f"the request body is over {self.limit} bytes ({size} "
                                     f"read); send less")).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class Stream(StreamingResponse):
    """An SSE response that calls ``on_exit`` however it ends. The body generator's own
    ``finally`` runs only once the generator has started, and a client that leaves before
    the first chunk is pulled never starts it: its request would decode on to max_tokens."""

    def __init__(self, content, on_exit: Callable[[], None], **kwargs):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"}, **kwargs)
        self.on_exit = on_exit

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_exit()


def create_app(engine, tokenizer, *, model_name: str, k: int | str = "auto", k_max: int = 8,
               max_batch: int = 16, max_model_len: int | None = None,
               max_tokens_limit: int = 2048, max_body_bytes: int = 1 << 20):
    """An app serving ``engine`` (a SpeculativeEngine) under ``model_name``. The scheduler
    thread starts with the app's lifespan and stops with it."""
    metrics = ServeMetrics(model_name)
    scheduler = Scheduler(engine, metrics, max_batch=max_batch, k=k, k_max=k_max,
                          max_model_len=max_model_len)

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="draftkit", lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics
    created = int(time.time())

    def error(status: int, message: str, param: str | None = None,
              code: str | None = None, request: bool = True) -> JSONResponse:
        if request:  # a refused request, not a health probe's answer
            metrics.reject(status)
        kind = "invalid_request_error" if status < 500 else "server_error"
        return JSONResponse(error_body(message, param, kind, code), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = main_error(exc.errors())
        if first.get("type") == "json_invalid":
            return error(400, "the request body is not valid JSON", None)
        unknown = first.get("type") == "extra_forbidden"
        param = error_param(first.get("loc", ()), unknown)
        if unknown:
            return error(400, f"unknown field '{param}'", param)
        msg = first.get("msg", "invalid request").removeprefix("Value error, ")
        return error(400, f"{param}: {msg}" if param else msg, param)

    @app.exception_handler(RequestError)
    async def _bad(request, exc: RequestError):
        return error(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(Exception)
    async def _bug(request, exc: Exception):
        # Starlette raises the exception again once this is sent: uvicorn logs its traceback
        return error(500, f"internal error ({type(exc).__name__}); see the server's log")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):  # unknown route, wrong method
        if isinstance(exc.__cause__, _TooLarge):  # FastAPI made a failed body read a 400:
            raise exc.__cause__  # on to BodyLimit, which answers 413
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed "
                f"on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error(exc.status_code, f"{what}; see /v1/models, /v1/completions and "
                                      f"/v1/chat/completions")

    app.add_middleware(BodyLimit, limit=max_body_bytes, on_reject=lambda: metrics.reject(413))

    @app.get("/health")
    async def health():
        if scheduler.stopping or scheduler.thread is None or not scheduler.thread.is_alive():
            return error(503, "the server is shutting down", request=False)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_endpoint():
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "draftkit",
            "root": model_name, "max_model_len": scheduler.context}]}

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise RequestError(f"the model '{name}' does not exist; this server serves "
                               f"'{model_name}'", "model", 404, "model_not_found")

    def make_job(req, prompt_ids: list[int], default_max: int | None) -> Job:
        n = len(prompt_ids)
        room = scheduler.context - n
        if room < 1:
            raise RequestError(f"the prompt has {n} tokens; this server's context is "
                               f"{scheduler.context} tokens; shorten the prompt", "messages"
                               if isinstance(req, ChatCompletionRequest) else "prompt")
        field = req.max_tokens_field
        max_tokens = getattr(req, field)
        if max_tokens is None:
            max_tokens = min(default_max or max_tokens_limit, max_tokens_limit, room)
        if max_tokens > max_tokens_limit:
            raise RequestError(f"{field} is {max_tokens}; this server's limit is "
                               f"{max_tokens_limit}", field)
        if n + max_tokens > scheduler.context:
            raise RequestError(f"this server's context is {scheduler.context} tokens; you "
                               f"requested {n + max_tokens} ({n} in the prompt, {max_tokens} "
                               f"for the completion); lower {field} or shorten the prompt",
                               field)
        temperature = 1.0 if req.temperature is None else req.temperature
        try:  # a temperature below MIN_TEMPERATURE decodes as greedy
            params = SamplingParams(temperature, max(req.top_k or 0, 0),
                                    1.0 if req.top_p is None else req.top_p)
        except DraftkitError as e:
            raise RequestError(str(e)) from None
        return Job(prompt_ids, params, max_tokens, req.seed,
                   TextStream(tokenizer, req.stop, prompt_ids), asyncio.get_running_loop())

    def encode(prompt, raw: bool) -> list[int]:
        if raw and isinstance(prompt, list):  # token ids
            vocab = engine.target.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise RequestError(f"prompt token ids must lie in [0, {vocab})", "prompt")
            return list(prompt)
        try:
            return encode_prompt(tokenizer, prompt, raw=raw)
        except DraftkitError as e:  # a template that refuses the messages too
            raise RequestError(str(e), "messages" if not raw else "prompt") from None

    async def run(request: Request, req, job: Job, chat: bool):
        rid, created = new_id("chatcmpl" if chat else "cmpl"), int(time.time())
        try:
            scheduler.submit(job)
        except RuntimeError as e:
            raise RequestError(str(e), status=503) from None
        prompt_n = len(job.prompt)
        if req.stream:
            return Stream(stream(rid, created, req, job, chat, prompt_n),
                          on_exit=lambda: scheduler.cancel(job))
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
                        scheduler.cancel(job)
                        return Response(status_code=499)
                if event is None:
                    continue
                if event[0] == "text":
                    parts.append(event[1])
                elif event[0] == "error":
                    return error(503 if "shutting down" in event[1] else 500, event[1])
                else:
                    _, reason, n_out, spec = event
                    use = usage(prompt_n, n_out)
                    build = chat_body if chat else completion_body
                    return build(rid, created, model_name, "".join(parts), reason, use, spec)
        finally:  # no-op for a finished job; frees the slot of an abandoned one
            scheduler.cancel(job)

    async def stream(rid: str, created: int, req, job: Job, chat: bool, prompt_n: int):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def sse(body: dict) -> str:
            return f"data: {json.dumps(body)}\n\n"

        def chunk(text: str | None, finish: str | None = None, spec: dict | None = None,
                  first: bool = False) -> str:
            if chat:
                return sse(chat_body(rid, created, model_name, text, finish, None, spec,
                                     chunk=True, first=first))
            return sse(completion_body(rid, created, model_name, text or "", finish, None,
                                       spec))

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
                else:  # usage only in a chunk of its own, when asked for (as OpenAI)
                    _, reason, n_out, spec = event
                    yield chunk(None, reason, spec)
                    if req.include_usage:
                        yield sse(usage_chunk(rid, created, model_name, obj,
                                              usage(prompt_n, n_out), spec))
                    break
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the response task is cancelled) or we are done
            scheduler.cancel(job)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(req.model)
        job = make_job(req, encode(req.prompt, raw=True), default_max=16)
        return await run(request, req, job, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        check_model(req.model)
        job = make_job(req, encode(req.chat(), raw=False), default_max=None)
        return await run(request, req, job, chat=True)

    return app

