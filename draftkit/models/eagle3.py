"""EAGLE-3 draft heads: one decoder layer that drafts from the target's own hidden states.

EAGLE-3 (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840) gives the draft more than tokens to go on: the target's
hidden states at a low, a middle and a high layer, concatenated and projected to the hidden size
(``fc``), feed one decoder layer together with the next token's embedding. Its output predicts
the token after that over a reduced draft vocabulary, and is fed back as the next step's hidden
state, so the head drafts K tokens from one set of target features. Such a head costs about one
layer of the target plus a head over N tokens.

One step at draft position t, with f_t the fused target feature after token t (or the head's own
output h_(t-1) on later steps) and e_(t+1) the embedding of token t + 1::

    x = [input_layernorm(e_(t+1)) ; hidden_norm(f_t)]       # (B, T, 2H): attention reads both
    h = f_t + o_proj(attention(q, k, v of x, RoPE at t))    # the residual is f_t, unnormed
    h = h + mlp(post_attention_layernorm(h))                # h: the next step's hidden state
    logits = lm_head(norm(h))                               # (B, T, N): token t + 2

Attention is the caller's: decoding keeps a KV cache (``draftkit.decode``), training unrolls
the head over its own outputs with the mask of the training-time test (``draftkit.distill``).
:meth:`Eagle3Draft.attention_inputs` and :meth:`Eagle3Draft.after_attention` are the two
halves around it; :meth:`Eagle3Draft.forward` is the plain causal pass over target features.
A deeper head (``num_hidden_layers`` > 1, as P-EAGLE's drafters are) stacks plain Llama layers
on this one (:mod:`draftkit.models.eagle3_layer`), ``layers.1.*`` .. on disk as vLLM loads them
(with the ``hidden_norm`` of ones vLLM builds into every layer); SGLang names its extra layers
otherwise and feeds them another residual, so such a head is vLLM's only.

On disk the head is the layout vLLM and SGLang load as an EAGLE-3 draft (``LlamaForCausalLMEagle3``;
tensor names ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``,
``t2d``): the draft vocabulary as ``d2t`` (N,) int64 offsets, target id = i + d2t[i], and
``t2d`` (V,) bool; no ``embed_tokens``, since the head reads the target's (frozen) embedding and
both engines share the target's when the draft ships none. The tapped layers are written in
both engines' conventions: ``eagle_aux_hidden_state_layer_ids`` counts the layer the hidden
state enters (vLLM), ``eagle_config.eagle_aux_hidden_state_layer_ids`` the layer it leaves
(SGLang adds one).

:func:`load_eagle3` also reads a head as SpecForge, vLLM's speculators or the EAGLE repository
publish it (:mod:`draftkit.models.eagle3_layouts`): their config keys, tensor names and weight
files, the embedding some of them ship dropped for the target's, and the references' default
tapped layers (with a warning) where a layout records none.

A parallel head ("P-EAGLE: Parallel-Drafting EAGLE with Scalable Training", arXiv 2602.01469;
``parallel_drafting`` in config.json) drafts all K tokens in one forward: draft position 1 reads
(f_t, token t + 1) as above, positions 2..K a learned placeholder for the unknown feature and
token: ``mask_hidden`` (1, 3 Ht), fused by ``fc`` like the target's features, and the token
``ptd_token_id`` (its embedding the target's), at RoPE positions t + 1 .. t + K - 1, each
attending causally to the context and to the placeholders before it. Both names are what vLLM
loads with ``parallel_drafting: true`` (``llama_eagle3.py``, and the spec-decode proposer's
``_init_parallel_drafting_params``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from draftkit.errors import ModelError
from draftkit.models.compat import check_eagle3_family
from draftkit.models.eagle3_layer import Eagle3Layer
from draftkit.models.eagle3_layouts import (ARCHITECTURE, VOCAB_MAPS, WEIGHTS,
                                            default_aux_layers, head_config, head_state,
                                            layout, unread_norms, writes_vocab_maps)
from draftkit.models.facts import text_config
from draftkit.models.reduced_head import ReducedHead
from draftkit.models.save import add_legacy_keys

def tapped(hidden_states: Any, layers: list[int]) -> torch.Tensor:
    """aux (B, T, 3 Ht), what a head's ``fuse`` reads: the residual stream entering each of
    ``layers``, low to high, concatenated. ``hidden_states[i]`` enters layer i, as in
    transformers' ``output_hidden_states`` (whose entry 0 is the embeddings' output)."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


def is_eagle3(config: Any) -> bool:
    """Whether a config (a head folder's config.json as a dict, or a loaded head's config)
    describes an EAGLE-3 head: draftkit's, or one in a layout
    :mod:`draftkit.models.eagle3_layouts` reads."""
    if isinstance(config, dict):
        return layout(config) is not None
    return ARCHITECTURE in (getattr(config, "architectures", None) or [])


