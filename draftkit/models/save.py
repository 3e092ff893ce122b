"""Writing a model folder that every engine reads: transformers 5 and the 4.x that some vLLM and
SGLang releases still pin.

Used wherever draftkit writes a model: the embedded target's converted copy, derived drafts,
distilled drafts and bundles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def save_tokenizer(tokenizer: "PreTrainedTokenizerBase", folder: str | Path) -> None:
    """``tokenizer.save_pretrained(folder)``, readable by transformers 4.x as well.

    transformers 5 records a tokenizer.json-backed tokenizer as class 'TokenizersBackend',
    which 4.x (still pinned by some vLLM and SGLang releases) cannot import; its 4.x name,
    PreTrainedTokenizerFast, loads the same tokenizer under both.
    """
    tokenizer.save_pretrained(folder)
    path = Path(folder) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def save_model(model: "PreTrainedModel", folder: str | Path) -> None:
    """``model.save_pretrained(folder)`` as safetensors, its config readable by transformers 4.x
    as well.

    transformers 5 keeps the RoPE base and scaling only in ``rope_parameters``. 4.x (still pinned
    by some vLLM and SGLang releases) reads ``rope_theta`` and ``rope_scaling`` instead and,
    finding neither, runs at its default base of 10000: the model loads and serves, with every
    attention score wrong. So the 4.x keys are written beside the new ones, for the model and
    any nested ``text_config``.
    """
    model.save_pretrained(folder, safe_serialization=True)
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    before = json.dumps(config, sort_keys=True)
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            add_legacy_keys(section)
    if json.dumps(config, sort_keys=True) != before:
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def add_legacy_keys(config: dict[str, Any]) -> None:
    """transformers 4.x's names for what 5 records as ``rope_parameters`` and ``dtype``:
    ``rope_theta``, ``rope_scaling`` and ``partial_rotary_factor`` (Phi, GPT-NeoX) at the top
    level, and for Gemma 3, whose parameters are per layer type, the full-attention layers'
    as those and the sliding ones' base as ``rope_local_base_freq``."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        local = rope.get("sliding_attention") or {}
        if "rope_theta" in local and config.get("rope_local_base_freq") is None:
            config["rope_local_base_freq"] = local["rope_theta"]
        rope = rope["full_attention"]
    if isinstance(rope, dict) and "rope_theta" in rope:
        if config.get("rope_theta") is None:
            config["rope_theta"] = rope["rope_theta"]
        if rope.get("partial_rotary_factor") is not None and \
                config.get("partial_rotary_factor") is None:
            config["partial_rotary_factor"] = rope["partial_rotary_factor"]
        if config.get("rope_scaling") is None:
            scaling = {k: v for k, v in rope.items()
                       if k not in ("rope_theta", "partial_rotary_factor")}
            config["rope_scaling"] = scaling if scaling.get("rope_type", "default") != \
                "default" else None
    if "dtype" in config and "torch_dtype" not in config:
        config["torch_dtype"] = config["dtype"]
