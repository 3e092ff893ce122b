"""Served acceptance per domain, beside the bundle's eval, with drift flagged (``draftkit
traffic``).

From the records ``draftkit serve --record`` kept (:mod:`.record`), per domain label:

- alpha_i: conditional acceptance at draft position i, accepted / tested there over every
  round (:meth:`TrafficRecord.per_position`, :func:`metrics.conditional_alphas`);
- alpha: accepted / tested over all positions, the truncation-corrected estimator
  (:func:`metrics.alpha_from_counts`): a round stops testing at its first rejection, so
  accepted / drafted would read low;
- tau: completion tokens per target call over the decoding rounds, the token the prefill
  emits left out (as :attr:`draftkit.decode.state.Result.tau`), pooled over requests as
  :meth:`DecodeStats.tau` pools rows. A completion cut at a stop string lost the tokens after
  it, so tau reads a little low on such requests;
- predicted speedup: what the cost model (:func:`metrics.speedup`: Leviathan et al., arXiv
  2211.17192, Theorem 3.8, with v = 1 as the manifest keeps no v) predicts from the served
  alpha_i at the K of each round, with c from the bundle's eval.

A request's acceptance is the serving engine's own per-step counts, or, where it reported none
(``rounds`` None), a replay of its completion through the bundle's draft
(:mod:`draftkit.traffic.replay`, which ``draftkit traffic --bundle`` runs); each domain says
how many requests each source gave (``counts``), and a request with neither is left out of the
figures. Each comes with a 95% percentile bootstrap over requests (:func:`metrics.bootstrap`): the
rounds of one request share its prompt and its sampling, so they are not independent trials;
requests are.

The flag (:func:`drift_status`): a domain drifted when the upper end of its served alpha's
interval lies below the bundle's eval alpha for that domain; a domain the eval did not measure
(traffic nobody trained or tested the draft for) is held to the mean of the eval's domains,
what the bundle promises on average. The manifest keeps the eval's
point estimate and no interval for it, so the served interval is the only noise there is to
measure: a served rate whose whole interval sits under the eval's is lower for any luck in
which requests came. The eval's own noise is not counted, so after a small eval a flag may be
the eval's luck; the report prints both figures. The manifest keeps no alpha_1, so the flag
reads alpha. A domain with fewer requests than ``min_requests`` is reported as too few to
tell, not flagged: a percentile bootstrap over a handful of requests is too narrow to trust.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from draftkit import metrics
from draftkit.manifest import DomainEntry, Manifest
from draftkit.records import Record, added_later
from draftkit.traffic.args import MIN_REQUESTS
from draftkit.traffic.record import ENGINE, REPLAY, Counts, TrafficRecord, engine_counts
from draftkit.traffic.shards import Integrity

LEVEL = 0.95
RESAMPLES = 1000  # metrics.bootstrap draws in Python: 1 s a figure over 10,000 requests

# a domain's status; only DRIFT is a flag
DRIFT, OK, ABOVE = "drift", "ok", "above eval"
TOO_FEW, NO_EVAL, NOTHING_DRAFTED = "too few requests", "no eval figure", "nothing drafted"
UNCOUNTED = "none"  # a request without acceptance counts (and nothing to replay it with)
OTHER_RULE = "other draft rule"  # served under another acceptance rule than the eval measured
RULE = ("drift: the served alpha's 95% interval (a bootstrap over requests) lies wholly below "
        "the bundle's eval alpha for the domain (for a domain its eval did not measure: the "
        "mean over the eval's domains); domains with fewer than {m} requests are too few to "
        "tell and are not flagged")


@dataclass(kw_only=True)
class Estimate(Record):
    """A figure over a domain's requests and its 95% bootstrap interval over them."""

    value: float
    low: float
    high: float


