"""Measuring a draft against its target on domain suites: the figures behind ``draftkit eval``.

For each domain, every prompt is decoded by the same engine with K = 0 (plain decoding, the
baseline) and with speculation, interleaved prompt by prompt, alternating which goes first, and
repeated, after one untimed decode of each; tokens per second pool every prompt and repeat,
and the measured speedup's interval resamples prompts, each a (plain, speculative) pair.
Acceptance (alpha, alpha_i, tau), the draft cost c and the verify inflation v come from the
engine's per-round statistics; the predicted speedup comes from those through
:mod:`draftkit.metrics`, so the gap between predicted and measured is the per-round overhead
the model does not explain, which the report states (:mod:`draftkit.evaluate.analysis` turns
these measurements into the report's figures).

Two sweeps show where speculation stops paying: K (a few prompts per domain, each decoded
plainly and at every K listed) and batch size (measured c(B), v(B) and speedup at each B, over a
few batches of distinct prompts); each sweep's speedups have intervals over their prompts or
batches, as the table's do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from draftkit import metrics
from draftkit.decode.choice import PLAIN, KChoice
from draftkit.decode.clock import synchronize
from draftkit.decode.drafters import teacher_forced_logits
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.k import KValue
from draftkit.decode.sampling import draft_probabilities, probabilities
from draftkit.decode.sampling_params import GREEDY_DRAFT, SamplingParams
from draftkit.decode.stats import DecodeStats
from draftkit.evaluate import entropy
from draftkit.evaluate.settings import EvalSettings
from draftkit.figures import BatchRow, EntropyTable
from draftkit.models.reduced_head import head_of

# Tokens of the untimed warm-up decodes: enough to run every forward the timed decodes run
# (prefill, draft steps, verify) once, so one-time costs (CUDA context, cuBLAS handles, oneDNN
# primitives, allocator growth) land there, not in whichever timed decode happens to go first.
WARMUP_TOKENS = 8
# TeacherForced.acceptance's key for the draft under greedy drafting (vLLM's default)
GREEDY_DRAFTS = "draft, greedy drafts"


@dataclass
class DomainRun:
    """Raw measurements of one domain at batch size 1."""

    plain_seconds: list[float]  # per repeat, all prompts
    spec_seconds: list[float]
    tokens: int  # new tokens per repeat (K = 0 and speculation agree under greedy)
    spec_tokens: int
    stats: DecodeStats  # of the speculative runs
    plain_stats: DecodeStats  # of the K = 0 runs
    sequences: list[tuple[list[int], list[int]]]  # (prompt ids, new ids) of the last spec run
    # per prompt, over every repeat: (plain, speculative) seconds and new tokens, the pairs
    # the speedup's interval resamples
    prompt_seconds: list[tuple[float, float]] = field(default_factory=list)
    prompt_tokens: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class TeacherForced:
    """Figures on decoded continuations, teacher-forced (:meth:`Evaluator.teacher_forced`)."""

    target_entropy: float | None  # nats, mean over the positions
    acceptance: dict[str, float | None]  # mean acceptance, by the name of each draft
    by_entropy: EntropyTable | None  # the same per bucket of the target's entropy


@dataclass
class KMeasurement:
    """The K sweep at one K, on one domain's first few prompts."""

    k: int
    tau: float
    c: float | None
    v: float | None  # at this K: v grows with K, so the predictions keep each K's own
    speedup_measured: float | None
    prompts: int  # what it was measured on
    new_tokens: int
    # the speedup's 95% interval over the prompts (None from one) and the prompts that would
    # decide where it includes 1.0 (:func:`paired_speedup`)
    speedup_low: float | None = None
    speedup_high: float | None = None
    prompts_to_decide: int | None = None


def _timed(fn: Callable[[], Any], device) -> tuple[Any, float]:
    synchronize(device)
    t = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t


