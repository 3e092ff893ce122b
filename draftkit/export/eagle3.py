"""EAGLE-3 heads in a bundle: the folder vLLM's and SGLang's EAGLE-3 loaders read, and the
checks that it is one.

A head (:mod:`draftkit.models.eagle3`) goes into ``draft/`` as
:func:`~draftkit.models.eagle3.save_eagle3` writes it, with the target's tokenizer beside it.
Both engines load a subtly wrong head folder without a word and then serve it with next to no
acceptance, so export checks what it wrote, and ``draftkit check`` a bundle, against what their
loaders read (vLLM 0.34: ``model_executor/models/llama_eagle3.py`` and
``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``; SGLang 0.5.23: ``srt/models/llama_eagle3.py``,
``srt/models/llama.py`` and ``model_runner_components/spec_aux_hidden_state.py``):

- ``architectures`` ["LlamaForCausalLMEagle3"] and ``model_type`` llama: SGLang picks the
  model class by that name, vLLM maps it to its EAGLE-3 Llama;
- ``num_hidden_layers`` a count (a deeper head's later layers as vLLM computes them, with the
  ``hidden_norm`` it builds into each; SGLang's extra layers differ, so it is refused such a
  head: :mod:`draftkit.engines.releases`) and ``tie_word_embeddings`` false (SGLang would make
  the embedding the head);
- the target's width, KV heads and head_dim (both engines share the target's embedding and
  apply ``fc`` only to features wider than it; vLLM puts the head's layer in the target's
  KV-cache groups), ``head_dim`` written out, ``max_position_embeddings`` not below the
  target's (vLLM sizes the head's RoPE cache by it), ``rope_theta`` beside
  ``rope_parameters`` (engines on transformers 4.x read only it, else run at base 10000);
- none of the variants plain EAGLE-3 lacks (``norm_before_residual``, which vLLM's
  speculators format takes as true when absent; ``norm_before_fc``, ``fc_norm``,
  ``norm_output``, biases): draftkit's head computes none of them;
- the tapped layers in both conventions: ``eagle_aux_hidden_state_layer_ids`` counts the
  layer each hidden state enters (vLLM reads it as it is), ``eagle_config``'s the layer it
  leaves (SGLang adds one for Llama-family targets); without them each engine taps its
  default layers, silently;
- a parallel head's (``parallel_drafting``; P-EAGLE, arXiv 2602.01469) placeholder token
  ``ptd_token_id`` an id of the vocabulary and no other token under a key vLLM reads before it
  (0.32: ``mask_token_id``, ``dspark_noise_token_id``, ``pard_token``;
  ``v1/spec_decode/llm_base_proposer.py`` ``_init_parallel_drafting_params``), and its
  ``mask_hidden`` (1, 3 Ht), which vLLM fuses with ``fc`` for positions 2..K and refuses a
  parallel head without, and skips, with a warning, where it is not told
  ``parallel_drafting`` (``llama_eagle3.py`` ``load_weights``);
- the weights unprefixed (vLLM adds ``model.`` itself) under the head's own names
  (``midlayer.*``: SGLang skips a name it does not know, leaving that weight random), each
  with its shape; ``d2t`` int64 offsets (target id = i + d2t[i], what both engines read) and
  the ``t2d`` bool mask of the same ids.

Export reads only the target's embedding, not all its weights
(:func:`target_embedding`): a head needs nothing else of the target to be loaded and compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import safe_open
from transformers import LlamaConfig

from draftkit.engines.releases import check_context
from draftkit.errors import ModelError
from draftkit.io import read_json
from draftkit.manifest import DraftEntry
from draftkit.models.eagle3 import (ARCHITECTURE, Eagle3Draft, eagle3_config, load_eagle3,
                                    save_eagle3)
from draftkit.models.eagle3_layouts import (VOCAB_MAPS, WEIGHTS, head_config, unread_norms,
                                            writes_vocab_maps)
from draftkit.models.facts import text_config
from draftkit.models.head_check import check_vocab_maps, load_head
from draftkit.models.load import check_bundle_target, load_causal_lm
from draftkit.models.reduced_head import ReducedHead
from draftkit.models.resolve import ResolvedModel
from draftkit.models.save import save_tokenizer

KIND = "eagle3"
LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
_VARIANTS = ("norm_before_residual", "norm_before_fc", "fc_norm", "use_aux_norm", "norm_output",
             "attention_bias", "mlp_bias", "bias")
_WRITTEN_OUT = {  # keys an engine would otherwise guess, and what it would guess
    "draft_vocab_size": "SGLang would load the target's whole head and vLLM a head over the "
                        "whole vocabulary",
    "head_dim": "the engines would take hidden_size / num_attention_heads",
    "max_position_embeddings": "vLLM would assume 8192",
    "rope_theta": "engines on transformers 4.x would run at RoPE base 10000",
}
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
# the keys vLLM takes a parallel head's placeholder token from before ptd_token_id, in its order
_PLACEHOLDER_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token")


def stored_dtype(config: dict) -> str:
    """The dtype a head's config says its weights are stored in."""
    return str(config.get("torch_dtype") or config.get("dtype") or "float32")


