"""EAGLE-3 heads on disk: the names draftkit writes, and the layouts other trainers publish
read as draftkit's own.

Besides the layout draftkit writes (:mod:`draftkit.models.eagle3`), three are in use, and
:func:`head_config` and :func:`head_state` read each into the config and tensors of an
:class:`~draftkit.models.eagle3.Eagle3Draft`, so a published head decodes, evaluates, exports
and warm-starts training (``draft.model``) like one draftkit trained:

- ``LlamaForCausalLMEagle3``, the layout SGLang and vLLM load, is also SpecForge's
  (sgl-project/SpecForge: ``scripts/train_eagle3.py`` saved it with ``save_pretrained``, as
  ``specforge export --to sglang`` does since its 2026 refactor): the tensors under
  draftkit's names in ``model.safetensors``, with ``d2t`` and ``t2d`` even over the whole
  vocabulary, where they are the identity; ``specforge export --to hf`` adds the target's
  ``embed_tokens.weight``.
  SpecForge records the tapped layers, when it records them, only as
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, the layer each hidden state leaves.
- vLLM's speculators format (vllm-project/speculators ``Eagle3DraftModel``; vLLM serves it from
  its config.json, ``transformers_utils/configs/speculators/``, as 0.10.2 already did):
  ``config.json`` has ``speculators_model_type: eagle3``, the layer's Llama config under
  ``transformer_layer_config`` (its ``vocab_size`` the target's), ``draft_vocab_size``,
  ``target_hidden_size``, ``norm_before_residual`` and ``eagle_aux_hidden_state_layer_ids``
  (the layer each hidden state enters, as vLLM reads it; null in a head converted from
  another format) beside ``speculators_config`` (verifier, proposals); ``model.safetensors``
  names the layer ``layers.0.*`` and ships the target's ``embed_tokens.weight``, and has
  ``d2t`` and ``t2d`` only where the vocabulary is reduced.
- the EAGLE repository's (SafeAILab/EAGLE ``eagle/traineagle3``, heads such as
  ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``): a Llama ``config.json`` (``architectures``
  ``LlamaForCausalLM``) with ``draft_vocab_size``; the weights under draftkit's names in
  ``pytorch_model.bin`` (DeepSpeed's ``save_16bit_model`` in its training script; read here
  with ``weights_only``) or ``model.safetensors``, which its loader reads in that order
  (``eagle/model/ea_model.py``); head_dim is hidden_size / heads whatever the config says (its
  attention computes it so, ``eagle/model/cnets.py``), and no tapped layers are recorded: its
  target code taps the layers entering [2, L // 2, L - 3] (``modeling_llama_kv.py``).

Any embedding a head ships is the target's copy: its shape is checked and it is dropped (the
head reads the target's, frozen). Where a layout records no tapped layers, the head reads
:func:`default_aux_layers`, the same as the EAGLE code, SpecForge and
speculators default to, and a warning says so. A variant draftkit's head does not compute
(speculators' ``norm_before_residual`` or ``norm_output``, ``fc_norm``, biases, more than one
layer outside the engines' layout) is refused, as is a folder in none of these layouts.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from draftkit.errors import ModelError
from draftkit.io import read_json
from draftkit.models.facts import text_config

# the names draftkit writes (draftkit.models.eagle3's module docstring), which the engines read
ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
VOCAB_MAPS = ("d2t", "t2d")
LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
ENGINES, SPECULATORS, EAGLE = ARCHITECTURE, "speculators", "EAGLE"
BIN_WEIGHTS = "pytorch_model.bin"
EMBEDDING = "embed_tokens.weight"
EXPECTED = (f"architectures [{ARCHITECTURE!r}] (draftkit, SGLang, SpecForge), "
            f"speculators_model_type 'eagle3' (vLLM speculators) or draft_vocab_size (the EAGLE "
            f"repository)")
# config keys of variants draftkit's head does not compute, refused where truthy
_VARIANTS = ("norm_before_residual", "norm_before_fc", "fc_norm", "use_aux_norm",
             "attention_bias", "mlp_bias")
_VARIANT = "a variant plain EAGLE-3 lacks, which draftkit's head does not compute"
# what a published config carries that is not the head's Llama config
_NOT_LLAMA = _VARIANTS + ("norm_output", "bias", "auto_map", "speculators_model_type",
                          "speculators_version", "speculators_config", "transformer_layer_config",
                          "embed_requires_grad", "has_no_defaults_at_init", "eagle_config",
                          LAYER_IDS)


def writes_vocab_maps(config: Any) -> bool:
    """Whether a head of ``config`` (an HF config or config.json dict) carries d2t and t2d: only
    where its vocabulary is a part of the target's. A head over the whole vocabulary has none,
    as vLLM reads it: vLLM 0.32 refuses to load one that has them ("no module or parameter
    named 'draft_id_to_target_id'"), and its ids are the target's as they are."""
    get = _getter(config)
    return get("draft_vocab_size") not in (None, get("vocab_size"))


def unread_norms(config: Any) -> list[str]:
    """The ``hidden_norm`` of each deeper layer: vLLM builds one into every layer and refuses
    a checkpoint without it, though only the first layer reads it; written as ones."""
    depth = _getter(config)("num_hidden_layers") or 1
    return [f"layers.{i}.hidden_norm.weight" for i in range(1, depth)]


def _getter(config: Any):
    """key -> value of an HF config or a config.json dict."""
    return config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)


