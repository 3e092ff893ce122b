"""``POST /admin/draft`` in front of the vLLM servers the front started: blue/green.

::

    curl -X POST localhost:8000/admin/draft -H "Authorization: Bearer $TOKEN" \\
         -H "Content-Type: application/json" -d '{"bundle": "/bundles/smol-v2"}'

1. The new bundle is checked as ``draftkit check`` checks it, against the serving target (it
   must record that target's content hash).
2. As many new ("green") replicas as serve now are started with it, in the old ones' places on
   the CPU build (they share cores for the while) or on spare GPUs (a GPU holds one vLLM: with
   none spare the swap is refused, saying so).
3. A canary: the most recent recorded requests (``--record``; up to :data:`CANARY` of them) are
   decoded greedily by a green replica and an old one; the swap goes on only when the new
   draft's alpha is not below the old one's beyond noise (the 95% interval of the paired
   difference lies above zero or straddles it). Without recorded traffic the canary is the
   replicas' health alone, and the answer says so.
4. The green replicas join the pool; the old ones take no new request, finish those in flight
   (their records name the old draft) and are stopped.

Any failure before step 4 stops the green replicas and answers 4xx/5xx with the reason; the old
draft serves on throughout. The answer names both drafts, the canary's figures and the seconds
the swap took.

vLLM's online weight update (``/start_draft_weight_update``, ``/update_weights``,
``/finish_weight_update``) would swap the weights without a second server, but its transfer
backends in the releases draftkit pins (nccl, ipc and their sharded forms) are GPU ones; on the
CPU build it is not available, and on GPUs it is not yet used here: blue/green is the one way.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from draftkit.errors import DraftkitError
from draftkit.export.bundle import check_bundle
from draftkit.metrics import bootstrap
from draftkit.models.resolve import bundle_ref, model_identity
from draftkit.serve import replicas as R
from draftkit.serve.http import RequestError
from draftkit.serve.swap import refused
from draftkit.serve.upstream import Pool, discover
from draftkit.serve.vllm_answer import rounds_of
from draftkit.traffic.shards import read_traffic

CANARY = 16  # recorded requests the canary decodes at most
CANARY_TOKENS = 64  # tokens each canary request decodes at most
WEIGHT_UPDATE = ("vLLM's draft weight update needs a GPU transfer backend (nccl, ipc); not "
                 "available on the CPU build")


class BlueGreen:
    """The swap over the replicas a front started: vLLM's launch, the replicas serving now and
    their places; :meth:`attach` gives it the pool, metrics and recorder once the app exists."""

    def __init__(self, launch: R.Launch, replicas: list[R.Replica], places: list[dict],
                 target_path: str | Path):
        self.launch, self.replicas, self.places = launch, list(replicas), list(places)
        self.target_path = str(target_path)
        self.pool: Pool | None = None
        self.metrics = None
        self.recorder = None
        self.busy = False

    def attach(self, pool: Pool, metrics, recorder) -> None:
        self.pool, self.metrics, self.recorder = pool, metrics, recorder

    async def swap(self, bundle: str) -> dict:
        self.busy = True
        task = asyncio.ensure_future(self._swap(bundle))
        task.add_done_callback(lambda _: setattr(self, "busy", False))
        # shielded: a client that leaves does not call the swap off halfway
        return await asyncio.shield(task)

    async def _swap(self, bundle: str) -> dict:
        started = time.perf_counter()
        old = [u for u in self.pool.upstreams if u.accepting]
        previous = old[0].draft if old else "none"
        identity = await asyncio.to_thread(self.check, bundle, previous)
        places = self.green_places()
        greens: list[R.Replica] = []
        try:
            try:
                for i, place in enumerate(places):
                    greens.append(await asyncio.to_thread(
                        R.start, self.launch, bundle, place, len(self.replicas) + i))
                await asyncio.to_thread(R.wait_ready, greens)
                new = [await asyncio.to_thread(discover, r.url, identity, r.draft_sample_method)
                       for r in greens]
            except DraftkitError as e:
                raise refused(bundle, previous, e) from None
            canary = await self.canary(new[0], old[0]) if old else None
            if canary and canary["verdict"] == "below":
                raise RequestError(
                    f"bundle {bundle} refused, draft {previous} serves on: its canary alpha "
                    f"{canary['alpha_new']:.3f} is below the serving draft's "
                    f"{canary['alpha_old']:.3f} beyond noise (difference "
                    f"{canary['difference']:+.3f}, 95% interval {canary['low']:+.3f} to "
                    f"{canary['high']:+.3f}, {canary['requests']} recorded requests)", "bundle",
                    422, "canary_failed")
        except BaseException:
            await asyncio.to_thread(R.stop_all, greens)
            raise
        for u in new:
            self.pool.add(u)
        self.metrics.serving_draft(identity)
        await asyncio.gather(*(self.pool.drain(u) for u in old))
        retired = [r for r in self.replicas if any(r.url == u.url for u in old)]
        await asyncio.to_thread(R.stop_all, retired)
        self.replicas = [r for r in self.replicas if r not in retired] + greens
        self.places = places  # where the serving replicas run now: the next swap's spares
        return {"object": "draft", "draft": identity, "previous": previous, "bundle": bundle,
                "method": "blue/green", "weight_update": WEIGHT_UPDATE
                if self.launch.cpu else "not used", "canary": canary or
                "none: no recorded traffic (start with --record); health only",
                "replicas": [r.url for r in greens],
                "seconds": round(time.perf_counter() - started, 3)}

    def check(self, bundle: str, previous: str) -> str:
        """``draftkit check``'s verification against the serving target; -> the new draft's
        identity (a worker thread's work)."""
        try:
            manifest = check_bundle(Path(bundle), target=self.target_path)
            if not manifest.target.sha256:
                raise DraftkitError("it records no content hash of its target (an earlier "
                                    "draftkit's export); re-export it to serve it here")
            return model_identity(bundle_ref(bundle, Path(bundle), manifest, "draft"))
        except (DraftkitError, OSError) as e:
            raise refused(bundle, previous, e) from None

    def green_places(self) -> list[dict]:
        """Where the new replicas run: the old ones' places on the CPU build; spare GPUs."""
        if self.launch.cpu:
            return list(self.places)
        used = {g for p in self.places for g in p.get("CUDA_VISIBLE_DEVICES", "").split(",")}
        spare = [g for g in R.gpu_ids() if g not in used]
        tp, n = self.launch.tensor_parallel_size, len(self.places)
        if len(spare) < n * tp:
            raise RequestError(f"a blue/green swap starts {n} new replica(s) of {tp} GPU(s) "
                               f"beside the serving ones; {len(spare)} GPU(s) are spare; start "
                               f"the front with fewer --replicas to leave room", "bundle", 409,
                               "no_spare_gpus")
        return [{"CUDA_VISIBLE_DEVICES": ",".join(spare[i * tp:(i + 1) * tp])}
                for i in range(n)]

    async def canary(self, new, old) -> dict | None:
        """The recorded requests decoded greedily by a green and an old replica: their alpha
        (truncation-corrected, per request, paired) and the verdict; None without traffic."""
        prompts = await asyncio.to_thread(self.recent_prompts)
        if not prompts:
            return None
        rows = []
        for prompt, budget in prompts:
            pair = []
            for upstream in (new, old):
                pair.append(await self.decode(upstream, prompt, budget))
            if None not in pair:
                rows.append(pair)
        if not rows:
            return None

        def alpha(which: int, idx) -> float:
            acc = sum(rows[i][which][0] for i in idx)
            tested = sum(rows[i][which][1] for i in idx)
            return acc / tested if tested else 0.0

        diff, low, high = bootstrap(lambda idx: alpha(0, idx) - alpha(1, idx), len(rows),
                                    resamples=2000)
        everyone = range(len(rows))
        return {"requests": len(rows), "alpha_new": round(alpha(0, everyone), 4),
                "alpha_old": round(alpha(1, everyone), 4), "difference": round(diff, 4),
                "low": round(low, 4), "high": round(high, 4),
                "verdict": "below" if high < 0 else "above" if low > 0 else "within noise"}

    def recent_prompts(self) -> list[tuple[list[int], int]]:
        """(prompt ids, token budget) of the most recent recorded requests that kept their
        prompt (the folder read as ``draftkit traffic`` reads it: bad shards left out)."""
        if self.recorder is None:
            return []

        try:
            records = read_traffic(self.recorder.folder, target=self.recorder.target,
                                   tokenizer=self.recorder.tokenizer)
        except DraftkitError:
            return []
        return [(r.prompt_ids, max(1, min(len(r.completion_ids), CANARY_TOKENS)))
                for r in [r for r in records if r.prompt_ids is not None][-CANARY:]]

    async def decode(self, upstream, prompt: list[int], budget: int) -> tuple[int, int] | None:
        """(accepted, tested) of one greedy request on ``upstream``, asked directly (not
        through the front: no record, no metric)."""
        body = {"model": upstream.model, "prompt": prompt, "max_tokens": budget,
                "temperature": 0.0}
        try:
            answer = await self.pool.client.post(f"{upstream.url}/v1/completions", json=body)
            rounds = rounds_of(((answer.json().get("metrics") or {})
                                .get("speculative_decoding")))
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if rounds is None:
            return None
        accepted = sum(a for _, a in rounds)
        return accepted, accepted + sum(1 for d, a in rounds if a < d)
