"""A decoding batch: its doors, admission, the prefill and the round (draft, verify, commit).

A batch is a fixed number of slots; a slot holds one row (a prompt and its new tokens) or is
free. :class:`Batch` is what :meth:`SpeculativeEngine.open <draftkit.decode.engine.
SpeculativeEngine.open>` returns and the only way in and out of a decode: admit rows, step a
round, release a slot, ask how many rows may join now, read a slot's output. The engine opens
it on its target's runner, the drafter (None: no draft in use, every round plain), the stop
tokens and the K choice; the batch owns its state (:class:`~draftkit.decode.state.
BatchState`, which no one else holds) and runs everything that reads or changes it.

One round (Leviathan et al., arXiv 2211.17192, Algorithm 1), per row, with L committed tokens
of which the target has processed the first L - 1:

1. draft: the drafter reads what it has not read yet (a standalone draft the last committed
   tokens, an EAGLE-3 head the target's features of the last round; drafters.py), then K - 1
   single steps: K drafted tokens and q_1..q_K;
2. verify: one target call on [x_(L-1), d_1..d_K] gives p_1..p_(K+1);
3. accept (verify.py's ``verify``): the first n drafted tokens are accepted, and the target
   adds one token (the residual sample at the first rejection, or the bonus token);
4. commit (:meth:`BatchState.commit <draftkit.decode.state.BatchState.commit>`): d_1..d_n and
   that token are appended, up to EOS or the row's budget; both caches roll back by position
   (the runners continue from the committed length: no tensor is copied).

K = 0 is plain decoding in the same loop: one target step, no draft work at all. The next
drafting round first feeds the draft what those rounds decoded (catch-up, timed apart from the
K drafting steps so c stays the cost of one drafting step).

Each round's K is the batch's :class:`~draftkit.decode.choice.KChoice`'s (fixed, or the
``auto`` policy's for the live rows), told what the round cost and kept.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import torch

from draftkit.decode.clock import RoundClock
from draftkit.decode.graphs import forward_path
from draftkit.decode.sampling import next_tokens, next_tokens_among
from draftkit.decode.sampling_params import SamplingParams
from draftkit.decode.state import BatchState, Result, row_budget
from draftkit.decode.stats import DecodeStats, RoundStats
from draftkit.decode.verify import committed_block, verify
from draftkit.errors import DraftkitError

if TYPE_CHECKING:
    from draftkit.decode.choice import KChoice
    from draftkit.decode.drafters import Eagle3Drafter, StandaloneDrafter


def no_grad(method: Callable) -> Callable:
    """Run ``method`` without autograd: a caller of the step-wise API outside
    ``torch.inference_mode()`` would otherwise chain every round's KV cache into one graph,
    and memory would grow with every token."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with torch.no_grad():
            return method(*args, **kwargs)
    return wrapper


