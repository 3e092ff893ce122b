"""The FastAPI app: OpenAI-compatible endpoints over draftkit's engine or over vLLM, one front.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events in the OpenAI chunk format, ending with ``data: [DONE]``),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format). With
``route_labels`` (``--route-labels code,math``) the three ``/v1`` routes are served under
``/<label>/v1`` too, and a request that came by one is labelled with it unless its body names
a label (``metadata.domain``, ``user``). ``POST /admin/draft`` swaps the draft for a new
bundle's, given the admin token set at start-up (:mod:`draftkit.serve.swap`).

:func:`create_app` serves draftkit's engine through a
:class:`~draftkit.serve.scheduler.Scheduler` (request bodies checked field by field,
:mod:`draftkit.serve.protocol`); :func:`create_proxy_app` serves vLLM servers through a
:class:`~draftkit.serve.upstream.Pool` (bodies passed on for vLLM to check,
:mod:`draftkit.serve.proxy`). Both are :func:`_front`: the same routes, error answers, body
limit, metrics and admin endpoint.

The routes are thin: the request work is ``app.state.completions``' (the engine's
:class:`~draftkit.serve.service.Completions` or :class:`~draftkit.serve.proxy.Proxied`), the
error answers, body limit and SSE response are :mod:`draftkit.serve.http`'s. Each route finds
what it serves on ``app.state`` (``metrics``, ``completions``, ``admin``, ``down()``,
``context()``).

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
from draftkit.decode.sampling_params import TOKEN
from draftkit.errors import ConfigError
from draftkit.serve.http import check_route, error_response, install_error_handlers
from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.protocol import ChatCompletionRequest, CompletionRequest
from draftkit.serve.scheduler import Scheduler
from draftkit.serve.proxy import Proxied
from draftkit.serve.service import Completions
from draftkit.serve.swap import Admin, EngineSwap
from draftkit.serve.upstream import Pool

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    down = request.app.state.down()
    if down:
        return error_response(request.app.state.metrics, 503, down, request=False)
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
        "root": name, "max_model_len": state.context()}]}


# an operator's labelled routes: /code/v1/... is /v1/... with the route label "code"
@router.get("/{route}/v1/models")
async def routed_models(route: str, request: Request):
    check_route(route, request.app.state.completions.route_labels)
    return await models(request)


# the built-in engine's completions: bodies checked field by field (protocol.py)
engine_routes = APIRouter()


@engine_routes.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=False)


@engine_routes.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=True)


@engine_routes.post("/{route}/v1/completions")
async def routed_completions(route: str, req: CompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=False, route=route)


@engine_routes.post("/{route}/v1/chat/completions")
async def routed_chat_completions(route: str, req: ChatCompletionRequest, request: Request):
    return await request.app.state.completions.answer(request, req, chat=True, route=route)


# vLLM's completions behind the front: bodies passed on as sent, vLLM checks them (proxy.py)
proxy_routes = APIRouter()


@proxy_routes.post("/v1/completions")
async def proxied_completions(request: Request):
    return await request.app.state.completions.answer(request, chat=False)


@proxy_routes.post("/v1/chat/completions")
async def proxied_chat_completions(request: Request):
    return await request.app.state.completions.answer(request, chat=True)


@proxy_routes.post("/{route}/v1/completions")
async def proxied_routed_completions(route: str, request: Request):
    return await request.app.state.completions.answer(request, chat=False, route=route)


@proxy_routes.post("/{route}/v1/chat/completions")
async def proxied_routed_chat_completions(route: str, request: Request):
    return await request.app.state.completions.answer(request, chat=True, route=route)


def create_app(engine, tokenizer, *, model_name: str, k: KChoice | KValue = AUTO,
               k_max: int = K_MAX, verify: str = TOKEN, max_batch: int = 16,
               max_model_len: int | None = None,
               max_tokens_limit: int = 2048, max_body_bytes: int = 1 << 20,
               route_labels: tuple[str, ...] = (), recorder=None, draft: str | None = None,
               admin_token: str | None = None, target_path: str | None = None) -> FastAPI:
    """An app serving ``engine`` (a SpeculativeEngine) under ``model_name``. The scheduler
    thread starts with the app's lifespan and stops with it, and so does ``recorder`` (a
    :class:`~draftkit.traffic.recorder.Recorder`: finished requests written to its folder).
    ``route_labels``: labels served as ``/<label>/v1/...`` routes (see the module).

    ``k``: the serve command's :class:`~draftkit.decode.choice.KChoice`, or a K given here,
    checked once (fixed, or ``auto`` up to ``k_max``); ``verify``: how sampled requests'
    drafts are verified (:attr:`~draftkit.decode.sampling_params.SamplingParams.verify`).
    ``draft``: the draft's identity (``model_identity``); ``admin_token``: turns ``POST
    /admin/draft`` on, checking bundles against the target in ``target_path``."""
    metrics = ServeMetrics(model_name)
    has_draft = engine.describe().has_draft
    if not isinstance(k, KChoice):
        k = resolve_k(k, k_max, has_draft=has_draft)
    scheduler = Scheduler(engine, metrics, k=k, max_batch=max_batch,
                          max_model_len=max_model_len, recorder=recorder,
                          draft=draft or ("unnamed" if has_draft else "none"))
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

    def down() -> str | None:
        if scheduler.stopping or scheduler.thread is None or not scheduler.thread.is_alive():
            return "the server is shutting down"
        return None

    if admin_token and not target_path:
        raise ConfigError("an admin token needs the target's folder: a new bundle is checked "
                          "against it")
    completions = Completions(model_name, tokenizer, scheduler, metrics, max_tokens_limit,
                              tuple(route_labels), verify)
    app = _front(lifespan, metrics, completions, engine_routes, max_body_bytes,
                 Admin(admin_token, metrics, EngineSwap(target_path, scheduler)), down,
                 lambda: scheduler.context)
    app.state.scheduler = scheduler
    return app


def create_proxy_app(pool: Pool, *, model_name: str, vocab: int, swapper,
                     max_body_bytes: int = 1 << 20, route_labels: tuple[str, ...] = (),
                     recorder=None, admin_token: str | None = None,
                     defaults: dict | None = None, on_stop=None) -> FastAPI:
    """The same front over vLLM servers (``pool``, :mod:`draftkit.serve.upstream`): requests
    are passed to the least busy one (:mod:`draftkit.serve.proxy`), recorded with
    ``recorder`` (a request's unset sampling read as ``defaults``, the servers' own:
    :func:`~draftkit.traffic.vllm_sampling.sampling_defaults`), counted under the same metric
    names; ``swapper`` runs ``POST /admin/draft`` (:mod:`draftkit.serve.vllm_swap`).
    ``on_stop``: called once the front stops (it stops the vLLM servers it started)."""
    metrics = ServeMetrics(model_name)
    metrics.serving_draft(pool.upstreams[0].draft if pool.upstreams else "none")
    if recorder is not None:
        metrics.recording.set_function(lambda: recorder.recording)
    completions = Proxied(model_name, pool, metrics, vocab, recorder, tuple(route_labels))
    if defaults is not None:
        completions.defaults = defaults
    swapper.attach(pool, metrics, recorder)
    stopping = []

    @asynccontextmanager
    async def lifespan(app):
        if recorder is not None:
            recorder.start()
        await pool.start()
        try:
            yield
        finally:
            stopping.append(True)
            await pool.stop()
            if recorder is not None:
                await asyncio.to_thread(recorder.stop)
            if on_stop is not None:
                await asyncio.to_thread(on_stop)

    def down() -> str | None:
        if stopping:
            return "the server is shutting down"
        if not pool.serving:
            return "no vLLM server is taking requests"
        return None

    return _front(lifespan, metrics, completions, proxy_routes, max_body_bytes,
                  Admin(admin_token, metrics, swapper), down, lambda: pool.max_model_len)


def _front(lifespan, metrics: ServeMetrics, completions, completion_routes: APIRouter,
           max_body_bytes: int, admin: Admin, down, context) -> FastAPI:
    """The app every engine is served through: the routes, the error answers and the body
    limit, with ``completions`` doing the requests' work; ``down()`` says why the server
    cannot take requests (None: it can), ``context()`` its context length."""
    app = FastAPI(title="draftkit", lifespan=lifespan)
    app.state.metrics, app.state.completions, app.state.admin = metrics, completions, admin
    app.state.down, app.state.context = down, context
    app.state.created = int(time.time())
    install_error_handlers(app, metrics, max_body_bytes)
    app.include_router(router)
    app.include_router(completion_routes)
    return app
