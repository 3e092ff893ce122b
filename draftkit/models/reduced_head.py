"""A draft's reduced head: it proposes only from the N tokens H the target emits most.

A small draft spends most of a decode step in its LM head: SmolLM2's 49152 x 576 head is
about eight of its transformer layers. FR-Spec (Zhao et al., "FR-Spec: Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling", arXiv 2502.14856)
restricts the draft's head to the most frequent tokens. Verification is unchanged: the draft's
q is zero outside the subset, so rejection sampling still returns exactly the target's
distribution; only acceptance can fall, by the target's mass outside the subset.

:class:`ReducedHead` is H (N token ids) with the whole vocabulary's size V, and the one place
the mapping between them is written: ``restrict`` takes the vocabulary's logits (..., V), or
the head's weight rows (V, D), to H's; ``expand`` takes logits over H (..., N) back to
(..., V) with -inf outside H, so argmax, softmax and sampling see q_H, zero outside H.

Where a reduced head lives:

- on disk, as ``draft_vocab.json`` next to the draft's weights (:meth:`ReducedHead.save`,
  :meth:`ReducedHead.load`): ``{"token_ids": [...], "vocab_size": V, "coverage": ...,
  "source": ...}``. The weights stay whole, so vLLM, SGLang and HF use the draft as it is (at
  the full head's cost);
- on a loaded draft, as ``model.reduced_head``: :func:`draftkit.models.load.load_model` sets
  it for drafts whose folder has the file (:func:`attach`), and everything that decodes or
  scores the draft as it is served reads it with :func:`head_of`. Our decoder then computes
  only H's rows of the head.

Frequencies come from the target's own tokens in the training data (:meth:`ReducedHead.choose`);
ties and any room left go to the lowest ids, which BPE tokenizers give to their most frequent
merges.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import torch

from draftkit.errors import ModelError
from draftkit.io import atomic_write_json, read_json

FILE = "draft_vocab.json"


class ReducedHead:
    """H, the N token ids a draft proposes from, in a vocabulary of ``vocab_size`` (V) ids.

    ``ids`` (N,) keeps the order given (:meth:`load` and :meth:`choose` give them sorted);
    ``index`` (V,) is each vocabulary id's position in H, -1 outside it. ``covered`` (the
    share of held-out target tokens inside H) and ``source`` (what H was chosen from) are
    what ``draft_vocab.json`` records beside the ids, when known.
    """

    def __init__(self, ids: "Iterable[int] | torch.Tensor", vocab_size: int,
                 covered: float | None = None, source: str | None = None):
        self.ids = torch.as_tensor(ids, dtype=torch.long).flatten()  # (N,)
        self.vocab_size = int(vocab_size)
        n = self.ids.numel()
        if not n or self.ids.unique().numel() != n or int(self.ids.min()) < 0 or \
                int(self.ids.max()) >= self.vocab_size:
            raise ModelError(f"token ids must be unique and within 0..{self.vocab_size - 1}")
        self.index = torch.full((self.vocab_size,), -1, dtype=torch.long,
                                device=self.ids.device)  # (V,)
        self.index[self.ids] = torch.arange(n, device=self.ids.device)
        self.covered, self.source = covered, source

    def __len__(self) -> int:
        return self.ids.numel()

    def __repr__(self) -> str:
        return f"ReducedHead({len(self)} of {self.vocab_size} tokens)"

    def to(self, device: Any) -> "ReducedHead":
        """This head with its tensors on ``device`` (a copy: this one stays where it is)."""
        head = copy.copy(self)
        head.ids, head.index = self.ids.to(device), self.index.to(device)
        return head

    def restrict(self, x: "torch.Tensor", dim: int = -1) -> "torch.Tensor":
        """The whole vocabulary's entries -> H's, along ``dim``: logits (..., V) -> (..., N),
        or a head's weight rows (V, D) -> (N, D) with ``dim=0``. ``x`` is on this head's
        device (:meth:`to`)."""
        return x.index_select(dim, self.ids)

    def expand(self, logits: "torch.Tensor", fill: float = float("-inf")) -> "torch.Tensor":
        """Logits over H (..., N) -> over the vocabulary (..., V), -inf outside H: the
        distribution argmax, softmax and sampling see is zero outside H, and the same as the
        subset's inside it. Probabilities over H expand with ``fill=0.0``."""
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), fill)
        full[..., self.ids] = logits
        return full

    def coverage(self, counts: "torch.Tensor") -> float:
        """Share of the counted tokens that fall inside H. counts: (V,) occurrences per id."""
        total = float(counts.sum())
        return float(counts[self.ids.to(counts.device)].sum()) / total if total else 0.0

    @classmethod
    def choose(cls, counts: "torch.Tensor", size: int, always: Iterable[int] = ()
               ) -> "ReducedHead":
        """The ``size`` most frequent token ids, sorted. counts: (V,) occurrences per id.

        ``always`` (the special tokens, EOS above all) is kept whatever its count.
        """
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
        return cls(sorted(keep[:size]), vocab)

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/draft_vocab.json``."""
        path = Path(directory) / FILE
        covered = None if self.covered is None else round(self.covered, 6)
        atomic_write_json(path, {"token_ids": self.ids.tolist(), "vocab_size": self.vocab_size,
                                 "coverage": covered, "source": self.source})
        return path

    @classmethod
    def load(cls, directory: str | Path, vocab_size: int) -> "ReducedHead | None":
        """The head stored in ``directory`` for a model of ``vocab_size`` tokens, ids sorted;
        None when it has none."""
        path = Path(directory) / FILE
        if not path.is_file():
            return None
        data = read_json(path, "draft vocabulary", "delete it to use the full vocabulary",
                         ModelError)
        try:
            ids = [int(i) for i in data["token_ids"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ModelError(f"{path}: not a draft vocabulary ({e}); delete it to use the full "
                             f"vocabulary") from None
        try:
            return cls(sorted(ids), vocab_size, data.get("coverage"), data.get("source"))
        except ModelError as e:
            raise ModelError(f"{path}: {e}; delete it to use the full vocabulary") from None


def attach(model: Any, head: ReducedHead | None) -> None:
    """Make ``head`` the reduced head ``model`` decodes with (None: its whole head)."""
    model.reduced_head = head


def head_of(model: Any) -> ReducedHead | None:
    """The reduced head ``model`` decodes with, or None for its whole head."""
    return getattr(model, "reduced_head", None)
