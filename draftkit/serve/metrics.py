"""Prometheus metrics for ``GET /metrics``, named like vLLM's with a ``draftkit:`` prefix.

Speculation counters mirror vLLM's (eval/README.md, "How speculation pays"):
``spec_decode_num_drafts`` (one per row per speculative round), ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos{position=}``; the text format
appends ``_total``. From them a dashboard gets tau = 1 + accepted / drafts per round, vLLM's
acceptance rate accepted / drafted (not alpha: a round stops testing at its first rejection) and
alpha at each position from the per-position counters. The gauge ``draftkit:spec_decode_k`` is the
K of the latest round (0: speculation off at this load).

Labels are vLLM's: ``model_name`` and ``engine`` on every series (``engine`` is "0": one engine
per server, where vLLM counts its data-parallel engines), plus ``position`` on the per-position
counter. As in vLLM, the per-position series for positions 0..K-1 exist at zero from start-up
(:meth:`ServeMetrics.open_positions`, K the most a round drafts: ``--k``, or ``--k-max`` under
``--k auto``), so a dashboard's ratios are defined before the first request and a position no
round reached reads 0 rather than missing.

The draft is named by its identity (:func:`draftkit.models.resolve.model_identity`, 16 hex
characters; ``none`` for plain decoding): the gauge ``draftkit:draft_info{draft=}`` is 1 for
the draft serving now and 0 for each one it replaced (``POST /admin/draft``, serve/README.md),
``draftkit:request_success_by_draft{draft=, finished_reason=}`` counts the requests finished
on each, and ``..._num_drafts_by_draft{draft=}`` with
``..._num_accepted_tokens_per_pos_by_draft{draft=, position=}`` their speculation, so a
dashboard splits acceptance and latency at a swap.

Per domain: a request's label (``metadata.domain``, else ``user``, else its route's
``--route-labels`` label, else ``unlabeled``; cleaned by
:func:`draftkit.traffic.record.clean_label`, as records keep it) labels
``draftkit:spec_decode_num_drafts_by_domain{domain=}``,
``..._num_draft_tokens_by_domain{domain=}`` and
``..._num_accepted_tokens_per_pos_by_domain{domain=, position=}``, counted from a request's
rounds when it finishes (not per round, as the series above; an aborted request counts in none).
The first MAX_DOMAINS labels get series of their own, later ones share ``other``: a label is a
client's text, and each one a series. The gauge ``draftkit:traffic_recording`` is 1 while
``--record`` writes finished requests, 0 without it or once it stopped (its quota, a failed
write).

In front of vLLM (``--engine vllm``, ``--upstream``) the same series are counted from each
finished request's per-step counts (:meth:`ServeMetrics.request_rounds`), so one dashboard
reads either engine; ``draftkit:traffic_unrecorded{reason=}`` counts the requests ``--record``
could not keep (``no_ids``: vLLM returned no token ids), ``draftkit:traffic_uncounted{reason=}``
those it kept without vLLM's acceptance counts, which ``draftkit traffic`` replays (``n>1``,
``no_counts``: an upstream started without per-request metrics). serve/grafana.json and
serve/alerts.yml read these names.

Each app gets its own registry, so several servers (tests) live in one process.
"""

from __future__ import annotations

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MAX_DOMAINS = 64  # domain labels with series of their own; later ones count as OTHER
OTHER = "other"
# why a finished request went unrecorded (vLLM behind the front): no token ids
UNRECORDED = ("no_ids",)
# why one was recorded without the engine's acceptance counts: n > 1, no per-step counts
UNCOUNTED = ("n>1", "no_counts")


