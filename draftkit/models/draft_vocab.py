"""A draft's reduced output vocabulary: the head computes only the tokens the target emits.

A small draft spends most of a decode step in its LM head: SmolLM2's 49152 x 576 head is
about eight of its transformer layers. FR-Spec (Zhao et al., "FR-Spec: Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling", arXiv 2502.14856)
restricts the draft's head to the most frequent tokens. Verification is unchanged: the draft's
q is zero outside the subset, so rejection sampling still returns exactly the target's
distribution; only acceptance can fall, by the target's mass outside the subset.

The subset lives next to the draft's weights as ``draft_vocab.json`` and is read by
:func:`draftkit.models.load.load_model` for drafts; our decoder then computes only those rows
of the head. The weights stay whole, so vLLM, SGLang and HF use the draft as it is (at the
full head's cost). Frequencies come from the target's own tokens in the training data; ties
and any room left go to the lowest ids, which BPE tokenizers give to their most frequent merges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from draftkit.errors import ModelError

if TYPE_CHECKING:
    import torch

FILE = "draft_vocab.json"


def choose(counts: "torch.Tensor", size: int, always: Iterable[int] = ()) -> list[int]:
    """The ``size`` token ids to keep, most frequent first. counts: (V,) occurrences per id.

    ``always`` (the special tokens, EOS above all) is kept whatever its count.
    """
    import torch

    vocab = counts.shape[0]
    if not 0 < size <= vocab:
        raise ModelError(f"draft vocabulary size {size} must be in 1..{vocab}")
    keep = list(dict.fromkeys(int(i) for i in always if 0 <= int(i) < vocab))
    # stable sort on -count: equal counts keep id order (lower id = more frequent merge)
    order = torch.sort(-counts.to(torch.float64), stable=True).indices.tolist()
    seen = set(keep)
    for i in order:
        if len(keep) >= size:
            break
        if i not in seen:
            keep.append(i)
            seen.add(i)
    return sorted(keep[:size])


def coverage(ids: list[int], counts: "torch.Tensor") -> float:
    """Share of the counted tokens that fall inside ``ids``."""
    total = float(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0


def save(directory: str | Path, ids: list[int], vocab_size: int, covered: float,
         source: str) -> Path:
    from draftkit.io import atomic_write_json

    path = Path(directory) / FILE
    atomic_write_json(path, {"token_ids": ids, "vocab_size": vocab_size,
                             "coverage": round(covered, 6), "source": source})
    return path


def load(directory: str | Path, vocab_size: int) -> list[int] | None:
    """The subset stored in ``directory``, or None when it has none."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        ids = [int(i) for i in data["token_ids"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{path}: not a draft vocabulary ({e}); delete it to use the full "
                         f"vocabulary") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= vocab_size:
        raise ModelError(f"{path}: token ids must be unique and within 0..{vocab_size - 1}; "
                         f"delete it to use the full vocabulary")
    return sorted(ids)


def attach(model, directory: str | Path) -> None:
    """Give ``model`` the subset stored next to its weights (``model.draft_vocab``)."""
    import torch

    ids = load(directory, model.config.get_text_config().vocab_size)
    if ids is not None:
        model.draft_vocab = torch.tensor(ids, dtype=torch.long)
