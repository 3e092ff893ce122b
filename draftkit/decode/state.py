"""What a decoding batch carries between rounds, and how a round's tokens are committed to it.

:class:`BatchState` keeps the committed tokens on the device and everything else on the host:
lengths, budgets, sampling parameters, random generators, finish reasons and per-row counts
(:class:`RowStats`); :meth:`BatchState.seat` puts a new row in a free slot,
:meth:`BatchState.commit` appends a round's accepted tokens (step 4 of Leviathan et al.,
arXiv 2211.17192, Algorithm 1: d_1..d_n and the target's token), stopping a row at EOS or its
token budget, and :meth:`BatchState.release` frees a slot. :func:`round_margin` and
:func:`row_budget` say how much room a row needs past its committed tokens.

This module imports nothing of the decoder above it. The state is the batch's
(:class:`~draftkit.decode.batch.Batch` holds it and is its only door); its drafters read it
when the batch hands it to them. A caller reads a row through :class:`Result`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import torch

from draftkit.decode.sampling import Generators, row_generator
from draftkit.decode.sampling_params import SamplingParams
from draftkit.decode.stats import DecodeStats
from draftkit.errors import DraftkitError
from draftkit.metrics import alpha_from_counts


def round_margin(k_max: int) -> int:
    """Positions a row keeps free past its committed length: a round may write K + 1 there
    (K drafted tokens and the target's own), with one to spare."""
    return k_max + 2


def row_budget(prompt_len: int, max_new_tokens: int, max_len: int | None, k_max: int,
               i: int) -> int:
    """New tokens row ``i`` may have: its request, capped so a round's K + 1 writes fit in
    ``max_len`` positions (None: no cap)."""
    room = (max_len - prompt_len - round_margin(k_max)) if max_len else max_new_tokens
    if room < 1:
        raise DraftkitError(f"prompt {i} has {prompt_len} tokens; the context window is "
                            f"{max_len} (room is needed for K = {k_max} drafted tokens "
                            f"too); shorten the prompt")
    return min(max_new_tokens, room)


@dataclass
class RowStats:
    """One row's counts: target calls (the prefill's included) and drafted tokens, and each
    decoding round's [K, accepted] (K 0: a plain step; the prefill is no round), which a
    served request's record and per-domain metrics read."""

    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    rounds: list[list[int]] = field(default_factory=list)

    @property
    def alpha(self) -> float:
        return alpha_from_counts(self.accepted, self.rejections)

    def count(self, k: int, accepted: int) -> None:
        """One target call that tested K drafted tokens (none for a plain step or the prefill)
        and accepted the first ``accepted`` of them."""
        if self.target_calls:  # a row's first call is its prefill (seat gives fresh counts)
            self.rounds.append([k, accepted])
        self.target_calls += 1
        self.drafted += k
        self.accepted += accepted
        self.rejections += accepted < k


@dataclass
class Result:
    """A row's output: what it has decoded so far, or all of it once it is done."""

    tokens: list[int]  # new tokens only (EOS included when it ended the row)
    finish_reason: Literal["eos", "length", "abort"] | None  # None: still decoding
    stats: RowStats
    seconds: float = 0.0  # wall time of the batch the row ran in

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def tau(self) -> float:
        """Tokens kept per target call over the decoding rounds, as :meth:`DecodeStats.tau`:
        the prefill and the first token it emits are left out. A row that ended at that first
        token had no decoding round: one token per target call, tau 1 (never below)."""
        rounds = self.stats.target_calls - 1
        return (len(self.tokens) - 1) / rounds if rounds > 0 else 1.0


@dataclass(kw_only=True)
class BatchState:
    """Everything a batch carries between rounds (device tensors plus host-side mirrors).

    One entry per slot; a free slot is unoccupied and done."""

    tokens: "torch.Tensor"  # (S, L) committed tokens, prompt first
    lengths: list[int]  # committed tokens per row
    prompt_lengths: list[int]
    budgets: list[int]  # max new tokens per row
    done: list[bool]
    finish: list[str | None]
    rows: list[RowStats]
    params: list[SamplingParams]  # per row
    generators: Generators  # one for the batch, or one per row
    k_max: int
    stats: DecodeStats
    occupied: list[bool] = field(default_factory=list)
    new_tokens: list[list[int]] = field(default_factory=list)  # host copy of each row's output
    cohort: list[int] = field(default_factory=list)  # rows in a general runner's cache
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def empty(cls, slots: int, max_len: int, *, k_max: int, stats: DecodeStats,
              device: "torch.device", seed: int | None = None) -> BatchState:
        """``slots`` free slots of ``max_len`` positions, with one generator per row, or with
        ``seed`` one for the batch, seeded with it."""
        generators: Generators = [None] * slots
        if seed is not None:
            generators = torch.Generator(device=device)
            generators.manual_seed(seed)
        return cls(tokens=torch.zeros(slots, max_len, dtype=torch.long, device=device),
                   lengths=[0] * slots, prompt_lengths=[0] * slots, budgets=[0] * slots,
                   done=[True] * slots, finish=[None] * slots,
                   rows=[RowStats() for _ in range(slots)], params=[SamplingParams()] * slots,
                   generators=generators, k_max=k_max, stats=stats,
                   occupied=[False] * slots,
                   new_tokens=[[] for _ in range(slots)])

    @property
    def slots(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_len(self) -> int:
        return self.tokens.shape[1]

    @property
    def finished(self) -> bool:
        return all(self.done)

    def live(self) -> list[int]:
        """Slots still decoding."""
        return [b for b in range(self.slots) if self.occupied[b] and not self.done[b]]

    def result(self, b: int, *, final: bool = True) -> Result:
        """Row b's output; ``final``: as the batch ends, a row still decoding counted as cut at
        its length."""
        finish = self.finish[b] or ("length" if final else None)
        return Result(list(self.new_tokens[b]), finish, self.rows[b],
                      time.perf_counter() - self.started)

    def rng(self, rows: list[int]) -> Generators:
        g = self.generators
        return [g[b] for b in rows] if isinstance(g, list) else g

    def seat(self, b: int, prompt: list[int], params: SamplingParams, budget: int,
             seed: int | None = None) -> None:
        """Put a new row in free slot ``b``. With one generator per row, a sampled row gets
        its own, seeded with ``seed`` (at random when None)."""
        self.tokens[b, :len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        self.lengths[b] = self.prompt_lengths[b] = len(prompt)
        self.budgets[b] = budget
        self.done[b], self.finish[b], self.occupied[b] = False, None, True
        self.rows[b], self.params[b], self.new_tokens[b] = RowStats(), params, []
        if isinstance(self.generators, list):
            self.generators[b] = (None if params.greedy
                                  else row_generator(seed, self.tokens.device))

    def release(self, b: int) -> None:
        """Free slot ``b``: a row still decoding there ends as ``abort``."""
        if not self.done[b]:
            self.finish[b] = "abort"
        self.done[b], self.occupied[b] = True, False

    def last_tokens(self, rows: list[int]) -> "torch.Tensor":
        """x_(L-1) of each row: the committed token the target has not processed. -> (b, 1)"""
        dev = self.tokens.device
        lens = torch.tensor([self.lengths[b] for b in rows], device=dev)
        return self.tokens[torch.tensor(rows, device=dev), lens - 1][:, None]

    def commit(self, rows: list[int], block: "torch.Tensor", accepted: list[int],
               eos: set[int]) -> list[int]:
        """Close a round (or the prefill) for each row of ``rows`` still decoding: count its
        target call, then append the first accepted[i] + 1 tokens of block[i] (d_1..d_n and
        the target's token), stopping at EOS or the row's budget.

        block: (b, K + 1); K = 0 for a plain step. Returns the tokens kept per row (0 when
        the row was done already)."""
        k = block.shape[1] - 1
        dev = block.device
        lens = torch.tensor([self.lengths[b] for b in rows], device=dev)
        cols = lens[:, None] + torch.arange(k + 1, device=dev)  # (b, K + 1)
        # Rows that are done write past their end, where nothing is ever read.
        self.tokens[torch.tensor(rows, device=dev)[:, None], cols] = block
        host = block.tolist()
        kept = [0] * len(rows)
        for i, b in enumerate(rows):
            if not self.done[b]:
                self.rows[b].count(k, accepted[i])
                kept[i] = self._append(b, host[i][:accepted[i] + 1], eos)
        return kept

    def _append(self, b: int, tokens: list[int], eos: set[int]) -> int:
        """Append to row b the tokens up to the first EOS, within its budget; returns how many
        it kept, and finishes the row at EOS or at its budget."""
        m, reason = len(tokens), None
        for j, t in enumerate(tokens):
            if t in eos:
                m, reason = j + 1, "eos"
                break
        room = self.budgets[b] - (self.lengths[b] - self.prompt_lengths[b])
        if m >= room:
            reason = reason if m == room else None  # an EOS past the budget is cut off
            m, reason = room, reason or "length"
        self.finish[b] = reason
        self.done[b] = reason is not None
        self.new_tokens[b].extend(tokens[:m])
        self.lengths[b] += m
        return m
