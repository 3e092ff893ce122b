"""Standalone drafts (``draft.kind: standalone``, the default): a draft model of its own.

A draft kind is what the trainer asks of the draft it trains, so that one loop trains every
kind (the other is draftkit/distill/eagle3.py's EAGLE-3 head)::

    kind = Standalone(cfg, target, tokenizer, target_ref, device)  # before the rows: cheap checks
    kind.start(target, key, rows, reduced_head, dist, progress, autocast)  # teacher, student
    loss, n = kind.loss(student, teacher, rows, idx)   # student: kind.student, maybe DDP-wrapped
    metrics = kind.evaluate(heldout)                   # held-out figures; metrics[kind.score]
    kind.export(out / "best", row)                     # picks best/

with ``kind.draft`` (whose trainable weights are optimised and checkpointed), ``kind.teacher``
(what scores the rows), ``kind.caches`` (its files on disk), ``kind.identity`` (what a
checkpoint records so that another kind's cannot resume) and ``kind.describe(metrics)``.

A standalone draft is trained on the target's distribution at each trained position
(:func:`micro_loss`), scored by held-out alpha per domain (distill/evaluate.py) and saved as a
plain HF model folder (distill/draft.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftkit.data import Rows, positions
from draftkit.distill.config import DistillConfig
from draftkit.distill.draft import build_draft, check_context, export_draft
from draftkit.distill.evaluate import heldout_alpha, model_logits
from draftkit.distill.hidden import taps
from draftkit.distill.losses import hidden_distance, next_token_ce, teacher_divergence
from draftkit.distill.reduced_head import restrict_labels, restrict_teacher
from draftkit.distill.teacher import MaskedLM, OnlineTeacher, build_teacher, caches_of
from draftkit.errors import DraftkitError
from draftkit.models.reduced_head import ReducedHead, head_of


class Standalone:
    """A draft model trained against the target (module docstring)."""

    score = "alpha"  # what picks best/: held-out acceptance of the draft's token
    identity = None  # what a checkpoint records of the kind: nothing (checkpoints as before)
    rollouts = None  # on-policy rows are the draft's own answers (distill/onpolicy.py)

    def __init__(self, cfg: DistillConfig, target: Any, tokenizer: Any, target_ref: Any,
                 device: str):
        self.cfg, self.tokenizer, self.device = cfg, tokenizer, device
        self.draft = build_draft(cfg, target, tokenizer, target_ref).to(device)
        check_context(self.draft.config, cfg.data.seq_len, "draft")
        self.kept_head = head_of(self.draft)  # a draft.model folder that has one

    def start(self, target: Any, key: str, rows: Rows, reduced_head: ReducedHead | None,
              dist: Any, progress: bool, autocast: Any) -> None:
        """The teacher of ``rows`` and the student, once the draft vocabulary is chosen."""
        cfg = self.cfg
        self.reduced_head, self.autocast = reduced_head, autocast
        draft_taps, target_taps = hidden_taps(cfg, target)
        self.teacher = build_teacher(cfg, target, key, rows, dist, progress, target_taps)
        self.online = OnlineTeacher(target, cfg.loss.temperature,  # on-policy rows need it
                                    target_taps)
        self.head = None  # the reduced head the draft trains over, if it does
        if cfg.draft.train_reduced_head:
            if reduced_head is None:
                raise DraftkitError(f"draft.train_reduced_head trains over a reduced head and "
                                    f"{cfg.draft.model} has none (no draft_vocab.json): set "
                                    f"draft.draft_vocab_size, or draft.train_reduced_head=false")
            self.head = reduced_head.to(self.device)
        self.student = MaskedLM(self.draft, draft_taps, self.head)
        self.draft_logits = model_logits(  # for evaluation: with the head it will decode with
            self.draft, self.device, autocast, reduced_head)
        self.target_logits = model_logits(target, self.device)

    @property
    def caches(self) -> list:
        return caches_of(self.teacher)

    def loss(self, student: Any, teacher: Any, rows: Rows, idx: torch.Tensor
             ) -> tuple[torch.Tensor, int]:
        return micro_loss(student, teacher, rows, idx, self.cfg, self.autocast, self.head)

    def evaluate(self, heldout: Rows) -> dict:
        e = self.cfg.eval
        return heldout_alpha(self.draft_logits, self.target_logits, heldout, e.batch_size,
                             e.temperature)

    def export(self, path: Path, row: dict) -> None:
        export_draft(self.draft, self.tokenizer, path, self.reduced_head, row)

    @staticmethod
    def describe(metrics: dict) -> str:
        parts = [f"{k.split('/', 1)[1]} {v:.3f}" for k, v in metrics.items()
                 if k.startswith("alpha/")]
        return f"{metrics['alpha']:.3f} ({', '.join(parts)})"

    @staticmethod
    def make_teacher(cfg: DistillConfig, target: Any, key: str, rows: Rows, dist: Any,
                     progress: bool) -> Any:
        """The teacher a run of ``cfg`` reads (``--prepare`` builds its cache)."""
        return build_teacher(cfg, target, key, rows, dist, progress, hidden_taps(cfg, target)[1])


def micro_loss(student: Any, teacher: Any, rows: Rows, idx: torch.Tensor, cfg: DistillConfig,
               autocast: Any, head: ReducedHead | None = None) -> tuple[torch.Tensor, int]:
    """Divergence over the response positions of rows ``idx``, plus ``loss.hidden_weight``
    times the hidden-state term where the student has taps; (loss, positions).

    ``head``: the student's logits are over this reduced head (draft.train_reduced_head), so
    the target, or the control's labels, are restricted to it (distill/reduced_head.py)."""
    ids = rows.input_ids[idx]  # (B, T)
    mask = rows.loss_mask[idx]  # (B, T)
    device = next(student.parameters()).device
    ids, mask, pos = ids.to(device), mask.to(device), positions(rows, idx).to(device)
    if cfg.loss.divergence == "ce":  # the control: the same tokens, no teacher distribution
        with autocast():
            logits, _ = student(ids, mask, pos)  # (N, V) or (N, |H|)
        labels = ids.roll(-1, dims=1)[mask]  # (N,) the next token at each trained position
        if head is not None:
            labels, inside = restrict_labels(labels, head)
            logits, labels = logits[inside], labels[inside]
        return next_token_ce(logits, labels), int(mask.sum())
    target = teacher(idx, ids, mask, pos)  # logp (N, V) or (N, k) + ids (N, k)
    with autocast():
        logits, hidden = student(ids, mask, pos)  # (N, V) or (N, |H|), (N, P, H) or None
    p_logp, p_ids = restrict_teacher(target.logp.to(device), None if target.ids is None
                                     else target.ids.to(device), head)
    per_token = teacher_divergence(cfg.loss.divergence, logits, p_logp, p_ids,
                                   cfg.loss.temperature, cfg.loss.beta)  # (N,)
    if not per_token.numel():
        return logits.sum() * 0.0, 0
    loss = per_token.mean()
    if hidden is not None:
        loss = loss + cfg.loss.hidden_weight * hidden_distance(
            hidden, target.hidden.to(device)).mean()
    return loss, int(mask.sum())


def hidden_taps(cfg: DistillConfig, target: Any) -> tuple[list, list]:
    """(draft taps, target taps) for ``loss.hidden_weight``; none when it is 0
    (draftkit/distill/hidden.py)."""
    if cfg.loss.hidden_weight <= 0:
        return [], []
    return taps(target, cfg.draft.derive_layers)