def default_aux_layers(num_layers: int) -> list[int]:
    """The tapped layers as the reference implementations pick them, in the "enters layer i"
    convention: [2, L // 2, L - 3], i.e. the outputs of layers 1, L // 2 - 1 and L - 4 (for
    targets too shallow for three distinct ones there, [1, L // 2, L - 1])."""
    if num_layers < 3:
        raise ModelError(f"an EAGLE-3 head taps three distinct layers; a target of "
                         f"{num_layers} layers has too few")
    ids = [2, num_layers // 2, num_layers - 3]
    return ids if len(set(ids)) == 3 and ids == sorted(ids) else \
        [1, num_layers // 2, num_layers - 1]


def layout(config: dict) -> str | None:
    """The layout a head folder's config.json (a dict) is in: :data:`ENGINES` (draftkit's,
    SGLang's, SpecForge's), :data:`SPECULATORS`, :data:`EAGLE`, or None for no EAGLE-3 head."""
    if ARCHITECTURE in (config.get("architectures") or []):
        return ENGINES  # draftkit's own exports carry speculators' keys too
    if "speculators_model_type" in config:
        return SPECULATORS if config["speculators_model_type"] == "eagle3" else None
    return EAGLE if "draft_vocab_size" in config else None


def head_config(folder: str | Path, target: Any) -> dict:
    """The config of the head in ``folder``, in any layout, as draftkit writes it for
    ``target`` (a model or its config): every field of its Llama config, its layers, the draft
    vocabulary's size and the tapped layers in both engines' conventions (vLLM's
    ``eagle_aux_hidden_state_layer_ids``, the layer entered; SGLang's ``eagle_config``, the
    layer left)."""
    folder = Path(folder)
    where = folder / "config.json"
    data = read_json(where, "EAGLE-3 head config", "give a head folder", ModelError)
    kind = layout(data)
    if kind is None:
        raise ModelError(f"{folder} is not an EAGLE-3 head in a layout draftkit reads: its "
                         f"config.json has none of {EXPECTED}")
    config = {ENGINES: _engines, SPECULATORS: _speculators, EAGLE: _eagle}[kind](data, where)
    layers = config.pop(LAYER_IDS)
    if layers is None:
        layers = default_aux_layers(text_config(target).num_hidden_layers)
        warnings.warn(f"{folder}: the head ({kind} layout) records no tapped layers; it reads "
                      f"the hidden states entering target layers {layers}, the default of the "
                      f"EAGLE code, SpecForge and speculators", stacklevel=3)
    llama = LlamaConfig(**{k: v for k, v in config.items() if k not in _NOT_LLAMA})
    llama.architectures = [ARCHITECTURE]
    # a deeper head in the engines' layout is read as vLLM reads it (models/eagle3_layer.py);
    # the other layouts' heads have one layer (speculators' more are refused above)
    depth = config.get("num_hidden_layers", 1) if kind == ENGINES else 1
    llama.num_hidden_layers, llama.tie_word_embeddings = depth, False
    llama.draft_vocab_size = config.get("draft_vocab_size") or llama.vocab_size  # vLLM's default
    llama.target_hidden_size = config.get("target_hidden_size") or llama.hidden_size
    llama.eagle_aux_hidden_state_layer_ids = list(layers)
    llama.eagle_config = {LAYER_IDS: [i - 1 for i in layers]}
    return llama.to_dict()


def _refuse_variants(config: dict, where: Path, prefix: str = "") -> None:
    for key in _VARIANTS:
        if config.get(key):
            raise ModelError(f"{where}: {prefix}{key} is set: {_VARIANT}")


def _engines(data: dict, where: Path) -> dict:
    """draftkit's, SGLang's and SpecForge's layout: the config is the head's Llama config."""
    _refuse_variants(data, where)
    if data.get("norm_output") is False:  # SpecForge: logits from the layer output unnormed
        raise ModelError(f"{where}: norm_output is false: {_VARIANT}")
    layers, left = data.get(LAYER_IDS), (data.get("eagle_config") or {}).get(LAYER_IDS)
    if layers and left and list(layers) != [i + 1 for i in left]:
        raise ModelError(f"{where}: {LAYER_IDS} {layers} (the layers entered, as vLLM reads them) "
                         f"and eagle_config's {left} (the layers left, as SGLang reads them) "
                         f"name other layers; make them agree")
    return {**data, LAYER_IDS: layers or ([i + 1 for i in left] if left else None)}


def _speculators(data: dict, where: Path) -> dict:
    """vLLM speculators' format: the layer's config nested, the EAGLE-3 fields beside it."""
    layer = dict(data.get("transformer_layer_config") or {})
    if layer.get("model_type", "llama") != "llama":
        raise ModelError(f"{where}: transformer_layer_config is a {layer['model_type']!r} layer; "
                         f"draftkit's head is a Llama layer")
    if layer.get("num_hidden_layers", 1) != 1:
        raise ModelError(f"{where}: the head has {layer['num_hidden_layers']} layers; draftkit's "
                         f"has one")
    _refuse_variants(data, where)
    _refuse_variants(layer, where, "transformer_layer_config.")
    if "norm_before_residual" not in data:
        raise ModelError(f"{where}: norm_before_residual is not set, and speculators reads it "
                         f"as false but vLLM as true; set it to what the head was trained with "
                         f"(draftkit computes false)")
    if data.get("norm_output"):  # speculators: the normed output fed back to the next step
        raise ModelError(f"{where}: norm_output is set: {_VARIANT}")
    dtype = data.get("torch_dtype") or data.get("dtype") or layer.get("torch_dtype") or \
        layer.get("dtype")
    return {**layer, "draft_vocab_size": data.get("draft_vocab_size"),
            "target_hidden_size": data.get("target_hidden_size"),
            LAYER_IDS: data.get(LAYER_IDS), **({"torch_dtype": dtype} if dtype else {})}


def _eagle(data: dict, where: Path) -> dict:
    """The EAGLE repository's: a Llama config with draft_vocab_size; its attention splits the
    width into heads whatever head_dim says (``eagle/model/cnets.py``)."""
    return {**data, "head_dim": None, LAYER_IDS: None}  # None: LlamaConfig's hidden / heads


def head_state(folder: str | Path, config: dict) -> dict:
    """The tensors of the head in ``folder`` under draftkit's names (``fc``, ``midlayer.*``,
    ``norm``, ``lm_head``, and ``d2t`` / ``t2d`` where the vocabulary is reduced), from
    ``model.safetensors`` or ``pytorch_model.bin``; ``config`` is :func:`head_config`'s. An
    embedding is dropped once its shape is checked, vocabulary maps over the whole vocabulary
    once they are checked to be the identity."""
    folder = Path(folder)
    if (folder / WEIGHTS).is_file():
        path, state = folder / WEIGHTS, load_file(str(folder / WEIGHTS))
    elif (folder / BIN_WEIGHTS).is_file():
        path = folder / BIN_WEIGHTS
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ModelError(f"{folder} holds no {WEIGHTS} or {BIN_WEIGHTS}: no EAGLE-3 head's "
                         f"weights")
    # speculators names the one layer as a stack of them
    state = {("midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k): v
             for k, v in state.items()}
    embedding = state.pop(EMBEDDING, None)
    if embedding is not None and tuple(embedding.shape) != (config["vocab_size"],
                                                            config["hidden_size"]):
        raise ModelError(f"{path}: {EMBEDDING} has shape {tuple(embedding.shape)}, not the "
                         f"target's ({config['vocab_size']}, {config['hidden_size']}): a head "
                         f"with an embedding of its own, which draftkit's head does not have")
    if config["draft_vocab_size"] == config["vocab_size"]:
        d2t, t2d = (state.pop(name, None) for name in VOCAB_MAPS)
        if (d2t is not None and bool(d2t.any())) or (t2d is not None and not bool(t2d.all())):
            raise ModelError(f"{path}: the head is over the whole vocabulary but its d2t / t2d "
                             f"map draft ids to other target ids")
    return state
