"""Measuring a draft against its target on domain suites: the figures behind ``draftkit eval``.

For each domain, every prompt is decoded by the same engine with K = 0 (plain decoding, the
baseline) and with speculation, interleaved prompt by prompt, alternating which goes first, and
repeated, after one untimed decode of each; tokens per second are medians over repeats.
Acceptance (alpha, alpha_i, tau), the draft cost c and the verify inflation v come from the
engine's per-round statistics; the predicted speedup comes from those through
:mod:`draftkit.metrics`, so the gap between predicted and measured is the per-round overhead
the model does not explain, which the report states.

Two sweeps show where speculation stops paying: K (predicted from the measured alpha_i and
v(K) for every K, measured on a few prompts per domain for the K listed) and batch size
(measured c(B), v(B) and speedup at each B, with the break-even batch where speedup crosses 1).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from draftkit import metrics
from draftkit.decode.args import DecodingArgs
from draftkit.decode.k import check_k
from draftkit.decode.policy import resolve_k
from draftkit.evaluate import entropy

# Tokens of the untimed warm-up decodes: enough to run every forward the timed decodes run
# (prefill, draft steps, verify) once, so one-time costs (CUDA context, cuBLAS handles, oneDNN
# primitives, allocator growth) land there, not in whichever timed decode happens to go first.
WARMUP_TOKENS = 8


@dataclass
class EvalSettings(DecodingArgs):
    """What the measurements decode with (K, sampling) and how much they measure."""

    max_new_tokens: int = 128
    repeats: int = 1
    k_sweep: list[int] = field(default_factory=lambda: [1, 2, 4, 6])
    k_sweep_prompts: int = 2
    k_sweep_tokens: int = 48
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    batch_tokens: int = 32


@dataclass
class DomainRun:
    """Raw measurements of one domain at batch size 1."""

    plain_seconds: list[float]  # per repeat, all prompts
    spec_seconds: list[float]
    tokens: int  # new tokens per repeat (K = 0 and speculation agree under greedy)
    spec_tokens: int
    stats: Any  # DecodeStats of the speculative runs
    plain_stats: Any  # DecodeStats of the K = 0 runs
    sequences: list[tuple[list[int], list[int]]]  # (prompt ids, new ids) of the last spec run


def _timed(fn: Callable[[], Any], device) -> tuple[Any, float]:
    from draftkit.decode.engine import synchronize

    synchronize(device)
    t = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t


class Evaluator:
    """Runs the measurements; one instance per (target, draft) pair."""

    def __init__(self, target_model, draft_model, settings: EvalSettings, progress=None):
        from draftkit.decode.engine import SpeculativeEngine

        self.target_model, self.draft_model, self.s = target_model, draft_model, settings
        self.engine = SpeculativeEngine(target_model, draft_model)
        self.device = self.engine.device
        self.progress = progress or (lambda n=1: None)
        self._warm = False  # run_domain has warmed both modes up
        self._turn = 0  # decode pairs so far: which of K = 0 and speculation goes first
        check_k(settings.k, settings.k_max)

    def decode(self, prompts: list[list[int]], k, max_new_tokens: int, stats, seed: int,
               policy=None):
        """Timed decode; with ``k="auto"``, ``policy`` (a KPolicy) carries what it learnt
        from earlier calls, else each call starts a fresh one."""
        s = self.s
        return _timed(lambda: self.engine.generate(
            prompts, k=k, max_new_tokens=max_new_tokens, temperature=s.temperature,
            top_k=s.top_k, top_p=s.top_p, seed=seed, k_max=s.k_max, policy=policy,
            stats=stats), self.device)

    def warm_up(self, prompts: list[list[int]], k) -> None:
        """Decode ``prompts`` once with K = 0 and once at ``k``, untimed and uncounted."""
        from draftkit.decode.stats import DecodeStats

        for kk in (0, k):
            self.decode(prompts, kk, WARMUP_TOKENS, DecodeStats(), self.s.seed)

    def order(self) -> tuple[str, str]:
        """Which of the next pair of decodes goes first, alternating over every pair this
        Evaluator times (also across calls: regimes times one prompt per call), so drifts in
        machine speed hit K = 0 and speculation alike."""
        self._turn += 1
        return ("plain", "spec") if self._turn % 2 else ("spec", "plain")

    # --- batch size 1, per domain -------------------------------------------------------------

    def run_domain(self, prompts: list[list[int]]) -> DomainRun:
        from draftkit.decode.stats import DecodeStats

        if not self._warm and prompts:
            self.warm_up(prompts[:1], self.s.k)
            self._warm = True
        spec_stats, plain_stats = DecodeStats(), DecodeStats()
        plain_secs, spec_secs, sequences = [], [], []
        # --k auto: one policy for the domain's prompts, as a server keeps one across requests
        policy = resolve_k(self.s.k, self.s.k_max, has_draft=self.draft_model is not None).policy
        tokens = spec_tokens = 0
        for rep in range(self.s.repeats):
            t_plain = t_spec = 0.0
            n_plain = n_spec = 0
            sequences = []
            for i, ids in enumerate(prompts):
                seed = self.s.seed + i
                # K = 0 and speculation interleaved prompt by prompt
                for mode in self.order():
                    if mode == "plain":
                        (res,), secs = self.decode([ids], 0, self.s.max_new_tokens,
                                                    plain_stats, seed)
                        t_plain += secs
                        n_plain += len(res.tokens)
                    else:
                        (res,), secs = self.decode([ids], self.s.k, self.s.max_new_tokens,
                                                    spec_stats, seed, policy)
                        t_spec += secs
                        n_spec += len(res.tokens)
                        sequences.append((ids, res.tokens))
                    self.progress(1)
            plain_secs.append(t_plain)
            spec_secs.append(t_spec)
            tokens, spec_tokens = n_plain, n_spec
        return DomainRun(plain_secs, spec_secs, tokens, spec_tokens, spec_stats, plain_stats,
                         sequences)

    # --- teacher-forced figures on the decoded continuations ----------------------------------

    def teacher_forced(self, sequences, drafts: dict[str, Any],
                       with_draft: bool = True) -> dict[str, Any]:
        """Target entropy, the draft's (``"draft"``, unless not ``with_draft``) and each extra
        draft's acceptance on the same continuations, and ``by_entropy``: the same per bucket of
        the target's entropy (:mod:`draftkit.evaluate.entropy`).

        Acceptance here is teacher-forced: at each continuation position, greedy decoding
        accepts when the draft's argmax equals the target's; sampling accepts with
        probability sum_x min(p, q) = 1 - TV (Leviathan et al., arXiv 2211.17192, section 3).
        It is not the decode-time alpha (accepted / tested, tested positions only), so compare
        a baseline draft's figure with the draft's ``"draft"`` figure, never with that alpha.
        """
        import torch

        from draftkit.decode.sampling import SamplingParams, probabilities
        from draftkit.models.reduced_head import head_of

        params = SamplingParams(self.s.temperature or 1.0, self.s.top_k, self.s.top_p)
        models = {"draft": self.draft_model, **drafts} if with_draft else dict(drafts)
        buckets = entropy.EntropyBuckets(list(models))
        heads = {}  # each draft's reduced head, if any: its q as the decoder sees it
        for name, model in models.items():
            head = head_of(model)
            heads[name] = None if head is None else head.to(self.device)
        with torch.inference_mode():
            for prompt, new in sequences:
                if not new:
                    continue
                seq = torch.tensor([prompt + new], device=self.device)
                span = slice(len(prompt) - 1, len(prompt) + len(new) - 1)
                p_logits = self.target_model(seq).logits[0, span].float()  # (T, V)
                p = probabilities(p_logits, params)
                accept = {}
                for name, model in models.items():
                    q_logits = model(seq).logits[0, span].float()  # (T, V)
                    if heads[name] is not None:  # zero outside its reduced head
                        q_logits = heads[name].expand(heads[name].restrict(q_logits))
                    if self.s.temperature == 0:
                        accept[name] = (q_logits.argmax(-1) == p_logits.argmax(-1)).double()
                    else:
                        accept[name] = torch.minimum(p, probabilities(q_logits, params)).sum(-1)
                buckets.add(-(p * p.clamp_min(1e-12).log()).sum(-1), accept)  # (T,) nats
        count = float(buckets.counts.sum())
        out: dict[str, Any] = {"target_entropy": float(buckets.entropy_sum / count)
                               if count else None}
        out.update({name: float(buckets.sums[name].sum() / count) if count else None
                    for name in models})
        out["by_entropy"] = buckets.result() if count else None
        return out

    # --- sweeps -------------------------------------------------------------------------------

    def k_sweep(self, prompts: list[list[int]]) -> list[dict]:
        """Measured speedup at each K in the sweep list, on a few prompts."""
        from draftkit.decode.stats import DecodeStats

        rows = []
        subset = prompts[: self.s.k_sweep_prompts]
        if not subset:
            return rows
        plain_stats = DecodeStats()  # its 1-token step prices c and v at every K
        plain_secs, plain_tok = 0.0, 0
        for i, ids in enumerate(subset):
            (res,), secs = self.decode([ids], 0, self.s.k_sweep_tokens, plain_stats,
                                        self.s.seed + i)
            plain_secs += secs
            plain_tok += len(res.tokens)
            self.progress(1)
        plain_tps = plain_tok / plain_secs if plain_secs else None
        step = plain_stats.target_step_seconds(1)
        for k in self.s.k_sweep:
            stats = DecodeStats()
            secs_sum, tok = 0.0, 0
            for i, ids in enumerate(subset):
                (res,), secs = self.decode([ids], k, self.s.k_sweep_tokens, stats,
                                            self.s.seed + i)
                secs_sum += secs
                tok += len(res.tokens)
                self.progress(1)
            tps = tok / secs_sum if secs_sum else None
            # v grows with K: keep the v (and c) measured at this K for the predictions
            rows.append({"k": k, "tau": stats.tau(), "c": stats.c(step), "v": stats.v(k, step),
                         "speedup_measured": (tps / plain_tps) if (tps and plain_tps) else None,
                         "prompts": len(subset), "new_tokens": self.s.k_sweep_tokens})
        return rows

    def batch_sweep(self, prompts: list[list[int]], k: int) -> list[dict]:
        """At each batch size: K = 0 and speculation at K on the same B prompts, each warmed up
        first (a new batch size means new kernel shapes and a larger KV cache)."""
        from draftkit.decode.stats import DecodeStats

        rows = []
        for bsz in self.s.batch_sizes:
            batch = [prompts[i % len(prompts)] for i in range(bsz)]
            self.warm_up(batch, k)
            plain_stats, spec_stats = DecodeStats(), DecodeStats()
            timed = {}
            for mode in self.order():
                kk, stats = (0, plain_stats) if mode == "plain" else (k, spec_stats)
                timed[mode] = self.decode(batch, kk, self.s.batch_tokens, stats, self.s.seed)
            (res_p, t_p), (res_s, t_s) = timed["plain"], timed["spec"]
            self.progress(1)
            tps_p = sum(len(r.tokens) for r in res_p) / t_p
            tps_s = sum(len(r.tokens) for r in res_s) / t_s
            step = plain_stats.target_step_seconds(1)
            alphas = spec_stats.alphas()
            c = spec_stats.c(step)
            v = spec_stats.v(k, step)
            predicted = (metrics.speedup(alphas or spec_stats.alpha(), c, k, v)
                         if (c is not None and v is not None and k > 0) else None)
            rows.append({"batch_size": bsz, "alpha": spec_stats.alpha(), "c": c, "v": v,
                         "k": k, "plain_tokens_per_s": tps_p, "spec_tokens_per_s": tps_s,
                         "speedup_predicted": predicted, "speedup_measured": tps_s / tps_p})
        return rows


# --- turning measurements into report rows ---------------------------------------------------

def k_used(stats) -> int:
    """The positive K the run used most (auto varies it per round and starts every decode
    with plain steps, so K = 0 counts only when the run never speculated)."""
    calls = stats.rounds_by_k()
    spec = {k: n for k, n in calls.items() if k > 0}
    calls = spec or calls
    if not calls:
        return 0
    return max(calls, key=lambda k: (calls[k], k))


def predicted_speedup(stats, target_step: float | None) -> float | None:
    """Speedup the model predicts for the rounds the run actually had, K by K.

    A round at K yields tau(alpha_1..alpha_K) tokens for K c + v(K) target steps (Leviathan et
    al., arXiv 2211.17192, Theorem 3.8, with the measured verify inflation v); a K = 0 round
    yields one token for one step. Summing both over the rounds gives expected tokens over
    expected time, so under ``--k auto`` the prediction covers the same mix of K (plain
    stretches included) as the measured speedup; at a fixed K it is ``metrics.speedup``.
    None when c or some v(K) is unknown.
    """
    alphas = stats.alphas() or stats.alpha()
    c = stats.c(target_step)
    tokens = steps = 0.0
    for k, n in stats.rounds_by_k().items():
        v = stats.v(k, target_step) if k else 1.0
        if k and (c is None or v is None):
            return None
        tokens += n * metrics.tau(alphas, k)
        steps += n * (k * c + v if k else 1.0)
    return tokens / steps if steps else 1.0  # no round at all: plain decoding by definition


def domain_figures(run: DomainRun, n_prompts: int, settings: EvalSettings) -> dict:
    """The report's per-domain fields from one domain's measurements.

    ``k`` (and ``v``, at that K) is the positive K the run used most; under ``--k auto``
    ``plain_round_share`` and ``rounds_by_k`` say how the rounds were spread over K, and
    ``speedup_predicted`` is for that spread (:func:`predicted_speedup`)."""
    stats = run.stats
    step = run.plain_stats.target_step_seconds(1)
    k = k_used(stats)
    plain_tps = statistics.median(run.tokens / s for s in run.plain_seconds if s > 0)
    spec_tps = statistics.median(run.spec_tokens / s for s in run.spec_seconds if s > 0)
    alphas = stats.alphas()
    by_k = stats.rounds_by_k()
    rounds = stats.rounds or 1
    # Round time the model does not explain: measured decode time per round minus the draft
    # and verify forwards it accounts for (the draft's catch-up after K = 0 rounds included).
    overhead_ms = 1000 * (stats.seconds_other + stats.seconds_catchup) / rounds
    # Nothing drafted (--k 0, or auto never speculated): alpha is unknown, not 0.
    drafted = stats.accepted + stats.rejections > 0
    return {
        "n_prompts": n_prompts, "new_tokens": run.spec_tokens,
        "alpha": stats.alpha() if drafted else None,
        "alpha_tv": stats.alpha_tv() if settings.temperature > 0 and drafted else None,
        "alpha_after": None,  # the draft's teacher-forced acceptance, set by the caller
        "alpha_per_position": alphas, "tau": stats.tau(), "c": stats.c(step),
        "v": stats.v(k, step) if k else None, "k": k,
        "plain_round_share": by_k.get(0, 0) / rounds,
        "rounds_by_k": {str(x): by_k[x] for x in sorted(by_k)},
        "speedup_predicted": predicted_speedup(stats, step),
        "speedup_measured": spec_tps / plain_tps,
        "plain_tokens_per_s": plain_tps, "spec_tokens_per_s": spec_tps,
        "target_entropy": None, "by_entropy": None, "overhead_per_round_ms": overhead_ms,
        "verdict": None,
    }


def verdict(fig: dict, k_max: int, v: Callable[[int], float] | None = None) -> str:
    """Speculate with which K, or do not, and why, from measured figures.

    ``v`` is v(K) for the predictions (:func:`v_of_k`); by default the run's v at every K."""
    measured, alpha, c = fig["speedup_measured"], fig["alpha"], fig["c"]
    if measured is not None and measured > 1.0 and fig["k"]:
        return f"speculate with K={fig['k']} (measured {measured:.2f}x)"
    if c is None:
        return "do not speculate: the draft never ran, so its cost is unknown"
    if alpha is None:
        return "do not speculate: no token was drafted, so alpha is unknown"
    if v is None:
        v_run = fig["v"] if fig["v"] is not None else 1.0
        v = lambda k: v_run  # noqa: E731
    be = metrics.break_even_alpha_any_k(c, k_max, v)
    if not math.isfinite(be):  # no alpha below 1 pays at this c and v
        vs = [v(k) for k in range(1, k_max + 1)]
        span = f"{min(vs):.2f}" if max(vs) - min(vs) < 5e-3 else f"{min(vs):.2f}-{max(vs):.2f}"
        return (f"do not speculate: at this draft's c={c:.2f} and verification cost v="
                f"{span} no acceptance rate pays")
    if alpha < be:
        why = f"alpha {alpha:.2f} is below the break-even {be:.2f} at this draft's c={c:.2f}"
        if c >= 0.5:
            why += " (the draft is too slow)"
        return f"do not speculate: {why}"
    best_k, best_s = metrics.optimal_k(fig["alpha_per_position"] or alpha, c, k_max, v)
    if best_k == 0:
        return "do not speculate: no K pays at this alpha, c and v"
    return (f"do not speculate yet: predicted {best_s:.2f}x at K={best_k} but measured "
            f"{measured:.2f}x; per-round overhead {fig['overhead_per_round_ms']:.1f} ms eats "
            f"the gain")


