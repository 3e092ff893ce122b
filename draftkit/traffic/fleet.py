"""``draftkit traffic --prometheus URL``: a running vLLM fleet's own speculation counters, read from
Prometheus, beside the bundle's eval.

vLLM's servers count, whoever is in front of them: ``vllm:spec_decode_num_drafts`` (verify
steps that drafted), ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
``..._num_accepted_tokens_per_pos{position}`` (steps whose first position+1 drafts were all
kept). Summed over the fleet (every server Prometheus scrapes, narrowed by ``--selector``) and
over ``--window`` (``increase``; none: since each server started), they give:

- tau = 1 + accepted / drafts (vLLM's mean acceptance length);
- vLLM's acceptance rate accepted / draft tokens (not alpha: a step stops testing at its first
  rejection);
- r_i = accepted at position i / drafts, and the conditional alpha_i = r_i / r_(i-1);
- alpha as draftkit measures it, accepted / tested, tested being the positions steps reached
  (position 1 always, position i+1 where position i was kept).

These are token-weighted fleet totals with no per-request units, so no interval: the recorded
traffic (``draftkit traffic DIR``) is where domains and intervals come from; this is the
whole-fleet check beside it. The Prometheus HTTP API is read with the standard library.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from draftkit.errors import DraftkitError
from draftkit.evaluate.render import fmt
from draftkit.records import Record

PREFIX = "vllm:spec_decode_"
COUNTERS = {"drafts": "num_drafts_total", "draft_tokens": "num_draft_tokens_total",
            "accepted": "num_accepted_tokens_total"}
PER_POS = "num_accepted_tokens_per_pos_total"
F3 = "{:.3f}"


@dataclass(kw_only=True)
class FleetFigures(Record):
    """What a fleet's counters say over the window."""

    url: str
    window: str | None  # a PromQL range ("1h"), None: the counters' totals
    selector: str  # the label matchers applied, "" for none
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: list[float] = field(default_factory=list)
    tau: float | None = None
    acceptance_rate: float | None = None
    alpha: float | None = None
    alpha_per_position: list[float | None] = field(default_factory=list)


def query(url: str, promql: str, timeout: float = 30.0) -> list[dict]:
    """The result vector of an instant query; one DraftkitError line where Prometheus cannot
    be reached or refuses it."""
    address = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as e:
        try:
            why = json.load(e).get("error", e.reason)
        except ValueError:
            why = e.reason
        raise DraftkitError(f"Prometheus at {url} refused the query {promql!r}: {why}") \
            from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DraftkitError(f"Prometheus at {url} does not answer its query API "
                            f"({type(e).__name__}); give --prometheus the base URL of a "
                            f"Prometheus server, e.g. http://prometheus:9090") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        raise DraftkitError(f"Prometheus at {url} answered the query {promql!r} without a "
                            f"result: {str(body)[:200]}")
    result = body.get("data", {}).get("result", [])
    return result if isinstance(result, list) else []


def _number(sample: dict) -> float:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise DraftkitError(f"Prometheus answered a sample without a number: {sample}") \
            from None


def fleet_figures(url: str, window: str | None = None, selector: str = "") -> FleetFigures:
    """Sum the fleet's counters (``selector``: PromQL label matchers, ``model_name="x"``) over
    ``window`` and derive the figures (module docstring)."""
    def series(name: str) -> str:
        metric = f"{PREFIX}{name}{{{selector}}}"
        return f"increase({metric}[{window}])" if window else metric

    totals = {}
    for key, name in COUNTERS.items():
        result = query(url, f"sum({series(name)})")
        totals[key] = _number(result[0]) if result else 0.0
    if not totals["drafts"]:
        raise DraftkitError(f"Prometheus at {url} has no speculative steps in "
                            f"vllm:spec_decode_num_drafts_total{{{selector}}}"
                            f"{f' over the last {window}' if window else ''}: is it scraping "
                            f"vLLM servers that decode with a draft?")
    per_pos: dict[int, float] = {}
    for sample in query(url, f"sum by (position) ({series(PER_POS)})"):
        position = sample.get("metric", {}).get("position")
        if isinstance(position, str) and position.isdigit():
            per_pos[int(position)] = _number(sample)
    passed = [per_pos.get(i, 0.0) for i in range(max(per_pos, default=-1) + 1)]
    drafts = totals["drafts"]
    reached = [drafts] + passed[:-1]  # steps that tested position i
    alphas = [p / r if r else None for p, r in zip(passed, reached)]
    tested = sum(reached)
    return FleetFigures(url=url, window=window, selector=selector, drafts=drafts,
                        draft_tokens=totals["draft_tokens"], accepted=totals["accepted"],
                        accepted_per_pos=passed, tau=1 + totals["accepted"] / drafts,
                        acceptance_rate=totals["accepted"] / totals["draft_tokens"]
                        if totals["draft_tokens"] else None,
                        alpha=sum(passed) / tested if tested else None,
                        alpha_per_position=alphas)


def eval_alpha(manifest) -> float | None:
    """The bundle's eval alpha for the fleet to be held to: the mean over its domains (the
    fleet's counters do not split by domain)."""
    alphas = [d.alpha for d in (manifest.domains if manifest else {}).values()
              if d.alpha is not None]
    return sum(alphas) / len(alphas) if alphas else None


def fleet_lines(fleet: FleetFigures, manifest=None) -> list[str]:
    """What ``draftkit traffic --prometheus`` prints."""
    over = f"over the last {fleet.window}" if fleet.window else "since each server started"
    where = f"{{{fleet.selector}}}" if fleet.selector else ""
    lines = [f"fleet {fleet.url} vllm:spec_decode_*{where}, {over}: {fleet.drafts:.0f} "
             f"speculative steps, {fleet.draft_tokens:.0f} drafted tokens, "
             f"{fleet.accepted:.0f} accepted",
             f"  tau {fleet.tau:.3f}; alpha {fmt(fleet.alpha, F3)} (accepted / tested positions); "
             f"vLLM's acceptance rate {fmt(fleet.acceptance_rate, F3)}",
             "  alpha_i " + " / ".join(fmt(a, F3) for a in fleet.alpha_per_position)]
    expected = eval_alpha(manifest)
    if expected is not None and fleet.alpha is not None:
        gap = fleet.alpha - expected
        lines.append(f"  the bundle's eval alpha (mean over its domains) {expected:.3f}: the "
                     f"fleet's is {gap:+.3f} from it (token-weighted totals, no interval; the "
                     f"recorded traffic's table gives domains and intervals)")
    return lines
