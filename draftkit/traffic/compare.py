"""Two drafts of one target on the same served requests, side by side: is the new one faster?

Each held-out request is decoded three times, plainly (K = 0), with the old draft and with the
new one, at the request's own sampling settings and seed, for as many tokens as it was served.
The order of the three rotates from request to request, so the machine's drifts fall on all of
them alike. Per domain and over the whole mix, each draft's speedup over plain decoding and the
new draft's over the old come with 95% paired-bootstrap intervals over requests
(:func:`draftkit.metrics.speedup_interval`), beside alpha at the first draft position and tau.

Each speedup is given twice. Measured: tokens per wall-clock second, request by request. And
by the cost model: each request's decoding rounds priced at the drafts' measured costs, a
verify at v target steps and a draft step at c (pooled over all the drafts' decodes here,
against the plain decodes' target step: the two share one architecture), so a request's cost
is rounds x v + draft steps x c. On a quiet machine the two agree; on a shared one, a burst from
another process lands on single requests and widens the measured intervals past use, while the
pooled c and v average it out and the per-request counts (tau) do not see it at all.

The rule :func:`decide` applies, on the cost-model figures: the new draft is exported only where
it is faster than the old beyond noise on the mix (the interval of new over old lies above 1)
and no domain the old draft served well (its own interval over plain above 1) loses beyond
noise (new over old below 1). The measured figures are reported beside them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from draftkit import metrics
from draftkit.decode.choice import PLAIN, KChoice
from draftkit.decode.clock import synchronize
from draftkit.decode.sampling_params import PROBABILISTIC
from draftkit.decode.stats import DecodeStats
from draftkit.records import Record
from draftkit.traffic.record import TrafficRecord

MODES = ("plain", "old", "new")
MIX = "mix"  # every held-out request together, as served


@dataclass(kw_only=True)
class Speedup(Record):
    estimate: float
    low: float | None  # None from fewer than two requests
    high: float | None

    @classmethod
    def paired(cls, base_seconds, seconds, base_tokens, tokens) -> Speedup:
        est, low, high = metrics.speedup_interval(base_seconds, seconds, base_tokens, tokens)
        return cls(estimate=est, low=low, high=high) if len(seconds) > 1 else \
            cls(estimate=est, low=None, high=None)

    @property
    def above(self) -> bool:
        return self.low is not None and self.low > 1.0

    @property
    def below(self) -> bool:
        return self.high is not None and self.high < 1.0

    def text(self) -> str:
        band = "" if self.low is None else f" ({self.low:.2f}-{self.high:.2f})"
        return f"{self.estimate:.2f}x{band}"


@dataclass(kw_only=True)
class DomainComparison(Record):
    domain: str
    requests: int
    alpha_1: dict[str, float | None]  # old / new: acceptance at the first draft position
    tau: dict[str, float | None]
    over_plain: dict[str, Speedup]  # old / new, by the cost model (module docstring)
    new_over_old: Speedup
    measured_over_plain: dict[str, Speedup]  # wall clock
    measured_new_over_old: Speedup


@dataclass
class _Times:
    """Per mode, one entry per request: wall-clock seconds, new tokens, decoding rounds (target
    calls after the prefill) and draft steps."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    tokens: dict[str, list[int]] = field(default_factory=lambda: {m: [] for m in MODES})
    rounds: dict[str, list[int]] = field(default_factory=lambda: {m: [] for m in MODES})
    draft_steps: dict[str, list[int]] = field(default_factory=lambda: {m: [] for m in MODES})
    stats: dict[str, DecodeStats] = field(default_factory=lambda: {m: DecodeStats()
                                                                   for m in MODES})

    def add(self, other: _Times) -> None:
        for m in MODES:
            for name in ("seconds", "tokens", "rounds", "draft_steps"):
                getattr(self, name)[m] += getattr(other, name)[m]

    def costs(self, mode: str, c: float, v: float) -> list[float]:
        """Each request's decoding rounds priced in target steps (module docstring)."""
        return [r * (1.0 if mode == "plain" else v) + d * c
                for r, d in zip(self.rounds[mode], self.draft_steps[mode])]

    def comparison(self, domain: str, stats: dict[str, DecodeStats],
                   prices: dict[str, tuple[float, float]]) -> DomainComparison:
        costs = {m: self.costs(m, *prices[m]) for m in MODES}
        decoded = {m: [max(n - 1, 0) for n in self.tokens[m]] for m in MODES}  # prefill's out

        def modelled(base: str, mode: str) -> Speedup:
            return Speedup.paired(costs[base], costs[mode], decoded[base], decoded[mode])

        def measured(base: str, mode: str) -> Speedup:
            return Speedup.paired(self.seconds[base], self.seconds[mode], self.tokens[base],
                                  self.tokens[mode])

        def alpha_1(s: DecodeStats) -> float | None:
            alphas = s.alphas()
            return alphas[0] if alphas else None

        return DomainComparison(
            domain=domain, requests=len(self.seconds["plain"]),
            alpha_1={m: alpha_1(stats[m]) for m in ("old", "new")},
            tau={m: stats[m].tau() if stats[m].rounds else None for m in ("old", "new")},
            over_plain={m: modelled("plain", m) for m in ("old", "new")},
            new_over_old=modelled("old", "new"),
            measured_over_plain={m: measured("plain", m) for m in ("old", "new")},
            measured_new_over_old=measured("old", "new"))


