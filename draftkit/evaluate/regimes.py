"""``draftkit regimes``: where speculation stops paying for this target, draft and traffic.

    draftkit regimes --out runs/regimes                     # embedded target, derived drafts
    draftkit regimes --target T --draft runs/quickstart/bundle --domains code math creative
    draftkit regimes --target T --draft D --drafts-by-domain code=D_code math=D_math

Speculative decoding fails in four known ways (README.md, "How speculation pays"). Each is measured
on the user's own target, draft and prompts, always against plain decoding (K = 0) run right
next to it, prompt by prompt (:meth:`Evaluator.run_domain`):

1. entropy: alpha and speedup of the draft against the target's entropy, per prompt and per
   domain, and against the sampling temperature;
2. draft cost: alpha, c and speedup of early-exit drafts of increasing depth cut from the target
   (its first N layers, then its final norm and head), and of the given draft;
3. domain mismatch: alpha and speedup of each draft on each domain;
4. batch size: speedup against batch size per domain from measured c(B) and v(B), and the K
   the policy (``--k auto``) picks at each batch size.

K is fixed (``--k``) in every measurement so that slowdowns show instead of being hidden by the
policy falling back to K = 0. For each regime the report puts the measured crossover (where
speedup falls below 1.0, :func:`draftkit.metrics.crossover`) next to the one the speedup model
predicts from the measured alpha_i, c and v (:func:`draftkit.metrics.speedup`); the model
leaves out per-round overhead, so the gap between the two is that overhead.

Why early exits: a cut that keeps the target's last layer (``0,1,2,29``) accepts almost nothing
before it is trained (the last layer expects the residual stream of layer 28), while the first
N layers read by the final norm and head already agree with the target now and then.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftkit import metrics
from draftkit.config import option, reuse
from draftkit.decode.args import SamplingArgs, SpeculationArgs
from draftkit.decode.k import AUTO, K, parse_k
from draftkit.errors import ConfigError, DraftkitError

DEFAULT_DRAFT_LAYERS = 4  # the early exit mapped when no --draft is given (c ~ 0.2 on CPU)

# the per-prompt / per-cell figures kept in report.json (the rest of eval's row is noise here)
FIG_KEYS = ("n_prompts", "new_tokens", "alpha", "alpha_per_position", "tau", "c", "v", "k",
            "speedup_measured", "speedup_predicted", "plain_tokens_per_s", "spec_tokens_per_s",
            "target_entropy", "overhead_per_round_ms")


@dataclass
class RegimesArgs(SpeculationArgs):
    """Measure where speculation stops paying for a target and draft on your own prompts: high
    entropy, a draft too slow for its acceptance, domain mismatch and large batches."""

    target: str = option("embedded", help="target model: HF folder, bundle, hub id, 'embedded'")
    draft: str | None = option(None, help="the draft to map: HF folder, bundle, hub id (default: "
                                          f"an early exit of the target's first "
                                          f"{DEFAULT_DRAFT_LAYERS} layers)")
    suite: str = option("builtin", help="JSONL suite file or folder of them; 'builtin' = the "
                                        "shipped eval/suites")
    domains: list[str] | None = option(None, nargs="*", metavar="DOMAIN",
                                       help="only these domains (space- or comma-separated)")
    out: str = option("runs/regimes", help="output directory for the report")
    drafts_by_domain: list[str] = option([], nargs="*", metavar="DOMAIN=PATH",
                                         help="drafts distilled on one domain each, for the "
                                              "mismatch matrix (default: every draft measured, "
                                              "on every domain)")
    layer_sizes: list[int] = option([1, 2, 4, 8, 15, 24, 30], nargs="*", metavar="N",
                                    help="depths of the early-exit drafts of the draft-cost "
                                         "regime; N >= the target's depth is the target itself")
    temperatures: list[float] = option([0.0, 0.7, 1.0, 1.3], nargs="*", metavar="T",
                                       help="sampling temperatures of the entropy regime")
    batch_sizes: list[int] = option([1, 2, 4, 8, 16], nargs="*", metavar="B",
                                    help="batch sizes of the batch regime (none to skip it)")
    prompts_per_domain: int = option(2, help="prompts per domain in the entropy, cost and "
                                             "mismatch regimes (the batch regime takes as many "
                                             "as its largest batch)")
    max_new_tokens: int = option(32, help="new tokens per prompt")
    k: K = reuse(SpeculationArgs, "k", 2, note="; regimes takes a fixed K >= 1, the same in "
                 "every measurement, so that slowdowns show instead of the policy hiding them "
                 "(the batch regime also reports the K that --k auto picks)")
    seed: int = reuse(SamplingArgs, "seed")
    dtype: str = option("auto", help="auto, float32, bfloat16 or float16")
    device: str | None = option(None, help="cpu or cuda (default: cuda if available)")

    def validate(self) -> None:
        super().validate()
        if parse_k(self.k) == AUTO:
            raise ConfigError("--k must be a fixed K >= 1: regimes measures every draft at "
                              "the same K")
        for name in ("prompts_per_domain", "max_new_tokens", "k", "k_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if any(n < 1 for n in self.layer_sizes) or any(b < 1 for b in self.batch_sizes):
            raise ConfigError("--layer-sizes and --batch-sizes take positive integers")
        if any(t < 0 for t in self.temperatures):
            raise ConfigError("--temperatures must be >= 0")
        for item in self.drafts_by_domain:
            domain, _, path = item.partition("=")
            if not domain.strip() or not path.strip():
                raise ConfigError(f"--drafts-by-domain takes DOMAIN=PATH, got {item!r}")


def domain_drafts(items: list[str] | None = None) -> dict[str, str]:
    """``["code=D1", "math=D2"]`` -> ``{"code": "D1", "math": "D2"}``."""
    return {d.strip(): p.strip() for d, _, p in (i.partition("=") for i in items or [])}


# --- the drafts --------------------------------------------------------------------------------

@dataclass
class Draft:
    name: str
    model: Any
    layers: int  # decoder layers
    main: bool = False  # the draft the entropy and batch regimes map
    derived: bool = False  # an early exit of the target (the draft-cost curve)
    home: str | None = None  # the domain a domain draft was distilled on


def num_layers(model) -> int:
    from draftkit.models.facts import text_config

    return text_config(model).num_hidden_layers


def early_exit(target, n: int):
    """The target's first n layers, then its final norm and head (the target itself when n
    covers it: a draft with alpha = 1 and c ~ 1)."""
    from draftkit.models.derive import derive_by_layers

    total = num_layers(target)
    return target if n >= total else derive_by_layers(target, list(range(n)))


def build_drafts(args: RegimesArgs, pair, domains: list[str]) -> list[Draft]:
    from draftkit.models import load_model, load_tokenizer, resolve_model
    from draftkit.models.compat import check_compatible

    total = num_layers(pair.target)
    drafts: list[Draft] = []
    if pair.draft is not None:
        drafts.append(Draft(pair.draft_ref.name, pair.draft, num_layers(pair.draft), main=True))
    for n in sorted({min(n, total) for n in args.layer_sizes}
                    | (set() if pair.draft is not None else {min(DEFAULT_DRAFT_LAYERS, total)})):
        name = f"target itself ({n} layers)" if n == total else f"first {n} layers"
        drafts.append(Draft(name, early_exit(pair.target, n), n, derived=True,
                            main=pair.draft is None and n == min(DEFAULT_DRAFT_LAYERS, total)))
    for domain, path in domain_drafts(args.drafts_by_domain).items():
        if domain not in domains:
            raise DraftkitError(f"--drafts-by-domain {domain}={path}: the suite has no domain "
                                f"{domain!r}; it has {', '.join(domains)}")
        ref = resolve_model(path, "draft")
        from transformers import AutoConfig

        check_compatible(pair.tokenizer, load_tokenizer(ref, "draft"),
                         AutoConfig.from_pretrained(pair.target_ref.path),
                         AutoConfig.from_pretrained(ref.path))
        model = load_model(ref, "draft", args.device, args.dtype)
        drafts.append(Draft(f"{domain} draft ({ref.name})", model, num_layers(model),
                            home=domain))
    return drafts


# --- measuring ---------------------------------------------------------------------------------

def settings_for(args: RegimesArgs, temperature: float = 0.0):
    from draftkit.evaluate.runner import EvalSettings

    return EvalSettings(k=args.k, k_max=args.k_max, temperature=temperature,
                        max_new_tokens=args.max_new_tokens, repeats=1, seed=args.seed,
                        k_sweep=[], batch_sizes=list(args.batch_sizes),
                        batch_tokens=args.max_new_tokens)


def compact(fig: dict) -> dict:
    out = {k: fig.get(k) for k in FIG_KEYS}
    c, v, k = fig.get("c"), fig.get("v"), fig.get("k")
    out["break_even_alpha"] = (_finite(metrics.break_even_alpha(c, k, v))
                               if c is not None and k else None)
    return out


def _finite(x: float) -> float | None:
    return None if x == float("inf") else x


def measure_prompts(ev, prompts: dict[str, list[list[int]]], entropy: bool) -> dict:
    """Each prompt decoded with K = 0 and with speculation at K, back to back.

    Returns ``{"prompts": {domain: [fig, ...]}, "domains": {domain: fig}, "overall": fig}``,
    the domain and overall figures token-weighted over their prompts' runs (eval's rule)."""
    from draftkit.evaluate import runner

    per_prompt: dict[str, list[dict]] = {}
    domains: dict[str, dict] = {}
    all_figs, all_runs = {}, {}
    for domain, ids_list in prompts.items():
        figs, runs = {}, {}
        for i, ids in enumerate(ids_list):
            run = ev.run_domain([ids])
            fig = runner.domain_figures(run, 1, ev.s)
            if entropy:
                tf = ev.teacher_forced(run.sequences, {}, with_draft=False)
                fig["target_entropy"] = tf["target_entropy"]
            figs[str(i)], runs[str(i)] = fig, run
            all_figs[f"{domain}/{i}"], all_runs[f"{domain}/{i}"] = fig, run
        per_prompt[domain] = [compact(f) for f in figs.values()]
        domains[domain] = compact(runner.aggregate(figs, runs, ev.s))
    return {"prompts": per_prompt, "domains": domains,
            "overall": compact(runner.aggregate(all_figs, all_runs, ev.s))}


def measure_batches(ev, prompts: list[list[int]], k: int) -> list[dict]:
    """eval's batch sweep at fixed K (measured c(B), v(B), speedup), then the K policy at each
    batch size: the K it used most and its speedup over the same K = 0 baseline."""
    from draftkit.decode.stats import DecodeStats
    from draftkit.evaluate import runner

    rows = ev.batch_sweep(prompts, k)
    for row in rows:
        bsz = row["batch_size"]
        batch = [prompts[i % len(prompts)] for i in range(bsz)]
        stats = DecodeStats()
        res, secs = ev.decode(batch, AUTO, ev.s.batch_tokens, stats, ev.s.seed)
        ev.progress(1)
        tps = sum(len(r.tokens) for r in res) / secs
        row["policy_k"] = runner.k_used(stats)
        row["speedup_policy"] = tps / row["plain_tokens_per_s"]
        row["break_even_alpha"] = (_finite(metrics.break_even_alpha(row["c"], k, row["v"]))
                                   if row["c"] is not None and row["v"] is not None else None)
    return rows


def measure(args: RegimesArgs, pair, drafts: list[Draft], prompts: dict, batch_prompts: dict,
            bar) -> dict:
    """Everything the four regimes read, measured draft by draft (one engine in memory at a
    time besides the target)."""
    from draftkit.evaluate.runner import Evaluator

    progress = lambda n=1: bar.update(n)  # noqa: E731
    main = next(d for d in drafts if d.main)
    at_zero: dict[str, dict] = {}  # draft name -> measure_prompts at T = 0
    by_temperature: dict[float, dict] = {}
    temps = sorted(set(args.temperatures) | {0.0})
    for t in temps:  # the main draft: entropy regime (T = 0 is also its cost / mismatch cell)
        bar.set_postfix_str(f"{main.name} T={t:g}")
        ev = Evaluator(pair.target, main.model, settings_for(args, t), progress)
        by_temperature[t] = measure_prompts(ev, prompts, entropy=True)
    at_zero[main.name] = by_temperature[0.0]
    for d in drafts:
        if d.main:
            continue
        bar.set_postfix_str(d.name)
        ev = Evaluator(pair.target, d.model, settings_for(args), progress)
        at_zero[d.name] = measure_prompts(ev, prompts, entropy=False)
    batch: dict[str, list[dict]] = {}
    if args.batch_sizes:
        ev = Evaluator(pair.target, main.model, settings_for(args), progress)
        for domain, ids in batch_prompts.items():
            bar.set_postfix_str(f"batch {domain}")
            batch[domain] = measure_batches(ev, ids, args.k)
    return {"at_zero": at_zero, "by_temperature": by_temperature, "batch": batch,
            "temperatures": temps}


def planned_runs(args: RegimesArgs, n_prompts: int, n_domains: int, n_drafts: int) -> int:
    """Progress-bar units: decodes at batch 1, batch sizes (K = 0 + K) and policy runs."""
    temps = len(set(args.temperatures) | {0.0})
    return (2 * n_prompts * (temps + n_drafts - 1)
            + 2 * n_domains * len(args.batch_sizes))


# --- analysis: crossovers and answers (pure functions of the measured figures) ----------------

def crossing(xs, ys, level: float = 1.0, log_x: bool = False) -> dict:
    kind, x = metrics.crossover(xs, ys, level, log_x)
    return {"kind": kind, "x": x}


def describe(cross: dict, var: str, what: str = "speedup", level: str = "1.0") -> str:
    """A crossover in words."""
    kind, x = cross["kind"], cross.get("x")
    if kind == "crosses":
        return f"{what} falls below {level} at {var} ~ {x:.3g}"
    if kind == "rises":
        return f"{what} rises above {level} at {var} ~ {x:.3g}"
    if kind == "below":
        return f"{what} below {level} everywhere (no crossover inside the range)"
    if kind == "above":
        return f"{what} at or above {level} everywhere (no crossover inside the range)"
    return "not measured"


def _span(values, fmt: str = "{:.2f}") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if abs(hi - lo) < 5e-3 else f"{fmt.format(lo)}-{fmt.format(hi)}"


def depth_trend(curve: list[dict], key: str) -> str:
    """How a figure moves with draft depth, in words from the measured points (``curve`` in
    depth order): it rises or falls only if every step does."""
    pts = [(r["layers"], r[key]) for r in curve if r.get(key) is not None]
    if not pts:
        return "was not measured"
    vals = [v for _, v in pts]
    (d0, v0), (d1, v1) = pts[0], pts[-1]
    ends = f"from {v0:.2f} ({d0} layers) to {v1:.2f} ({d1} layers)"
    if max(vals) - min(vals) < 5e-3:
        return f"stays at {v0:.2f}"
    if all(a <= b for a, b in zip(vals, vals[1:])):
        return f"rises {ends}"
    if all(a >= b for a, b in zip(vals, vals[1:])):
        return f"falls {ends}"
    return f"moves unevenly ({_span(vals)}), {ends}"


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope), or None with fewer than two distinct x."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def entropy_crossover(points: list[dict], alpha_be: float | None) -> dict:
    """The target entropy at which alpha, fitted linearly against it over the prompts, falls to
    the break-even alpha: the model's crossover in entropy (it may lie outside the measured
    range; ``inside`` says whether it does)."""
    pts = [(p["target_entropy"], p["alpha"]) for p in points
           if p.get("target_entropy") is not None and p.get("alpha") is not None]
    fit = linear_fit([h for h, _ in pts], [a for _, a in pts])
    out = {"intercept": None, "slope": None, "alpha_break_even": alpha_be, "entropy": None,
           "inside": False}
    if fit is None:
        return out
    out["intercept"], out["slope"] = fit
    if alpha_be is not None and fit[1] < 0:
        h = (alpha_be - fit[0]) / fit[1]
        out["entropy"] = h
        out["inside"] = min(p[0] for p in pts) <= h <= max(p[0] for p in pts)
    return out


def entropy_model_text(fit: dict) -> str:
    be = fit["alpha_break_even"]
    if be is None:
        return "no K pays at this c and v whatever alpha is"
    if fit["slope"] is None:
        return "too few prompts to fit alpha against entropy"
    if fit["slope"] >= 0:
        return (f"alpha does not fall with entropy over these prompts (slope "
                f"{fit['slope']:+.3f}/nat); it needs {be:.2f} to break even")
    h = fit["entropy"]
    if h <= 0:
        return (f"alpha fitted against entropy ({fit['intercept']:.2f} {fit['slope']:+.3f}/nat) "
                f"is below the break-even {be:.2f} at every entropy")
    where = "" if fit["inside"] else " (extrapolated)"
    return (f"alpha fitted against entropy ({fit['intercept']:.2f} {fit['slope']:+.3f}/nat) "
            f"reaches the break-even {be:.2f} at entropy ~ {h:.2f} nats{where}")


def entropy_regime(draft: str, by_temperature: dict[float, dict], temps: list[float],
                   k: int) -> dict:
    zero = by_temperature[0.0]
    prompts = [dict(p, domain=d, index=i) for d, ps in zero["prompts"].items()
               for i, p in enumerate(ps)]
    base = zero["overall"]
    alpha_be = base.get("break_even_alpha")
    rows = []
    for t in temps:
        res = by_temperature[t]
        rows.append(dict(res["overall"], temperature=t,
                         per_domain={d: res["domains"][d] for d in res["domains"]}))
    xs = [r["temperature"] for r in rows]
    cross_t = {"measured": crossing(xs, [r["speedup_measured"] for r in rows]),
               "predicted": crossing(xs, [r["speedup_predicted"] for r in rows]),
               "alpha": (crossing(xs, [r["alpha"] for r in rows], alpha_be)
                         if alpha_be is not None else {"kind": "empty", "x": None})}
    hs = [p["target_entropy"] for p in prompts]
    cross_h = {"measured": crossing(hs, [p["speedup_measured"] for p in prompts]),
               "predicted": crossing(hs, [p["speedup_predicted"] for p in prompts]),
               "model": entropy_crossover(prompts, alpha_be)}
    per_domain_t = {d: {"measured": crossing(xs, [r["per_domain"][d]["speedup_measured"]
                                                  for r in rows]),
                        "predicted": crossing(xs, [r["per_domain"][d]["speedup_predicted"]
                                                   for r in rows])}
                    for d in zero["domains"]}
    measured = [r["speedup_measured"] for r in rows]
    pays = [r["temperature"] for r in rows if (r["speedup_measured"] or 0) > 1.0]
    head = (f"with {draft} at K={k}, speculation pays at temperature "
            f"{', '.join(f'{t:g}' for t in pays)}" if pays else
            f"with {draft} at K={k}, speculation pays at no temperature measured")
    answer = (f"{head} (speedup {_span(measured)}x); measured: "
              f"{describe(cross_t['measured'], 'temperature')}; predicted from alpha, c, v: "
              f"{describe(cross_t['predicted'], 'temperature')}. Per prompt, "
              f"{entropy_model_text(cross_h['model'])}.")
    return {"draft": draft, "k": k, "break_even_alpha": alpha_be, "c": base.get("c"),
            "v": base.get("v"), "prompts": prompts, "domains": zero["domains"],
            "temperatures": rows, "crossover": {"temperature": cross_t, "entropy": cross_h,
                                                "per_domain_temperature": per_domain_t},
            "answer": answer}


def cost_regime(drafts: list[Draft], at_zero: dict[str, dict], k: int) -> dict:
    rows = []
    for d in drafts:
        if not (d.derived or d.main):
            continue
        fig = at_zero[d.name]["overall"]
        alphas = fig.get("alpha_per_position") or fig.get("alpha")
        max_c = (metrics.max_draft_cost(alphas, k, fig["v"])
                 if fig.get("v") is not None and alphas is not None else None)
        rows.append(dict(fig, name=d.name, layers=d.layers, derived=d.derived, main=d.main,
                         max_c=max_c))
    curve = sorted((r for r in rows if r["derived"]), key=lambda r: r["layers"])
    xs = [r["layers"] for r in curve]
    cross = {"measured": crossing(xs, [r["speedup_measured"] for r in curve]),
             "predicted": crossing(xs, [r["speedup_predicted"] for r in curve])}

    def best(key):
        vals = [r for r in rows if r.get(key) is not None]
        return max(vals, key=lambda r: r[key])["name"] if vals else None

    best_m, best_p = best("speedup_measured"), best("speedup_predicted")
    pays = [r for r in curve if (r.get("c") is not None and r.get("max_c") is not None
                                 and r["c"] < r["max_c"])]
    answer = (f"with early-exit depth, alpha {depth_trend(curve, 'alpha')} and c "
              f"{depth_trend(curve, 'c')}; measured speedup "
              f"{_span(r['speedup_measured'] for r in rows)}x, best {best_m}; measured: "
              f"{describe(cross['measured'], 'draft layers')}; predicted: "
              f"{describe(cross['predicted'], 'draft layers')}. ")
    best_curve = max((r for r in curve if r.get("speedup_measured") is not None),
                     key=lambda r: r["speedup_measured"], default=None)
    # "no longer pays" only past a depth that paid
    if (best_curve is not None and best_curve is not curve[-1]
            and best_curve["speedup_measured"] > 1.0):
        answer += (f"Past {best_curve['layers']} layers, a deeper draft's extra acceptance no "
                   f"longer pays for its extra cost. ")
    answer += (f"The model says a draft pays only while c stays below the largest cost its alpha "
               f"affords (c_max); {len(pays)} of {len(curve)} derived drafts are under it.")
    return {"k": k, "drafts": rows, "crossover": cross, "best_measured": best_m,
            "best_predicted": best_p, "answer": answer}


def mismatch_regime(drafts: list[Draft], at_zero: dict[str, dict], domains: list[str]) -> dict:
    homes = any(d.home for d in drafts)
    rows = [d for d in drafts if d.home or d.main or not homes]
    cell = lambda d, dom, key: at_zero[d.name]["domains"][dom].get(key)  # noqa: E731
    alpha = [[cell(d, dom, "alpha") for dom in domains] for d in rows]
    measured = [[cell(d, dom, "speedup_measured") for dom in domains] for d in rows]
    predicted = [[cell(d, dom, "speedup_predicted") for dom in domains] for d in rows]
    flat = [(m, p) for mr, pr in zip(measured, predicted) for m, p in zip(mr, pr)
            if m is not None and p is not None]
    slow_m = sum(m < 1.0 for m, _ in flat)
    slow_p = sum(p < 1.0 for _, p in flat)
    agree = sum((m < 1.0) == (p < 1.0) for m, p in flat)
    cross = {"cells": len(flat), "measured_slowdowns": slow_m, "predicted_slowdowns": slow_p,
             "agree": agree}
    answer = (f"{slow_m} of {len(flat)} draft x domain cells are measured slowdowns; the model "
              f"predicts {slow_p} from each cell's alpha, c and v and agrees on {agree}. ")
    if homes:
        home_a = [a for d, ar in zip(rows, alpha) for dom, a in zip(domains, ar)
                  if d.home == dom and a is not None]
        away_a = [a for d, ar in zip(rows, alpha) for dom, a in zip(domains, ar)
                  if d.home and d.home != dom and a is not None]
        cross["alpha_home"] = statistics.fmean(home_a) if home_a else None
        cross["alpha_away"] = statistics.fmean(away_a) if away_a else None
        if home_a and away_a:
            answer += (f"Drafts accept {cross['alpha_home']:.2f} on their own domain and "
                       f"{cross['alpha_away']:.2f} elsewhere.")
    else:
        main_row = next(i for i, d in enumerate(rows) if d.main)
        vals = [(a, dom) for a, dom in zip(alpha[main_row], domains) if a is not None]
        if vals:
            lo, hi = min(vals), max(vals)
            answer += (f"No domain-distilled drafts were given (--drafts-by-domain), so rows are "
                       f"the drafts measured; the main draft's alpha ranges from {lo[0]:.2f} "
                       f"({lo[1]}) to {hi[0]:.2f} ({hi[1]}).")
    return {"drafts": [d.name for d in rows], "home": {d.name: d.home for d in rows},
            "domains": domains, "alpha": alpha, "speedup_measured": measured,
            "speedup_predicted": predicted, "crossover": cross, "answer": answer}


def batch_crossovers(rows: list[dict]) -> dict:
    """Measured and predicted break-even batch size (interpolated in log2 B)."""
    bs = [r["batch_size"] for r in rows]
    return {"measured": crossing(bs, [r["speedup_measured"] for r in rows], log_x=True),
            "predicted": crossing(bs, [r["speedup_predicted"] for r in rows], log_x=True)}


def batch_regime(draft: str, batch: dict[str, list[dict]], k: int) -> dict:
    if not batch:
        return {"draft": draft, "k": k, "domains": {}, "crossover": {},
                "answer": "not measured (no --batch-sizes)"}
    cross = {d: batch_crossovers(rows) for d, rows in batch.items()}
    allrows = [r for rows in batch.values() for r in rows]
    ks = sorted({r["policy_k"] for r in allrows})
    groups: dict[str, list[str]] = {}  # domains whose crossovers read the same share a line
    for d, c in cross.items():
        text = (f"measured {describe(c['measured'], 'batch')}, predicted "
                f"{describe(c['predicted'], 'batch')}")
        groups.setdefault(text, []).append(d)
    parts = [f"{', '.join(ds) if len(ds) < len(cross) else 'every domain'}: {text}"
             for text, ds in groups.items()]
    answer = (f"with {draft} at K={k}, speedup runs {_span(r['speedup_measured'] for r in allrows)}"
              f"x over batch sizes {min(r['batch_size'] for r in allrows)}-"
              f"{max(r['batch_size'] for r in allrows)}, with v(B) "
              f"{_span(r['v'] for r in allrows)}; the policy picks K in "
              f"{{{', '.join(map(str, ks))}}}. " + "; ".join(parts) + ".")
    return {"draft": draft, "k": k, "domains": batch, "crossover": cross, "answer": answer}


def headline(report: dict) -> str:
    """One sentence over all four regimes: where speculation paid, as measured."""
    points = [("temperature " + f"{r['temperature']:g}", r["speedup_measured"])
              for r in report["entropy"]["temperatures"]]
    points += [(r["name"], r["speedup_measured"]) for r in report["draft_cost"]["drafts"]]
    mis = report["mismatch"]
    points += [(f"{d} on {dom}", m) for d, row in zip(mis["drafts"], mis["speedup_measured"])
               for dom, m in zip(mis["domains"], row)]
    points += [(f"batch {r['batch_size']} ({dom})", r["speedup_measured"])
               for dom, rows in report["batch"]["domains"].items() for r in rows]
    points = [(name, s) for name, s in points if s is not None]
    wins = [(name, s) for name, s in points if s > 1.0]
    main = report["entropy"]
    if not wins:
        be = main.get("break_even_alpha")
        why = ""
        a = main["temperatures"][0]["alpha"] if main["temperatures"] else None  # T = 0
        if None not in (be, a, main["c"], main["v"]):
            at = f"at c={main['c']:.2f}, v={main['v']:.2f}"
            why = (f"; the model agrees: the draft's alpha {a:.2f} is below the {be:.2f} it "
                   f"needs {at}" if a < be else
                   f"; the model predicts a gain (the draft's alpha {a:.2f} is at or above the "
                   f"break-even {be:.2f} {at}), so per-round overhead, which it leaves out, ate "
                   f"it")
        return (f"Speculation did not pay anywhere measured ({len(points)} points, speedup "
                f"{_span(s for _, s in points)}x){why}.")
    best = max(wins, key=lambda w: w[1])
    return (f"Speculation paid at {len(wins)} of {len(points)} points measured (best "
            f"{best[1]:.2f}x: {best[0]}) and lost at the rest; the regimes below say where the "
            f"line runs.")


# --- the command -------------------------------------------------------------------------------

def run_regimes(args: RegimesArgs) -> dict:
    """Load, measure all four regimes and return the report dict (``regimes`` writes it)."""
    import torch
    from tqdm.auto import tqdm

    from draftkit.chat import encode_prompt
    from draftkit.evaluate.runner import now
    from draftkit.evaluate.suite import builtin_suites_dir, by_domain, load_suite
    from draftkit.models import load_pair

    started = time.perf_counter()
    suite = builtin_suites_dir() if args.suite == "builtin" else Path(args.suite)
    n_batch = max(args.batch_sizes, default=1)
    rows = load_suite(suite, limit=max(args.prompts_per_domain, n_batch), domains=args.domains)
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    groups = {d: [encode_prompt(pair.tokenizer, r.prompt) for r in g]
              for d, g in by_domain(rows).items()}
    prompts = {d: ids[:args.prompts_per_domain] for d, ids in groups.items()}
    domains = list(groups)
    torch.manual_seed(args.seed)
    drafts = build_drafts(args, pair, domains)
    main = next(d for d in drafts if d.main)
    total = planned_runs(args, sum(map(len, prompts.values())), len(domains), len(drafts))
    with tqdm(total=total, desc="regimes", unit="run", dynamic_ncols=True) as bar:
        raw = measure(args, pair, drafts, prompts, groups, bar)
    report = {
        "target": pair.target_ref.name, "draft": main.name,
        "target_layers": num_layers(pair.target), "device": str(next(pair.target.parameters())
                                                               .device),
        "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""), "k": args.k,
        "k_max": args.k_max, "max_new_tokens": args.max_new_tokens,
        "prompts_per_domain": args.prompts_per_domain, "domains": domains,
        "drafts": [{"name": d.name, "layers": d.layers, "main": d.main, "derived": d.derived,
                    "home": d.home} for d in drafts],
        "entropy": entropy_regime(main.name, raw["by_temperature"], raw["temperatures"], args.k),
        "draft_cost": cost_regime(drafts, raw["at_zero"], args.k),
        "mismatch": mismatch_regime(drafts, raw["at_zero"], domains),
        "batch": batch_regime(main.name, raw["batch"], args.k),
        "created": now(), "seconds": None,
    }
    report["headline"] = headline(report)
    report["seconds"] = time.perf_counter() - started
    return report


def regimes(args: RegimesArgs) -> dict:
    """``draftkit regimes``: measure the four regimes, write the report, print the answers."""
    from draftkit.config import to_dict
    from draftkit.evaluate.regimes_report import REGIMES, write_regimes_report
    from draftkit.tracking import Tracker

    with Tracker("regimes", to_dict(args), out_dir=args.out) as tracker:
        report = run_regimes(args)
        files = write_regimes_report(report, args.out, tracker)
    print(report["headline"])
    for key, title in REGIMES:
        print(f"{title}: {report[key]['answer']}")
    print(f"report: {files['md']} (also {files['html'].name}, {files['json'].name}, plots); "
          f"{report['seconds'] / 60:.1f} min")
    return report
