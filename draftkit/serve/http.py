"""HTTP plumbing of the server: the OpenAI error answer, the body-size limit, the SSE response,
and the route and model checks every engine's requests take.

Every 4xx answer carries the OpenAI error body
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``; FastAPI's 422 for
a body that does not validate becomes a 400 in that shape, and an unexpected exception (a bug)
a 500 of type "server_error", its traceback logged.

fastapi is imported at the top: only ``draftkit serve`` imports this module.
"""

from __future__ import annotations

import json
from typing import Callable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.protocol import error_body, error_param, main_error


DISCONNECT_POLL_S = 0.25  # how often a request waiting for its answer checks its client


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


def error_response(metrics: ServeMetrics, status: int, message: str, param: str | None = None,
                   code: str | None = None, request: bool = True) -> JSONResponse:
    """An OpenAI error body with ``status``; ``request``: a refused request (counted in the
    metrics), not a health probe's answer."""
    if request:
        metrics.reject(status)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(error_body(message, param, kind, code), status_code=status)


def install_error_handlers(app: FastAPI, metrics: ServeMetrics, max_body_bytes: int) -> None:
    """Every failure answers in the OpenAI error shape: invalid bodies, refused requests,
    unknown routes, bodies over ``max_body_bytes`` and bugs."""

    def error(status: int, message: str, param: str | None = None, code: str | None = None):
        return error_response(metrics, status, message, param, code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        ctype = request.headers.get("content-type", "")
        media = ctype.split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            # FastAPI reads a body as JSON only under a JSON content type; otherwise every
            # field "is missing", which would hide the actual mistake
            return error(400, f"the request body must be JSON sent with Content-Type: "
                              f"application/json (got {ctype or 'no Content-Type'})")
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


def check_route(route: str, labels: tuple[str, ...]) -> None:
    """404 for a ``/<route>/v1`` the server was not given (``--route-labels``)."""
    if route not in labels:
        served = ", ".join(f"/{r}/v1" for r in labels) or "none"
        raise RequestError(f"no route /{route}/v1 on this server (labelled routes: "
                           f"{served}; --route-labels); use /v1", status=404)


def check_model(name: object, served: str) -> None:
    """404 for a request naming another model than the one served (none named: fine)."""
    if name is not None and name != served:
        raise RequestError(f"the model '{name}' does not exist; this server serves "
                           f"'{served}'", "model", 404, "model_not_found")


def sse(body: dict) -> str:
    """One server-sent event carrying ``body``."""
    return f"data: {json.dumps(body)}\n\n"