def prices(stats: dict[str, DecodeStats], k: int) -> dict[str, tuple[float, float]]:
    """(c, v) per mode: what a draft step and a verify of K + 1 tokens cost in target steps
    (plain: (0, 1)). The two drafts share one architecture (a refresh starts the new one from
    the old), so one price, pooled over both drafts' decodes against the plain decodes' target
    step, serves both: new over old then rests on counts alone."""
    step = stats["plain"].target_step_seconds(1)
    both = DecodeStats()
    both.merge(stats["old"])
    both.merge(stats["new"])
    price = (both.c(step) or 0.0, both.v(k, step) or 1.0)
    return {"plain": (0.0, 1.0), "old": price, "new": price}


def measure(engines: dict[str, object], requests: list[TrafficRecord], k: int,
            max_new_tokens: int, progress: bool = True) -> list[DomainComparison]:
    """Per domain, then the whole mix (:data:`MIX`), last. ``engines``: a
    :class:`~draftkit.decode.engine.SpeculativeEngine` per draft, "old" and "new", on one
    target; plain decoding runs on the old one at K = 0. ``k``: the fixed K both drafts run."""
    choices = {"plain": PLAIN, **{m: KChoice.of(k, k, has_draft=True) for m in ("old", "new")}}
    by_domain: dict[str, _Times] = {}
    stats = {m: DecodeStats() for m in MODES}
    with tqdm(total=len(requests) * len(MODES), desc="old vs new draft", unit="decode",
              disable=not progress) as bar:
        for i, rec in enumerate(requests):
            times = by_domain.setdefault(rec.domain, _Times())
            turn = MODES[i % 3:] + MODES[:i % 3]  # rotate which goes first
            for mode in turn:
                engine = engines["old" if mode == "plain" else mode]
                secs, n, one = _decode(engine, rec, choices[mode], max_new_tokens,
                                       [times.stats[mode], stats[mode]], i)
                times.seconds[mode].append(secs)
                times.tokens[mode].append(n)
                times.rounds[mode].append(max(one.target_calls - 1, 0))
                times.draft_steps[mode].append(one.draft_steps)
                bar.update(1)
    priced = prices(stats, k)
    rows = [t.comparison(d, t.stats, priced) for d, t in by_domain.items()]
    mix = _Times()
    for t in by_domain.values():
        mix.add(t)
    return rows + [mix.comparison(MIX, stats, priced)]


def _decode(engine, rec: TrafficRecord, k: KChoice, max_new_tokens: int,
            into: list[DecodeStats], index: int) -> tuple[float, int, DecodeStats]:
    """One timed decode of ``rec``'s prompt: (seconds, new tokens, its stats); its counts go to
    every stats of ``into`` too."""
    s = rec.sampling
    n = max(1, min(len(rec.completion_ids), max_new_tokens))
    one = DecodeStats()
    synchronize(engine.device)
    start = time.perf_counter()
    # the request's own settings, the way its engine chose drafts included (vLLM's greedy
    # drafting accepts otherwise than sampled drafts: the comparison is under the served rule)
    (res,) = engine.generate([rec.prompt_ids], k=k, max_new_tokens=n,
                             temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                             seed=s.seed if s.seed is not None else index, stats=one,
                             draft_sample_method=s.draft_sample_method or PROBABILISTIC)
    synchronize(engine.device)
    secs = time.perf_counter() - start
    for stats in into:
        stats.merge(one)
    return secs, len(res.tokens), one


def decide(rows: list[DomainComparison]) -> tuple[bool, str]:
    """(export the new draft?, why), by the rule in the module's docstring."""
    mix = next(r for r in rows if r.domain == MIX)
    if mix.new_over_old.low is None:
        return False, "too few held-out requests to tell the drafts apart; record more traffic"
    lost = [r.domain for r in rows if r.domain != MIX and r.over_plain["old"].above
            and r.new_over_old.below]
    if lost:
        return False, (f"the new draft is slower than the old beyond noise on {', '.join(lost)}, "
                       f"where the old one paid")
    if not mix.new_over_old.above:
        return False, (f"the new draft is not faster than the old beyond noise on the traffic "
                       f"mix ({mix.new_over_old.text()} of the old draft's speed)")
    return True, f"the new draft is {mix.new_over_old.text()} as fast as the old on the mix"


def table(rows: list[DomainComparison]) -> str:
    """The comparison as a markdown table: cost-model speedups, the measured ones beside."""
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    lines = ["| domain | requests | alpha_1 old | alpha_1 new | tau old | tau new | old vs plain "
             "| new vs plain | new vs old | measured: old vs plain | new vs plain | new vs old |",
             "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r.domain} | {r.requests} | {f(r.alpha_1['old'])} | "
                     f"{f(r.alpha_1['new'])} | {f(r.tau['old'])} | {f(r.tau['new'])} | "
                     f"{r.over_plain['old'].text()} | {r.over_plain['new'].text()} | "
                     f"{r.new_over_old.text()} | {r.measured_over_plain['old'].text()} | "
                     f"{r.measured_over_plain['new'].text()} | {r.measured_new_over_old.text()} |")
    return "\n".join(lines)