# --- the served layout ---------------------------------------------------------------------------

def check_served_layout(folder: str | Path) -> dict:
    """The config of the head in ``folder``, or a ModelError naming the first thing vLLM or
    SGLang would read otherwise than draftkit computes it (module docstring)."""
    folder = Path(folder)
    config = read_json(folder / "config.json", "EAGLE-3 head config", "re-export the head",
                       ModelError)
    _check_config(config, folder / "config.json")
    _check_tensors(folder, config)
    return config


def _check_config(config: dict, where: Path) -> None:
    def refuse(what: str):
        raise ModelError(f"{where}: {what}; re-export the head")

    if config.get("architectures") != [ARCHITECTURE]:
        refuse(f"architectures is {config.get('architectures')!r}, not [{ARCHITECTURE!r}] "
               f"(SGLang picks the model class by it)")
    if config.get("model_type") != "llama":
        refuse(f"model_type is {config.get('model_type')!r}, not 'llama' (both engines read "
               f"the head as a Llama config)")
    depth = config.get("num_hidden_layers")
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        refuse(f"num_hidden_layers is {depth!r}, not a count of layers")
    if config.get("tie_word_embeddings") is not False:
        refuse("tie_word_embeddings is not false (SGLang would use the embedding as the head)")
    for key, guess in _WRITTEN_OUT.items():
        if config.get(key) is None:
            refuse(f"{key} is missing ({guess})")
    rope = (config.get("rope_parameters") or {}).get("rope_theta", config["rope_theta"])
    if rope != config["rope_theta"]:
        refuse(f"rope_theta {config['rope_theta']} differs from rope_parameters' {rope}")
    if config.get("target_hidden_size", config.get("hidden_size")) != config.get("hidden_size"):
        refuse(f"target_hidden_size {config['target_hidden_size']} differs from hidden_size "
               f"{config.get('hidden_size')} (both engines share the target's embedding, so "
               f"the head is as wide as the target)")
    eagle = config.get("eagle_config") or {}
    for key in _VARIANTS:
        if config.get(key) or eagle.get(key):
            refuse(f"{key} is set: a variant plain EAGLE-3 lacks, which draftkit's head does "
                   f"not compute (and SGLang may not)")
    if eagle.get("use_aux_hidden_state") is False or config.get("num_aux_hidden_states") not in \
            (None, 3):
        refuse("the head must read three tapped target layers (use_aux_hidden_state, "
               "num_aux_hidden_states)")
    layers = config.get(LAYER_IDS)
    if not (isinstance(layers, list) and len(layers) == 3 and
            all(isinstance(i, int) and i >= 1 for i in layers) and layers == sorted(set(layers))):
        refuse(f"{LAYER_IDS} is {layers!r}, not three ascending layer ids, each the layer a "
               f"hidden state enters (without them vLLM taps its default layers)")
    if eagle.get(LAYER_IDS) != [i - 1 for i in layers]:
        refuse(f"eagle_config.{LAYER_IDS} is {eagle.get(LAYER_IDS)!r}, not "
               f"{[i - 1 for i in layers]}: SGLang adds one to each, so it would tap other "
               f"layers than vLLM's {layers}")
    token = config.get("ptd_token_id")
    if config.get("parallel_drafting") and not (isinstance(token, int) and
                                                0 <= token < config["vocab_size"]):
        refuse(f"a parallel head's ptd_token_id is {token!r}, not one of the "
               f"{config['vocab_size']} token ids; vLLM fills positions 2..K with it")
    before = next((k for k in _PLACEHOLDER_KEYS if config.get(k) not in (None, token)), None)
    if config.get("parallel_drafting") and before:
        refuse(f"{before} is {config[before]!r}, not the ptd_token_id {token}: vLLM reads it "
               f"first as the token positions 2..K read, which the head was not trained on")


