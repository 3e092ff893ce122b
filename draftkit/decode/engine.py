"""The batched verify-and-accept decoder that generation, evaluation and serving run on.

One round (Leviathan et al., arXiv 2211.17192, Algorithm 1), per row, with L committed tokens
of which the target has processed the first L - 1:

1. draft: the draft reads what it has not read yet (a standalone draft the last committed
   tokens, an EAGLE-3 head the target's features of the last round; drafters.py), then K - 1
   single steps: K drafted tokens and q_1..q_K;
2. verify: one target call on [x_(L-1), d_1..d_K] gives p_1..p_(K+1);
3. accept (verify.py's ``verify``): the first n drafted tokens are accepted, and the target
   adds one token (the residual sample at the first rejection, or the bonus token);
4. commit (batch.py): d_1..d_n and that token are appended, up to EOS or the row's budget;
   both caches roll back by position (the runners continue from the committed length: no
   tensor is copied).

K = 0 is plain decoding in the same loop: one target step, no draft work at all. The next
drafting round first feeds the draft what those rounds decoded (catch-up, timed apart from the
K drafting steps so c stays the cost of one drafting step).

The kind of draft is the drafter's (drafters.py), not the engine's: an EAGLE-3 head has the
target's forwards capture the hidden states it reads (``runner.capture``), and keeps them per
row until it reads them.

Rows of different lengths each keep their own position pointer, so a row's tokens do not
depend on the other rows (under greedy decoding they equal decoding it alone). A round
computes only the rows still decoding; finished rows (EOS or their token budget) stay in the
batch, idle, until the batch ends.

Slots (continuous batching, as a server runs it): :meth:`SpeculativeEngine.open` returns a
:class:`~draftkit.decode.batch.Batch` of N empty slots with caches sized for the context
window, whose doors are the only way in and out: ``admit`` prefills new rows into free slots
(only their cache rows are written) while the other rows keep their state, ``step`` runs one
round over the live rows, ``release`` frees a slot, ``free_slots`` says how many rows may join
now and ``output`` reads a slot. :meth:`~SpeculativeEngine.start` is ``open`` plus ``admit`` of
a fixed batch. The Llama-family fast path admits at any round; the general transformers path
cannot write one row of a ``DynamicCache``, so it admits only into an empty batch (cohorts)
and every round computes the whole cohort (:meth:`SpeculativeEngine.free_slots`). A server
takes a new draft between batches (:meth:`SpeculativeEngine.swap_draft`, then ``open``): a
batch never holds rows of two drafts.

Sampling parameters are per row (temperature, top-k, top-p; greedy rows stay exact argmax).
Random numbers come from one seeded ``torch.Generator`` for the batch (``start``/``generate``:
a seeded run is reproducible, but which sample a row gets depends on the batch it ran in) or
from one generator per row (``Batch.admit(seeds=...)``): each round a row draws the same
numbers in the same order whatever else is in the batch, so a seeded row's tokens depend only
on its prompt, parameters, seed and the K of each round. Under a fixed K that makes it
independent of the batch; under ``--k auto`` the K chosen follows load and timing, which
changes which sample is drawn (never its distribution). Greedy rows never depend on the batch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from draftkit.decode.batch import Batch, BatchState, Result, round_margin
from draftkit.decode.choice import PLAIN, KChoice, resolve_k
from draftkit.decode.clock import RoundClock
from draftkit.decode.drafters import make_drafter
from draftkit.decode.graphs import forward_path
from draftkit.decode.k import AUTO, K_MAX, KValue
from draftkit.decode.runners import make_runner
from draftkit.decode.sampling import (PROBABILISTIC, TOKEN, SamplingParams, next_tokens,
                                      next_tokens_among)
from draftkit.decode.stats import DecodeStats, RoundStats
from draftkit.decode.verify import committed_block, verify
from draftkit.errors import DraftkitError
from draftkit.models.facts import (decoding_context, sliding_window, stop_token_ids, text_config,
                                   token_ids)

if TYPE_CHECKING:
    import torch


def _no_grad(method: Callable) -> Callable:
    """Run ``method`` without autograd: a caller of the step-wise API outside
    ``torch.inference_mode()`` would otherwise chain every round's KV cache into one graph,
    and memory would grow with every token."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        import torch

        with torch.no_grad():
            return method(*args, **kwargs)
    return wrapper