@dataclass(kw_only=True)
class DomainDrift(Record):
    """One domain's served figures beside its eval's."""

    requests: int
    counts: dict[str, int]  # requests by where their acceptance came from: engine, replay,
    # none (no counts and nothing to replay them with: left out of every figure below)
    completion_tokens: int
    rounds: int  # decoding rounds (target calls after the prefill), K = 0 rounds included
    rounds_by_k: dict[str, int]
    tested_per_position: list[float]  # expected counts where a sampled replay gave them
    alpha_per_position: list[float]  # served conditional alpha_i
    alpha_1: Estimate | None  # None: no round drafted a token
    alpha: Estimate | None
    tau: Estimate | None  # None: no request with counts
    c: float | None  # the bundle's draft / target cost ratio this prediction used
    c_source: str | None  # "domain": the eval's for this domain; "bundle": mean over its domains
    speedup_predicted: Estimate | None  # None: no c (no bundle, or no c in it)
    temperatures: list[float]  # the sampling temperatures served
    # how the engine chose drafts for the sampled requests (SamplingEntry.draft_sample_method;
    # "unknown": a server the front did not start)
    draft_sample_methods: list[str] = field(default_factory=list)
    eval: DomainEntry | None  # the bundle's eval figures for this domain
    status: str  # drift, ok, above eval, too few requests, no eval figure, nothing drafted, ""
    why: str


@dataclass(kw_only=True)
class TrafficReport(Record):
    """``draftkit traffic``'s report.json."""

    folder: str
    bundle: str | None
    target: str  # the identities the traffic was recorded under
    tokenizer: str
    requests: int
    first: str  # when the first and the last request finished
    last: str
    level: float
    min_requests: int
    rule: str
    eval_temperature: float | None  # the bundle's eval's
    eval_draft_sample_method: str | None = None  # how its eval's draft chose tokens (sampled)
    domains: dict[str, DomainDrift] = field(default_factory=dict)
    overall: DomainDrift
    notes: list[str] = field(default_factory=list)
    integrity: Integrity | None = added_later()  # what reading the folder verified, left out
    folded: list[str] | None = added_later()  # labels the table folds into one row ...
    other: DomainDrift | None = added_later()  # ... their requests together (no status)
    created: str

    def flagged(self) -> list[str]:
        return [name for name, d in self.domains.items() if d.status == DRIFT]


# --- estimators --------------------------------------------------------------------------------

def predicted_speedup(alphas: Sequence[float], c: float, rounds_by_k: dict[int, int]) -> float:
    """The speedup :func:`metrics.speedup` predicts for the rounds served, K by K: a round at
    K yields tau(K) tokens in tau(K) / S(K) target steps, so the mix is the tokens summed over
    the time summed (one K: S(K) itself; a K = 0 round, one token in one step)."""
    tokens = steps = 0.0
    for k, n in rounds_by_k.items():
        t = metrics.tau(alphas, k)
        tokens += n * t
        steps += n * t / metrics.speedup(alphas, c, k)
    return tokens / steps if steps else 1.0


class _Counts:
    """One domain's per-request counts (:class:`~draftkit.traffic.record.Counts`: the
    engine's or a replay's), as arrays a bootstrap resample sums over."""

    def __init__(self, records: list[TrafficRecord], counts: list[Counts]):
        self.k_max = max((len(c.tested) for c in counts), default=0)
        shape = (len(counts), self.k_max)
        self.accepted, self.tested = np.zeros(shape), np.zeros(shape)  # (n, K_max) each
        for i, c in enumerate(counts):
            self.accepted[i, :len(c.accepted)] = c.accepted
            self.tested[i, :len(c.tested)] = c.tested
        # tokens of the decoding rounds: the prefill's first token is not theirs
        self.decoded = np.array([max(len(r.completion_ids) - 1, 0) for r in records])  # (n,)
        self.rounds = np.array([len(c.rounds) for c in counts], dtype=np.int64)  # (n,)
        self.by_k = np.zeros((len(counts), self.k_max + 1), dtype=np.int64)  # (n, K_max + 1)
        for i, c in enumerate(counts):
            for k, _ in c.rounds:
                self.by_k[i, k] += 1

    def alphas(self, idx) -> list[float]:
        return metrics.conditional_alphas(self.accepted[idx].sum(0).tolist(),
                                          self.tested[idx].sum(0).tolist())

    def alpha(self, idx) -> float:
        accepted, tested = float(self.accepted[idx].sum()), float(self.tested[idx].sum())
        return metrics.alpha_from_counts(accepted, tested - accepted)

    def alpha_1(self, idx) -> float:
        accepted, tested = float(self.accepted[idx, 0].sum()), float(self.tested[idx, 0].sum())
        return metrics.alpha_from_counts(accepted, tested - accepted)

    def tau(self, idx) -> float:
        rounds = int(self.rounds[idx].sum())  # no round at all: one token per call, tau 1
        return int(self.decoded[idx].sum()) / rounds if rounds else 1.0

    def speedup(self, idx, c: float) -> float:
        by_k = {k: int(n) for k, n in enumerate(self.by_k[idx].sum(0)) if n}
        return predicted_speedup(self.alphas(idx), c, by_k)


