"""Prometheus metrics for ``GET /metrics``, named like vLLM's with a ``draftkit:`` prefix.

Speculation counters mirror vLLM's (README.md, "How speculation pays"): ``spec_decode_num_drafts``
(one per row per speculative round), ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
``..._num_accepted_tokens_per_pos{position=}``; the text format appends ``_total``. From them a
dashboard gets tau = 1 + accepted / drafts per round, vLLM's acceptance rate accepted / drafted
(not alpha: a round stops testing at its first rejection) and alpha at each position from the
per-position counters. The gauge
``draftkit:spec_decode_k`` is the K of the latest round (0: speculation off at this load).

Labels are vLLM's: ``model_name`` and ``engine`` on every series (``engine`` is "0": one engine
per server, where vLLM counts its data-parallel engines), plus ``position`` on the per-position
counter. As in vLLM, the per-position series for positions 0..K-1 exist at zero from start-up
(:meth:`ServeMetrics.open_positions`, K the most a round drafts: ``--k``, or ``--k-max`` under
``--k auto``), so a dashboard's ratios are defined before the first request and a position no
round reached reads 0 rather than missing.

Each app gets its own registry, so several servers (tests) live in one process.
"""

from __future__ import annotations

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServeMetrics:
    def __init__(self, model_name: str):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        prometheus_client.disable_created_metrics()  # no *_created series (vLLM does the same)
        self.registry = r = CollectorRegistry(auto_describe=True)
        label = {"model_name": model_name, "engine": "0"}
        names = list(label)

        def counter(name, doc, extra=()):
            c = Counter(f"draftkit:{name}", doc, names + list(extra), registry=r)
            return c if extra else c.labels(**label)

        def gauge(name, doc):
            return Gauge(f"draftkit:{name}", doc, names, registry=r).labels(**label)

        def histogram(name, doc):
            return Histogram(f"draftkit:{name}", doc, names, buckets=LATENCY_BUCKETS,
                             registry=r).labels(**label)

        self.label = label
        self.running = gauge("num_requests_running", "requests decoding in the batch")
        self.waiting = gauge("num_requests_waiting", "requests waiting for a free slot")
        self.success = counter("request_success", "finished requests by finish reason",
                               ["finished_reason"])
        self.rejected = counter("request_rejected", "requests refused with an HTTP error",
                                ["status"])
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of admitted requests")
        self.generation_tokens = counter("generation_tokens", "generated tokens")
        self.e2e = histogram("e2e_request_latency_seconds", "arrival to last token")
        self.ttft = histogram("time_to_first_token_seconds", "arrival to first token")
        self.queue = histogram("request_queue_time_seconds", "arrival to admission")
        self.drafts = counter("spec_decode_num_drafts", "rows times speculative rounds")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "drafted tokens")
        self.accepted = counter("spec_decode_num_accepted_tokens", "accepted drafted tokens")
        self.accepted_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                    "accepted drafted tokens per draft position",
                                    ["position"])
        self.accepted_at: list = []  # the per-position children, 0..K-1 (open_positions)
        self.k = gauge("spec_decode_k", "K (num_speculative_tokens) of the latest round")
        self.rounds = counter("engine_rounds", "decoding rounds run by the scheduler")

    def open_positions(self, k_max: int) -> None:
        """Create the per-position series 0..``k_max`` - 1 at zero (the scheduler calls this
        with the most K any round will draft; 0 without a draft)."""
        for i in range(len(self.accepted_at), k_max):
            self.accepted_at.append(self.accepted_pos.labels(position=str(i), **self.label))

    def observe_round(self, r) -> None:
        """One engine round (a :class:`~draftkit.decode.stats.RoundStats`)."""
        self.rounds.inc()
        self.k.set(r.k)
        self.generation_tokens.inc(r.tokens)
        if r.k and r.rows:
            self.drafts.inc(r.rows)
            self.draft_tokens.inc(r.rows * r.k)
            self.accepted.inc(sum(r.accepted_per_position))
            self.open_positions(r.k)  # a no-op when the scheduler opened them all
            for counter, n in zip(self.accepted_at, r.accepted_per_position):
                counter.inc(n)

    def finished(self, reason: str) -> None:
        self.success.labels(finished_reason=reason, **self.label).inc()

    def reject(self, status: int) -> None:
        self.rejected.labels(status=str(status), **self.label).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
