"""The vLLM servers behind ``draftkit serve --engine vllm`` (or ``--upstream URL ...``): a pool
that sends each request to the least busy one.

An upstream is an OpenAI-compatible vLLM server, named by its base URL. A request goes to the
healthy upstream that is taking new requests with the fewest of this front's requests in flight
(ties in turn). An upstream that refuses a connection is marked down and skipped at once; a
probe of its ``/health`` every :data:`PROBE_S` seconds marks it up again. An upstream being
drained (a blue/green swap, :mod:`draftkit.serve.vllm_swap`) takes no new request and leaves
the pool once its last one has finished.

Each upstream carries the identity of the draft it decodes with, so a record and the per-draft
metrics name the draft that served the request even while two of them serve side by side.

httpx is imported at the top: only the serve command's vLLM front imports this module.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field

import httpx

from draftkit.errors import DraftkitError

log = logging.getLogger("draftkit.serve")

PROBE_S = 2.0  # seconds between health probes of each upstream
CONNECT_S = 5.0  # a connection not made in this long counts as the upstream being down


class NoUpstream(Exception):
    """No upstream is healthy and taking requests."""


@dataclass(eq=False)
class Upstream:
    """One vLLM server: its base URL (``http://host:port``, without ``/v1``), the model name it
    serves (sent in each body), its context, the identity of its draft."""

    url: str
    model: str
    max_model_len: int | None
    draft: str
    healthy: bool = True
    accepting: bool = True  # False while it drains
    busy: int = 0  # this front's requests in flight on it
    idle: asyncio.Event | None = field(default=None, repr=False)  # set when busy falls to 0
    # how it chooses drafts at temperature > 0 (Replica.draft_sample_method); None: a server
    # the front did not start, whose speculative config it cannot see
    draft_sample_method: str | None = None


def discover(url: str, draft: str, draft_sample_method: str | None = None,
             timeout: float = 10.0) -> Upstream:
    """The upstream at ``url`` as its ``/v1/models`` describes it (the first model listed);
    a one-line DraftkitError where nothing OpenAI-like answers there."""
    url = url.rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise DraftkitError(f"--upstream {url} is not an http(s) URL; give a vLLM server's base "
                            f"URL, e.g. http://10.0.0.5:8000")
    try:
        answer = httpx.get(f"{url}/v1/models", timeout=timeout)
        answer.raise_for_status()
        model = answer.json()["data"][0]
        name, length = str(model["id"]), model.get("max_model_len")
    except httpx.HTTPError as e:
        raise DraftkitError(f"the upstream at {url} does not answer GET /v1/models "
                            f"({type(e).__name__}: {e}); start its vLLM server first, or check "
                            f"the URL") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise DraftkitError(f"the upstream at {url} answered GET /v1/models without a model "
                            f"list; give the URL of a vLLM OpenAI server") from None
    return Upstream(url, name, int(length) if isinstance(length, int) else None, draft,
                    draft_sample_method=draft_sample_method)


class Pool:
    """The upstreams and the HTTP client that reaches them. :meth:`start` / :meth:`stop` run
    with the app's lifespan (the client and the prober live on its event loop)."""

    def __init__(self, upstreams: list[Upstream], read_timeout: float = 600.0):
        self.upstreams = list(upstreams)
        self.read_timeout = read_timeout
        self.client: httpx.AsyncClient | None = None
        self._turn = itertools.count()
        self._prober: asyncio.Task | None = None

    async def start(self) -> None:
        # no pool limit: vLLM queues what it cannot run, and a limit here would queue twice
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.read_timeout, connect=CONNECT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self._prober = asyncio.create_task(self._probe_loop())

    async def stop(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            try:
                await self._prober
            except asyncio.CancelledError:
                pass
        if self.client is not None:
            await self.client.aclose()

    # --- routing ---------------------------------------------------------------------------

    def pick(self, avoid: tuple[Upstream, ...] = ()) -> Upstream:
        """The healthy, accepting upstream with the fewest requests in flight, ties in turn;
        ``avoid``: ones this request already failed on."""
        ready = [u for u in self.upstreams if u.healthy and u.accepting and u not in avoid]
        if not ready:
            raise NoUpstream()
        least = min(u.busy for u in ready)
        ties = [u for u in ready if u.busy == least]
        return ties[next(self._turn) % len(ties)]

    def take(self, upstream: Upstream) -> None:
        upstream.busy += 1

    def release(self, upstream: Upstream) -> None:
        upstream.busy -= 1
        if upstream.busy == 0 and upstream.idle is not None:
            upstream.idle.set()

    def down(self, upstream: Upstream, why: str) -> None:
        """A connection to ``upstream`` failed: skip it until a probe finds it healthy."""
        if upstream.healthy:
            log.warning(f"upstream {upstream.url} is down ({why}); routing around it")
        upstream.healthy = False

    @property
    def serving(self) -> bool:
        """Whether some upstream takes requests (``/health``)."""
        return any(u.healthy and u.accepting for u in self.upstreams)

    @property
    def max_model_len(self) -> int | None:
        lengths = [u.max_model_len for u in self.upstreams if u.max_model_len]
        return min(lengths) if lengths else None

    # --- blue/green --------------------------------------------------------------------------

    def add(self, upstream: Upstream) -> None:
        self.upstreams.append(upstream)

    async def drain(self, upstream: Upstream) -> None:
        """Take no new request on ``upstream``, wait for its last one, drop it from the pool."""
        upstream.accepting = False
        upstream.idle = asyncio.Event()
        if upstream.busy:
            await upstream.idle.wait()
        self.upstreams.remove(upstream)

    # --- health ------------------------------------------------------------------------------

    async def probe(self, upstream: Upstream) -> bool:
        try:
            answer = await self.client.get(f"{upstream.url}/health", timeout=CONNECT_S)
            ok = answer.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok and not upstream.healthy:
            log.info(f"upstream {upstream.url} is back")
        upstream.healthy = ok
        return ok

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S)
            await asyncio.gather(*(self.probe(u) for u in list(self.upstreams)))
