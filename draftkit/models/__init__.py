"""Finding, loading, pairing and deriving models.

The names below are read from their modules on first use: ``draftkit COMMAND --help`` imports
this package's light module of flags (args.py), which runs this file, and must not import
torch, transformers and model-signing with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker reads; at run time, __getattr__ below
    from draftkit.models.compat import check_compatible
    from draftkit.models.load import (ModelPair, default_device, dtype_name, load_another_draft,
                                      load_model, load_pair, load_tokenizer, parse_dtype)
    from draftkit.models.resolve import ResolvedModel, resolve_model

__all__ = ["ModelPair", "ResolvedModel", "load_pair", "check_compatible", "default_device",
           "dtype_name", "load_another_draft", "load_model", "load_tokenizer", "parse_dtype",
           "resolve_model"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from draftkit.models import compat, load, resolve  # lazy: the docstring says why

    return next(getattr(m, name) for m in (compat, load, resolve) if hasattr(m, name))
