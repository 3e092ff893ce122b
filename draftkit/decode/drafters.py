"""Drafters: how a draft reads the sequence and proposes tokens, whatever kind of draft it is.

The batch (batch.py) runs one round for every draft; the kinds differ only in what the draft
reads, and that lives here, behind one interface:

- ``prefill(state, slots, inp, last, aux)``: the admitted rows' prompts (right-padded ``inp``,
  each row's last index ``last``; ``aux`` the target's captured features, or None);
- ``catch_up(state, rows, lengths, k)``: feed what the draft has not read, up to what the
  drafting lap reads itself; True when there was any. Timed apart from drafting, so c stays
  the cost of one drafting step whatever came before the round;
- ``first_logits(state, rows, lengths, k)``: the drafting lap's first forward: d_1's logits
  (b, V), or (b, N) over the draft's reduced head (``vocab``);
- ``next_logits(tokens, i, rows, lengths)``: having read d_(i+1) (b,), d_(i+2)'s logits;
- ``round_logits(state, rows, lengths, k)``: in place of the two above for a ``per_round``
  drafter, its one forward: all K drafts' logits (b, K, V) or (b, K, N). None reads another
  draft, so the batch chooses the K at once, one call where K would each pay the sampler's
  fixed cost;
- ``vocab``: the draft's reduced head, or None: the tokens its logits score. The batch
  chooses the drafts among them (:func:`~draftkit.decode.sampling.next_tokens_among`), a
  fraction of choosing over all V on a CPU (``eval/benchmarks/probes/sampler_cost.py``);
- ``after_round(state, rows, k, kept, aux)``: what the round leaves the draft to read.

``aux_layers`` names the target layers whose input hidden states the draft reads (None: it
reads tokens only); the batch has the target's forwards capture them on the way.

A drafter owns its per-slot state (how many positions its cache holds, an EAGLE-3 head's
pending features), sized by ``open(slots)`` when a batch opens on it; the batch's own
state it only reads.

:class:`StandaloneDrafter` is a small causal LM over tokens. :class:`Eagle3Drafter` is an
EAGLE-3 head (Li et al., arXiv 2503.01840), which drafts from the target's own features;
:class:`ParallelEagle3Drafter` a parallel one (P-EAGLE, arXiv 2602.01469), which drafts the
round's K tokens in its first forward (``per_round``: its cost is one forward a round, not one
per drafted token, and the K policy prices it so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.utils.rnn import pad_sequence

from draftkit.decode.eagle3_runner import Eagle3Runner
from draftkit.decode.runners import make_runner
from draftkit.models.compat import check_eagle3
from draftkit.models.eagle3 import is_eagle3, tapped

if TYPE_CHECKING:
    from draftkit.decode.state import BatchState
    from draftkit.models.reduced_head import ReducedHead


def make_drafter(model, target_model, fast: bool | None = None
                 ) -> "StandaloneDrafter | Eagle3Drafter":
    """The drafter for ``model``: an EAGLE-3 head (checked against ``target_model``) or a
    standalone draft (on the fast path when ``fast`` allows, as the target's runner)."""
    if not is_eagle3(getattr(model, "config", {})):
        return StandaloneDrafter(model, fast)
    check_eagle3(target_model.config, model.config)
    return ParallelEagle3Drafter(model) if model.parallel else Eagle3Drafter(model)


class _Drafter:
    """What both kinds share: a runner whose KV cache is the drafter's, reset per batch, and
    per slot the positions that cache holds."""

    runner: "Eagle3Runner | object"
    lengths: list[int]  # per slot, positions the draft's cache holds
    per_round = False  # a forward per drafted token (True: one forward drafts the round)

    @property
    def cache(self):
        return self.runner.cache

    @property
    def vocab(self) -> "ReducedHead | None":
        """The reduced head the draft's logits are over (None: the whole vocabulary)."""
        return self.runner.vocab

    def open(self, slots: int) -> None:
        """Per-slot state for a new batch of ``slots``."""
        self.lengths = [0] * slots

    def reset(self, batch: int, max_len: int) -> None:
        self.runner.reset(batch, max_len)


class StandaloneDrafter(_Drafter):
    """A draft language model: it reads the committed tokens into its own KV cache.

    After a drafting round it holds every committed position below L - 2, so the drafting lap
    feeds the last two committed tokens at L - 2, L - 1 (re-writing L - 2 is a no-op when it
    was held, and reads the bonus token when it was not)."""

    aux_layers = None

    def __init__(self, model, fast: bool | None = None):
        self.runner = make_runner(model, fast, reduced=True)
        self.supports_rows = self.runner.supports_rows

    def prefill(self, state: "BatchState", slots: list[int], inp: "torch.Tensor",
                last: list[int], aux=None) -> None:
        self.runner.forward(inp, [0] * len(slots), last=last, rows=slots)
        for b, i in zip(slots, last):
            self.lengths[b] = i + 1

    def catch_up(self, state: "BatchState", rows: list[int], lengths: list[int], k: int) -> bool:
        """Feed the committed tokens the draft has not read, up to position L - 3 (tokens
        decoded by K = 0 rounds). Rows needing fewer start earlier, re-writing positions they
        hold with the same values (a short row may write past its end, where nothing is read
        before the next forwards overwrite it)."""
        width = max(n - 2 - min(self.lengths[b], n - 2) for b, n in zip(rows, lengths))
        if width == 0:
            return False
        dev = state.tokens.device
        starts = [max(0, n - 2 - width) for n in lengths]
        idx = torch.tensor(starts, device=dev)[:, None] + torch.arange(width, device=dev)
        inp = state.tokens[torch.tensor(rows, device=dev)[:, None], idx]  # (b, W)
        self.runner.forward(inp, starts, last=[width - 1] * len(rows), rows=rows)
        return True

    def first_logits(self, state: "BatchState", rows: list[int], lengths: list[int],
                     k: int) -> "torch.Tensor":
        dev = state.tokens.device
        starts = [n - 2 for n in lengths]
        idx = torch.tensor(starts, device=dev)[:, None] + torch.arange(2, device=dev)
        inp = state.tokens[torch.tensor(rows, device=dev)[:, None], idx]  # (b, 2)
        return self.runner.forward(inp, starts, last=[1] * len(rows), rows=rows)  # (b, V | N)

    def next_logits(self, tokens: "torch.Tensor", i: int, rows: list[int],
                    lengths: list[int]) -> "torch.Tensor":
        # d_(i+1) sits at position L + i
        return self.runner.forward(tokens[:, None], [n + i for n in lengths], rows=rows)[:, -1]

    def after_round(self, state: "BatchState", rows: list[int], k: int, kept: list[int],
                    aux=None) -> None:
        if k:  # the draft read d_1..d_n itself: it holds every committed position below L - 2
            for b in rows:
                self.lengths[b] = state.lengths[b] - 2


class Eagle3Drafter(_Drafter):
    """An EAGLE-3 head: it drafts from the target's hidden states (:mod:`draftkit.models.eagle3`).

    Draft position t reads (f_t, token t + 1) and scores token t + 2, f_t being the target's
    fused feature after token t. With L committed tokens the target has read positions
    0..L - 2; the head holds 0..D - 1 (``lengths``), and the features of D..L - 2 wait in
    ``features``. A round feeds them (the older ones as catch-up, the last
    <= K + 1 in the drafting lap, in one forward whose last output scores d_1 = token L), then
    K - 1 steps on the head's own output h: position L - 2 + j reads (h_(L-3+j), d_j). The
    verify pass returns the features of positions L - 1..L - 1 + K; those the target read with
    committed tokens (n + 1 of them; 1 after a plain step) join the pending ones, and the
    head's entries from L - 1 on, drafted from its own h, are written again from them.
    """

    supports_rows = True  # its cache is its own, whatever runner the target has

    def __init__(self, model):
        self.model = model
        self.runner = Eagle3Runner(model)
        self.aux_layers = model.aux_layers
        self._h: "torch.Tensor | None" = None  # (b, H): the output at the latest position
        # per slot, the target's features the head has yet to read: chunks (n, 3 Ht)
        self.features: list[list["torch.Tensor"]] = []

    def open(self, slots: int) -> None:
        super().open(slots)
        self.features = [[] for _ in range(slots)]

    def prefill(self, state: "BatchState", slots: list[int], inp: "torch.Tensor",
                last: list[int], aux: "torch.Tensor") -> None:
        """Nothing to compute: the prompt's features (aux (n, W, 3 Ht)) wait for the first
        drafting round."""
        for i, b in enumerate(slots):
            self.lengths[b] = 0
            self.features[b] = [aux[i, :last[i] + 1]]

    def catch_up(self, state: "BatchState", rows: list[int], lengths: list[int], k: int) -> bool:
        """Feed each row's pending features but its last K + 1: keys and values only, as no
        output is needed there."""
        older = [(b, n - (k + 1)) for b in rows if (n := self._pending(b)) > k + 1]
        if not older:
            return False
        sel = [b for b, _ in older]
        self.runner.feed(*self._inputs(state, sel, [n for _, n in older]), rows=sel)
        return True

    def first_logits(self, state: "BatchState", rows: list[int], lengths: list[int],
                     k: int) -> "torch.Tensor":
        counts = [self._pending(b) for b in rows]  # <= K + 1 after catch_up; 0: a done row
        hidden, tokens, start = self._inputs(state, rows, counts)
        logits, self._h = self.runner.forward(hidden, tokens, start,
                                              last=[max(c, 1) - 1 for c in counts], rows=rows)
        return logits

    def next_logits(self, tokens: "torch.Tensor", i: int, rows: list[int],
                    lengths: list[int]) -> "torch.Tensor":
        # d_(i+1) is read at position L - 1 + i, with the output at the position before it
        logits, self._h = self.runner.forward(self._h[:, None], tokens[:, None],
                                              [n - 1 + i for n in lengths],
                                              last=[0] * len(rows), rows=rows)
        return logits

    def after_round(self, state: "BatchState", rows: list[int], k: int, kept: list[int],
                    aux: "torch.Tensor") -> None:
        """Keep the features of the positions the target read with committed tokens: the
        first kept[i] of aux (b, K + 1, 3 Ht) for a row still decoding."""
        for i, b in enumerate(rows):
            if state.done[b]:
                self.features[b] = []
            elif kept[i]:
                self.features[b].append(aux[i, :kept[i]])

    def _inputs(self, state: "BatchState", rows: list[int], counts: list[int]):
        """Take the first counts[i] pending features of each row: (fused features (b, W, H),
        tokens (b, W), start positions), right-padded to the longest row."""
        dev = state.tokens.device
        start = [self.lengths[b] for b in rows]
        aux = pad_sequence([self._take(b, n) for b, n in zip(rows, counts)],
                           batch_first=True)  # (b, W, 3 Ht)
        # position t reads token t + 1
        idx = (torch.tensor(start, device=dev)[:, None] + 1
               + torch.arange(aux.shape[1], device=dev)).clamp(max=state.max_len - 1)
        tokens = state.tokens[torch.tensor(rows, device=dev)[:, None], idx]  # (b, W)
        return self.runner.fuse(aux), tokens, start

    def _take(self, b: int, n: int) -> "torch.Tensor":
        """The first n pending features of row b (n, 3 Ht), which the head then holds; a row
        with none gives one zero feature, padding."""
        chunks = self.features[b]
        if not chunks:
            return torch.zeros(1, 3 * self.model.config.target_hidden_size,
                               dtype=self.runner.param.dtype, device=self.runner.param.device)
        feats = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        self.features[b] = [feats[n:]] if n < feats.shape[0] else []
        self.lengths[b] += n
        return feats[:n]

    def _pending(self, b: int) -> int:
        """Target features row b has that the head has not read."""
        return sum(f.shape[0] for f in self.features[b])


class ParallelEagle3Drafter(Eagle3Drafter):
    """A parallel EAGLE-3 head (P-EAGLE, arXiv 2602.01469; :mod:`draftkit.models.eagle3`): the
    round's K tokens from one forward.

    That forward feeds the pending features as :class:`Eagle3Drafter`'s first does, the last
    (position L - 2, token L - 1) scoring d_1, and behind them K - 1 placeholders (the learned
    feature and token) at positions L - 1 .. L + K - 3 scoring d_2..d_K, each attending to the
    context and the placeholders before it. None reads a drafted token, so the batch chooses
    the K drafts from these logits at once (:meth:`round_logits`; the autoregressive
    ``first_logits`` and ``next_logits`` it inherits are not called) and verifies them as any
    draft's. The placeholders' keys lie where the next round writes the target's features, as
    an autoregressive head's own outputs do.
    """

    per_round = True

    def round_logits(self, state: "BatchState", rows: list[int], lengths: list[int],
                     k: int) -> "torch.Tensor":
        counts = [self._pending(b) for b in rows]  # <= K + 1 after catch_up; 0: a done row
        hidden, tokens, start = self._inputs(state, rows, counts)
        return self.runner.forward_parallel(hidden, tokens, start, [max(c, 1) for c in counts],
                                            k, rows)  # (b, K, N)


def teacher_forced_logits(draft_model, target_model, seq: "torch.Tensor") -> "torch.Tensor":
    """The draft's logits (B, T, V) at every position of ``seq`` (B, T) for the token after
    it, as its first drafting step computes them from committed tokens: a standalone draft's
    forward, or an EAGLE-3 head's pass over the target's features (position 0, which no
    round drafts from, gets zeros)."""
    if not is_eagle3(getattr(draft_model, "config", {})):
        return draft_model(seq).logits
    aux = tapped(target_model(seq, output_hidden_states=True).hidden_states,
                 draft_model.aux_layers)  # (B, T, 3 Ht)
    logits, _ = draft_model(aux[:, :-1], seq[:, 1:])  # (B, T - 1, N): i scores token i + 2
    logits = draft_model.reduced_head.expand(logits)
    return torch.cat([torch.zeros_like(logits[:, :1]), logits], 1)