class Evaluator:
    """Runs the measurements; one instance per (target, draft) pair."""

    def __init__(self, target_model, draft_model, settings: EvalSettings, progress=None):
        self.target_model, self.draft_model, self.s = target_model, draft_model, settings
        self.engine = SpeculativeEngine(target_model, draft_model)
        self.device = self.engine.device
        self.progress = progress or (lambda n=1: None)
        self._warm = False  # run_domain has warmed both modes up
        self._turn = 0  # decode pairs so far: which of K = 0 and speculation goes first

    def choice(self, k: KValue) -> KChoice:
        """How a decode at ``k`` (validated with the settings) picks each round's K: under
        ``auto`` a fresh policy up to the settings' k_max, which learns across every decode
        it is given to."""
        return KChoice.of(k, self.s.k_max, has_draft=self.draft_model is not None)

    def decode(self, prompts: list[list[int]], k: KChoice, max_new_tokens: int, stats,
               seed: int):
        """Timed decode at ``k`` (a policy given to several decodes carries what it learnt)."""
        s = self.s
        return _timed(lambda: self.engine.generate(
            prompts, k=k, max_new_tokens=max_new_tokens, temperature=s.temperature,
            top_k=s.top_k, top_p=s.top_p, seed=seed, stats=stats,
            draft_sample_method=s.draft_sample_method, verify=s.verify), self.device)

    def warm_up(self, prompts: list[list[int]], k: KValue) -> None:
        """Decode ``prompts`` once with K = 0 and once at ``k``, untimed and uncounted."""
        for kk in (PLAIN, self.choice(k)):
            self.decode(prompts, kk, WARMUP_TOKENS, DecodeStats(), self.s.seed)

    def order(self) -> tuple[str, str]:
        """Which of the next pair of decodes goes first, alternating over every pair this
        Evaluator times (also across calls: regimes times one prompt per call), so drifts in
        machine speed hit K = 0 and speculation alike."""
        self._turn += 1
        return ("plain", "spec") if self._turn % 2 else ("spec", "plain")

    # --- batch size 1, per domain -------------------------------------------------------------

    def run_domain(self, prompts: list[list[int]]) -> DomainRun:
        if not self._warm and prompts:
            self.warm_up(prompts[:1], self.s.k)
            self._warm = True
        # --k auto: one policy for the domain's prompts, as a server keeps one across requests
        modes = {"plain": (PLAIN, DecodeStats()), "spec": (self.choice(self.s.k), DecodeStats())}
        secs = {m: [] for m in modes}  # per repeat, all prompts
        tokens = dict.fromkeys(modes, 0)  # new tokens of a repeat (the last)
        pair_secs = [[0.0, 0.0] for _ in prompts]  # per prompt, every repeat: (plain, spec)
        pair_tokens = [[0, 0] for _ in prompts]
        sequences = []
        for _ in range(self.s.repeats):
            sequences, tokens = [], dict.fromkeys(modes, 0)
            for m in modes:
                secs[m].append(0.0)
            for i, ids in enumerate(prompts):
                # K = 0 and speculation interleaved prompt by prompt
                for mode in self.order():
                    k, stats = modes[mode]
                    (res,), t = self.decode([ids], k, self.s.max_new_tokens, stats,
                                            self.s.seed + i)
                    j = mode == "spec"
                    secs[mode][-1] += t
                    tokens[mode] += len(res.tokens)
                    pair_secs[i][j] += t
                    pair_tokens[i][j] += len(res.tokens)
                    if j:
                        sequences.append((ids, res.tokens))
                    self.progress(1)
        return DomainRun(secs["plain"], secs["spec"], tokens["plain"], tokens["spec"],
                         modes["spec"][1], modes["plain"][1], sequences,
                         prompt_seconds=[tuple(p) for p in pair_secs],
                         prompt_tokens=[tuple(p) for p in pair_tokens])

    # --- teacher-forced figures on the decoded continuations ----------------------------------

    def teacher_forced(self, sequences, drafts: dict[str, Any],
                       with_draft: bool = True) -> TeacherForced:
        """Target entropy, the draft's (``"draft"``, unless not ``with_draft``) and each extra
        draft's acceptance on the same continuations, and the same per bucket of the target's
        entropy (:mod:`draftkit.evaluate.entropy`).

        Acceptance here is teacher-forced: at each continuation position, greedy decoding
        accepts when the draft's argmax equals the target's; sampling accepts with
        probability sum_x min(p, q) = 1 - TV (Leviathan et al., arXiv 2211.17192, section 3).
        It is not the decode-time alpha (accepted / tested, tested positions only), so compare
        a baseline draft's figure with the draft's ``"draft"`` figure, never with that alpha.

        Sampled with probabilistic drafts, the draft's acceptance under greedy drafting
        (vLLM's default ``draft_sample_method``: the argmax kept with probability p) comes too,
        as ``GREEDY_DRAFTS``: what an engine that drafts so accepts on the same continuations.
        """
        params = SamplingParams(self.s.temperature or 1.0, self.s.top_k, self.s.top_p,
                                self.s.draft_sample_method)
        models = {"draft": self.draft_model, **drafts} if with_draft else dict(drafts)
        # the draft's q read again under greedy drafts: one forward, two rules
        greedy = replace(params, draft_sample_method=GREEDY_DRAFT) if with_draft and \
            self.s.temperature > 0 and not params.greedy_draft else None
        buckets = entropy.EntropyBuckets(list(models) + ([GREEDY_DRAFTS] if greedy else []))
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
                    q_logits = teacher_forced_logits(model, self.target_model, seq)[0, span]
                    q_logits = q_logits.float()  # (T, V)
                    if heads[name] is not None:  # zero outside its reduced head
                        q_logits = heads[name].expand(heads[name].restrict(q_logits))
                    if self.s.temperature == 0:
                        accept[name] = (q_logits.argmax(-1) == p_logits.argmax(-1)).double()
                    else:
                        q = draft_probabilities(q_logits, params)
                        accept[name] = torch.minimum(p, q).sum(-1)
                        if name == "draft" and greedy is not None:
                            q = draft_probabilities(q_logits, greedy)  # one-hot at the argmax
                            accept[GREEDY_DRAFTS] = torch.minimum(p, q).sum(-1)
                buckets.add(-(p * p.clamp_min(1e-12).log()).sum(-1), accept)  # (T,) nats
        count = float(buckets.counts.sum())
        return TeacherForced(
            target_entropy=float(buckets.entropy_sum / count) if count else None,
            acceptance={name: float(buckets.sums[name].sum() / count) if count else None
                        for name in buckets.sums},
            by_entropy=buckets.result() if count else None)

    # --- sweeps -------------------------------------------------------------------------------

    def k_sweep(self, prompts: list[list[int]]) -> list[KMeasurement]:
        """Measured speedup at each K in the sweep list, on a few prompts: each prompt decoded
        plainly and at every K, back to back in an order that rotates from prompt to prompt, so
        each K's speedup pairs with the same plain decodes and has an interval over the
        prompts (:func:`paired_speedup`)."""
        subset, ks = prompts[: self.s.k_sweep_prompts], list(self.s.k_sweep)
        if not subset or not ks:
            return []
        plain_stats = DecodeStats()  # its 1-token step prices c and v at every K
        stats = {k: DecodeStats() for k in ks}
        timed: dict[int, list[tuple[float, int]]] = {k: [] for k in [0, *ks]}  # per prompt
        modes = [0, *ks]
        for i, ids in enumerate(subset):
            self._turn += 1  # drifts in machine speed hit every K alike
            turn = self._turn % len(modes)
            for k in modes[turn:] + modes[:turn]:
                (res,), secs = self.decode([ids], self.choice(k), self.s.k_sweep_tokens,
                                            stats.get(k, plain_stats), self.s.seed + i)
                timed[k].append((secs, len(res.tokens)))
                self.progress(1)
        step = plain_stats.target_step_seconds(1)
        rows = []
        for k in ks:
            speedup, low, high, to_decide = paired_speedup(
                [(p, s, pn, sn) for (p, pn), (s, sn) in zip(timed[0], timed[k])])
            # v grows with K: keep the v (and c) measured at this K for the predictions
            rows.append(KMeasurement(
                k=k, tau=stats[k].tau(), c=stats[k].c(step), v=stats[k].v(k, step),
                speedup_measured=speedup, prompts=len(subset),
                new_tokens=self.s.k_sweep_tokens, speedup_low=low, speedup_high=high,
                prompts_to_decide=to_decide))
        return rows

    def batch_sweep(self, prompts: list[list[int]], k, sizes: list[int]) -> list[BatchRow]:
        """At each batch size in ``sizes``: up to ``--batch-groups`` batches of distinct prompts
        (:func:`batches`), each decoded with K = 0 and with speculation at ``k`` (a number or
        auto, a fresh policy per decode as a server starting at that load), interleaved, after
        the first is warmed up (a new batch size means new kernel shapes and a larger KV
        cache). Tokens/s pool the batches; the speedup's interval resamples them. The rows'
        verdicts are left to the caller (:func:`draftkit.evaluate.analysis.sweep_verdict`)."""
        rows = []
        for bsz in sizes:
            groups = batches(prompts, bsz, self.s.batch_groups)
            self.warm_up(groups[0], k)
            plain_stats, spec_stats = DecodeStats(), DecodeStats()
            pairs = []
            for batch in groups:
                timed = {}
                for mode in self.order():
                    kk, stats = (0, plain_stats) if mode == "plain" else (k, spec_stats)
                    timed[mode] = self.decode(batch, self.choice(kk), self.s.sweep_tokens,
                                              stats, self.s.seed)
                (res_p, t_p), (res_s, t_s) = timed["plain"], timed["spec"]
                pairs.append((t_p, t_s, sum(len(r.tokens) for r in res_p),
                              sum(len(r.tokens) for r in res_s)))
            self.progress(1)
            speedup, low, high, to_decide = paired_speedup(pairs)
            plain_s, spec_s, plain_n, spec_n = (sum(x) for x in zip(*pairs))
            step = plain_stats.target_step_seconds(1)
            used = spec_stats.k_used()  # under auto: the K > 0 it ran most
            drafted = spec_stats.accepted + spec_stats.rejections > 0
            rows.append(BatchRow(
                batch_size=bsz, alpha=spec_stats.alpha() if drafted else None,
                c=spec_stats.c(step), v=spec_stats.v(used, step) if used else None, k=used,
                plain_tokens_per_s=plain_n / plain_s, spec_tokens_per_s=spec_n / spec_s,
                speedup_predicted=spec_stats.predicted_speedup(step) if drafted
                else None, speedup_measured=speedup, speedup_low=low, speedup_high=high,
                prompts_to_decide=to_decide and to_decide * bsz, batches=len(groups),
                draft_per_round=spec_stats.draft_per_round or None))
        return rows