class SpeculativeEngine:
    """Speculative decoding of a target with an optional draft, batched.

    ``fast_path``: None picks the Llama-family fast path where the model supports it,
    False forces the general transformers-cache path.
    """

    def __init__(self, target_model, draft_model=None, *, eos_token_id: int | list[int] | None
                 = "auto", fast_path: bool | None = None):
        self.target_model, self.fast_path = target_model, fast_path
        self.target = make_runner(target_model, fast_path)
        self.device = next(target_model.parameters()).device
        self.eos = set(stop_token_ids(target_model) if eos_token_id == "auto"
                       else token_ids(eos_token_id))
        self._set_draft(draft_model)

    def _set_draft(self, draft_model) -> None:
        """The draft (None: plain decoding) and what follows from it: its drafter, the
        context, slots or cohorts. Nothing changes until the draft has passed its checks."""
        tv = text_config(self.target_model).vocab_size
        if draft_model is not None and text_config(draft_model).vocab_size != tv:
            raise DraftkitError(f"draft vocab_size {text_config(draft_model).vocab_size} differs "
                                f"from the target's {tv}; speculative decoding compares the two "
                                f"distributions token id by token id, so the draft must share "
                                f"the target's vocabulary")
        draft = (make_drafter(draft_model, self.target_model, self.fast_path)
                 if draft_model is not None else None)
        self.draft_model, self.draft = draft_model, draft
        self.context = decoding_context(self.target_model, draft_model)
        # slots (admit at any round) need runners that can write a subset of cache rows
        self.slotted = self.target.supports_rows and (
            self.draft is None or self.draft.supports_rows)
        # transformers' sliding-window masks and caches count cache columns, and a batched
        # general cache holds padding and rolled-back holes besides a row's tokens: only a
        # batch of one keeps columns and positions equal, so decoding_context's cap is exact
        self.one_row_cohorts = not self.slotted and any(
            sliding_window(m) for m in (self.target_model, draft_model) if m is not None)

    def swap_draft(self, draft_model, max_len: int) -> None:
        """Decode with ``draft_model`` from the next :meth:`open` on (a server taking a new
        draft). The caller has released every row first: a batch's per-slot draft state (its
        cache, an EAGLE-3 head's pending features) is the draft's it opened with, so the rows
        of a new draft need a new batch. ``max_len``: the positions that batch's slots will
        hold, which the new draft must reach. Checked before anything changes: a draft refused
        leaves the engine decoding with the old one."""
        if draft_model is None or self.draft is None:
            raise DraftkitError("a draft swap replaces one draft with another; this engine "
                                "decodes without a draft" if self.draft is None else
                                "no draft given to swap in")
        context = decoding_context(self.target_model, draft_model)
        if context is not None and context < max_len:
            raise DraftkitError(f"the new draft decodes exactly up to {context} positions; "
                                f"this batch's slots hold {max_len}")
        self._set_draft(draft_model)

    # --- one-call API ---------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], *, k: KChoice | KValue = AUTO,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, k_max: int = K_MAX,
                 stats: DecodeStats | None = None, draft_sample_method: str = PROBABILISTIC,
                 verify: str = TOKEN) -> list[Result]:
        """Decode every prompt (token ids) and return one :class:`Result` per prompt.

        ``k``: a :class:`~draftkit.decode.choice.KChoice` (a command's, validated where it
        entered; with ``auto`` its policy goes on learning across calls), or a K given here,
        checked once: fixed, or ``"auto"`` up to ``k_max``; K = 0 without a draft.
        ``draft_sample_method`` and ``verify``: :class:`SamplingParams`' own."""
        import torch

        params = SamplingParams(temperature, top_k, top_p, draft_sample_method, verify)
        choice = k if isinstance(k, KChoice) else resolve_k(
            k, k_max, has_draft=self.draft is not None)
        if self.one_row_cohorts and len(prompts) > 1:  # one policy learns from every row
            for i, p in enumerate(prompts):  # each fits, named by its index, before any runs
                self._budget(len(p), max_new_tokens, self.context, choice.k_max, i)
            return [self.generate([p], k=choice, max_new_tokens=max_new_tokens,
                                  temperature=temperature, top_k=top_k, top_p=top_p,
                                  seed=None if seed is None else seed + i, stats=stats,
                                  draft_sample_method=draft_sample_method, verify=verify)[0]
                    for i, p in enumerate(prompts)]
        with torch.inference_mode():
            batch = self.start(prompts, params, max_new_tokens, seed, choice, stats)
            while not batch.finished:
                batch.step()
        return batch.results()

    # --- batches ----------------------------------------------------------------------------

    @_no_grad
    def start(self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int,
              seed: int | None = None, k: KChoice = PLAIN, stats: DecodeStats | None = None
              ) -> Batch:
        """A fixed batch: validate, allocate the caches, prefill both models and emit each
        row's first token. Rows share one generator seeded with ``seed``."""
        if not prompts:
            raise DraftkitError("no prompts given")
        if max_new_tokens < 1:
            raise DraftkitError(f"max new tokens must be >= 1, got {max_new_tokens}")
        lens = [len(p) for p in prompts]
        if min(lens) == 0:
            raise DraftkitError("empty prompt; give some text")
        budgets = [self._budget(n, max_new_tokens, self.context, k.k_max, i)
                   for i, n in enumerate(lens)]
        max_len = max(n + b for n, b in zip(lens, budgets)) + round_margin(k.k_max)
        batch = self.open(len(prompts), k, max_len, stats,
                          seed=None if params.greedy else (seed if seed is not None else 0))
        batch.admit(prompts, params, budgets)
        return batch

    @_no_grad
    def open(self, slots: int, k: KChoice = PLAIN, max_len: int | None = None,
             stats: DecodeStats | None = None, *, seed: int | None = None) -> Batch:
        """An empty batch of ``slots`` rows whose caches hold ``max_len`` positions (default:
        the target's context window), each round's K chosen by ``k``. Rows enter with
        :meth:`Batch.admit`, each with its own generator, or with ``seed`` all drawing from
        one generator seeded with it (:meth:`start`)."""
        if slots < 1:
            raise DraftkitError(f"a batch needs at least one slot, got {slots}")
        if max_len is None:
            if not self.context:
                raise DraftkitError("the target's config has no max_position_embeddings; "
                                    "give the maximum sequence length")
            max_len = self.context
        state = BatchState.empty(slots, max_len, k_max=k.k_max, device=self.device,
                                 stats=stats if stats is not None else DecodeStats(), seed=seed)
        use_draft = self.draft is not None and k.k_max > 0
        # the features a drafter reads from the target's forwards (an EAGLE-3 head's)
        self.target.capture = self.draft.aux_layers if use_draft else None
        if self.draft is not None:
            self.draft.open(slots)
        if self.slotted:  # the general runner allocates per cohort instead
            self.target.reset(slots, max_len)
            if use_draft:
                self.draft.reset(slots, max_len)
        return Batch(self, state, k)

    def free_slots(self, state: BatchState) -> int:
        """How many new rows may join the batch now: the free slots, except that the general
        path admits only into an empty batch (a cohort) and, for a sliding-window model on it,
        one row at a time."""
        if not self.slotted and any(state.occupied):
            return 0
        free = state.occupied.count(False)
        return min(free, 1) if self.one_row_cohorts else free

    def admit(self, state: BatchState, prompts: list[list[int]],
              params: list[SamplingParams], budgets: list[int],
              seeds: list[int | None] | None = None) -> list[int]:
        """Prefill new rows into free slots and emit their first token; returns the slots
        (:meth:`Batch.admit`, which checked them)."""
        slots = [b for b in range(state.slots) if not state.occupied[b]][:len(prompts)]
        for i, b in enumerate(slots):
            state.seat(b, prompts[i], params[i], budgets[i],
                       seeds[i] if seeds is not None else None)
        clock = RoundClock(self.device)
        self._prefill(state, slots)
        state.stats.add_prefill(clock.lap("prefill"), len(prompts))
        return slots

    @_no_grad
    def step(self, state: BatchState, k: int) -> RoundStats:
        """One round at K drafted tokens (K = 0: a plain target step) over the live rows:
        Leviathan et al. (arXiv 2211.17192) Algorithm 1 for every row at once, positions as
        in the module docstring. Each lap of the clock waits for the device."""
        import torch

        if k > state.k_max:
            raise DraftkitError(f"K = {k} exceeds the K the batch was started with "
                                f"({state.k_max})")
        if self.draft is None:
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
            logits = self.target.forward(last, positions, rows=rows)  # (b, 1, V)
            clock.lap("verify")
            target_path, draft_path = forward_path(self.target), None
            token, _ = next_tokens(logits[:, 0], params, state.rng(rows))  # (b,)
            block, verdict, accepted = token[:, None], None, [0] * len(rows)
        else:
            if self.draft.catch_up(state, rows, lengths, k):
                clock.lap("catchup")
            drafted, q = self._draft(state, rows, lengths, k)  # (b, K), (b, K, V) or None
            clock.lap("draft")
            draft_path = forward_path(self.draft.runner)  # its drafting steps' (the last one's)
            verify_in = torch.cat([last, drafted], dim=1)  # (b, K + 1)
            logits = self.target.forward(verify_in, positions, rows=rows)  # (b, K + 1, V)
            clock.lap("verify")
            target_path = forward_path(self.target)
            verdict = verify(drafted, q, logits, params, state.rng(rows))
            block = committed_block(drafted, verdict)  # (b, K + 1)
            accepted = verdict.num_accepted.tolist()
        kept = state.commit(rows, block, accepted, self.eos)
        if self.draft is not None and state.k_max > 0:
            self.draft.after_round(state, rows, k, kept, self.target.aux)
        r = RoundStats.from_verdict(verdict, accepted=accepted, active=active, kept=kept)
        r.draft_per_round = bool(k) and self.draft.per_round  # c: a forward's, K or one a round
        r.set_paths(target_path, draft_path)
        clock.lap("other")  # sampling, acceptance, commit and counting are overhead too
        r.set_seconds(clock.laps)
        state.stats.add_round(r)
        return r

    # --- pieces -----------------------------------------------------------------------------

    @staticmethod
    def _budget(prompt_len: int, max_new_tokens: int, max_len: int | None, k_max: int,
                i: int) -> int:
        """New tokens a row may have: its request, capped so a round's K + 1 writes fit."""
        room = (max_len - prompt_len - round_margin(k_max)) if max_len else max_new_tokens
        if room < 1:
            raise DraftkitError(f"prompt {i} has {prompt_len} tokens; the context window is "
                                f"{max_len} (room is needed for K = {k_max} drafted tokens "
                                f"too); shorten the prompt")
        return min(max_new_tokens, room)

    def admission_budgets(self, state: BatchState, prompts: list[list[int]],
                          budgets: list[int], seeds: list | None) -> list[int]:
        """Check that ``prompts`` may enter the batch now (:meth:`free_slots`); returns each
        one's budget, capped so its rounds fit (:meth:`_budget`)."""
        n, free = len(prompts), self.free_slots(state)
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
            capped.append(self._budget(len(prompt), b, state.max_len, state.k_max, i))
        if seeds is not None and not isinstance(state.generators, list):
            raise DraftkitError("per-row seeds need a batch made by open(), not start()")
        return capped

    def _prefill(self, state: BatchState, slots: list[int]) -> None:
        """Both models read the new rows' prompts; the target's next token is each row's
        first, committed like a plain step's."""
        import torch

        n = len(slots)
        use_draft = self.draft is not None and state.k_max > 0
        if not self.slotted:  # a new cohort: fresh caches holding exactly these rows
            state.cohort = list(slots)
            self.target.reset(n, state.max_len)
            if use_draft:
                self.draft.reset(n, state.max_len)
        lens = [state.lengths[b] for b in slots]
        rows_t = torch.tensor(slots, device=self.device)
        inp = state.tokens[rows_t, :max(lens)]  # (n, W) right-padded prompts
        last = [m - 1 for m in lens]
        logits = self.target.forward(inp, [0] * n, last=last, rows=slots)  # (n, V)
        if use_draft:
            self.draft.prefill(state, slots, inp, last, self.target.aux)
        first, _ = next_tokens(logits, [state.params[b] for b in slots], state.rng(slots))
        state.commit(slots, first[:, None], [0] * n, self.eos)

    def _draft(self, state: BatchState, rows: list[int], lengths: list[int], k: int):
        """K draft tokens per row (and their warped q unless every row is greedy)."""
        import torch

        vocab = self.draft.vocab  # a reduced head: drafts are chosen among its N tokens
        params, gens = [state.params[b] for b in rows], state.rng(rows)
        if self.draft.per_round:  # one forward scored all K, none reading another: chosen at once
            logits = self.draft.round_logits(state, rows, lengths, k)  # (b, K, V), or (b, K, N)
            return next_tokens_among(logits, params, gens, vocab)  # (b, K), q (b, K, V) or None
        logits = self.draft.first_logits(state, rows, lengths, k)  # (b, V), or (b, N)
        tokens, qs = [], []
        for i in range(k):
            d, q = next_tokens_among(logits, params, gens, vocab)  # (b,), (b, V) or None
            tokens.append(d)
            qs.append(q)
            if i < k - 1:
                logits = self.draft.next_logits(d, i, rows, lengths)
        drafted = torch.stack(tokens, dim=1)  # (b, K)
        return drafted, (torch.stack(qs, dim=1) if qs[0] is not None else None)  # q (b, K, V)