def _check_tensors(folder: Path, config: dict) -> None:
    """Every tensor the head's modules have, under their names and shapes, read from the
    safetensors header (no weights loaded); the vocabulary maps read whole (N + V values)."""
    path = folder / WEIGHTS
    if not path.is_file():
        raise ModelError(f"{path} is missing; re-export the head")
    try:
        with torch.device("meta"):  # shapes and dtypes only, no memory
            expected = {k: v for k, v in Eagle3Draft(LlamaConfig(**config)).state_dict().items()
                        if not k.startswith("embed_tokens.")}  # the target's, shared
    except (TypeError, ValueError, AttributeError) as e:
        raise ModelError(f"{folder}/config.json does not describe an EAGLE-3 head "
                         f"({type(e).__name__}: {e}); re-export the head") from None
    expected.update({name: expected["norm.weight"] for name in unread_norms(config)})
    maps = writes_vocab_maps(config)
    if not maps:
        expected = {k: v for k, v in expected.items() if k not in VOCAB_MAPS}
    with safe_open(str(path), "pt") as f:
        names = set(f.keys())
        if not maps and names & set(VOCAB_MAPS):
            raise ModelError(f"{path} holds d2t / t2d for a draft vocabulary that is the "
                             f"target's whole: vLLM refuses to load such a head (\"no module or "
                             f"parameter named 'draft_id_to_target_id'\"); re-export the head")
        missing, unknown = sorted(set(expected) - names), sorted(names - set(expected))
        if missing == ["mask_hidden"]:  # SGLang never reads it
            raise ModelError(f"{path} lacks mask_hidden, the placeholder a parallel head's "
                             f"positions 2..K read: vLLM refuses the head; re-export it")
        if missing:
            raise ModelError(f"{path} lacks {missing[0]}: SGLang would serve that weight random, "
                             f"without a word; re-export the head")
        if unknown:
            raise ModelError(f"{path} holds {unknown[0]}, a name neither engine loads (vLLM adds "
                             f"'model.' itself; SGLang skips names it does not know); re-export "
                             f"the head")
        for name, want in expected.items():
            shape = tuple(f.get_slice(name).get_shape())
            if shape != tuple(want.shape):
                raise ModelError(f"{path}: {name} has shape {shape}; the config makes it "
                                 f"{tuple(want.shape)}; re-export the head")
        floats = {_SAFETENSORS_DTYPES.get(d, d) for d in (
            f.get_slice(k).get_dtype() for k in expected if k not in VOCAB_MAPS)}
        if floats != {stored_dtype(config)}:
            raise ModelError(f"{path}: weights stored as {sorted(floats)}, config.json says "
                             f"{stored_dtype(config)}; re-export the head")
        if not maps:  # the whole vocabulary: draft ids are the target's, no map to check
            return
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        raise ModelError(f"{path}: d2t is {d2t.dtype} and t2d {t2d.dtype}, not int64 offsets "
                         f"and a bool mask; re-export the head")
    check_vocab_maps(d2t, t2d, path)


