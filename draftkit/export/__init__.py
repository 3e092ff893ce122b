"""Bundles: a tuned draft with its target reference, measured figures and serving configs.

``check_bundle`` and ``export_bundle`` (:mod:`draftkit.export.bundle`) are read from there on
first use: ``draftkit COMMAND --help`` imports this package's light module of flags (args.py,
with k.py), which runs this file, and must not import torch and transformers with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker reads; at run time, __getattr__ below
    from draftkit.export.bundle import check_bundle, export_bundle

__all__ = ["check_bundle", "export_bundle"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from draftkit.export import bundle  # lazy: the docstring says why

    return getattr(bundle, name)
