"""A decoding batch: its doors, what it carries between rounds, and how a round's tokens are
committed to it.

A batch is a fixed number of slots; a slot holds one row (a prompt and its new tokens) or is
free. :class:`Batch` is what :meth:`SpeculativeEngine.open <draftkit.decode.engine.
SpeculativeEngine.open>` returns and the only way in and out of a decode: admit rows, step a
round, release a slot, ask how many rows may join now, read a slot's output. Behind it,
:class:`BatchState` keeps the committed tokens on the device and everything else on the host:
lengths, budgets, sampling parameters, random generators, finish reasons and per-row counts;
:meth:`BatchState.commit` appends a round's accepted tokens, stopping a row at EOS or its
token budget. Only the engine and its drafters (``draftkit/decode``) read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from draftkit.decode.sampling import Generators, SamplingParams, row_generator
from draftkit.decode.stats import DecodeStats

if TYPE_CHECKING:
    import torch

    from draftkit.decode.choice import KChoice
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.stats import RoundStats


def round_margin(k_max: int) -> int:
    """Positions a row keeps free past its committed length: a round may write K + 1 there
    (K drafted tokens and the target's own), with one to spare."""
    return k_max + 2


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
        from draftkit.metrics import alpha_from_counts

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
        import torch

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
        import torch

        self.tokens[b, :len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        self.lengths[b] = self.prompt_lengths[b] = len(prompt)
        self.budgets[b] = budget
        self.done[b], self.finish[b], self.occupied[b] = False, None, True
        self.rows[b], self.params[b], self.new_tokens[b] = RowStats(), params, []
        if isinstance(self.generators, list):
            self.generators[b] = (None if params.greedy
                                  else row_generator(seed, self.tokens.device))

    def last_tokens(self, rows: list[int]) -> "torch.Tensor":
        """x_(L-1) of each row: the committed token the target has not processed. -> (b, 1)"""
        import torch

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
        import torch

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


class Batch:
    """An open batch of slots on an engine (:meth:`SpeculativeEngine.open
    <draftkit.decode.engine.SpeculativeEngine.open>`), each round's K chosen by ``k``.

    Its doors are the only way in and out of a decode: :meth:`free_slots` (how many rows may
    join now: the one admission rule), :meth:`admit`, :meth:`step`, :meth:`release` and
    :meth:`output`. A server's scheduler, data generation and the one-call ``generate`` are
    loops over them."""

    def __init__(self, engine: "SpeculativeEngine", state: BatchState, k: "KChoice"):
        self.engine, self._state, self.k = engine, state, k  # _state: decode/'s alone

    @property
    def slots(self) -> int:
        return self._state.slots

    @property
    def max_len(self) -> int:
        """Positions each slot holds: a prompt, its new tokens and a round's room."""
        return self._state.max_len

    @property
    def live(self) -> list[int]:
        """Slots still decoding."""
        return self._state.live()

    @property
    def finished(self) -> bool:
        """Every slot is done or free."""
        return self._state.finished

    def free_slots(self) -> int:
        """How many new rows may join now (:meth:`SpeculativeEngine.free_slots
        <draftkit.decode.engine.SpeculativeEngine.free_slots>`)."""
        return self.engine.free_slots(self._state)

    def admit(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
              max_new_tokens: int | list[int], seeds: list[int | None] | None = None
              ) -> list[int]:
        """Prefill new rows into free slots and emit their first token; returns the slots.

        Only the admitted rows' caches are written; the live rows keep decoding at the next
        :meth:`step`. ``seeds``: one per new row (the batch must have been opened, not
        started), each seeding the row's own generator; a sampled row without one (None) gets
        a generator seeded at random."""
        import torch

        n = len(prompts)
        params = params if isinstance(params, list) else [params] * n
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        budgets = self.engine.admission_budgets(self._state, prompts, budgets, seeds)
        with torch.no_grad():
            return self.engine.admit(self._state, prompts, params, budgets, seeds)

    def step(self, k: int | None = None) -> "RoundStats":
        """One round over the live rows at the K the batch's choice picks for them (and tells
        what the round cost and kept), or at ``k`` when given (a caller driving K itself)."""
        if k is not None:
            return self.engine.step(self._state, k)
        r = self.engine.step(self._state, self.k.choose(len(self.live)))
        self.k.observe(r)
        return r

    def release(self, slot: int) -> None:
        """Free a slot (a finished row, or one whose client went away) for the next admit."""
        state = self._state
        if not state.done[slot]:
            state.finish[slot] = "abort"
        state.done[slot], state.occupied[slot] = True, False

    def output(self, slot: int) -> Result:
        """What the row in ``slot`` has decoded so far (``done`` once it finished)."""
        return self._state.result(slot, final=False)

    def results(self) -> list[Result]:
        """Every slot's output as the batch ends (a row still decoding counted as cut)."""
        return [self._state.result(b) for b in range(self.slots)]