def _estimate(statistic, n: int, resamples: int, seed: int) -> Estimate:
    value, low, high = metrics.bootstrap(lambda idx: statistic(np.asarray(idx)), n, resamples,
                                         LEVEL, seed)
    return Estimate(value=value, low=low, high=high)


def domain_drift(records: list[TrafficRecord], counts: list[Counts | None] | None = None, *,
                 eval_entry: DomainEntry | None = None, c: float | None = None,
                 c_source: str | None = None, min_requests: int = MIN_REQUESTS,
                 compare: bool = True, fallback_alpha: float | None = None,
                 eval_rule: str | None = None, resamples: int = RESAMPLES,
                 seed: int = 0) -> DomainDrift:
    """One domain's served figures (its ``records``, at least one) beside ``eval_entry``, with
    the predicted speedup where ``c`` is known and a status unless ``compare`` is False;
    ``counts``: each record's acceptance (default: the engine's; None for a record that has
    none, left out of the figures); ``fallback_alpha``: what a domain the eval did not measure
    is held to; ``eval_rule``: how the eval's draft chose tokens, where it sampled
    (:func:`same_rule`)."""
    counts = [engine_counts(r) for r in records] if counts is None else counts
    sources = Counter(c.source if c is not None else UNCOUNTED for c in counts)
    kept = [(r, x) for r, x in zip(records, counts) if x is not None]
    counted = _Counts([r for r, _ in kept], [x for _, x in kept])
    n = len(kept)
    drafted = counted.k_max > 0 and float(counted.tested[:, 0].sum()) > 0
    alpha_1 = _estimate(counted.alpha_1, n, resamples, seed) if drafted else None
    alpha = _estimate(counted.alpha, n, resamples, seed) if drafted else None
    speedup = None if c is None or not n else _estimate(
        lambda idx: counted.speedup(idx, c), n, resamples, seed)
    if eval_entry is not None and eval_entry.alpha is not None:
        reference, source = eval_entry.alpha, "the eval's"
    else:
        reference, source = fallback_alpha, "the bundle's mean eval alpha (none for this domain)"
    status, why = drift_status(n, alpha, reference, min_requests, source) if compare else \
        ("", "")
    methods = sorted({r.sampling.draft_sample_method or "unknown" for r in records
                      if r.sampling.temperature > 0})
    status, why = same_rule(status, why, methods, eval_rule)
    if not n and compare:
        status, why = UNCOUNTED, (f"no request carries acceptance counts ({len(records)} "
                                  f"without); pass --bundle to replay them through its draft")
    everyone = slice(None)
    return DomainDrift(
        requests=len(records), counts={s: sources[s] for s in (ENGINE, REPLAY, UNCOUNTED)
                                       if sources[s]},
        completion_tokens=sum(len(r.completion_ids) for r in records),
        rounds=int(counted.rounds.sum()),
        rounds_by_k={str(k): int(m) for k, m in enumerate(counted.by_k.sum(0)) if m},
        tested_per_position=[round(float(t), 3) for t in counted.tested.sum(0)],
        alpha_per_position=counted.alphas(everyone), alpha_1=alpha_1, alpha=alpha,
        tau=_estimate(counted.tau, n, resamples, seed) if n else None, c=c, c_source=c_source,
        speedup_predicted=speedup,
        temperatures=sorted({r.sampling.temperature for r in records}), eval=eval_entry,
        draft_sample_methods=methods, status=status, why=why)