# --- the head against its target ---------------------------------------------------------------

def check_against_target(config: dict, target_config: Any, where: str | Path) -> None:
    """One line naming the first way the head ``config`` (at ``where``) was not built for the
    target of ``target_config``: another family, vocabulary, width, attention shape, too few
    layers for its tapped ids, or a shorter context."""
    tc = text_config(target_config)
    fix = "pass the target it was trained on"
    layers, top = config.get(LAYER_IDS) or [], tc.num_hidden_layers - 1
    if layers and max(layers) > top:  # first: the default layers of a shallow one would not do
        raise ModelError(f"{where} taps target layers {layers}; this target has "
                         f"{tc.num_hidden_layers} layers (ids within 1..{top}): {fix}")
    # what models.eagle3 builds for this target (a one-token vocabulary: only the target's
    # own fields matter) over the head's layers; it refuses a target outside the Llama family
    want = eagle3_config(target_config, ReducedHead([0], tc.vocab_size), layers or None)
    for key in ("vocab_size", "hidden_size", "target_hidden_size", "num_attention_heads",
                "num_key_value_heads", "head_dim"):
        if config.get(key, getattr(want, key)) != getattr(want, key):
            raise ModelError(f"{where} is an EAGLE-3 head for a target with {key} "
                             f"{config.get(key)}; this target has {getattr(want, key)}: {fix}")
    t_max, d_max = want.max_position_embeddings, config.get("max_position_embeddings")
    if t_max and d_max and d_max < t_max:
        raise ModelError(f"{where}: max_position_embeddings {d_max} is below the target's "
                         f"{t_max}; vLLM would size the head's RoPE cache by it and cut "
                         f"contexts short. Set it to {t_max} in its config.json before "
                         f"exporting")


def target_embedding(path: str | Path, config: Any):
    """What :func:`~draftkit.models.eagle3.load_eagle3` reads of a target, its config and its
    input embedding, read alone from the target's safetensors (an 8B target is 32 GB in
    float32, its embedding 2); a target stored otherwise loads whole."""
    tc = text_config(config)
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            name = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)
            weight = f.get_tensor(name).float() if name else None
        if weight is not None and tuple(weight.shape) == (tc.vocab_size, tc.hidden_size):
            embedding = torch.nn.Embedding.from_pretrained(weight, freeze=True)
            return SimpleNamespace(config=config, get_input_embeddings=lambda: embedding,
                                   parameters=embedding.parameters)
    return load_causal_lm(path, torch.float32, "target")[0]


# --- export --------------------------------------------------------------------------------------

