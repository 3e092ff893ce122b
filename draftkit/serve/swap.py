"""``POST /admin/draft``: a running server takes a new bundle's draft, without a restart.

::

    draftkit serve BUNDLE --admin-token "$TOKEN"      # or DRAFTKIT_ADMIN_TOKEN=... in the env
    curl -X POST localhost:8000/admin/draft -H "Authorization: Bearer $TOKEN" \\
         -H "Content-Type: application/json" -d '{"bundle": "/bundles/smol-v2"}'
    # 200 {"draft": "<identity>", "previous": "<identity>", "bundle": "/bundles/smol-v2", ...}

The bundle is checked as ``draftkit check`` checks it (:func:`~draftkit.export.bundle.
check_bundle`: every file's sha256, the draft's config, its tokenizer and config against the
target this server serves), and it must have been exported for that very target: the content
hash it records equals the serving target's. Then its draft is read into host memory. Both
happen in a worker thread, while the scheduler decodes on. The scheduler then stops
admitting, lets the requests in flight finish on the draft they started with, puts the new
draft on the device and admits again (:class:`~draftkit.serve.scheduler.DraftSwap`); the
answer comes once the new draft serves, so it waits for the longest request in flight.

A draft is named by its identity (:func:`~draftkit.models.resolve.model_identity`): the
answer, each response's ``draftkit.draft`` and ``/metrics`` (``draftkit:draft_info``,
``draftkit:request_success_by_draft``) carry it.

Refusals are OpenAI error bodies of one line, and leave the serving draft as it was: 403 when
the server has no admin token (the endpoint is off), 401 for a missing or wrong token, 400 for
a body without a ``bundle`` path, 422 for a bundle that fails its check, was exported for
another target or whose draft does not load, 409 while another swap is in progress or on a
server decoding without a draft, 503 while the server shuts down.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from pathlib import Path
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import Response

from draftkit.errors import DraftkitError
from draftkit.export.bundle import check_bundle
from draftkit.models.head_check import load_head
from draftkit.models.load import dtype_name, is_eagle3_dir, load_model
from draftkit.models.resolve import bundle_ref, model_identity
from draftkit.serve.args import TOKEN_ENV
from draftkit.serve.http import RequestError, error_response
from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.scheduler import DraftSwap, Scheduler


class Admin:
    """The admin endpoint: its token (None: off) and what swaps a draft in: ``swapper``, with
    ``busy`` (a swap in progress) and ``async swap(bundle) -> answer``: :class:`EngineSwap`
    for the built-in engine, :mod:`draftkit.serve.vllm_swap`'s for vLLM behind the front."""

    def __init__(self, token: str | None, metrics: ServeMetrics, swapper):
        self.token, self.metrics, self.swapper = token or None, metrics, swapper

    @property
    def busy(self) -> bool:
        return self.swapper.busy

    async def answer(self, request: Request) -> Response:
        """The whole request: authorize, read the body, swap."""
        refused = self.refuse(request.headers.get("authorization"))
        if refused is not None:
            return refused
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        bundle = body.get("bundle") if isinstance(body, dict) else None
        if not isinstance(bundle, str) or not bundle.strip():
            raise RequestError('the body must be JSON naming a bundle directory: {"bundle": '
                               '"/path/to/bundle"}', "bundle")
        if self.swapper.busy:
            raise RequestError("a draft swap is in progress; retry once it has answered",
                               "bundle", 409, "swap_in_progress")
        return await self.swapper.swap(bundle.strip())

    def refuse(self, authorization: str | None) -> Response | None:
        """403 while the endpoint is off, 401 without the right bearer token; else None."""
        if self.token is None:
            return error_response(self.metrics, 403, f"the admin endpoint is off: start "
                                  f"draftkit serve with --admin-token (or {TOKEN_ENV})")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                  self.token.encode()):
            answer = error_response(self.metrics, 401, "missing or wrong admin token; send "
                                    "Authorization: Bearer <the token given at start-up>")
            answer.headers["WWW-Authenticate"] = "Bearer"
            return answer
        return None


class EngineSwap:
    """The built-in engine's swap: the folder of the target bundles are checked against, the
    scheduler that puts the new draft in, and whether a swap is in progress (one at a
    time)."""

    def __init__(self, target_path: str | None, scheduler: Scheduler):
        self.target_path, self.scheduler = target_path, scheduler
        self.busy = False

    async def swap(self, bundle: str) -> dict:
        """Check and load ``bundle``'s draft off the event loop, hand it to the scheduler and
        answer once it serves."""
        if not self.scheduler.engine.describe().has_draft or not self.scheduler.k_choice.k_max:
            raise RequestError("this server decodes without a draft (--k 0 or --draft none); "
                               "restart it with one to swap drafts", "bundle", 409)
        started, previous = time.perf_counter(), self.scheduler.draft
        self.busy = True  # no await since Admin's check: no other swap got in between
        try:
            new = await asyncio.to_thread(self.prepare, bundle)
            self.scheduler.swap(new)
        except BaseException:
            self.busy = False
            if self.scheduler.stopping:  # the scheduler takes no swap then
                raise RequestError("the server is shutting down", status=503) from None
            raise
        new.done.add_done_callback(lambda _: setattr(self, "busy", False))
        try:  # shielded: a client that leaves does not call the swap off halfway
            identity = await asyncio.shield(asyncio.wrap_future(new.done))
        except DraftkitError as e:  # the engine refused the draft (its context, say)
            raise refused(bundle, previous, e) from None
        except Exception as e:  # out of memory putting it on the device, or shutting down
            if self.scheduler.stopping:
                raise RequestError("the server is shutting down", status=503) from None
            why = " ".join(f"{type(e).__name__}: {e}".split())
            raise RequestError(f"the draft swap failed ({why}); draft {previous} serves on",
                               status=500) from None
        return {"object": "draft", "draft": identity, "previous": previous,
                "bundle": bundle, "seconds": round(time.perf_counter() - started, 3)}

    def prepare(self, bundle: str) -> DraftSwap:
        """``draftkit check``'s verification against the serving target, then the draft read
        into host memory (a worker thread's work)."""
        try:
            manifest = check_bundle(Path(bundle), target=self.target_path)
            if not manifest.target.sha256:
                raise DraftkitError("it records no content hash of its target (an earlier "
                                    "draftkit's export); re-export it to serve it here")
            ref = bundle_ref(bundle, Path(bundle), manifest, "draft")  # checked just above
            return DraftSwap(model_identity(ref), stage(ref, self.scheduler.engine),
                             source=bundle)
        except (DraftkitError, OSError) as e:
            raise refused(bundle, self.scheduler.draft, e) from None


def refused(bundle: str, serving: str, e: Exception) -> RequestError:
    """A 422 naming the bundle, the draft that serves on, and why (one line)."""
    why = " ".join(str(e).split())
    return RequestError(f"bundle {bundle} refused, draft {serving} serves on: {why}", "bundle",
                        422, "bundle_refused")


def stage(ref, engine) -> Callable[[], Any]:
    """Read the draft in ``ref`` (a resolved model) into host memory, in the serving dtype;
    return what puts it on the engine's device (the scheduler thread calls it). An EAGLE-3
    head is small and loads onto its target, whose embedding it reads: all of it is left to
    that call."""
    if is_eagle3_dir(ref.path):
        return lambda: load_head(ref.path, engine.target_model, ref.spec)
    model = load_model(ref, "draft", "cpu", dtype_name(engine.target_model))
    return lambda: model.to(engine.describe().device)
