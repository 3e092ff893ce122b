"""Distillation: train a draft against the target's distribution.

The pipeline, one module each: ``config`` (the recipe) -> ``draftkit.data`` (rows, packing,
masks) -> ``draft`` (the model trained, its frozen parts and reduced vocabulary) -> ``teacher``
(online or top-k cache) -> ``losses`` (divergences) -> ``trainer`` (the loop, with
``schedule``, ``checkpoint`` and ``evaluate``) -> ``out_dir/best`` (``draft.export_draft``).

The draft kind (``draft.kind``) decides a step's loss, the held-out figures and what ``best/``
holds: ``standalone`` (a draft model of its own) or ``eagle3`` (an EAGLE-3 head on the target,
with ``ttt``, its training-time test, and ``features``, the target's hidden states it reads).
"""