class Batch:
    """An open batch of ``slots`` rows whose caches hold ``max_len`` positions, each round's K
    chosen by ``k`` (:meth:`SpeculativeEngine.open <draftkit.decode.engine.SpeculativeEngine.
    open>` makes it).

    ``target``: the target's runner; ``drafter``: the draft's (None when no draft is in use:
    every round is a plain step); ``eos``: the stop tokens; ``slotted``: rows join at any
    round (else only an empty batch, a cohort); ``one_row_cohorts``: a cohort is one row;
    ``seed``: all rows draw from one generator seeded with it (else one per row).

    Its doors are the only way in and out of a decode: :meth:`free_slots` (how many rows may
    join now: the one admission rule), :meth:`admit`, :meth:`step`, :meth:`release` and
    :meth:`output`. A server's scheduler, data generation and the one-call ``generate`` are
    loops over them."""

    def __init__(self, slots: int, max_len: int, k: "KChoice", *, target,
                 drafter: "StandaloneDrafter | Eagle3Drafter | None", eos: set[int],
                 device: "torch.device", slotted: bool, one_row_cohorts: bool,
                 stats: DecodeStats | None = None, seed: int | None = None):
        self.k, self.target, self.drafter, self.eos = k, target, drafter, eos
        self.device, self.slotted, self.one_row_cohorts = device, slotted, one_row_cohorts
        self._state = BatchState.empty(slots, max_len, k_max=k.k_max, device=device,
                                       stats=stats if stats is not None else DecodeStats(),
                                       seed=seed)
        # the features a drafter reads from the target's forwards (an EAGLE-3 head's)
        target.capture = drafter.aux_layers if drafter is not None else None
        if drafter is not None:
            drafter.open(slots)
        if slotted:  # the general runner allocates per cohort instead
            target.reset(slots, max_len)
            if drafter is not None:
                drafter.reset(slots, max_len)

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
        """How many new rows may join the batch now: the free slots, except that the general
        path admits only into an empty batch (a cohort) and, for a sliding-window model on it,
        one row at a time."""
        state = self._state
        if not self.slotted and any(state.occupied):
            return 0
        free = state.occupied.count(False)
        return min(free, 1) if self.one_row_cohorts else free

    @no_grad
    def admit(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
              max_new_tokens: int | list[int], seeds: list[int | None] | None = None
              ) -> list[int]:
        """Prefill new rows into free slots and emit their first token; returns the slots.

        Only the admitted rows' caches are written; the live rows keep decoding at the next
        :meth:`step`. ``seeds``: one per new row (the batch must have been opened, not
        started), each seeding the row's own generator; a sampled row without one (None) gets
        a generator seeded at random."""
        n, state = len(prompts), self._state
        params = params if isinstance(params, list) else [params] * n
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        budgets = self._budgets(prompts, budgets, seeds)
        slots = [b for b in range(state.slots) if not state.occupied[b]][:n]
        for i, b in enumerate(slots):
            state.seat(b, prompts[i], params[i], budgets[i],
                       seeds[i] if seeds is not None else None)
        clock = RoundClock(self.device)
        self._prefill(slots)
        state.stats.add_prefill(clock.lap("prefill"), n)
        return slots

    def step(self) -> RoundStats:
        """One round over the live rows at the K the batch's choice picks for them; the choice
        is told what the round cost and kept."""
        r = self._round(self.k.choose(len(self.live)))
        self.k.observe(r)
        return r

    def release(self, slot: int) -> None:
        """Free a slot (a finished row, or one whose client went away) for the next admit."""
        self._state.release(slot)

    def output(self, slot: int) -> Result:
        """What the row in ``slot`` has decoded so far (``done`` once it finished)."""
        return self._state.result(slot, final=False)

    def results(self) -> list[Result]:
        """Every slot's output as the batch ends (a row still decoding counted as cut)."""
        return [self._state.result(b) for b in range(self.slots)]

    # --- behind the doors -------------------------------------------------------------------

    def _budgets(self, prompts: list[list[int]], budgets: list[int],
                 seeds: list | None) -> list[int]:
        """Check that ``prompts`` may enter the batch now (:meth:`free_slots`); returns each
        one's budget, capped so its rounds fit (:func:`~draftkit.decode.state.row_budget`)."""
        state = self._state
        n, free = len(prompts), self.free_slots()
        if n and not free and not self.slotted:
            raise DraftkitError("the general decoding path admits rows only into an empty "
                                "batch; wait until every slot is released")
        if n > 1 and free == 1 and self.one_row_cohorts:
            raise DraftkitError("a sliding-window model on the general decoding path decodes "
                                "one row at a time; admit one prompt")
        if n == 0 or n > free:
            raise DraftkitError(f"cannot admit {n} rows: {free} slots are free")
        capped = []
        for i, (prompt, b) in enumerate(zip(prompts, budgets)):
            if not prompt:
                raise DraftkitError("empty prompt; give some text")
            if b < 1:
                raise DraftkitError(f"max new tokens must be >= 1, got {b}")
            capped.append(row_budget(len(prompt), b, state.max_len, state.k_max, i))
        if seeds is not None and not isinstance(state.generators, list):
            raise DraftkitError("per-row seeds need a batch made by open(), not start()")
        return capped

    def _prefill(self, slots: list[int]) -> None:
        """Both models read the new rows' prompts; the target's next token is each row's
        first, committed like a plain step's."""
        state, target, drafter = self._state, self.target, self.drafter
        n = len(slots)
        if not self.slotted:  # a new cohort: fresh caches holding exactly these rows
            state.cohort = list(slots)
            target.reset(n, state.max_len)
            if drafter is not None:
                drafter.reset(n, state.max_len)
        lens = [state.lengths[b] for b in slots]
        rows_t = torch.tensor(slots, device=self.device)
        inp = state.tokens[rows_t, :max(lens)]  # (n, W) right-padded prompts
        last = [m - 1 for m in lens]
        logits = target.forward(inp, [0] * n, last=last, rows=slots)  # (n, V)
        if drafter is not None:
            drafter.prefill(state, slots, inp, last, target.aux)
        first, _ = next_tokens(logits, [state.params[b] for b in slots], state.rng(slots))
        state.commit(slots, first[:, None], [0] * n, self.eos)

    @no_grad
    def _round(self, k: int) -> RoundStats:
        """One round at K drafted tokens (K = 0: a plain target step) over the live rows:
        Leviathan et al. (arXiv 2211.17192) Algorithm 1 for every row at once, positions as
        in the module docstring. Each lap of the clock waits for the device."""
        state, target, drafter = self._state, self.target, self.drafter
        if drafter is None:
            k = 0
        rows = state.live()
        if not rows:
            return RoundStats.empty(k)
        if not self.slotted:  # the general runner computes its whole cohort
            rows = state.cohort
        clock = RoundClock(self.device)
        active = [not state.done[b] for b in rows]
        lengths = [state.lengths[b] for b in rows]
        positions = [n - 1 for n in lengths]  # x_(L-1) sits at L - 1, after what the target holds
        last = state.last_tokens(rows)  # (b, 1)
        params = [state.params[b] for b in rows]
        # set-up is round overhead: timed inside the plain step's forward it made T(1) read
        # high, and so v = T(K + 1) / T(1) and c low
        clock.lap("other")
        if k == 0:  # plain decoding: the target's next token, nothing drafted
            logits = target.forward(last, positions, rows=rows)  # (b, 1, V)
            clock.lap("verify")
            target_path, draft_path = forward_path(target), None
            token, _ = next_tokens(logits[:, 0], params, state.rng(rows))  # (b,)
            block, verdict, accepted = token[:, None], None, [0] * len(rows)
        else:
            if drafter.catch_up(state, rows, lengths, k):
                clock.lap("catchup")
            drafted, q = self._draft(rows, lengths, k)  # (b, K), (b, K, V) or None
            clock.lap("draft")
            draft_path = forward_path(drafter.runner)  # its drafting steps' (the last one's)
            verify_in = torch.cat([last, drafted], dim=1)  # (b, K + 1)
            logits = target.forward(verify_in, positions, rows=rows)  # (b, K + 1, V)
            clock.lap("verify")
            target_path = forward_path(target)
            verdict = verify(drafted, q, logits, params, state.rng(rows))
            block = committed_block(drafted, verdict)  # (b, K + 1)
            accepted = verdict.num_accepted.tolist()
        kept = state.commit(rows, block, accepted, self.eos)
        if drafter is not None:
            drafter.after_round(state, rows, k, kept, target.aux)
        r = RoundStats.from_verdict(verdict, accepted=accepted, active=active, kept=kept)
        r.draft_per_round = bool(k) and drafter.per_round  # c: a forward's, K or one a round
        r.set_paths(target_path, draft_path)
        clock.lap("other")  # sampling, acceptance, commit and counting are overhead too
        r.set_seconds(clock.laps)
        state.stats.add_round(r)
        return r

    def _draft(self, rows: list[int], lengths: list[int], k: int):
        """K draft tokens per row (and their warped q unless every row is greedy):
        (b, K), q (b, K, V) or None."""
        state, drafter = self._state, self.drafter
        vocab = drafter.vocab  # a reduced head: drafts are chosen among its N tokens
        params, gens = [state.params[b] for b in rows], state.rng(rows)
        if drafter.per_round:  # one forward scored all K, none reading another: chosen at once
            logits = drafter.round_logits(state, rows, lengths, k)  # (b, K, V), or (b, K, N)
            return next_tokens_among(logits, params, gens, vocab)  # (b, K), q (b, K, V) or None
        logits = drafter.first_logits(state, rows, lengths, k)  # (b, V), or (b, N)
        tokens, qs = [], []
        for i in range(k):
            d, q = next_tokens_among(logits, params, gens, vocab)  # (b,), (b, V) or None
            tokens.append(d)
            qs.append(q)
            if i < k - 1:
                logits = drafter.next_logits(d, i, rows, lengths)
        drafted = torch.stack(tokens, dim=1)  # (b, K)
        return drafted, (torch.stack(qs, dim=1) if qs[0] is not None else None)  # q (b, K, V)
