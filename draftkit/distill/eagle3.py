"""EAGLE-3 heads (``draft.kind: eagle3``): a draft kind the trainer trains like a standalone draft.

An EAGLE-3 head (Li et al., arXiv 2503.01840; draftkit/models/eagle3.py) is built on the target:
one decoder layer over the target's hidden states at three layers and its (frozen) embedding,
a head over the N tokens the target emits most in the training data (``draft.draft_vocab_size``,
chosen as for reduced heads: distill/draft.py). As a draft kind (distill/standalone.py says what
one is) it is:

- trained with training-time test (distill/ttt.py): unrolled ``draft.ttt_steps`` times over its
  own outputs, step i's divergence against the target over the draft vocabulary weighted
  ``draft.ttt_decay``^i; the target's features come from a forward each step or from the
  feature cache (distill/features.py), as ``teacher.mode`` says;
- scored by held-out alpha per domain and per unrolled position k = 1..K (K = ttt_steps):
  1 - TV(p, q) at step k - 1, the head reading its own outputs as when it drafts; ``alpha`` is
  alpha_1, what a standalone draft reports;
- kept in ``best/`` by tau = 1 + sum_k prod_(i <= k) alpha_i, the expected tokens per target
  call (draftkit.metrics.tau), in the layout vLLM and SGLang load (models/eagle3.save_eagle3),
  with the evaluation that chose it in best.json.

With ``draft.parallel`` the head is a parallel one (P-EAGLE, arXiv 2602.01469): the same loss,
held-out alpha per position and tau, its K positions computed in one forward over its learned
placeholder (distill/ttt.parallel_pass), so the placeholder trains with the layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftkit.data import Rows, positions
from draftkit.distill.config import DistillConfig
from draftkit.distill.features import (CachedFeatures, FeatureCache, OnlineFeatures,
                                       VllmFeatures, feature_key, target_forward)
from draftkit.distill.losses import dense_logprobs
from draftkit.distill.rollouts import Rollouts, RolloutTeacher
from draftkit.distill.teacher import TeacherOut, build_teacher, cache_dir, caches_of
from draftkit.distill.ttt import step_masks, teacher_rows, ttt_loss, unroll
from draftkit.errors import DraftkitError, ModelError
from draftkit.io import atomic_dir, atomic_write_json
from draftkit.metrics import tau
from draftkit.models.eagle3 import (as_parallel, default_aux_layers, eagle3_config, from_target,
                                    save_eagle3, with_vocabulary)
from draftkit.models.facts import text_config
from draftkit.models.head_check import load_head, record_target
from draftkit.models.load import check_bundle_target, dtype_name
from draftkit.models.reduced_head import ReducedHead
from draftkit.models.resolve import resolve_model


def aux_layers(cfg: DistillConfig, target: Any) -> list[int]:
    """The tapped layers: the recipe's, else the references' for the target's depth."""
    return list(cfg.draft.aux_layers or default_aux_layers(text_config(target).num_hidden_layers))


def check_target(cfg: DistillConfig, target: Any) -> None:
    """An eagle3 recipe against its target (a model or its HF config, as a dry run has it): a
    Llama-family target, N within its vocabulary, the tapped layers within its depth. A head
    to start from (``draft.model``) is checked against the target as it loads."""
    if cfg.draft.model is not None:
        return
    n, v = cfg.draft.draft_vocab_size, text_config(target).vocab_size
    if n > v:
        raise DraftkitError(f"draft.draft_vocab_size={n} is more than the target's {v} tokens; "
                            f"lower it")
    try:
        eagle3_config(target, ReducedHead(range(n), v), cfg.draft.aux_layers)
    except ModelError as e:
        raise DraftkitError(f"draft.kind eagle3: {e}") from None


