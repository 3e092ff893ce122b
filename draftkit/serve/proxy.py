"""The completions endpoints in front of vLLM: a request passed to the pool, its answer passed
back, what vLLM served recorded and counted.

The body goes to vLLM as the client sent it (every field vLLM takes is passed on, none refused
here), with three changes: ``model`` is the upstream's name, ``return_token_ids`` is on, and a
stream asks for its usage chunk, where vLLM puts each request's speculative counts
(``metrics.speculative_decoding``, per verify step with ``--per-request-spec-decode-metrics
detailed``). What the client did not ask for is taken out again before it sees the answer;
``model`` reads the front's name; a ``draftkit`` field carries the request's speculation stats,
as the built-in engine's answers do.

A finished request (``n`` 1) is handed to the recorder and the metrics as the built-in engine's
are: prompt and completion ids as vLLM saw them, each verify step as a round ``[drafted,
accepted]``, the domain label, the identity of the draft of the upstream that served it.

Failures reach the client as OpenAI error bodies: no upstream up (503; a connection refused is
tried on the next upstream), an upstream's 4xx passed on as it came, its 5xx, a body that is
not JSON or a connection dropped midway (502), no answer in time (504). A stream cut midway
ends with an error event and ``[DONE]``. A request that failed, was cut short or was left by
its client is never recorded, so a record is always a whole request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from draftkit.serve.http import (DISCONNECT_POLL_S, RequestError, Stream, check_model,
                                 check_route, sse)
from draftkit.serve.metrics import ServeMetrics
from draftkit.serve.protocol import error_body
from draftkit.serve.upstream import NoUpstream, Pool, Upstream
from draftkit.serve.vllm_answer import Served, events, rounds_of, stats, upstream_message
from draftkit.serve.vllm_request import Job
from draftkit.traffic.record import recorded, request_label
from draftkit.traffic.vllm_sampling import DEFAULTS

log = logging.getLogger("draftkit.serve")


@dataclass
class Proxied:
    """What ``/v1/completions`` and ``/v1/chat/completions`` share in front of vLLM: the name
    they serve, the pool, the metrics, the recorder (None: not recording) and the vocabulary
    size (recorded ids are checked against it)."""

    model_name: str
    pool: Pool
    metrics: ServeMetrics
    vocab: int
    recorder: object = None
    route_labels: tuple[str, ...] = ()
    defaults: dict = field(default_factory=lambda: dict(DEFAULTS))  # sampling_defaults()
    running: int = 0
    warned: set = field(default_factory=set)  # what a record lacked, said once per reason

    # --- the request -----------------------------------------------------------------------

    async def answer(self, request: Request, chat: bool, route: str | None = None) -> Response:
        if route is not None:
            check_route(route, self.route_labels)
        body = await self.read(request)
        check_model(body.get("model"), self.model_name)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be true or false", "stream")
        path = "/v1/chat/completions" if chat else "/v1/completions"
        job = Job(body, chat, request_label(body.get("metadata"), body.get("user"), route),
                  recorded(body.get("metadata")), time.perf_counter())
        if stream:
            return await self.open_stream(path, job)
        return await self.once(request, path, job)

    @staticmethod
    async def read(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def lease(self, avoid: tuple[Upstream, ...] = ()) -> Upstream:
        try:
            upstream = self.pool.pick(avoid)
        except NoUpstream:
            down = sum(not u.healthy for u in self.pool.upstreams)
            raise RequestError(f"no vLLM server is taking requests ({down} of "
                               f"{len(self.pool.upstreams)} down); retry shortly", status=503,
                               code="upstream_unavailable") from None
        self.pool.take(upstream)
        self.running += 1
        self.metrics.running.set(self.running)
        return upstream

    def unlease(self, upstream: Upstream) -> None:
        self.pool.release(upstream)
        self.running -= 1
        self.metrics.running.set(self.running)

    async def send(self, path: str, job: Job, stream: bool) -> tuple[Upstream, httpx.Response]:
        """Send to the least busy upstream, the next one where a connection is refused;
        -> (the upstream, leased: the caller unleases it, its response: headers read)."""
        tried: tuple[Upstream, ...] = ()
        while True:
            upstream = self.lease(tried)
            request = self.pool.client.build_request(
                "POST", upstream.url + path, json=job.upstream_body(upstream, stream))
            try:
                return upstream, await self.pool.client.send(request, stream=stream)
            except httpx.ConnectError as e:  # nothing reached it: the next one may take it
                self.unlease(upstream)
                self.pool.down(upstream, type(e).__name__)
                tried += (upstream,)
            except BaseException as e:
                self.unlease(upstream)
                if isinstance(e, httpx.TimeoutException):
                    raise RequestError(f"the vLLM server at {upstream.url} did not answer "
                                       f"within {self.pool.read_timeout:g} s", status=504,
                                       code="upstream_timeout") from None
                if isinstance(e, httpx.HTTPError):
                    raise upstream_failed(upstream, f"dropped the connection "
                                                    f"({type(e).__name__})") from None
                raise

    def refusal(self, upstream: Upstream, status: int, raw: bytes) -> Response:
        """An upstream's error answer: its 4xx passed on (the client's mistake, in vLLM's
        words), anything else a 502."""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if status < 500 and isinstance(body, dict) and "error" in body:
            self.metrics.reject(status)
            return JSONResponse(body, status_code=status)
        raise upstream_failed(upstream, f"answered {status}: {upstream_message(body)}")

    # --- one body ----------------------------------------------------------------------------

    async def once(self, request: Request, path: str, job: Job) -> Response:
        """The upstream's answer as one body; a client that left has its request cancelled
        upstream (closing the connection aborts it in vLLM) and gets a 499."""
        task = asyncio.create_task(self._once(path, job))
        checked = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if time.monotonic() - checked >= DISCONNECT_POLL_S:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return Response(status_code=499)
        finally:
            if not task.done():
                task.cancel()

    async def _once(self, path: str, job: Job) -> Response:
        upstream, answer = await self.send(path, job, stream=False)
        try:
            if answer.status_code >= 400:
                return self.refusal(upstream, answer.status_code, answer.content)
            try:
                body = answer.json()
            except ValueError:
                raise upstream_failed(upstream, "answered with a body that is not "
                                                "JSON") from None
            choices = body.get("choices") if isinstance(body, dict) else None
            if not isinstance(choices, list):
                raise upstream_failed(upstream, "answered without choices")
            served = Served()
            # chat has the prompt's ids at the top, completions in each choice
            if "prompt_token_ids" in body:
                served.take_prompt(body["prompt_token_ids"], self.vocab)
            for choice in choices:
                if isinstance(choice, dict):
                    served.take_choice(choice, self.vocab)
            served.take_metrics(body)
            rounds = self.finish(job, served, upstream, len(choices))
            body["model"] = self.model_name
            job.hide(body)
            body["draftkit"] = stats(rounds, len(served.completion), upstream.draft)
            return JSONResponse(body)
        finally:
            self.unlease(upstream)

    # --- a stream ----------------------------------------------------------------------------

    async def open_stream(self, path: str, job: Job) -> Response:
        """Start the upstream's stream; its refusal (a 4xx before any event) is answered as
        one body with its status, as vLLM itself answers it."""
        upstream, answer = await self.send(path, job, stream=True)
        if answer.status_code >= 400:
            try:
                raw = await answer.aread()
            finally:
                await answer.aclose()
                self.unlease(upstream)
            return self.refusal(upstream, answer.status_code, raw)
        ended = []

        def close() -> None:  # however the stream ends, the client leaving before it began too
            if not ended:
                ended.append(True)
                self.unlease(upstream)
                asyncio.ensure_future(answer.aclose())

        return Stream(self.relay(upstream, answer, job, close), on_exit=close)

    async def relay(self, upstream: Upstream, answer: httpx.Response, job: Job, close):
        """The upstream's server-sent events, passed on chunk by chunk (less what the client
        did not ask for); a stream cut midway ends with an error event."""
        served, choices, first = Served(), 1, True
        try:
            async for data in events(answer):
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    chunk = None
                if not isinstance(chunk, dict):
                    raise ValueError("a chunk that is not a JSON object")
                if "error" in chunk:  # vLLM failed mid-stream and said so
                    yield sse(chunk)
                    break
                got = chunk.get("choices")
                if isinstance(chunk.get("prompt_token_ids"), list):  # chat's first chunk
                    served.take_prompt(chunk["prompt_token_ids"], self.vocab)
                for choice in got if isinstance(got, list) else ():
                    if isinstance(choice, dict):
                        index = choice.get("index")
                        choices = max(choices, index + 1 if type(index) is int else 1)
                        served.take_choice(choice, self.vocab)
                served.take_metrics(chunk)
                if first and served.completion:
                    first = False
                    self.metrics.ttft.observe(time.perf_counter() - job.arrived)
                usage_chunk = got == [] and "usage" in chunk
                if usage_chunk:
                    rounds = self.finish(job, served, upstream, choices)
                    if not job.wants_usage:
                        continue
                    chunk["draftkit"] = stats(rounds, len(served.completion), upstream.draft)
                chunk["model"] = self.model_name
                if job.hide(chunk) or usage_chunk:
                    yield sse(chunk)
            else:
                raise ValueError("the stream ended before [DONE]")
            yield "data: [DONE]\n\n"
        except (httpx.HTTPError, ValueError) as e:
            why = f"{type(e).__name__}: {e}" if isinstance(e, ValueError) else type(e).__name__
            yield sse(error_body(f"the vLLM server at {upstream.url} broke off the stream "
                                 f"({why}); the answer is incomplete", None, "server_error"))
            yield "data: [DONE]\n\n"
        finally:
            close()

    # --- a finished request ------------------------------------------------------------------

    def finish(self, job: Job, served: Served, upstream: Upstream,
               choices: int) -> list[list[int]] | None:
        """Count a whole answer in the metrics and hand it to the recorder, each choice as a
        record; -> its rounds (None: vLLM reported none, or n > 1, which it counts for one
        sequence only)."""
        rounds = rounds_of(served.spec) if choices == 1 else None
        reason = served.finishes.get(0) or "stop"
        self.metrics.finished(reason, upstream.draft)
        self.metrics.e2e.observe(time.perf_counter() - job.arrived)
        self.metrics.generation_tokens.inc(sum(len(c) for c in served.completions.values()))
        if served.prompt is not None:
            self.metrics.prompt_tokens.inc(len(served.prompt))
        if isinstance(served.spec, dict) and type(served.spec.get("num_spec_tokens")) is int:
            self.metrics.k.set(served.spec["num_spec_tokens"])
        if rounds is not None:
            self.metrics.request_rounds(rounds)
            self.metrics.domain_rounds(job.domain, rounds, upstream.draft)
        if self.recorder is None or not job.record:
            return rounds
        if served.prompt is None or served.bad_ids or len(served.completions) != choices:
            self.lacking("no_ids", "vLLM returned no token ids, or ids outside the "
                                      "vocabulary", self.metrics.not_recorded)
            return rounds
        if rounds is None:  # recorded all the same: draftkit traffic replays its acceptance
            why = ("n>1", "a request of n > 1 (vLLM counts one sequence)") if choices > 1 else \
                ("no_counts", "vLLM reported no per-step speculative counts (start it with "
                              "--per-request-spec-decode-metrics detailed)")
            self.lacking(*why, self.metrics.uncounted_record)
        for index in range(choices):
            self.recorder.add(domain=job.domain, prompt_ids=served.prompt,
                              completion_ids=served.completions[index], sampling=job.sampling(
                                  len(served.prompt), self.pool.max_model_len, self.defaults,
                                  upstream.draft_sample_method),
                              finish_reason=served.finishes.get(index) or "stop",
                              rounds=rounds, draft=upstream.draft)
        return rounds

    def lacking(self, reason: str, what: str, count) -> None:
        """Count a finished request whose answer lacked what a record needs (no token ids: not
        recorded) or wants (no per-step counts: recorded without them), through ``count`` (a
        metrics door), and say it in the log the first time."""
        count(reason)
        if reason not in self.warned:
            self.warned.add(reason)
            kept = "recorded without acceptance counts (draftkit traffic replays them)" \
                if reason != "no_ids" else "not recorded"
            series = "traffic_uncounted" if reason != "no_ids" else "traffic_unrecorded"
            log.warning(f"--record: {kept}: {what}; counted in "
                        f"draftkit:{series}{{reason=\"{reason}\"}}")


def upstream_failed(upstream: Upstream, what: str) -> RequestError:
    return RequestError(f"the vLLM server at {upstream.url} {what}", status=502,
                        code="upstream_error")
