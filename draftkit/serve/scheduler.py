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
4. frees the slot of every request that finished (EOS, its token budget, a stop string),
   counts its rounds under its domain label and, under ``--record``, hands it to the
   recorder (a queue put: the disk is the recorder's thread's).

How many requests may join is the batch's to say (``Batch.free_slots``): on the general
(non-Llama) runner the batch admits only into an empty one, so requests are admitted in
cohorts, a new one when the last has left (one row at a time for a model with a sliding
window).

A new draft (``POST /admin/draft``, :mod:`draftkit.serve.swap`) comes in between batches:
once it is loaded, the loop stops admitting, lets the live requests finish on the draft they
started with (new ones wait in the queue), then swaps the engine's draft, opens a fresh batch
on it (the batch's per-slot draft state is its draft's) and admits again. Each request keeps
the identity of the draft it decoded with (``Job.draft``, its ``draftkit.draft`` stat).

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
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from draftkit.decode.choice import KChoice
from draftkit.decode.k import AUTO
from draftkit.decode.sampling_params import SamplingParams
from draftkit.decode.state import round_margin
from draftkit.errors import ConfigError
from draftkit.serve.detok import TextStream
from draftkit.serve.metrics import ServeMetrics
from draftkit.traffic.record import UNLABELED, SamplingEntry

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
    draft: str | None = None  # identity of the draft it decodes with, set at admission
    domain: str = UNLABELED  # the request's label (protocol's label()), cleaned
    record: bool = True  # False: the request opted out of --record

    def push(self, *event: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
            pass


@dataclass
class DraftSwap:
    """A new draft waiting to come in. ``place`` puts it on the serving device; the scheduler
    thread calls it, as the only thread that runs the engine's kernels (while it captures a
    CUDA graph, another thread's allocation would break the capture). ``done`` resolves to
    ``identity`` once the draft serves, or to the error that left the old one serving."""

    identity: str
    place: Callable[[], Any]
    source: str = ""  # where it comes from (a bundle), for the log
    done: Future = field(default_factory=Future)


class Scheduler:
    def __init__(self, engine, metrics: ServeMetrics, *, k: KChoice, max_batch: int = 16,
                 max_model_len: int | None = None, recorder=None, draft: str = "none"):
        """``k``: each round's K, fixed or the policy's for the live batch size (the serve
        command's, validated there; K = 0 without a draft). ``recorder``: a
        :class:`~draftkit.traffic.recorder.Recorder` each finished request is handed to."""
        self.engine, self.metrics = engine, metrics
        self.recorder = recorder
        # draft: the serving draft's identity (none: plain decoding); pending: a DraftSwap
        self.draft, self.pending = draft, None
        metrics.serving_draft(draft)
        self.k_choice = k
        k_max = k.k_max
        metrics.open_positions(k_max)
        limit = engine.describe().context
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

    def swap(self, new: DraftSwap) -> None:
        """Bring ``new`` in once the requests decoding now have finished on the draft they
        started with; requests arriving meanwhile wait in the queue (``new.done`` says when
        it serves). One swap at a time."""
        with self.lock:
            if self.stopping:
                raise RuntimeError("the server is shutting down")
            if self.pending is not None:
                raise RuntimeError("a draft swap is in progress already")
            self.pending = new
        log.info("draft swap: %s (%s) comes in once %d requests in flight finish on %s",
                 new.identity, new.source, len(self.jobs), self.draft)
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
                self.metrics.finished("abort", job.draft)
        self.metrics.running.set(len(self.jobs))

    def _admit(self) -> None:
        if self.pending is not None:  # no admission until the live rows have finished
            if self.jobs:
                return
            self._swap()
        free = self.batch.free_slots()
        batch: list[Job] = []
        with self.lock:
            while self.waiting and len(batch) < free:  # cancel() took the cancelled ones out
                batch.append(self.waiting.popleft())
            self.metrics.waiting.set(len(self.waiting))
        if not batch:
            return
        # being prefilled is running (as vLLM counts it): off the queue, never in neither gauge
        self.metrics.running.set(len(self.jobs) + len(batch))
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
            job.slot, job.draft = slot, self.draft
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
                else 0.0, "target_calls": row.target_calls, "draft": job.draft}
        self.batch.release(slot)
        del self.jobs[slot]
        self.metrics.running.set(len(self.jobs))
        self.metrics.finished(reason, job.draft)
        self.metrics.e2e.observe(time.perf_counter() - job.arrived)
        self.metrics.domain_rounds(job.domain, row.rounds, job.draft)
        if self.recorder is not None and job.record:
            self._record(job, out.tokens[:job.stream.tokens], reason, row.rounds)
        job.push("done", reason, job.stream.tokens, spec)  # none after a stop string

    def _record(self, job: Job, completion: list[int], reason: str,
                rounds: list[list[int]]) -> None:
        """Hand a finished request to the recorder: ids as served (cut after the token that
        completed a stop string, as ``usage`` counts them), never text. A queue put."""
        p = job.params
        sampling = SamplingEntry(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                                 seed=job.seed, max_tokens=job.max_tokens)
        self.recorder.add(domain=job.domain, prompt_ids=list(job.prompt),
                          completion_ids=completion, sampling=sampling, finish_reason=reason,
                          rounds=list(rounds),
                          draft=None if job.draft == "none" else job.draft)  # none: plain

    def _swap(self) -> None:
        """No row is live: put the pending draft in and open a fresh batch on it. Under
        ``--k auto`` the policy starts afresh: what it learnt was the old draft's alpha and c.
        A draft that fails to come in leaves the old one serving."""
        new, self.pending = self.pending, None
        engine, batch, k = self.engine, self.batch, self.k_choice
        old = engine.draft_model
        try:
            engine.swap_draft(new.place(), batch.max_len)
            if k.policy is not None:
                k = KChoice.of(AUTO, k.k_max, has_draft=True)
            self.batch, self.k_choice = engine.open(batch.slots, k, batch.max_len), k
        except Exception as e:
            log.exception("draft swap to %s failed; %s serves on", new.identity, self.draft)
            if engine.draft_model is not old:  # the new batch did not open: back to the old
                engine.swap_draft(old, batch.max_len)
                self.batch = engine.open(batch.slots, self.k_choice, batch.max_len)
            new.done.set_exception(e)
            return
        log.info("draft swap: %s serves, replacing %s", new.identity, self.draft)
        self.draft = new.identity
        self.metrics.serving_draft(new.identity)
        new.done.set_result(new.identity)

    def _fail_all(self, message: str) -> None:
        for slot, job in list(self.jobs.items()):
            self.batch.release(slot)
            job.push("error", message)
        self.jobs.clear()
        self.metrics.running.set(0)

    def _shutdown(self) -> None:
        with self.lock:
            waiting, self.waiting = list(self.waiting), deque()
            pending, self.pending = self.pending, None
        if pending is not None:
            pending.done.set_exception(RuntimeError("the server is shutting down"))
        for job in waiting:
            job.push("error", "the server is shutting down")
        self._fail_all("the server is shutting down")
        self.metrics.waiting.set(0)