def warm_start(cfg: DistillConfig, target: Any, target_ref: Any = None) -> Any:
    """The head ``draft.model`` names (a head folder, or a bundle holding one), trained on from
    where it is: its tapped layers stay, as its weights are fitted to them, so the recipe
    leaves them null or names the head's own. Its vocabulary stays too, unless the recipe sets
    ``draft.draft_vocab_size``: then the vocabulary is chosen again on the training rows and
    the tokens it keeps keep their rows (:func:`draftkit.models.eagle3.with_vocabulary`). It is
    checked as every command
    checks a head (:mod:`draftkit.models.head_check`), and against ``target_ref``, the target
    it records."""
    ref = resolve_model(cfg.draft.model, "draft")
    try:
        head = load_head(ref.path, target, cfg.draft.model)  # first: is it a head at all
        if target_ref is not None:
            check_bundle_target(target_ref, ref)
    except ModelError as e:
        raise DraftkitError(f"draft.model: {e}") from None
    except FileNotFoundError:
        raise DraftkitError(f"draft.model {cfg.draft.model} holds no EAGLE-3 head "
                            f"(config.json and weights); give a head folder or a bundle") from None
    if cfg.draft.aux_layers not in (None, head.aux_layers):
        raise DraftkitError(f"draft.aux_layers {cfg.draft.aux_layers} differ from the layers "
                            f"{head.aux_layers} the head in draft.model reads; set "
                            f"draft.aux_layers=null")
    if cfg.draft.num_layers not in (None, head.config.num_hidden_layers):
        raise DraftkitError(f"draft.num_layers {cfg.draft.num_layers} differs from the "
                            f"{head.config.num_hidden_layers} layers of the head in draft.model; "
                            f"set draft.num_layers=null")
    if head.parallel and not cfg.draft.parallel:  # its layer is fitted to the placeholder
        raise DraftkitError(f"draft.model {cfg.draft.model} is a parallel head: set "
                            f"draft.parallel: true")
    return as_parallel(head, cfg.seed) if cfg.draft.parallel else head


class Unrolled(torch.nn.Module):
    """The head under training-time test, as one module for DDP and DeepSpeed to wrap:
    aux (B, T, 3 Ht), input_ids, position_ids (B, T) and each step's positions (B, T) bool ->
    each step's logits there, (N_i, N)."""

    def __init__(self, draft: Any):
        super().__init__()
        self.draft = draft

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                masks: list[torch.Tensor]) -> list[torch.Tensor]:
        hs = unroll(self.draft, aux, input_ids, position_ids, len(masks))
        return [self.draft.logits(h[m]) for h, m in zip(hs, masks)]


