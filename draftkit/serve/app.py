"""The FastAPI app: OpenAI-compatible endpoints over a :class:`~draftkit.serve.scheduler.Scheduler`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events in the OpenAI chunk format, ending with ``data: [DONE]``),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format). With
``route_labels`` (``--route-labels code,math``) the three ``/v1`` routes are served under
``/<label>/v1`` too, and a request that came by one is labelled with it unless its body names
a label (``metadata.domain``, ``user``). ``POST /admin/draft`` swaps the draft for a new
bundle's, given the admin token set at start-up (:mod:`draftkit.serve.swap`).

The routes are thin: the request work is :class:`~draftkit.serve.service.Completions`', the
error answers, body limit and SSE response are :mod:`draftkit.serve.http`'s. Each route finds
what it serves on ``app.state`` (``scheduler``, ``metrics``, ``completions``).

fastapi is imported at the top: only ``draftkit serve`` imports this module. (FastAPI reads
the handlers' annotations, so ``Request`` must be a module-level name.)
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from draftkit.decode.choice import KChoice, resolve_k
from draftkit.decode.k import AUTO, K_MAX, KValue
from draftkit.serve.http import error_response, install_error_handlers
from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.protocol import ChatCompletionRequest, CompletionRequest
from draftkit.serve.scheduler import Scheduler
from draftkit.serve.service import Completions
from draftkit.serve.swap import Admin

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    scheduler = request.app.state.scheduler
    if scheduler.stopping or scheduler.thread is None or not scheduler.thread.is_alive():
        return error_response(request.app.state.metrics, 503, "the server is shutting down",
                              request=False)
    return {"status": "ok"}


@router.get("/metrics")
async def metrics_endpoint(request: Request):
    body, ctype = request.app.state.metrics.render()
    return Response(body, media_type=ctype)


@router.post("/admin/draft")
async def admin_draft(request: Request):
    return await request.app.state.admin.answer(request)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state
    name = state.completions.model_name
    return {"object": "list", "data": [{
        "id": name, "object": "model", "created": state.created, "owned_by": "draftkit",
        "root": name, "max_model_len": state.scheduler.context}]}


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=True)


# an operator's labelled routes: /code/v1/... is /v1/... with the route label "code"
@router.get("/{route}/v1/models")
async def routed_models(route: str, request: Request):
    request.app.state.completions.check_route(route)
    return await models(request)


@router.post("/{route}/v1/completions")
async def routed_completions(route: str, req: CompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=False, route=route)


@router.post("/{route}/v1/chat/completions")
async def routed_chat_completions(route: str, req: ChatCompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=True, route=route)


def create_app(engine, tokenizer, *, model_name: str, k: KChoice | KValue = AUTO,
               k_max: int = K_MAX, max_batch: int = 16, max_model_len: int | None = None,
               max_tokens_limit: int = 2048, max_body_bytes: int = 1 << 20,
               route_labels: tuple[str, ...] = (), recorder=None, draft: str | None = None,
               admin_token: str | None = None, target_path: str | None = None) -> FastAPI:
    """An app serving ``engine`` (a SpeculativeEngine) under ``model_name``. The scheduler
    thread starts with the app's lifespan and stops with it, and so does ``recorder`` (a
    :class:`~draftkit.traffic.recorder.Recorder`: finished requests written to its folder).
    ``route_labels``: labels served as ``/<label>/v1/...`` routes (see the module).

    ``k``: the serve command's :class:`~draftkit.decode.choice.KChoice`, or a K given here,
    checked once (fixed, or ``auto`` up to ``k_max``). ``draft``: the draft's identity
    (``model_identity``); ``admin_token``: turns ``POST /admin/draft`` on, checking bundles
    against the target in ``target_path``."""
    metrics = ServeMetrics(model_name)
    if not isinstance(k, KChoice):
        k = resolve_k(k, k_max, has_draft=engine.draft is not None)
    scheduler = Scheduler(engine, metrics, k=k, max_batch=max_batch,
                          max_model_len=max_model_len, recorder=recorder,
                          draft=draft or ("none" if engine.draft is None else "unnamed"))
    if recorder is not None:
        metrics.recording.set_function(lambda: recorder.recording)

    @asynccontextmanager
    async def lifespan(app):
        if recorder is not None:
            recorder.start()
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)
            if recorder is not None:  # after the scheduler: its last requests are queued
                await asyncio.to_thread(recorder.stop)

    app = FastAPI(title="draftkit", lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics
    app.state.completions = Completions(model_name, tokenizer, scheduler, metrics,
                                        max_tokens_limit, tuple(route_labels))
    app.state.created = int(time.time())
    app.state.admin = Admin(admin_token, target_path, scheduler, metrics)
    install_error_handlers(app, metrics, max_body_bytes)
    app.include_router(router)
    return app
