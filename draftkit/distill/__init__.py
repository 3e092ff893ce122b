"""Distillation: train a draft against the target's distribution.

The pipeline, one module each: ``config`` (the recipe) -> ``draftkit.data`` (rows, packing,
masks) -> ``draft`` (the model trained, its frozen parts and reduced vocabulary) -> ``teacher``
(online or top-k cache) -> ``losses`` (divergences) -> ``trainer`` (the loop, with
``schedule``, ``checkpoint`` and ``evaluate``) -> ``out_dir/best`` (``draft.export_draft``).
"""