def drift_status(requests: int, alpha: Estimate | None, reference: float | None,
                 min_requests: int, source: str = "the eval's") -> tuple[str, str]:
    """(status, why in one sentence) by the module's rule: drift (the served interval wholly
    below ``reference``, the eval's alpha, named by ``source``), ok (it holds it), above eval
    (wholly above: no flag, but the eval suite undersells this traffic), or why there is no
    comparison."""
    if alpha is None:
        return NOTHING_DRAFTED, "no round drafted a token (plain decoding): no acceptance"
    if reference is None:
        return NO_EVAL, "the bundle's eval has no alpha to compare with"
    if requests < min_requests:
        return TOO_FEW, (f"{requests} request(s), fewer than {min_requests}: too few to tell "
                         f"drift from chance")
    served = f"served alpha {alpha.value:.3f} (95% {alpha.low:.3f}-{alpha.high:.3f})"
    if alpha.high < reference:
        return DRIFT, f"{served} lies below {source} {reference:.3f}"
    if alpha.low > reference:
        return ABOVE, f"{served} lies above {source} {reference:.3f}"
    return OK, f"{served} includes {source} {reference:.3f}"


def same_rule(status: str, why: str, methods: list[str],
              eval_rule: str | None) -> tuple[str, str]:
    """(status, why), withheld where a domain's sampled requests were served under another
    acceptance rule (``methods``, as :class:`DomainDrift` keeps them) than the eval measured
    (vLLM's greedy drafting against draftkit's sampled drafts, or the reverse): the two alphas
    then differ by the rule, not by drift."""
    served = [m for m in methods if m != "unknown"]
    if eval_rule is None or not served or served == [eval_rule] or \
            status not in (DRIFT, OK, ABOVE):
        return status, why
    rule = served[0] if len(served) == 1 else "mixed"
    return OTHER_RULE, (
        f"served with {' and '.join(served)} drafts, the eval measured {eval_rule} drafts: "
        f"their alphas differ by the acceptance rule, not by drift; evaluate with `draftkit "
        f"eval --draft-sample-method {rule}` and export with that report to compare like with "
        f"like")


def bundle_alpha(manifest: Manifest) -> float | None:
    """What the bundle promises a domain its eval did not measure: the mean of its domains'
    alpha; None where no domain has one."""
    alphas = [d.alpha for d in manifest.domains.values() if d.alpha is not None]
    return sum(alphas) / len(alphas) if alphas else None


def bundle_c(manifest: Manifest) -> float | None:
    """The bundle's overall c: the mean of its domains' (one draft and one target on one
    device, so c barely moves between domains); None where no domain has one."""
    cs = [d.c for d in manifest.domains.values() if d.c is not None]
    return sum(cs) / len(cs) if cs else None


# --- the report --------------------------------------------------------------------------------

def traffic_drift(records: list[TrafficRecord], manifest: Manifest | None = None,
                  counts: list[Counts | None] | None = None, *, folder: str = "",
                  bundle: str | None = None, draft: str | None = None,
                  min_requests: int = MIN_REQUESTS, resamples: int = RESAMPLES,
                  replay_k: int | None = None, created: str = "") -> TrafficReport:
    """The report over ``records`` (at least one, as :func:`read_traffic` gives them), each
    domain beside ``manifest``'s figures; ``draft``: the bundle's draft identity, to say when
    the traffic was served by another; ``counts``: each record's acceptance (as
    :func:`domain_drift` takes them); ``replay_k``: the K the replayed ones were drafted at."""
    counts = [engine_counts(r) for r in records] if counts is None else counts
    by_domain: dict[str, tuple[list[TrafficRecord], list[Counts | None]]] = {}
    for r, x in zip(records, counts):
        rs, xs = by_domain.setdefault(r.domain, ([], []))
        rs.append(r)
        xs.append(x)
    overall_c = bundle_c(manifest) if manifest else None
    fallback = bundle_alpha(manifest) if manifest else None
    eval_temperature = manifest.report.temperature if manifest and manifest.report else None
    eval_rule = (manifest.report.draft_sample_method or "probabilistic") \
        if eval_temperature else None
    domains = {}
    for name, (rs, xs) in sorted(by_domain.items()):
        entry = manifest.domains.get(name) if manifest else None
        c, source = (entry.c, "domain") if entry and entry.c is not None else \
            (overall_c, "bundle" if overall_c is not None else None)
        domains[name] = domain_drift(rs, xs, eval_entry=entry, c=c, c_source=source,
                                     min_requests=min_requests, fallback_alpha=fallback,
                                     eval_rule=eval_rule, resamples=resamples)
    overall = domain_drift(records, counts, c=overall_c,
                           c_source=None if overall_c is None else "bundle",
                           compare=False, resamples=resamples)
    return TrafficReport(
        folder=folder, bundle=bundle, target=records[0].target, tokenizer=records[0].tokenizer,
        requests=len(records), first=records[0].time, last=records[-1].time, level=LEVEL,
        min_requests=min_requests, rule=RULE.format(m=min_requests),
        eval_temperature=eval_temperature, eval_draft_sample_method=eval_rule,
        domains=domains, overall=overall,
        notes=_notes(records, counts, manifest, domains, overall_c, draft, replay_k),
        created=created)