def eagle3_config(target: Any, head: ReducedHead, aux_layers: list[int] | None = None,
                  intermediate_size: int | None = None, parallel: bool = False,
                  num_layers: int = 1):
    """The head's config for ``target`` (a model or its config): the target's attention shape
    (heads, KV heads, head_dim), RoPE and context, ``num_layers`` layers (EAGLE-3's one, or a
    deeper head's: :mod:`draftkit.models.eagle3_layer`), untied, over ``head``'s N tokens;
    ``parallel``: a parallel head's (module docstring), its placeholder token the vocabulary's
    last id (a reserved or rare token in most vocabularies, unlike what real positions read).

    vLLM places the head's layer in the target's KV cache groups, so KV heads and head_dim must
    equal the target's; the width must equal the embedding's, which both engines share."""
    tc = text_config(target)
    check_eagle3_family(tc)
    if head.vocab_size != tc.vocab_size:
        raise ModelError(f"the draft vocabulary is over {head.vocab_size} ids; the target has "
                         f"{tc.vocab_size}")
    layers = list(aux_layers) if aux_layers else default_aux_layers(tc.num_hidden_layers)
    top = tc.num_hidden_layers - 1  # a hidden state that enters a layer: the last is L - 1
    if num_layers < 1:
        raise ModelError(f"a head has at least one layer, not {num_layers}")
    if len(layers) != 3 or layers != sorted(set(layers)) or not all(1 <= i <= top for i in layers):
        raise ModelError(f"aux layers {layers}: give three distinct layer ids in ascending order "
                         f"within 1..{top} (the layer each hidden state enters: low, middle, "
                         f"high)")
    heads = tc.num_attention_heads
    rope = {k: getattr(tc, k) for k in ("rope_theta", "rope_scaling", "rope_parameters")
            if getattr(tc, k, None) is not None}
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
        intermediate_size=intermediate_size or tc.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=getattr(tc, "num_key_value_heads", heads),
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        bos_token_id=getattr(tc, "bos_token_id", None),
        eos_token_id=getattr(tc, "eos_token_id", None),
        pad_token_id=getattr(tc, "pad_token_id", None), **rope)
    cfg.architectures = [ARCHITECTURE]
    cfg.draft_vocab_size = len(head)
    cfg.target_hidden_size = tc.hidden_size
    cfg.eagle_aux_hidden_state_layer_ids = layers
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}
    if parallel:
        cfg.parallel_drafting, cfg.ptd_token_id = True, tc.vocab_size - 1
    return cfg