def v_of_k(fig: dict, measured: list[dict]):
    """v(K) for the predictions (:func:`metrics.v_between`): the run's v at the run's K, the K
    sweep's v at the K it measured (the mean where several domains' rows measured one K),
    interpolated in between; None when no v was measured."""
    by_k: dict[int, list[float]] = {}
    for r in measured:
        if r.get("v") is not None:
            by_k.setdefault(r["k"], []).append(r["v"])
    points = {k: statistics.fmean(vs) for k, vs in by_k.items()}
    if fig.get("k") and fig.get("v") is not None:
        points[fig["k"]] = fig["v"]  # measured over every round of the run, not a few prompts
    return metrics.v_between(points)


def k_sweep_rows(domain: str, fig: dict, measured: list[dict], k_max: int) -> list[dict]:
    """Predicted tau and speedup for K = 1..k_max from the measured alpha_i, c and v(K)
    (:func:`v_of_k`), beside the figures measured where the sweep ran that K (``tau_measured``,
    c, v, ``speedup_measured``, and the ``prompts`` and ``new_tokens`` they were measured on;
    None elsewhere)."""
    by_k = {r["k"]: r for r in measured}
    rows = []
    alpha = fig["alpha_per_position"] or fig["alpha"]
    v = v_of_k(fig, measured)
    for k in range(1, k_max + 1):
        pred = tau = None
        if alpha is not None:  # None: nothing was drafted
            tau = metrics.tau(alpha, k)
            if fig["c"] is not None:
                pred = metrics.speedup(alpha, fig["c"], k, v)
        m = by_k.get(k) or {}
        rows.append({"domain": domain, "k": k, "tau": tau, "tau_measured": m.get("tau"),
                     "c": m.get("c"), "v": m.get("v"), "speedup_predicted": pred,
                     "speedup_measured": m.get("speedup_measured"),
                     "prompts": m.get("prompts"), "new_tokens": m.get("new_tokens")})
    return rows