def batches(prompts: list[list[int]], size: int, groups: int) -> list[list[list[int]]]:
    """Up to ``groups`` batches of ``size`` prompts, no prompt in two (consecutive runs of
    ``prompts``, which the eval mixes across domains); with fewer prompts than ``size``, one
    batch that repeats them."""
    if len(prompts) < size:
        return [[prompts[i % len(prompts)] for i in range(size)]]
    return [prompts[g * size:(g + 1) * size] for g in range(min(groups, len(prompts) // size))]


def paired_speedup(pairs: list[tuple[float, float, int, int]]
                   ) -> tuple[float, float | None, float | None, int | None]:
    """(speedup, its 95% interval's low and high, units that would decide) of paired
    measurements, one (plain seconds, speculative seconds, plain tokens, speculative tokens) per
    unit (a prompt, or a batch of them): tokens per second pooled over the units, the interval
    a paired bootstrap over them (:func:`metrics.speedup_interval`), None from fewer than two,
    and where it includes 1.0 about how many units would put it clear
    (:func:`metrics.units_to_decide`)."""
    plain_s, spec_s, plain_n, spec_n = (sum(x) for x in zip(*pairs))
    speedup = (spec_n / max(spec_s, 1e-12)) / max(plain_n / max(plain_s, 1e-12), 1e-12)
    if len(pairs) < 2:
        return speedup, None, None, None
    est, low, high = metrics.speedup_interval(*zip(*pairs))
    return est, low, high, metrics.units_to_decide(len(pairs), est, low, high)