class Eagle3Draft(nn.Module):
    """An EAGLE-3 head over a target of hidden size H and vocabulary V, drafting over N tokens.

    ``embed_tokens`` is the target's, frozen (:func:`from_target` copies it in); ``d2t`` /
    ``t2d`` are the draft vocabulary as both engines read it (:attr:`reduced_head`)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        h, n = config.hidden_size, config.draft_vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * config.target_hidden_size, h, bias=False)
        self.midlayer = Eagle3Layer(config)  # the fused first layer
        if config.num_hidden_layers > 1:  # named layers.1.. on disk, as vLLM loads them
            self.layers = nn.ModuleDict({str(i): Eagle3Layer(config, fused=False)
                                         for i in range(1, config.num_hidden_layers)})
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, n, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(n, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        if self.parallel:  # unit variance, as P-EAGLE's trainers start it
            self.mask_hidden = nn.Parameter(torch.randn(1, 3 * config.target_hidden_size))

    @property
    def deeper(self) -> list[Eagle3Layer]:
        """The plain layers after the first, in order (none for EAGLE-3's one-layer head)."""
        return list(self.layers.values()) if hasattr(self, "layers") else []

    @property
    def parallel(self) -> bool:
        """Whether the head drafts all K tokens in one forward (module docstring)."""
        return bool(getattr(self.config, "parallel_drafting", False))

    def placeholder(self) -> tuple[int, torch.Tensor]:
        """What a parallel head's positions 2..K read: the placeholder token id and the fused
        placeholder feature (H,)."""
        return self.config.ptd_token_id, self.fuse(self.mask_hidden)[0]

    # --- the draft vocabulary -----------------------------------------------------------------

    @property
    def aux_layers(self) -> list[int]:
        """The target layers whose input hidden states the head reads (low, middle, high)."""
        return list(self.config.eagle_aux_hidden_state_layer_ids)

    @property
    def reduced_head(self) -> ReducedHead:
        """The draft vocabulary: target id of draft id i is i + d2t[i]."""
        ids = torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t
        return ReducedHead(ids, self.config.vocab_size)

    def set_vocabulary(self, head: ReducedHead) -> None:
        """d2t and t2d from the N target ids of ``head`` (sorted, as draft ids are)."""
        ids = head.ids.sort().values.to(self.d2t.device)
        if ids.numel() != self.d2t.numel():
            raise ModelError(f"the head has {self.d2t.numel()} rows; the vocabulary has "
                             f"{ids.numel()} tokens")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    # --- the two halves around attention ------------------------------------------------------

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The three tapped hidden states (B, T, 3 Ht), low to high, as one feature (B, T, H)."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def layer_input(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """What the decoder layer's attention reads (B, T, 2H): the normed embedding of tokens
        ``input_ids`` (B, T) joined with the normed ``hidden`` (B, T, H). The decoding runner
        (:mod:`draftkit.decode.eagle3_runner`) reads it too, so the two cannot drift apart."""
        layer = self.midlayer
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        return torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)

    def attention_inputs(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                         position_ids: torch.Tensor):
        """The first layer's q (B, nh, T, hd) and k, v (B, nkv, T, hd), RoPE applied at
        ``position_ids`` (B, T), for tokens ``input_ids`` (B, T) read with ``hidden`` (B, T, H)."""
        x = self.layer_input(input_ids, hidden)
        return self.midlayer.qkv(x, *self.rotary_emb(x, position_ids))

    def after_attention(self, o: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The first layer's output (B, T, H) from attention's ``o`` (B, nh, T, hd) and the
        residual ``hidden``; for a one-layer head, what the next step reads as its hidden state
        (before the final norm)."""
        return self.midlayer.finish(o, hidden)

    def deeper_inputs(self, layer: Eagle3Layer, h: torch.Tensor, position_ids: torch.Tensor):
        """A deeper layer's q, k, v (as :meth:`attention_inputs`') over the stream h (B, T, H)."""
        x = layer.attention_input(h)
        return layer.qkv(x, *self.rotary_emb(x, position_ids))

    def causal(self, input_ids: torch.Tensor, hidden: torch.Tensor,
               position_ids: torch.Tensor) -> torch.Tensor:
        """Every layer over a sequence, causally: the output h (B, T, H) at each position of
        tokens ``input_ids`` (B, T) read with ``hidden`` (B, T, H), as decoding computes it."""
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=k.shape[1] != q.shape[1])

        h = self.after_attention(attend(*self.attention_inputs(input_ids, hidden, position_ids)),
                                 hidden)
        for layer in self.deeper:
            h = layer.finish(attend(*self.deeper_inputs(layer, h, position_ids)), h)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (..., N) from layer outputs (..., H)."""
        return self.lm_head(self.norm(h))

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's first step over a whole sequence, causally: aux (B, T, 3 Ht) from the
        target after tokens 0..T-1, input_ids (B, T) tokens 1..T. Returns (logits (B, T, N),
        h (B, T, H)); logits[:, t] scores token t + 2."""
        bsz, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)[None].expand(bsz, t)
        h = self.causal(input_ids, self.fuse(aux), position_ids)
        return self.logits(h), h


def from_target(target: Any, head: ReducedHead, aux_layers: list[int] | None = None,
                seed: int = 0, parallel: bool = False, num_layers: int = 1) -> Eagle3Draft:
    """A new head for ``target`` (a loaded model): random layer, fc and lm_head (seeded), the
    target's embedding copied in and frozen, the lm_head rows started from the target's head
    rows for the draft vocabulary (a draft that starts from the target's own head agrees with
    it sooner); ``parallel``: a parallel head, its placeholder random too; ``num_layers``: its
    depth."""
    torch.manual_seed(seed)
    head = ReducedHead(head.ids.sort().values, head.vocab_size)  # draft ids in target-id order
    draft = Eagle3Draft(eagle3_config(target, head, aux_layers, parallel=parallel,
                                      num_layers=num_layers))
    param = next(target.parameters())
    draft.to(dtype=param.dtype)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        draft.lm_head.weight.copy_(head.restrict(target.get_output_embeddings().weight, dim=0))
    draft.set_vocabulary(head)
    return draft.to(param.device)


def with_vocabulary(draft: Eagle3Draft, head: ReducedHead, target: Any) -> Eagle3Draft:
    """``draft`` over another draft vocabulary ``head`` (a warm start on traffic whose tokens
    the old vocabulary missed): a token it already had keeps its trained lm_head row, a new
    token's row starts from the target's head row, as :func:`from_target` starts every row.
    The layer, fc and tapped layers are untouched: only which tokens it proposes changes."""
    head = ReducedHead(head.ids.sort().values, head.vocab_size)  # draft ids in target-id order
    old, weight = draft.reduced_head, draft.lm_head.weight  # (N_old, H)
    with torch.no_grad():
        rows = head.restrict(target.get_output_embeddings().weight, dim=0).to(weight)  # (N, H)
        at = old.index.to(head.ids.device)[head.ids]  # (N,) each token's old row, -1 if new
        kept = at >= 0
        rows[kept.to(rows.device)] = weight[at[kept].to(weight.device)]
    n = len(head)
    draft.lm_head = nn.Linear(rows.shape[1], n, bias=False).to(rows)
    with torch.no_grad():
        draft.lm_head.weight.copy_(rows)
    draft.d2t = torch.zeros(n, dtype=torch.long, device=draft.d2t.device)
    draft.config.draft_vocab_size = n
    draft.set_vocabulary(head)
    return draft


