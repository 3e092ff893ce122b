"""Crossovers of the regime map: where a measured curve crosses speedup 1.0, where alpha fitted
against the target's entropy reaches the break-even alpha, and how each reads in words.

Pure functions of measured figures; the crossover itself is :func:`draftkit.metrics.crossover`.
"""

from __future__ import annotations

import statistics

from draftkit import metrics
from draftkit.figures import Crossover, EntropyFit, PointFigures


def crossing(xs, ys, level: float = 1.0, log_x: bool = False) -> Crossover:
    kind, x = metrics.crossover(xs, ys, level, log_x)
    return Crossover(kind=kind, x=x)


def describe(cross: Crossover, var: str, what: str = "speedup", level: str = "1.0") -> str:
    """A crossover in words."""
    kind, x = cross.kind, cross.x
    if kind == "crosses":
        return f"{what} falls below {level} at {var} ~ {x:.3g}"
    if kind == "rises":
        return f"{what} rises above {level} at {var} ~ {x:.3g}"
    if kind == "below":
        return f"{what} below {level} everywhere (no crossover inside the range)"
    if kind == "above":
        return f"{what} at or above {level} everywhere (no crossover inside the range)"
    return "not measured"


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope), or None with fewer than two distinct x."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def entropy_crossover(points: list[PointFigures], alpha_be: float | None) -> EntropyFit:
    """The target entropy at which alpha, fitted linearly against it over the prompts, falls to
    the break-even alpha: the model's crossover in entropy (it may lie outside the measured
    range; ``inside`` says whether it does)."""
    pts = [(p.target_entropy, p.alpha) for p in points
           if p.target_entropy is not None and p.alpha is not None]
    fit = linear_fit([h for h, _ in pts], [a for _, a in pts])
    out = EntropyFit(intercept=None, slope=None, alpha_break_even=alpha_be, entropy=None,
                     inside=False)
    if fit is None:
        return out
    out.intercept, out.slope = fit
    if alpha_be is not None and fit[1] < 0:
        h = (alpha_be - fit[0]) / fit[1]
        out.entropy = h
        out.inside = min(p[0] for p in pts) <= h <= max(p[0] for p in pts)
    return out


def entropy_model_text(fit: EntropyFit) -> str:
    be = fit.alpha_break_even
    if be is None:
        return "no K pays at this c and v whatever alpha is"
    if fit.slope is None:
        return "too few prompts to fit alpha against entropy"
    if fit.slope >= 0:
        return (f"alpha does not fall with entropy over these prompts (slope "
                f"{fit.slope:+.3f}/nat); it needs {be:.2f} to break even")
    h = fit.entropy
    if h <= 0:
        return (f"alpha fitted against entropy ({fit.intercept:.2f} {fit.slope:+.3f}/nat) "
                f"is below the break-even {be:.2f} at every entropy")
    where = "" if fit.inside else " (extrapolated)"
    return (f"alpha fitted against entropy ({fit.intercept:.2f} {fit.slope:+.3f}/nat) "
            f"reaches the break-even {be:.2f} at entropy ~ {h:.2f} nats{where}")
