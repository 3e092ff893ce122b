"""The batched verify-and-accept decoder that generation, evaluation and serving run on.

One round (Leviathan et al., arXiv 2211.17192, Algorithm 1), per row, with L committed tokens
of which the target has processed the first L - 1:

1. draft: feed the last two committed tokens at positions L - 2, L - 1 (re-writing position
   L - 2 is a no-op when the draft already had it, and is the catch-up on the bonus token when
   the draft had not seen it), then K - 1 single steps: K drafted tokens and q_1..q_K;
2. verify: one target call on [x_(L-1), d_1..d_K] gives p_1..p_(K+1);
3. accept (verify.py): n drafted tokens plus one target token are committed; both caches roll
   back by position (the runners continue from the committed length: no tensor is copied).

K = 0 is plain decoding in the same loop: one target step, no draft work at all. The next
drafting round first feeds the draft the tokens those rounds decoded (catch-up, timed apart
from the K drafting steps so c stays the cost of one drafting step).

Rows of different lengths each keep their own position pointer, so a row's tokens do not
depend on the other rows (under greedy decoding they equal decoding it alone). A round
computes only the rows still decoding; finished rows (EOS or their token budget) stay in the
batch, idle, until the batch ends.

Slots (continuous batching, as a server runs it): :meth:`SpeculativeEngine.open` allocates a
batch of N empty slots with caches sized for the context window; :meth:`~SpeculativeEngine.admit`
prefills new rows into free slots (only their cache rows are written) while the other rows
keep their state; :meth:`~SpeculativeEngine.step` runs one round over the live rows;
:meth:`~SpeculativeEngine.release` frees a slot. :meth:`~SpeculativeEngine.start` is ``open``
plus ``admit`` of a fixed batch. The Llama-family fast path admits at any round; the general
transformers path cannot write one row of a ``DynamicCache``, so it admits only into an empty
batch (cohorts) and every round computes the whole cohort.

Sampling parameters are per row (temperature, top-k, top-p; greedy rows stay exact argmax).
Random numbers come from one seeded ``torch.Generator`` for the batch (``start``/``generate``:
a seeded run is reproducible, but which sample a row gets depends on the batch it ran in) or
from one generator per row (``admit(generators=...)``): each round a row draws the same
numbers in the same order whatever else is in the batch, so a seeded row's tokens depend only
on its prompt, parameters, seed and the K of each round. Under a fixed K that makes it
independent of the batch; under ``--k auto`` the K chosen follows load and timing, which
changes which sample is drawn (never its distribution). Greedy rows never depend on the batch.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal

from draftkit.decode.k import AUTO, K_MAX, KValue, check_k_max
from draftkit.decode.policy import KPolicy, resolve_k
from draftkit.decode.runners import make_runner
from draftkit.decode.sampling import Generators, SamplingParams, row_probabilities, sample
from draftkit.decode.stats import DecodeStats, RoundStats
from draftkit.decode.verify import committed_block, verify
from draftkit.errors import DraftkitError
from draftkit.models.facts import (decoding_context, sliding_window, stop_token_ids, text_config,
                                   token_ids)

if TYPE_CHECKING:
    import torch


@dataclass
class RowStats:
    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0

    @property
    def alpha(self) -> float:
        from draftkit.metrics import alpha_from_counts

        return alpha_from_counts(self.accepted, self.rejections)


def round_margin(k_max: int) -> int:
    """Positions a row keeps free past its committed length: a round may write K + 1 there
    (K drafted tokens and the target's own), with one to spare."""
    return k_max + 2


@dataclass
class Result:
    tokens: list[int]  # new tokens only (EOS included when it ended the row)
    finish_reason: Literal["eos", "length", "abort"]
    stats: RowStats
    seconds: float = 0.0  # wall time of the batch the row ran in

    @property
    def tau(self) -> float:
        """Tokens kept per target call over the decoding rounds, as :meth:`DecodeStats.tau`:
        the prefill and the first token it emits are left out."""
        rounds = self.stats.target_calls - 1
        return (len(self.tokens) - 1) / rounds if rounds > 0 else 0.0


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


@dataclass
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
    draft_lengths: list[int] = field(default_factory=list)  # positions the draft cache holds
    occupied: list[bool] = field(default_factory=list)
    new_tokens: list[list[int]] = field(default_factory=list)  # host copy of each row's output
    cohort: list[int] = field(default_factory=list)  # rows in a general runner's cache
    started: float = field(default_factory=time.perf_counter)

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

    def result(self, b: int) -> Result:
        return Result(list(self.new_tokens[b]), self.finish[b] or "length", self.rows[b],
                      time.perf_counter() - self.started)

    def results(self) -> list[Result]:
        return [self.result(b) for b in range(self.slots)]

    def rng(self, rows: list[int]) -> Generators:
        g = self.generators
        return [g[b] for b in rows] if isinstance(g, list) else g


def synchronize(device: "torch.device") -> None:
    """Wait for queued device work so the clock reads what was actually spent."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class SpeculativeEngine:
    """Speculative decoding of a target with an optional draft, batched.

    ``fast_path``: None picks the Llama-family fast path where the model supports it,
    False forces the general transformers-cache path.
    """

    def __init__(self, target_model, draft_model=None, *, eos_token_id: int | list[int] | None
                 = "auto", fast_path: bool | None = None):
        tv = text_config(target_model).vocab_size
        if draft_model is not None and text_config(draft_model).vocab_size != tv:
            raise DraftkitError(f"draft vocab_size {text_config(draft_model).vocab_size} differs "
                                f"from the target's {tv}; speculative decoding compares the two "
                                f"distributions token id by token id, so the draft must share "
                                f"the target's vocabulary")
        self.target_model, self.draft_model = target_model, draft_model
        self.target = make_runner(target_model, fast_path)
        self.draft = make_runner(draft_model, fast_path) if draft_model is not None else None
        self.device = next(target_model.parameters()).device
        self.eos = set(stop_token_ids(target_model) if eos_token_id == "auto"
                       else token_ids(eos_token_id))
        self.context = decoding_context(target_model, draft_model)
        # slots (admit at any round) need runners that can write a subset of cache rows
        self.slotted = self.target.supports_rows and (
            self.draft is None or self.draft.supports_rows)
        # transformers' sliding-window masks and caches count cache columns, and a batched
        # general cache holds padding and rolled-back holes besides a row's tokens: only a
        # batch of one keeps columns and positions equal, so decoding_context's cap is exact
        self.one_row_cohorts = not self.slotted and any(
            sliding_window(m) for m in (target_model, draft_model) if m is not None)

    # --- one-call API ---------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], *, k: KValue = AUTO,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, k_max: int = K_MAX,
                 policy: "KPolicy | None" = None, stats: DecodeStats | None = None
                 ) -> list[Result]:
        """Decode every prompt (token ids) and return one :class:`Result` per prompt.

        K is fixed, or ``"auto"``: chosen each round by ``policy`` (a fresh KPolicy up to
        ``k_max`` when None); K = 0 without a draft (:func:`~draftkit.decode.policy.resolve_k`)."""
        import torch

        params = SamplingParams(temperature, top_k, top_p)
        choice = resolve_k(k, k_max, has_draft=self.draft is not None, policy=policy)
        if self.one_row_cohorts and len(prompts) > 1:  # one policy learns from every row
            for i, p in enumerate(prompts):  # each fits, named by its index, before any runs
                self._budget(len(p), max_new_tokens, self.context, choice.k_max, i)
            return [self.generate([p], k=k, max_new_tokens=max_new_tokens,
                                  temperature=temperature, top_k=top_k, top_p=top_p,
                                  seed=None if seed is None else seed + i, k_max=k_max,
                                  policy=choice.policy, stats=stats)[0]
                    for i, p in enumerate(prompts)]
        with torch.inference_mode():
            state = self.start(prompts, params, max_new_tokens, seed, choice.k_max, stats)
            while not state.finished:
                choice.observe(self.step(state, choice.choose(sum(not d for d in state.done))))
        return state.results()

    # --- step-wise API ----------------------------------------------------------------------

    @_no_grad
    def start(self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int,
              seed: int | None = None, k_max: int = 0, stats: DecodeStats | None = None
              ) -> BatchState:
        """A fixed batch: validate, allocate the caches, prefill both models and emit each
        row's first token. Rows share one generator seeded with ``seed``."""
        import torch

        if not prompts:
            raise DraftkitError("no prompts given")
        if max_new_tokens < 1:
            raise DraftkitError(f"max new tokens must be >= 1, got {max_new_tokens}")
        check_k_max(k_max)
        lens = [len(p) for p in prompts]
        if min(lens) == 0:
            raise DraftkitError("empty prompt; give some text")
        budgets = [self._budget(n, max_new_tokens, self.context, k_max, i)
                   for i, n in enumerate(lens)]
        max_len = max(n + b for n, b in zip(lens, budgets)) + round_margin(k_max)
        state = self.open(len(prompts), k_max, max_len, stats)
        if not params.greedy:
            state.generators = torch.Generator(device=self.device)
            state.generators.manual_seed(seed if seed is not None else 0)
        self.admit(state, prompts, params, budgets)
        return state

    @_no_grad
    def open(self, slots: int, k_max: int = 0, max_len: int | None = None,
             stats: DecodeStats | None = None) -> BatchState:
        """An empty batch of ``slots`` rows whose caches hold ``max_len`` positions (default:
        the target's context window). Rows enter with :meth:`admit`."""
        import torch

        if slots < 1:
            raise DraftkitError(f"a batch needs at least one slot, got {slots}")
        check_k_max(k_max)
        if max_len is None:
            if not self.context:
                raise DraftkitError("the target's config has no max_position_embeddings; "
                                    "give the maximum sequence length")
            max_len = self.context
        tokens = torch.zeros(slots, max_len, dtype=torch.long, device=self.device)
        state = BatchState(tokens, [0] * slots, [0] * slots, [0] * slots, [True] * slots,
                           [None] * slots, [RowStats() for _ in range(slots)],
                           [SamplingParams()] * slots, [None] * slots, k_max,
                           stats if stats is not None else DecodeStats(),
                           draft_lengths=[0] * slots, occupied=[False] * slots,
                           new_tokens=[[] for _ in range(slots)])
        if self.slotted:  # the general runner allocates per cohort instead
            self.target.reset(slots, max_len)
            if self.draft is not None and k_max > 0:
                self.draft.reset(slots, max_len)
        return state

    @_no_grad
    def admit(self, state: BatchState, prompts: list[list[int]],
              params: SamplingParams | list[SamplingParams], max_new_tokens: int | list[int],
              generators: list["torch.Generator | None"] | None = None) -> list[int]:
        """Prefill new rows into free slots and emit their first token; returns the slots.

        Only the admitted rows' caches are written; the live rows keep decoding at the next
        :meth:`step`. ``generators``: one per new row (the batch must have been opened, not
        started); a sampled row without one gets a fresh generator seeded at random.
        """
        import torch

        n = len(prompts)
        params = params if isinstance(params, list) else [params] * n
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        free = [b for b in range(state.slots) if not state.occupied[b]]
        if not self.slotted and any(state.occupied):
            raise DraftkitError("the general decoding path admits rows only into an empty "
                                "batch; wait until every slot is released")
        if self.one_row_cohorts and n > 1:
            raise DraftkitError("a sliding-window model on the general decoding path decodes "
                                "one row at a time; admit one prompt")
        if n == 0 or n > len(free):
            raise DraftkitError(f"cannot admit {n} rows: {len(free)} slots are free")
        lens = [len(p) for p in prompts]
        for i, (m, b) in enumerate(zip(lens, budgets)):
            if m == 0:
                raise DraftkitError("empty prompt; give some text")
            if b < 1:
                raise DraftkitError(f"max new tokens must be >= 1, got {b}")
            budgets[i] = self._budget(m, b, state.max_len, state.k_max, i)
        slots = free[:n]
        dev = self.device
        for i, b in enumerate(slots):
            state.tokens[b, :lens[i]] = torch.tensor(prompts[i], dtype=torch.long)
            state.lengths[b] = state.prompt_lengths[b] = lens[i]
            state.budgets[b] = budgets[i]
            state.done[b], state.finish[b], state.occupied[b] = False, None, True
            state.rows[b], state.params[b], state.new_tokens[b] = RowStats(), params[i], []
            if isinstance(state.generators, list):
                g = generators[i] if generators is not None else None
                if g is None and not params[i].greedy:
                    g = torch.Generator(device=dev)
                    g.seed()
                state.generators[b] = g
            elif generators is not None:
                raise DraftkitError("per-row generators need a batch made by open(), not "
                                    "start()")
        t0 = time.perf_counter()
        use_draft = self.draft is not None and state.k_max > 0
        if not self.slotted:  # a new cohort: fresh caches holding exactly these rows
            state.cohort = list(slots)
            self.target.reset(n, state.max_len)
            if use_draft:
                self.draft.reset(n, state.max_len)
        width = max(lens)
        rows_t = torch.tensor(slots, device=dev)
        inp = state.tokens[rows_t, :width]  # (n, W) right-padded prompts
        last = [m - 1 for m in lens]
        logits = self.target.forward(inp, [0] * n, last=last, rows=slots)  # (n, V)
        if use_draft:
            self.draft.forward(inp, [0] * n, last=last, rows=slots)
            for b, m in zip(slots, lens):
                state.draft_lengths[b] = m
        first = self._choose(logits, state, slots)
        for b in slots:
            state.rows[b].target_calls += 1
        self._commit(state, slots, first[:, None], [1] * n)
        synchronize(dev)
        state.stats.add_prefill(time.perf_counter() - t0, n)
        return slots

    def release(self, state: BatchState, slot: int) -> None:
        """Free a slot (a finished row, or one whose client went away) for the next admit."""
        if not state.done[slot]:
            state.finish[slot] = "abort"
        state.done[slot], state.occupied[slot] = True, False

    @_no_grad
    def step(self, state: BatchState, k: int) -> RoundStats:
        """One round at K drafted tokens (K = 0: a plain target step) over the live rows."""
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
        dev = self.device
        t0 = time.perf_counter()
        active = [not state.done[b] for b in rows]
        lengths = [state.lengths[b] for b in rows]
        rows_t = torch.tensor(rows, device=dev)
        lens = torch.tensor(lengths, device=dev)
        last_tok = state.tokens[rows_t, lens - 1][:, None]  # (b, 1)
        params = [state.params[b] for b in rows]
        synchronize(dev)
        # the set-up above is round overhead: timed inside the plain step's forward it made
        # T(1) read high, and so v = T(K + 1) / T(1) and c low
        t_setup = time.perf_counter()
        if k == 0:
            t1 = t_setup
            logits = self.target.forward(last_tok, [n - 1 for n in lengths], rows=rows)
            synchronize(dev)  # logits: (b, 1, V)
            t2 = time.perf_counter()
            new = self._choose(logits[:, 0], state, rows)[:, None]  # (b, 1)
            verdict, n_host = None, [0] * len(rows)
            counts = [1] * len(rows)
            catchup = 0.0
        else:
            catchup = self._catch_up(state, rows, lengths)
            drafted, q = self._draft(state, rows, lengths, k)  # (b, K), (b, K, V) or None
            synchronize(dev)
            t1 = time.perf_counter()
            verify_in = torch.cat([last_tok, drafted], dim=1)  # (b, K + 1)
            logits = self.target.forward(verify_in, [n - 1 for n in lengths], rows=rows)
            synchronize(dev)
            t2 = time.perf_counter()
            verdict = verify(drafted, q, logits, params, state.rng(rows))  # logits: (b, K + 1, V)
            n = verdict.num_accepted  # (b,)
            new = committed_block(drafted, verdict)  # (b, K + 1)
            n_host = n.tolist()
            counts = [x + 1 for x in n_host]
            for i, x in enumerate(n_host):
                if active[i]:
                    row = state.rows[rows[i]]
                    row.drafted += k
                    row.accepted += x
                    row.rejections += x < k
        for i, b in enumerate(rows):
            if active[i]:
                state.rows[b].target_calls += 1
        kept = self._commit(state, rows, new, counts)
        if k:  # the draft holds every committed position below L - 2 (see _draft)
            for b in rows:
                state.draft_lengths[b] = state.lengths[b] - 2
        r = RoundStats.from_verdict(verdict, accepted=n_host, active=active, kept=kept)
        synchronize(dev)
        t3 = time.perf_counter()
        r.set_seconds({"draft": t1 - t_setup - catchup, "verify": t2 - t1,
                       "other": t3 - t2 + (t_setup - t0), "catchup": catchup})
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

    def _catch_up(self, state: BatchState, rows: list[int], lengths: list[int]) -> float:
        """Feed the draft the committed tokens it has not seen, up to position L - 3 (tokens
        decoded by K = 0 rounds); returns the seconds it took, zero when there were none.

        Separate from the first drafting step so that step costs the same as in any round at
        a fixed K, and c measures drafting, not the length of the plain stretch before it.
        Rows needing fewer tokens start earlier, re-writing positions they already hold with
        the same values (a short row may write past its end, where nothing is read before the
        next forwards overwrite it)."""
        import torch

        width = max(n - 2 - min(state.draft_lengths[b], n - 2) for b, n in zip(rows, lengths))
        if width == 0:
            return 0.0
        dev = self.device
        t0 = time.perf_counter()
        starts = [max(0, n - 2 - width) for n in lengths]
        idx = torch.tensor(starts, device=dev)[:, None] + torch.arange(width, device=dev)
        inp = state.tokens[torch.tensor(rows, device=dev)[:, None], idx]  # (b, W)
        self.draft.forward(inp, starts, last=[width - 1] * len(rows), rows=rows)
        synchronize(dev)
        return time.perf_counter() - t0

    def _draft(self, state: BatchState, rows: list[int], lengths: list[int], k: int):
        """K draft tokens per row (and their warped q unless every row is greedy)."""
        import torch

        # The first step feeds the last two committed tokens at L - 2, L - 1: after a round
        # the draft holds every position below L - 2 (after K = 0 rounds, _catch_up has fed
        # them), so the bonus token of a fully accepted round and the last accepted draft
        # token are fed here.
        dev = self.device
        starts = [n - 2 for n in lengths]
        idx = torch.tensor(starts, device=dev)[:, None] + torch.arange(2, device=dev)
        inp = state.tokens[torch.tensor(rows, device=dev)[:, None], idx]  # (b, 2)
        logits = self.draft.forward(inp, starts, last=[1] * len(rows), rows=rows)  # (b, V)
        params = [state.params[b] for b in rows]
        greedy = all(p.greedy for p in params)
        gens = None if greedy else state.rng(rows)
        tokens, qs = [], []
        for i in range(k):
            if greedy:
                d = logits.argmax(-1)
            else:
                q = row_probabilities(logits, params)  # (b, V)
                d = self._exact_greedy(sample(q, gens), logits, params)
                qs.append(q)
            tokens.append(d)
            if i < k - 1:
                logits = self.draft.forward(d[:, None], [n + i for n in lengths],
                                            rows=rows)[:, -1]
        drafted = torch.stack(tokens, dim=1)  # (b, K)
        return drafted, (torch.stack(qs, dim=1) if qs else None)

    def _choose(self, logits: "torch.Tensor", state: BatchState, rows: list[int]
                ) -> "torch.Tensor":
        """Next token from the target's logits (b, V) -> (b,): argmax or a warped sample."""
        params = [state.params[b] for b in rows]
        if all(p.greedy for p in params):
            return logits.argmax(-1)
        tok = sample(row_probabilities(logits, params), state.rng(rows))
        return self._exact_greedy(tok, logits, params)

    @staticmethod
    def _exact_greedy(tok: "torch.Tensor", logits: "torch.Tensor",
                      params: list[SamplingParams]) -> "torch.Tensor":
        """Greedy rows of a mixed batch take the argmax itself. tok: (b,), logits: (b, V)."""
        import torch

        greedy = [p.greedy for p in params]
        if not any(greedy):
            return tok
        return torch.where(torch.tensor(greedy, device=tok.device), logits.argmax(-1), tok)

    def _commit(self, state: BatchState, rows: list[int], new: "torch.Tensor",
                counts: list[int]) -> list[int]:
        """Append the first counts[i] tokens of new[i] to each active row rows[i], stopping at
        EOS or the row's budget. new: (b, T). Returns the tokens kept per row (0 when done)."""
        import torch

        t = new.shape[1]
        dev = new.device
        lens = torch.tensor([state.lengths[b] for b in rows], device=dev)
        cols = lens[:, None] + torch.arange(t, device=dev)  # (b, T)
        # Rows that are done write past their end, where nothing is ever read.
        state.tokens[torch.tensor(rows, device=dev)[:, None], cols] = new
        host = new.tolist()
        kept = [0] * len(rows)
        for i, b in enumerate(rows):
            if state.done[b]:
                continue
            m, reason = counts[i], None
            if self.eos:
                for j in range(m):
                    if host[i][j] in self.eos:
                        m, reason = j + 1, "eos"
                        break
            room = state.budgets[b] - (state.lengths[b] - state.prompt_lengths[b])
            if m >= room:
                reason = reason if m == room else None  # an EOS past the budget is cut off
                m, reason = room, reason or "length"
            state.finish[b] = reason
            if reason is not None:
                state.done[b] = True
            state.new_tokens[b].extend(host[i][:m])
            state.lengths[b] += m
            kept[i] = m
        return kept