def _notes(records: list[TrafficRecord], counts: list[Counts | None],
           manifest: Manifest | None, domains: dict[str, DomainDrift], overall_c: float | None,
           draft: str | None, replay_k: int | None) -> list[str]:
    """What a reader should know before trusting the comparison."""
    uncounted = sum(x is None for x in counts)
    notes = [f"{uncounted} of {len(records)} requests carry no acceptance counts from the "
             f"engine (n > 1, a vLLM server without --per-request-spec-decode-metrics "
             f"detailed, or imported logs) and are left out of the figures; --bundle replays "
             f"them through its draft"] if uncounted else []
    promptless = sum(r.prompt_ids is None for r in records)
    if promptless:
        notes.append(f"{promptless} of {len(records)} requests were recorded without their "
                     f"prompt (--no-record-prompts): their figures are the engine's counts "
                     f"alone; they cannot be replayed (a replay needs the prompt: "
                     f"{sum(x is None for r, x in zip(records, counts) if r.prompt_ids is None)} "
                     f"without counts are left out) nor trained on by `draftkit refresh`")
    replayed = sum(x is not None and x.source == REPLAY for x in counts)
    if replayed:
        notes.append(f"{replayed} of {len(records)} requests' acceptance comes from replaying "
                     f"their completion through the bundle's draft at K = {replay_k}, "
                     f"teacher-forced, under draftkit's lossless rule (greedy: the exact "
                     f"rounds; sampled: the expected acceptance); the 'acceptance from' column "
                     f"says which figures are the engine's")
    if manifest is None:
        return notes + ["no bundle: no eval figures to compare and no c, so no predicted "
                        "speedup; pass --bundle BUNDLE (the one that served this traffic)"]
    if not manifest.domains:
        notes.append("the bundle records no eval figures (exported without --report): "
                     "nothing to compare")
    elif overall_c is None:
        notes.append("the bundle's eval measured no c: no predicted speedup")
    unserved = sorted(set(manifest.domains) - set(domains))
    if unserved:
        notes.append(f"eval domains with no served request: {', '.join(unserved)}")
    t = manifest.report.temperature if manifest.report else None
    other = {name: d.temperatures for name, d in domains.items() if d.temperatures != [t]}
    if t is not None and other:
        served = "; ".join(f"{name} at {', '.join(f'{x:g}' for x in ts)}"
                           for name, ts in other.items())
        notes.append(f"served at another temperature than the eval's {t:g} ({served}): "
                     f"acceptance moves with temperature, so a gap there may be that, not drift")
    # a replay's acceptance is the bundle's draft's, whoever served the request
    drafts = Counter(r.draft for r, x in zip(records, counts) if x is not None and
                     x.source == ENGINE)
    other = sum(n for d, n in drafts.items() if d != draft)
    if draft is not None and other:
        notes.append(f"{other} of {len(records)} requests were served by another draft than "
                     f"this bundle's ({', '.join(sorted(str(d) for d in drafts if d != draft))}"
                     f"): their acceptance is that draft's")
    return notes
