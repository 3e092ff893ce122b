"""Matching the draft's hidden states to the target's where the draft skips layers.

A draft derived from target layers ``0, 1, 2, 29`` feeds its copy of layer 29 the stream that
layer 2 leaves, while in the target layer 29 reads the stream 26 more layers built. The
logits tell the draft's first layers what that input should be only through layer 29 and the
head; ``loss.hidden_weight`` says it directly, position by position: the stream entering the
draft's copy of layer ``l`` should be the one entering the target's layer ``l``
(:func:`~draftkit.distill.config.junctions` lists where that holds).

Both streams are compared after the target's own input norm of layer ``l``, as the layer reads
them: the raw stream of a deep layer is dominated by a few huge, nearly constant activations
(more than half the mean square in one channel of SmolLM2-135M's layer 29) that a regression
on it would chase instead of what the layer uses. The norm is a frozen copy, so the draft
cannot lower the term by rescaling its own.

Fitting a student's hidden states to the teacher's is TinyBERT's (Jiao et al. 2020, arXiv
1909.10351); EAGLE (Li et al. 2024, arXiv 2401.15077) regresses the target's features to
train its draft.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from draftkit.distill.config import junctions
from draftkit.errors import DraftkitError

# (index into hidden_states, the norm the layer there reads its input with)
Tap = tuple[int, torch.nn.Module]


def input_norm(model: Any, layer: int) -> torch.nn.Module:
    """A frozen copy of the norm decoder layer ``layer`` of ``model`` applies to its input."""
    block = model.get_decoder().layers[layer]
    norm = getattr(block, "input_layernorm", None)
    if norm is None:
        raise DraftkitError(f"loss.hidden_weight: layer {layer} of the target "
                            f"({type(block).__name__}) has no input_layernorm to compare the "
                            f"streams after; set loss.hidden_weight=0")
    return copy.deepcopy(norm).float().requires_grad_(False)


def taps(target: Any, derive_layers: list[int]) -> tuple[list[Tap], list[Tap]]:
    """(draft taps, target taps) at the :func:`junctions`, each with the target's frozen norm;
    ``DistillConfig.validate`` has checked there is one."""
    pairs = junctions(derive_layers)
    norms = [input_norm(target, layer) for _, layer in pairs]
    return [(j, n) for (j, _), n in zip(pairs, norms)], \
        [(layer, n) for (_, layer), n in zip(pairs, norms)]


def tapped(hidden_states: tuple[torch.Tensor, ...], mask: torch.Tensor,
           taps_: list[Tap]) -> torch.Tensor | None:
    """The normed streams at ``taps_`` and the masked positions: (N, P, H), or None for none.

    hidden_states: transformers' ``output_hidden_states``, entry ``j`` the input of layer
    ``j``, each (B, T, H); mask: (B, T).
    """
    if not taps_:
        return None
    return torch.stack([norm(hidden_states[j][mask].float()) for j, norm in taps_], dim=1)