def aggregate(domains: dict[str, dict], runs: dict[str, DomainRun], settings,
              measured: list[dict] = ()) -> dict:
    """The ``overall`` row: token-weighted over all domains' runs; ``measured`` are the K
    sweep's rows of every domain (their v(K) price the verdict's predictions)."""
    from draftkit.decode.stats import DecodeStats

    total, plain = DecodeStats(), DecodeStats()
    for run in runs.values():
        _merge(total, run.stats)
        _merge(plain, run.plain_stats)
    merged = DomainRun(
        [sum(r.plain_seconds[i] for r in runs.values()) for i in range(settings.repeats)],
        [sum(r.spec_seconds[i] for r in runs.values()) for i in range(settings.repeats)],
        sum(r.tokens for r in runs.values()), sum(r.spec_tokens for r in runs.values()),
        total, plain, [])
    fig = domain_figures(merged, sum(d["n_prompts"] for d in domains.values()), settings)
    # teacher-forced figures: one value per decoded token
    for key in ("target_entropy", "alpha_before", "alpha_after"):
        vals = [(d[key], d["new_tokens"]) for d in domains.values() if d.get(key) is not None]
        if vals:
            fig[key] = sum(a * n for a, n in vals) / max(1, sum(n for _, n in vals))
    by_entropy = [d["by_entropy"] for d in domains.values() if d.get("by_entropy")]
    if by_entropy:
        fig["by_entropy"] = entropy.merge(by_entropy)
    fig["verdict"] = verdict(fig, settings.k_max, v_of_k(fig, list(measured)))
    return fig


def _merge(into, other) -> None:
    """Add one DecodeStats into another (counts, times and per-position lists)."""
    for name, value in vars(other).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(into, name, getattr(into, name) + value)
        elif isinstance(value, list):
            mine = getattr(into, name)
            for i, x in enumerate(value):
                if i < len(mine):
                    mine[i] += x
                else:
                    mine.append(x)
        elif isinstance(value, dict):
            mine = getattr(into, name)
            for key, x in value.items():
                mine[key] = mine.get(key, 0) + x


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
