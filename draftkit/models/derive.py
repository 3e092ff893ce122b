"""Deriving a draft from its target.

Two ways, both keeping the target's vocabulary and tokenizer so the pair is compatible:

- ``layers``: copy a subset of the target's decoder layers (plus embeddings, final norm and
  head). ``0,1,2,29`` keeps the bottom of the network and its last layer, which already maps
  hidden states to the head's space; ``0,1,2,3`` is an early exit.
- reduced shape with random init: ``num_layers`` / ``hidden_size`` / ``intermediate_size``.
  The embeddings and head are copied when the width is kept, random otherwise.

``draftkit derive`` (:mod:`draftkit.models.command`) runs either on a target it loads.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from draftkit.errors import DraftkitError, ModelError
from draftkit.io import atomic_dir
from draftkit.models.args import check_layers
from draftkit.models.save import save_model, save_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def decoder_layers(model: "PreTrainedModel"):
    """The model's ``nn.ModuleList`` of decoder layers and its state-dict prefix."""
    n = model.config.get_text_config().num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n and name:
            return name, module
    raise ModelError(f"cannot find the decoder layers of {type(model).__name__}; "
                     f"use --num-layers (random init) instead of --layers")


def _slice_per_layer(config, layers: list[int]) -> None:
    """Per-layer config lists (e.g. ``layer_types`` for sliding/full attention) follow the copy."""
    n = config.num_hidden_layers
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == n and key != "architectures":
            setattr(config, key, [value[i] for i in layers])


def derive_by_layers(target: "PreTrainedModel", layers: list[int]) -> "PreTrainedModel":
    """A draft made of ``layers`` of ``target`` (in the given order), sharing nothing with it."""
    prefix, module_list = decoder_layers(target)
    check_layers(layers, len(module_list))
    config = copy.deepcopy(target.config)
    _slice_per_layer(config, layers)
    config.num_hidden_layers = len(layers)
    window_from = getattr(config, "max_window_layers", None)  # Qwen2: sliding from this layer on
    if isinstance(window_from, int):
        # transformers reads layer_types (sliced above), some engines still read this count:
        # the kept layers below it stay full attention
        config.max_window_layers = sum(1 for i in layers if i < window_from)
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.(.*)$")
    source = target.state_dict()
    new_state = {}
    for key, tensor in source.items():
        m = pattern.match(key)
        if m is None:
            new_state[key] = tensor.detach().clone()
            continue
        src = int(m.group(1))
        for dst, chosen in enumerate(layers):
            if chosen == src:
                new_state[f"{prefix}.{dst}.{m.group(2)}"] = tensor.detach().clone()
    with torch.device("meta"):
        draft = type(target)(config)
    missing, unexpected = draft.load_state_dict(new_state, strict=False, assign=True)
    missing = [k for k in missing if not _is_tied(draft, k)]
    if missing or unexpected:
        raise ModelError(f"deriving a draft from {type(target).__name__} left weights "
                         f"unmatched ({(missing + unexpected)[:3]}); use --num-layers instead")
    draft.tie_weights()
    # Non-persistent buffers (rotary inv_freq) are not in the state dict: rebuild them.
    _rebuild_buffers(draft, target)
    return draft.eval()


def _is_tied(model, key: str) -> bool:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    keys = tied.keys() if isinstance(tied, dict) else tied
    return any(re.fullmatch(k.replace(".", r"\."), key) or k == key for k in keys) and \
        getattr(model.config, "tie_word_embeddings", False)


def _rebuild_buffers(draft, target) -> None:
    tgt_buffers = dict(target.named_buffers())
    for name, buf in list(draft.named_buffers()):
        if buf.is_meta:
            module_name, _, attr = name.rpartition(".")
            module = draft.get_submodule(module_name) if module_name else draft
            src = tgt_buffers.get(name)
            if src is None:  # a per-layer buffer; any layer's copy has the same values
                src = next(v for k, v in tgt_buffers.items() if k.endswith("." + attr))
            module._buffers[attr] = src.detach().clone()


def derive_random(target: "PreTrainedModel", num_layers: int | None, hidden_size: int | None,
                  intermediate_size: int | None, seed: int = 0) -> "PreTrainedModel":
    """A randomly initialised draft of a reduced shape, with the target's architecture."""
    config = copy.deepcopy(target.config)
    n = num_layers or config.num_hidden_layers
    if n > config.num_hidden_layers:
        _slice_per_layer(config, [i % config.num_hidden_layers for i in range(n)])
    else:
        _slice_per_layer(config, list(range(n)))
    config.num_hidden_layers = n
    same_width = hidden_size in (None, config.hidden_size)
    if hidden_size is not None:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        if hidden_size % head_dim:
            raise DraftkitError(f"--hidden-size {hidden_size} must be a multiple of the "
                                f"head size {head_dim}")
        config.hidden_size = hidden_size
        config.num_attention_heads = hidden_size // head_dim
        kv = getattr(config, "num_key_value_heads", None)
        if kv:
            config.num_key_value_heads = max(1, min(kv, config.num_attention_heads))
            while config.num_attention_heads % config.num_key_value_heads:
                config.num_key_value_heads -= 1
    if intermediate_size is not None:
        config.intermediate_size = intermediate_size
    torch.manual_seed(seed)
    draft = type(target)(config).to(next(target.parameters()).dtype)
    if same_width:
        draft.get_input_embeddings().weight.data.copy_(target.get_input_embeddings().weight.data)
        if not getattr(config, "tie_word_embeddings", False):
            draft.get_output_embeddings().weight.data.copy_(
                target.get_output_embeddings().weight.data)
    return draft.eval()


def save_draft(draft: "PreTrainedModel", tokenizer, out: Path, force: bool = False,
               also: Callable[[Path], None] | None = None) -> Path:
    """Write a plain HF model directory (safetensors + the target's tokenizer files), whole or
    not at all; ``also(folder)`` adds files to it before it is renamed into place."""
    out = Path(out)
    if out.exists() and not force:
        raise DraftkitError(f"{out} already exists; pass --force to replace it or choose "
                            f"another --out")
    with atomic_dir(out, overwrite=force) as tmp:
        save_model(draft, tmp)
        save_tokenizer(tokenizer, tmp)
        if also is not None:
            also(tmp)
    return out
