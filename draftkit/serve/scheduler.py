"""Continuous batching at round granularity over :class:`~draftkit.decode.engine.SpeculativeEngine`.

One background thread owns the engine and its batch of N slots (Orca, Yu et al., OSDI 2022:
iteration-level scheduling; here the iteration is one speculative round). Each turn of its
loop:

1. frees the slots of requests whose client went away;
2. admits waiting requests into free slots (one prefill for all of them; the live rows keep
   their caches and continue next round);
3. runs one round over the live rows (``Batch.step``), at the batch's K: fixed, or
   ``KPolicy.choose(live rows)`` under ``--k auto``, whose timing tables are keyed by batch
   size, so K falls to 0 when the batch makes speculation a loss (SmartSpec, arXiv
   2406.14066), and sends each request its new text;
4. frees the slot of every request that finished (EOS, its token budget, a stop string).

How many requests may join is the batch's to say (``Batch.free_slots``): on the general
(non-Llama) runner the engine admits only into an empty batch, so requests are admitted in
cohorts, a new one when the last has left (one row at a time for a model with a sliding
window).

Requests talk to the thread through :class:`Job`: the event loop puts it in the waiting
queue and reads its events from an ``asyncio.Queue`` the thread fills with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from draftkit.decode.batch import round_margin
from draftkit.decode.choice import KChoice
from draftkit.decode.sampling import SamplingParams
from draftkit.errors import ConfigError
from draftkit.serve.detok import TextStream
from draftkit.serve.metrics import ServeMetrics

log = logging.getLogger("draftkit.serve")


@dataclass
class Job:
    """One request as the scheduler sees it. Events: ("text", str), ("done", finish_reason,
    completion_tokens, speculation stats), ("error", message)."""

    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int | None
    stream: TextStream
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    slot: int | None = None
    seen: int = 0  # tokens of the slot's output already fed to ``stream``
    first_token: float | None = None

    def push(self, *event: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            pass


class Scheduler:
    def __init__(self, engine, metrics: ServeMetrics, *, k: KChoice, max_batch: int = 16,
                 max_model_len: int | None = None):
        """``k``: each round's K, fixed or the policy's for the live batch size (the serve
        command's, validated there; K = 0 without a draft)."""
        self.engine, self.metrics = engine, metrics
        self.k_choice = k
        k_max = k.k_max
        metrics.open_positions(k_max)
        limit = engine.context
        if max_model_len is not None and limit is not None:
            max_model_len = min(max_model_len, limit)
        max_len = max_model_len or limit
        margin = round_margin(k_max)
        if max_len is not None and max_len - margin < 1:
            raise ConfigError(f"{max_len} positions per slot (--max-model-len, at most the "
                              f"target's context) leave no room for a prompt: a round needs "
                              f"K + 2 = {margin} of them (K: --k, or --k-max under --k "
                              f"auto); raise --max-model-len or lower K")
        self.batch = engine.open(max_batch, k, max_len)
        self.context = self.batch.max_len - margin
        self.waiting: deque[Job] = deque()
        self.jobs: dict[int, Job] = {}  # slot -> job
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.k = 0  # K of the latest round

    # --- called from the event loop ---------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="draftkit-scheduler", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.stopping:
                raise RuntimeError("the server is shutting down")
            self.waiting.append(job)
            self.metrics.waiting.set(len(self.waiting))
        self.wake.set()

    def cancel(self, job: Job) -> None:
        """The client went away: a queued request leaves the queue now, counted as an abort;
        a running one's slot is freed before the next round."""
        with self.lock:  # the same lock _admit pops under: a job is queued or it is not
            job.cancelled = True
            queued = len(self.waiting)
            self.waiting = deque(j for j in self.waiting if j is not job)
            if len(self.waiting) < queued:
                self.metrics.waiting.set(len(self.waiting))
                self.metrics.finished("abort")
        self.wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop admitting; cancel what is still queued or decoding; join the thread."""
        with self.lock:
            self.stopping = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def running(self) -> int:
        return len(self.jobs)

    # --- the loop (scheduler thread) --------------------------------------------------------

    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                if self.stopping:
                    self._shutdown()
                    return
                self._reap()
                try:
                    self._admit()
                    if not self.jobs:
                        self.wake.wait(0.05)
                        self.wake.clear()
                        continue
                    self._round()
                except Exception as e:  # a bug or out of memory: fail the batch, keep serving
                    log.exception("decoding failed")
                    self._fail_all(f"decoding failed: {type(e).__name__}: {e}")

    def _round(self) -> None:
        live = self.batch.live
        r = self.batch.step()
        self.k = r.k
        self.metrics.observe_round(r)
        for slot in live:
            self._emit(slot)

    def _reap(self) -> None:
        for slot, job in list(self.jobs.items()):
            if job.cancelled:
                self.batch.release(slot)
                del self.jobs[slot]
                self.metrics.finished("abort")
        self.metrics.running.set(len(self.jobs))

    def _admit(self) -> None:
        free = self.batch.free_slots()
        batch: list[Job] = []
        with self.lock:
            while self.waiting and len(batch) < free:  # cancel() took the cancelled ones out
                batch.append(self.waiting.popleft())
            self.metrics.waiting.set(len(self.waiting))
        if not batch:
            return
        try:
            now = time.perf_counter()
            slots = self.batch.admit([j.prompt for j in batch], [j.params for j in batch],
                                     [j.max_tokens for j in batch], [j.seed for j in batch])
        except Exception as e:
            # off the queue but not running yet: _fail_all would not reach them
            for job in batch:
                job.push("error", f"decoding failed: {type(e).__name__}: {e}")
            raise
        for job, slot in zip(batch, slots):
            job.slot = slot
            self.jobs[slot] = job
            self.metrics.queue.observe(now - job.arrived)
            self.metrics.prompt_tokens.inc(len(job.prompt))
        self.metrics.generation_tokens.inc(len(batch))  # the prefill's first tokens
        self.metrics.running.set(len(self.jobs))
        for slot in slots:
            self._emit(slot)

    def _emit(self, slot: int) -> None:
        """Send a request the text its row gained; finish it when its row is done."""
        job = self.jobs[slot]
        out = self.batch.output(slot)
        new, job.seen = out.tokens[job.seen:], len(out.tokens)
        done = out.done
        if new and job.first_token is None:
            job.first_token = time.perf_counter()
            self.metrics.ttft.observe(job.first_token - job.arrived)
        text = job.stream.feed(new, final=done)
        if text:
            job.push("text", text)
        if not (done or job.stream.stopped):
            return
        reason = "stop" if job.stream.stopped or out.finish_reason == "eos" else "length"
        row = out.stats
        rounds = max(row.target_calls - 1, 0)  # the prefill is not a round
        spec = {"drafted": row.drafted, "accepted": row.accepted, "tau": round(out.tau, 4),
                "alpha": round(row.alpha, 4), "k": round(row.drafted / rounds, 4) if rounds
                else 0.0, "target_calls": row.target_calls}
        self.batch.release(slot)
        del self.jobs[slot]
        self.metrics.running.set(len(self.jobs))
        self.metrics.finished(reason)
        self.metrics.e2e.observe(time.perf_counter() - job.arrived)
        job.push("done", reason, job.stream.tokens, spec)  # none after a stop string

    def _fail_all(self, message: str) -> None:
        for slot, job in list(self.jobs.items()):
            self.batch.release(slot)
            job.push("error", message)
        self.jobs.clear()
        self.metrics.running.set(0)

    def _shutdown(self) -> None:
        with self.lock:
            waiting, self.waiting = list(self.waiting), deque()
        for job in waiting:
            job.push("error", "the server is shutting down")
        self._fail_all("the server is shutting down")
        self.metrics.waiting.set(0)