class Eagle3Export:
    """An EAGLE-3 head on its way into a bundle, checked against the target before anything is
    written (the standalone draft's counterpart is
    :class:`draftkit.export.bundle.StandaloneExport`).

    ``target_sha256``: the target's content hash, which a head taken from a bundle must have
    been exported with."""

    kind = KIND

    def __init__(self, draft_ref: ResolvedModel, target_ref: ResolvedModel, target_config: Any,
                 target_sha256: str):
        folder = Path(draft_ref.path)
        config = head_config(folder, target_config)  # draftkit's, whatever layout it is in
        check_against_target(config, target_config, folder)
        check_context(config, target_config, f"EAGLE-3 head {folder}")
        check_bundle_target(target_ref, draft_ref, target_sha256)
        self.ref, self.target_config, self.config = draft_ref, target_config, config
        # the target vLLM serves when given the head folder alone (speculators_config)
        self.verifier = target_ref.spec if target_ref.kind == "hub" else str(target_ref.path)
        self.target = target_embedding(target_ref.path, target_config)
        self.head = load_head(folder, self.target, draft_ref.spec)  # float32, as the target's
        # embedding; checked (layers, vocabulary maps) before anything is written
        stored = getattr(torch, stored_dtype(config), None)
        if not (isinstance(stored, torch.dtype) and stored.is_floating_point):
            raise ModelError(f"{folder}/config.json: torch_dtype {stored_dtype(config)!r} is "
                             f"not a floating dtype; re-save the head")

    def write(self, folder: Path, tokenizer: Any, k: int, dtype: str) -> None:
        """``folder`` as the engines read it (module docstring), the head's weights in
        ``dtype``, the target's tokenizer beside it; what was written is checked and loaded
        back, and its logits compared with the in-memory head's rounded to ``dtype``."""
        save_eagle3(self.head, folder, dtype=getattr(torch, dtype))
        add_speculators_config(folder / "config.json", self.verifier, self.target_config, k,
                               self.parallel)
        with torch.no_grad():  # the stored values, exactly: compared in float32 below
            for name, p in self.head.named_parameters():
                if not name.startswith("embed_tokens."):  # the target's, not stored
                    p.copy_(p.to(getattr(torch, dtype)).float())
        save_tokenizer(tokenizer, folder)  # engines use the target's; draftkit's check reads it
        check_against_target(check_served_layout(folder), self.target_config, folder)
        written = load_eagle3(folder, self.target)
        g = torch.Generator().manual_seed(0)
        tc = text_config(self.target_config)
        aux = torch.randn(2, 16, 3 * tc.hidden_size, generator=g)  # (B, T, 3 Ht)
        ids = torch.randint(0, tc.vocab_size, (2, 16), generator=g)
        with torch.no_grad():
            diff = max((a - b).abs().max().item()
                       for a, b in zip(written(aux, ids), self.head(aux, ids)))
        if diff > 1e-4:
            raise ModelError(f"the written head's logits differ from the in-memory head's by "
                             f"{diff:.2e}; export aborted, nothing written")

    @property
    def parallel(self) -> bool:
        """Whether the head drafts all K tokens in one forward (P-EAGLE, arXiv 2602.01469),
        which vLLM must be told (``parallel_drafting``)."""
        return self.head.parallel

    def entry(self) -> DraftEntry:
        """The manifest's ``draft`` entry: the kind and the tapped layers beside the usual (its
        dtype is export's)."""
        return DraftEntry(kind=KIND, name=self.ref.name, source=str(self.ref.path),
                          lora_merged=False,
                          num_parameters=sum(p.numel() for n, p in self.head.named_parameters()
                                             if not n.startswith("embed_tokens.")),
                          num_hidden_layers=self.head.config.num_hidden_layers,
                          eagle_aux_hidden_state_layer_ids=self.head.aux_layers,
                          draft_vocab_size=self.head.d2t.numel())


def add_speculators_config(path: Path, verifier: str, target_config: Any, k: int,
                           parallel: bool) -> None:
    """The head's config.json, given the keys of vLLM's speculators format as well, so
    ``vllm serve BUNDLE/draft`` serves the target (the verifier) with this head and K, with
    nothing else (vLLM's ``maybe_override_with_speculators``). The head's own keys stay as the
    engines read them: with ``model_type`` llama, vLLM loads the folder as before when it is
    given as a speculative model, and SGLang ignores the rest. ``norm_before_residual`` is
    written out false: the speculators format reads its absence as true, which draftkit's head
    does not compute."""
    config = json.loads(path.read_text())
    layer = {key: value for key, value in config.items() if key not in _NOT_LAYER}
    config.update({
        "speculators_model_type": "peagle" if parallel else "eagle3",
        "norm_before_residual": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "peagle" if parallel else "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": max(k, 1)}],
            "verifier": {"name_or_path": verifier,
                         "architectures": list(getattr(target_config, "architectures", None)
                                               or [])}}})
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# the head's keys that are not its Llama layer's (speculators' transformer_layer_config)
_NOT_LAYER = ("architectures", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids",
              "eagle_config", "target_hidden_size", "parallel_drafting", "ptd_token_id",
              "speculators_model_type", "speculators_config", "transformer_layer_config",
              "norm_before_residual")
