"""Finding, loading, pairing and deriving models."""

from draftkit.models.compat import check_compatible
from draftkit.models.load import (ModelPair, default_device, dtype_name, load_another_draft,
                                  load_model, load_pair, load_tokenizer, parse_dtype)
from draftkit.models.resolve import ResolvedModel, resolve_model

__all__ = ["ModelPair", "ResolvedModel", "load_pair", "check_compatible", "default_device",
           "dtype_name", "load_another_draft", "load_model", "load_tokenizer", "parse_dtype", "resolve_model"]
