"""Can this draft serve this target? Checked before any work starts.

Speculative decoding compares the two models' distributions token id by token id, so the
vocabulary and the special token ids must be the same. A mismatch is an error that names what
differs. The chat templates need not be: the target's renders every prompt, for the draft too
(Llama-3.2-1B-Instruct drafts for Llama-3.1-8B-Instruct, whose templates differ).

An EAGLE-3 head has no tokenizer of its own: it reads the target's tokens through the target's
embedding, and the target's hidden states at three layers, so what must match is the
vocabulary size, the hidden size it reads and the layers it taps (:func:`check_eagle3`).
"""

from __future__ import annotations

from typing import Any

from draftkit.errors import ModelError
from draftkit.models.facts import is_llama_family, text_config, vocab_size

_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def check_compatible(target_tokenizer: Any, draft_tokenizer: Any, target_config: Any = None,
                     draft_config: Any = None) -> None:
    """Raise :class:`ModelError` naming the first difference between target and draft."""
    fix = ("derive the draft from the target (`draftkit derive`) or pick a draft of the same "
           "model family")
    if target_config is not None and draft_config is not None:
        tv, dv = vocab_size(target_config), vocab_size(draft_config)
        if tv != dv:
            raise ModelError(f"draft vocab_size {dv} differs from the target's {tv}; {fix}")
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        only_t = sorted(set(t_vocab) - set(d_vocab))
        only_d = sorted(set(d_vocab) - set(t_vocab))
        moved = sorted(k for k in set(t_vocab) & set(d_vocab) if t_vocab[k] != d_vocab[k])
        parts = []
        if only_t:
            parts.append(f"{len(only_t)} tokens only in the target (e.g. {only_t[0]!r})")
        if only_d:
            parts.append(f"{len(only_d)} tokens only in the draft (e.g. {only_d[0]!r})")
        if moved:
            k = moved[0]
            parts.append(f"{len(moved)} tokens with other ids (e.g. {k!r}: target "
                         f"{t_vocab[k]}, draft {d_vocab[k]})")
        raise ModelError(f"draft and target tokenizers differ: {'; '.join(parts)}; {fix}")
    for name in _SPECIAL:
        t = getattr(target_tokenizer, name, None)
        d = getattr(draft_tokenizer, name, None)
        if t != d:
            raise ModelError(f"draft {name} is {d} but the target's is {t}; {fix}")


def check_eagle3_family(target_config: Any) -> None:
    """Raise :class:`ModelError` unless ``target_config`` is of a Llama-family model."""
    if not is_llama_family(target_config):
        family = getattr(text_config(target_config), "model_type", None)
        raise ModelError(f"EAGLE-3 heads are built for Llama-family targets (Llama, Mistral, "
                         f"Qwen2, Qwen3); this target is {family!r}")


def check_eagle3(target_config: Any, head_config: Any) -> None:
    """Raise :class:`ModelError` unless ``target_config`` is Llama-family and the EAGLE-3 head
    of ``head_config`` (its config.json as a dict, or its config) reads its vocabulary, hidden
    size and layers."""
    def get(key):
        return head_config.get(key) if isinstance(head_config, dict) else \
            getattr(head_config, key, None)

    check_eagle3_family(target_config)
    tc = text_config(target_config)
    fix = "pass the target it was trained on"
    if get("vocab_size") != tc.vocab_size:
        raise ModelError(f"the EAGLE-3 head's vocab_size {get('vocab_size')} differs from the "
                         f"target's {tc.vocab_size}; {fix}")
    hidden = get("target_hidden_size") or get("hidden_size")
    if hidden != tc.hidden_size:
        raise ModelError(f"the EAGLE-3 head reads hidden states of size {hidden}; the "
                         f"target's are {tc.hidden_size}; {fix}")
    layers, top = get("eagle_aux_hidden_state_layer_ids"), tc.num_hidden_layers - 1
    if not layers or not all(1 <= i <= top for i in layers):
        raise ModelError(f"the EAGLE-3 head reads the hidden states entering layers {layers}; "
                         f"the target has {tc.num_hidden_layers} layers (ids 1..{top}); {fix}")