def as_parallel(draft: Eagle3Draft, seed: int = 0) -> Eagle3Draft:
    """``draft`` made a parallel head (a warm start of P-EAGLE from an autoregressive head):
    its layer, fc and vocabulary as they are, a new placeholder (seeded) for positions 2..K."""
    if draft.parallel:
        return draft
    draft.config.parallel_drafting, draft.config.ptd_token_id = True, draft.config.vocab_size - 1
    torch.manual_seed(seed)
    draft.mask_hidden = nn.Parameter(torch.randn(1, draft.fc.in_features).to(draft.fc.weight))
    return draft


# --- on disk -------------------------------------------------------------------------------------

def save_eagle3(draft: Eagle3Draft, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    """config.json and model.safetensors in the layout vLLM and SGLang load (module
    docstring): every weight but the target's embedding; ``dtype`` for the floating ones."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    maps = writes_vocab_maps(draft.config)
    for name, tensor in draft.state_dict().items():
        if name.startswith(("embed_tokens.", "rotary_emb.")) or (name in VOCAB_MAPS and not maps):
            continue
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.contiguous().cpu()
    for name in unread_norms(draft.config):
        state[name] = torch.ones_like(state["norm.weight"])
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    config = draft.config.to_dict()
    config["torch_dtype"] = str(dtype or draft.fc.weight.dtype).removeprefix("torch.")
    add_legacy_keys(config)  # rope_theta beside rope_parameters, for transformers 4.x engines
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_eagle3(folder: str | Path, target: Any) -> Eagle3Draft:
    """The head in ``folder`` on ``target``'s device and dtype, reading the target's
    embedding: as :func:`save_eagle3` wrote it, or in a layout SpecForge, vLLM's speculators or
    the EAGLE repository publish (:mod:`draftkit.models.eagle3_layouts`). Every tensor must be
    there with its shape."""
    folder = Path(folder)
    data = head_config(folder, target)
    config = LlamaConfig(**data)
    tc = text_config(target)
    if (config.vocab_size, config.target_hidden_size) != (tc.vocab_size, tc.hidden_size):
        raise ModelError(f"{folder} is an EAGLE-3 head for a target of vocabulary "
                         f"{config.vocab_size} and hidden size {config.target_hidden_size}; "
                         f"this target has {tc.vocab_size} and {tc.hidden_size}: pass the target "
                         f"it was trained on")
    if config.hidden_size != tc.hidden_size:
        raise ModelError(f"{folder} is an EAGLE-3 head {config.hidden_size} wide on a target "
                         f"{tc.hidden_size} wide; draftkit's head reads the target's embedding, "
                         f"so it is as wide as the target")
    token = getattr(config, "ptd_token_id", None)
    if getattr(config, "parallel_drafting", False) and \
            not 0 <= (-1 if token is None else token) < tc.vocab_size:
        raise ModelError(f"{folder} is a parallel head whose placeholder token ptd_token_id "
                         f"{token} is no id of the target's {tc.vocab_size}; re-export the head")
    draft = Eagle3Draft(config)
    state = head_state(folder, data)
    for name in unread_norms(config):
        state.pop(name, None)
    maps = writes_vocab_maps(config)
    expected = {k: v.shape for k, v in draft.state_dict().items()
                if not k.startswith(("embed_tokens.", "rotary_emb.")) and
                (maps or k not in VOCAB_MAPS)}
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise ModelError(f"{folder}: " + (f"missing {missing[0]}" if missing else
                         f"unknown tensor {unknown[0]}") + "; re-export the head")
    bad = [k for k, shape in expected.items() if state[k].shape != shape]
    if bad:
        raise ModelError(f"{folder}: {bad[0]} has shape {tuple(state[bad[0]].shape)}, "
                         f"expected {tuple(expected[bad[0]])}; re-export the head")
    param = next(target.parameters())
    draft.to(dtype=param.dtype)
    draft.load_state_dict({k: v.to(draft.state_dict()[k].dtype) for k, v in state.items()},
                          strict=False)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        if not maps:  # the whole vocabulary: draft id i is target id i
            draft.t2d.fill_(True)
    return draft.to(param.device).eval()
