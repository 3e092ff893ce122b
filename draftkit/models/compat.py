"""Can this draft serve this target? Checked before any work starts.

Speculative decoding compares the two models' distributions token id by token id, so the
vocabulary and the special token ids must be the same. A mismatch is an error that names what
differs. The chat templates need not be: the target's renders every prompt, for the draft too
(Llama-3.2-1B-Instruct drafts for Llama-3.1-8B-Instruct, whose templates differ).
"""

from __future__ import annotations

from typing import Any

from draftkit.errors import ModelError
from draftkit.models.facts import vocab_size

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