class Eagle3:
    """An EAGLE-3 head on the target, as a draft kind (module docstring)."""

    score = "tau"  # what picks best/: expected tokens per target call over K positions
    kept_head = None  # the head's own vocabulary, on a warm start; else it is chosen
    online = None  # a standalone draft's on-policy teacher; a head's is its rollouts'
    rollouts: Rollouts | None = None  # on-policy steps (data.lmbda): the head drafting

    def __init__(self, cfg: DistillConfig, target: Any, tokenizer: Any, target_ref: Any,
                 device: str):
        check_target(cfg, target)
        self.cfg, self.device, self.target, self.target_ref = cfg, device, target, target_ref
        self.init = None if cfg.draft.model is None else warm_start(cfg, target, target_ref)
        if self.init is not None:
            self.kept_head = self.init.reduced_head
        self.layers = self.init.aux_layers if self.init is not None else aux_layers(cfg, target)
        self.steps, self.decay = cfg.draft.steps, cfg.draft.decay

    @property
    def identity(self) -> dict:
        """What a checkpoint records, so that a resume on other layers or another draft
        vocabulary (whose weights would load all the same) is refused."""
        out = {"kind": "eagle3", "aux_layers": self.layers,
               "draft_vocab_size": len(self.kept_head) if self.init is not None and
               self.cfg.draft.draft_vocab_size is None else self.cfg.draft.draft_vocab_size}
        depth = self.init.config.num_hidden_layers if self.init is not None else \
            self.cfg.draft.num_layers or 1
        out = {**out, "num_layers": depth} if depth > 1 else out  # older checkpoints: one
        return {**out, "parallel": True} if self.cfg.draft.parallel else out

    def start(self, target: Any, key: str, rows: Rows, reduced_head: ReducedHead | None,
              dist: Any, progress: bool, autocast: Any) -> None:
        """The head over the chosen draft vocabulary, its features and teacher, the student."""
        cfg, self.autocast = self.cfg, autocast
        # its context is the target's (models/eagle3.eagle3_config), which the rows fit
        if self.init is None:
            self.draft = from_target(target, reduced_head, self.layers, cfg.seed,
                                     parallel=cfg.draft.parallel,
                                     num_layers=cfg.draft.num_layers or 1)
        elif not torch.equal(reduced_head.ids.sort().values.cpu(),  # draft_vocab_size chose
                             self.init.reduced_head.ids.cpu()):  # again
            self.draft = with_vocabulary(self.init, reduced_head, target)
        else:
            self.draft = self.init
        self.draft = self.draft.float()
        self.draft.to(self.device)
        self.head = self.draft.reduced_head  # (its ids sorted, as draft ids are)
        self.head.covered, self.head.source = reduced_head.covered, reduced_head.source
        self.teacher = self.make_teacher(cfg, target, key, rows, dist, progress)
        self.student = Unrolled(self.draft)
        if cfg.data.lmbda > 0:
            self.rollouts = Rollouts(target, self.layers, cfg.loss.temperature, self.steps,
                                     cfg.draft.rejections)

    @property
    def caches(self) -> list:
        return caches_of(self.teacher)

    @staticmethod
    def make_teacher(cfg: DistillConfig, target: Any, key: str, rows: Rows, dist: Any,
                     progress: bool) -> Any:
        """The target's features and distribution for ``rows``: online, or the feature cache
        beside the top-k teacher cache (none for the ce control), built by rank 0 if they are
        not on disk yet (``--prepare`` builds them)."""
        check_target(cfg, target)  # --prepare has not checked it yet
        layers = aux_layers(cfg, target)
        if cfg.teacher.mode == "online":
            return OnlineFeatures(target, layers, cfg.loss.temperature)
        topk = None if cfg.loss.divergence == "ce" else \
            build_teacher(cfg, target, key, rows, dist, progress)
        fkey = feature_key(key, layers, rows, cfg.teacher.features)
        directory = cache_dir(cfg, fkey, "features")
        engine = None
        if cfg.teacher.features == "vllm":  # the states as vLLM computes them, its own process
            engine = VllmFeatures(resolve_model(cfg.target, "target").path,
                                  dtype_name(target), layers,
                                  directory.with_name(directory.name + ".engine"),
                                  cfg.data.generate.tensor_parallel_size)
        cache = FeatureCache(directory, rows, layers, text_config(target).hidden_size, key,
                             engine)
        try:
            ready = cache.ready(target, rows, cfg.eval.batch_size, dist, progress)
        except BaseException:
            if engine is not None:
                engine.close()  # its log stays, which the error names
            raise
        if engine is not None:
            engine.close(remove=True)
        return CachedFeatures(topk, ready)

    def loss(self, student: Any, teacher: Any, rows: Rows, idx: torch.Tensor
             ) -> tuple[torch.Tensor, int]:
        """The training-time-test loss of rows ``idx`` (distill/ttt.py); (loss, trained
        positions)."""
        dev = self.device
        ids, mask, pos = rows.input_ids[idx].to(dev), rows.loss_mask[idx].to(dev), \
            positions(rows, idx).to(dev)  # (B, T) each
        target, aux = teacher(idx, ids, mask, pos)  # TeacherOut at mask's n positions, (B, T, 3Ht)
        masks = step_masks(mask, pos, self.steps)
        with self.autocast():
            step_logits = student(aux.to(dev), ids, pos, masks)  # (N_i, N) each
        n, loss = int(mask.sum()), self.cfg.loss
        # an on-policy step's: the drafts rejected while decoding weigh more (rollouts.py)
        weights = teacher.step_weights(idx, masks) if isinstance(teacher, RolloutTeacher) \
            else None
        if loss.divergence == "ce":  # the control: the data's next tokens, no teacher
            return ttt_loss(step_logits, teacher_rows(mask, masks), self.head, loss, self.decay,
                            n, labels=ids.roll(-1, dims=1)[mask], weights=weights), n
        target = TeacherOut(target.logp.to(dev), None if target.ids is None
                            else target.ids.to(dev), None)
        return ttt_loss(step_logits, teacher_rows(mask, masks), self.head, loss, self.decay, n,
                        target, weights=weights), n

    @torch.no_grad()
    def evaluate(self, heldout: Rows) -> dict:
        """Held-out alpha per domain per unrolled position, and tau (module docstring)."""
        e, k, dev = self.cfg.eval, self.steps, self.device
        sums = torch.zeros(len(heldout.domains), k, dtype=torch.float64)
        counts = torch.zeros_like(sums)
        for start in range(0, len(heldout), e.batch_size):
            sel = slice(start, start + e.batch_size)
            mask = heldout.loss_mask[sel]
            width = int(mask.nonzero()[:, 1].max()) + 2 if mask.any() else 1  # no trailing pads
            ids, mask = heldout.input_ids[sel, :width].to(dev), mask[:, :width].to(dev)
            pos = positions(heldout, sel)[:, :width].to(dev)
            # the target's distribution only where a step is scored: (n, V), not (B, T, V)
            logits, aux = target_forward(self.target, self.layers, ids, pos, mask)
            p_logp = dense_logprobs(logits, e.temperature)
            with self.autocast():
                hs = unroll(self.draft, aux, ids, pos, k)
            masks = step_masks(mask, pos, k)
            for i, (h, m, r) in enumerate(zip(hs, masks, teacher_rows(mask, masks))):
                b, t = m.nonzero(as_tuple=True)
                with self.autocast():
                    q_logits = self.draft.logits(h[b, t])  # (N_i, N)
                q = dense_logprobs(self.head.expand(q_logits.float()), e.temperature)
                p = p_logp[r]  # (N_i, V): the target at t + 1 + i, where step i is scored
                # sum_x min(p, q) = 1 - TV(p, q), never below 0 by rounding
                accept = torch.minimum(p.exp(), q.exp()).sum(-1).double().cpu()
                dom = heldout.domain_ids[sel][b.cpu()]
                sums[:, i].index_add_(0, dom, accept)
                counts[:, i].index_add_(0, dom, torch.ones_like(accept))
        return step_figures(sums, counts, heldout.domains)

    def export(self, path: Path, row: dict) -> None:
        """``path`` as models/eagle3.save_eagle3 writes a head, with the evaluation that chose
        it (best.json) and the target it reads (target.json: models/head_check), in one
        rename."""
        with atomic_dir(path, overwrite=True) as tmp:
            save_eagle3(self.draft, tmp)
            if self.target_ref is not None:
                record_target(tmp, self.target_ref)
            atomic_write_json(tmp / "best.json", row)

    @staticmethod
    def describe(metrics: dict) -> str:
        k = sum(1 for key in metrics if key.startswith("alpha_") and "/" not in key)
        alphas = ", ".join(f"{metrics[f'alpha_{i}']:.3f}" for i in range(1, k + 1))
        domains = ", ".join(f"{key.split('/', 1)[1]} {v:.3f}" for key, v in metrics.items()
                            if key.startswith("tau/"))
        return f"{metrics['tau']:.3f} (alpha per position {alphas}; tau {domains})"


