"""Learning rate: linear warmup, then cosine decay to ``min_lr_ratio`` of the peak."""

from __future__ import annotations

import math
from functools import partial

import torch


def lr_factor(step: int, warmup: int, total: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    # From the peak (the last warmup step's, or step 0's) down to the floor on the last step:
    # each factor used once, the floor reached.
    peak = warmup - 1 if warmup > 0 else 0
    progress = min(1.0, (step - peak) / max(1, total - 1 - peak))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(optimizer, warmup: int, total: int, min_lr_ratio: float):
    """A LambdaLR over :func:`lr_factor`; its state_dict resumes exactly."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, partial(lr_factor, warmup=warmup, total=total, min_lr_ratio=min_lr_ratio))