class ServeMetrics:
    def __init__(self, model_name: str):
        import prometheus_client  # optional extra: serve
        from prometheus_client import CollectorRegistry  # optional extra: serve

        prometheus_client.disable_created_metrics()  # no *_created series (vLLM does the same)
        self.registry = CollectorRegistry(auto_describe=True)
        self.label = {"model_name": model_name, "engine": "0"}
        self.running = self._gauge("num_requests_running", "requests decoding (in the batch, "
                                                           "or at vLLM behind the front)")
        self.waiting = self._gauge("num_requests_waiting", "requests waiting for a free slot")
        self.success = self._counter("request_success", "finished requests by finish reason",
                                     ["finished_reason"])
        self.rejected = self._counter("request_rejected", "requests refused with an HTTP error",
                                      ["status"])
        self.prompt_tokens = self._counter("prompt_tokens", "prompt tokens of admitted requests")
        self.generation_tokens = self._counter("generation_tokens", "generated tokens")
        self.e2e = self._histogram("e2e_request_latency_seconds", "arrival to last token")
        self.ttft = self._histogram("time_to_first_token_seconds", "arrival to first token")
        self.queue = self._histogram("request_queue_time_seconds", "arrival to admission")
        self.recording = self._gauge("traffic_recording", "1 while --record writes finished "
                                                          "requests to its folder")
        self.unrecorded = self._counter("traffic_unrecorded", "finished requests --record "
                                        "could not keep, by why (no token ids)", ["reason"])
        self.uncounted = self._counter("traffic_uncounted", "finished requests --record kept "
                                       "without the engine's acceptance counts (draftkit "
                                       "traffic replays them), by why (n > 1, no per-step "
                                       "counts)", ["reason"])
        for reason in UNRECORDED:  # at zero from start-up, so an alert's series exist
            self.unrecorded.labels(reason=reason, **self.label)
        for reason in UNCOUNTED:
            self.uncounted.labels(reason=reason, **self.label)
        self.rounds = self._counter("engine_rounds", "decoding rounds run by the scheduler")
        self._speculation()
        self._drafts()

    def _speculation(self) -> None:
        """The speculation counters, vLLM's names; per domain label too."""
        self.k = self._gauge("spec_decode_k", "K (num_speculative_tokens) of the latest round")
        self.drafts = self._counter("spec_decode_num_drafts", "rows times speculative rounds")
        self.draft_tokens = self._counter("spec_decode_num_draft_tokens", "drafted tokens")
        self.accepted = self._counter("spec_decode_num_accepted_tokens",
                                      "accepted drafted tokens")
        self.accepted_pos = self._counter("spec_decode_num_accepted_tokens_per_pos",
                                          "accepted drafted tokens per draft position",
                                          ["position"])
        self.accepted_at: list = []  # the per-position children, 0..K-1 (open_positions)
        self.drafts_by_domain = self._counter("spec_decode_num_drafts_by_domain", "rows times "
                                              "speculative rounds, by the request's domain "
                                              "label", ["domain"])
        self.draft_tokens_by_domain = self._counter("spec_decode_num_draft_tokens_by_domain",
                                                    "drafted tokens, by domain label",
                                                    ["domain"])
        self.accepted_pos_by_domain = self._counter(
            "spec_decode_num_accepted_tokens_per_pos_by_domain", "accepted drafted tokens per "
            "draft position, by domain label", ["domain", "position"])
        self.tested_by_domain = self._counter(
            "spec_decode_num_tested_tokens_by_domain", "drafted tokens that reached the accept "
            "test (accepted ones, and one a round that rejected), by domain label: served "
            "alpha = accepted / tested, as draftkit eval measures it", ["domain"])
        self.domains: dict[str, tuple] = {}  # label -> (drafts, tokens, tested, per position)
        self.eval_alpha = self._gauge("eval_alpha", "the bundle's eval alpha per domain "
                                      "(draftkit.json): the figure served alpha is held to",
                                      ["domain"])

    def _drafts(self) -> None:
        """Which draft serves, and what each one did: a swap splits the figures."""
        self.draft_info = self._gauge("draft_info", "1 for the draft serving now (by its "
                                      "identity), 0 for the drafts it replaced", ["draft"])
        self.by_draft = self._counter("request_success_by_draft", "finished requests by the "
                                      "draft they decoded with and finish reason",
                                      ["draft", "finished_reason"])
        self.accepted_pos_by_draft = self._counter(
            "spec_decode_num_accepted_tokens_per_pos_by_draft", "accepted drafted tokens per "
            "draft position, by the draft that drafted them", ["draft", "position"])
        self.drafts_by_draft = self._counter("spec_decode_num_drafts_by_draft", "rows times "
                                             "speculative rounds, by draft", ["draft"])
        self.draft: str | None = None  # the identity serving now

    def _counter(self, name: str, doc: str, extra=()):
        from prometheus_client import Counter  # optional extra: serve

        c = Counter(f"draftkit:{name}", doc, list(self.label) + list(extra),
                    registry=self.registry)
        return c if extra else c.labels(**self.label)

    def _gauge(self, name: str, doc: str, extra=()):
        from prometheus_client import Gauge  # optional extra: serve

        g = Gauge(f"draftkit:{name}", doc, list(self.label) + list(extra),
                  registry=self.registry)
        return g if extra else g.labels(**self.label)

    def _histogram(self, name: str, doc: str):
        from prometheus_client import Histogram  # optional extra: serve

        return Histogram(f"draftkit:{name}", doc, list(self.label), buckets=LATENCY_BUCKETS,
                         registry=self.registry).labels(**self.label)

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

    def finished(self, reason: str, draft: str | None = None) -> None:
        """A request finished; ``draft``: the identity it decoded with (None: it never ran)."""
        self.success.labels(finished_reason=reason, **self.label).inc()
        if draft is not None:
            self.by_draft.labels(draft=draft, finished_reason=reason, **self.label).inc()

    def serving_draft(self, draft: str) -> None:
        """``draft`` (an identity) serves from now on; the one before it reads 0."""
        if self.draft is not None:
            self.draft_info.labels(draft=self.draft, **self.label).set(0)
        self.draft_info.labels(draft=draft, **self.label).set(1)
        self.draft = draft

    def request_rounds(self, rounds: list[list[int]]) -> None:
        """A finished request's rounds into the whole server's speculation counters, where an
        engine reports them per request, not per round (vLLM behind the front)."""
        drafted, passed = _passed(rounds)
        if not drafted:
            return
        self.drafts.inc(len(drafted))
        self.draft_tokens.inc(sum(k for k, _ in drafted))
        self.accepted.inc(sum(passed))
        self.open_positions(len(passed))
        for counter, n in zip(self.accepted_at, passed):
            counter.inc(n)

    def domain_rounds(self, domain: str, rounds: list[list[int]],
                      draft: str | None = None) -> None:
        """A finished request's rounds ([K, accepted] each; K 0: a plain step) under its
        domain label (already cleaned), and under ``draft``, the identity it decoded with."""
        domain, (drafts, tokens, tested, at) = self._domain(domain)
        drafted, passed = _passed(rounds)
        if not drafted:
            return
        tested.inc(sum(min(n + 1, k) for k, n in drafted))
        if draft is not None:
            self.drafts_by_draft.labels(draft=draft, **self.label).inc(len(drafted))
            for i, n in enumerate(passed):
                self.accepted_pos_by_draft.labels(draft=draft, position=str(i),
                                                  **self.label).inc(n)
        drafts.inc(len(drafted))
        tokens.inc(sum(k for k, _ in drafted))
        for i, n in enumerate(passed):
            while len(at) <= i:  # a K above open_positions' (a caller driving K itself)
                at.append(self.accepted_pos_by_domain.labels(domain=domain, position=str(
                    len(at)), **self.label))
            at[i].inc(n)

    def _domain(self, domain: str) -> tuple[str, tuple]:
        """(the label counted, its children), made at zero for positions 0..K-1 the first time
        it is seen; past MAX_DOMAINS labels, OTHER's."""
        if domain not in self.domains and len(self.domains) >= MAX_DOMAINS:
            domain = OTHER
        if domain not in self.domains:
            labels = dict(domain=domain, **self.label)
            self.domains[domain] = (
                self.drafts_by_domain.labels(**labels),
                self.draft_tokens_by_domain.labels(**labels),
                self.tested_by_domain.labels(**labels),
                [self.accepted_pos_by_domain.labels(position=str(i), **labels)
                 for i in range(len(self.accepted_at))])
        return domain, self.domains[domain]

    def eval_figures(self, domains: dict) -> None:
        """The bundle's eval alpha per domain (its manifest's ``domains``), for the drift alert
        (serve/alerts.yml) to hold served alpha to."""
        for name, entry in domains.items():
            if entry.alpha is not None:
                self.eval_alpha.labels(domain=name, **self.label).set(entry.alpha)

    def not_recorded(self, reason: str) -> None:
        self.unrecorded.labels(reason=reason, **self.label).inc()

    def uncounted_record(self, reason: str) -> None:
        self.uncounted.labels(reason=reason, **self.label).inc()

    def reject(self, status: int) -> None:
        self.rejected.labels(status=str(status), **self.label).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # optional extra: serve

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _passed(rounds: list[list[int]]) -> tuple[list[tuple[int, int]], list[int]]:
    """(the rounds that drafted, as (K, accepted); how many of them accepted position i)."""
    drafted = [(k, n) for k, n in rounds if k]
    passed = [0] * max((k for k, _ in drafted), default=0)
    for _, n in drafted:
        for i in range(n):
            passed[i] += 1
    return drafted, passed