def step_figures(sums: torch.Tensor, counts: torch.Tensor, domains: list[str]) -> dict:
    """The held-out figures from acceptance summed per domain and step, (D, K) each:
    ``alpha/<domain>`` and ``alpha`` (position 1, as every draft reports them), ``alpha_k`` and
    ``alpha_k/<domain>`` for k = 1..K, ``tau/<domain>`` and ``tau`` over K positions.
    Positions no held-out draft reaches (answers shorter than K) are left out; tau counts them
    at the last measured alpha (draftkit.metrics.tau)."""
    k = sums.shape[1]
    # per domain with held-out drafts, and None: all domains together
    rows: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {
        d: (sums[i], counts[i]) for i, d in enumerate(domains) if counts[i, 0] > 0}
    rows[None] = (sums.sum(0), counts.sum(0))

    def key(name: str, d: str | None) -> str:
        return name if d is None else f"{name}/{d}"

    out: dict[str, float] = {}
    for d, (s, c) in rows.items():
        out[key("alpha", d)] = float(s[0] / c[0]) if c[0] > 0 else 0.0
    for i in range(k):
        out.update({key(f"alpha_{i + 1}", d): float(s[i] / c[i])
                    for d, (s, c) in rows.items() if c[i] > 0})
    for d, (s, c) in rows.items():
        measured = [float(s[i] / c[i]) for i in range(k) if c[i] > 0]
        out[key("tau", d)] = tau(measured, k) if measured else 1.0
    return out
