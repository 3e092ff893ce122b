"""The batched verify-and-accept decoder that generation, evaluation and serving run on.

One round (Leviathan et al., arXiv 2211.17192, Algorithm 1), per row, with L committed tokens
of which the target has processed the first L - 1:

1. draft: feed the last two committed tokens at positions L - 2, L - 1 (re-writing position
   L - 2 is a no-op when the draft already had it, and is the catch-up on the bonus token when
   the draft had not seen it), then K - 1 single steps: K drafted tokens and q_1..q_K;
2. verify: one target call on [x_(L-1), d_1..d_K] gives p_1..p_(K+1);
3. accept (verify.py): n drafted tokens plus one target token are committed; both caches roll
   back by position (the runners continue from the committed length: no tensor is copied).

K = 0 is plain decoding in the same loop: one target step, no draft work at all.

Rows of different lengths each keep their own position pointer, so a row's tokens do not
depend on the other rows (under greedy decoding they equal decoding it alone). Finished rows
(EOS or their token budget) stay in the batch, idle, until the batch ends; a server can drive
:meth:`SpeculativeEngine.start` / :meth:`SpeculativeEngine.step` itself.

Sampling draws from one seeded ``torch.Generator`` per batch: a seeded run is reproducible,
and each row's tokens are distributed exactly as the target's, but which sample a row gets
depends on the batch it ran in (greedy rows do not depend on the batch at all).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from draftkit.decode.runners import context_window, make_runner, text_config
from draftkit.decode.sampling import SamplingParams, probabilities, sample
from draftkit.decode.stats import DecodeStats, RoundStats
from draftkit.decode.verify import verify_greedy, verify_sampled
from draftkit.errors import DraftkitError

if TYPE_CHECKING:
    import torch

    from draftkit.decode.policy import KPolicy


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


@dataclass
class Result:
    tokens: list[int]  # new tokens only (EOS included when it ended the row)
    finish_reason: Literal["eos", "length"]
    stats: RowStats
    seconds: float = 0.0  # wall time of the batch the row ran in

    @property
    def tau(self) -> float:
        return len(self.tokens) / self.stats.target_calls if self.stats.target_calls else 0.0


@dataclass
class BatchState:
    """Everything a batch carries between rounds (device tensors plus host-side mirrors)."""

    tokens: "torch.Tensor"  # (B, S) committed tokens, prompt first
    lengths: list[int]  # committed tokens per row
    prompt_lengths: list[int]
    budgets: list[int]  # max new tokens per row
    done: list[bool]
    finish: list[str | None]
    rows: list[RowStats]
    params: SamplingParams
    generator: "torch.Generator | None"
    k_max: int
    stats: DecodeStats
    draft_lengths: list[int] = field(default_factory=list)  # positions the draft cache holds
    started: float = field(default_factory=time.perf_counter)

    @property
    def finished(self) -> bool:
        return all(self.done)

    def results(self) -> list[Result]:
        wall = time.perf_counter() - self.started
        out = []
        for b, row in enumerate(self.rows):
            p, n = self.prompt_lengths[b], self.lengths[b]
            out.append(Result(self.tokens[b, p:n].tolist(), self.finish[b] or "length", row,
                              wall))
        return out


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
        if eos_token_id == "auto":
            gen = getattr(target_model, "generation_config", None)
            eos_token_id = getattr(gen, "eos_token_id", None) if gen is not None else None
            if eos_token_id is None:
                eos_token_id = getattr(text_config(target_model), "eos_token_id", None)
        ids = eos_token_id if isinstance(eos_token_id, (list, tuple)) else (
            [] if eos_token_id is None else [eos_token_id])
        self.eos = set(int(i) for i in ids)
        self.context = context_window(target_model)

    # --- one-call API ---------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], *, k: int | Literal["auto"] = 4,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, k_max: int = 8,
                 policy: "KPolicy | None" = None, stats: DecodeStats | None = None
                 ) -> list[Result]:
        """Decode every prompt (token ids) and return one :class:`Result` per prompt."""
        import torch

        params = SamplingParams(temperature, top_k, top_p)
        if k != "auto":
            if not isinstance(k, int) or k < 0:
                raise DraftkitError(f"K (num_speculative_tokens) must be >= 0 or 'auto', got {k}")
            k_max = k
        else:
            if policy is None:
                from draftkit.decode.policy import KPolicy

                policy = KPolicy(k_max=k_max)
            k_max = policy.k_max
        if self.draft is None:
            k, k_max, policy = 0, 0, None
        with torch.inference_mode():
            state = self.start(prompts, params, max_new_tokens, seed, k_max, stats)
            while not state.finished:
                if policy is None:
                    self.step(state, k)
                else:
                    policy.observe(self.step(state, policy.choose(sum(not d for d in state.done))))
        return state.results()

    # --- step-wise API ----------------------------------------------------------------------

    def start(self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int,
              seed: int | None = None, k_max: int = 0, stats: DecodeStats | None = None
              ) -> BatchState:
        """Validate, allocate the caches, prefill both models and emit each row's first token."""
        import torch

        if not prompts:
            raise DraftkitError("no prompts given")
        if max_new_tokens < 1:
            raise DraftkitError(f"max new tokens must be >= 1, got {max_new_tokens}")
        if k_max < 0:
            raise DraftkitError(f"K (num_speculative_tokens) must be >= 0, got {k_max}")
        lens = [len(p) for p in prompts]
        if min(lens) == 0:
            raise DraftkitError("empty prompt; give some text")
        margin = k_max + 2  # a round may write K + 1 positions past the committed length
        budgets = []
        for i, n in enumerate(lens):
            room = (self.context - n - margin) if self.context else max_new_tokens
            if room < 1:
                raise DraftkitError(f"prompt {i} has {n} tokens; the target's context window is "
                                    f"{self.context} (room is needed for K = {k_max} drafted "
                                    f"tokens too); shorten the prompt")
            budgets.append(min(max_new_tokens, room))
        bsz = len(prompts)
        max_len = max(n + b for n, b in zip(lens, budgets)) + margin
        dev = self.device
        tokens = torch.zeros(bsz, max_len, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            tokens[b, :len(p)] = torch.tensor(p, dtype=torch.long)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=dev)
            generator.manual_seed(seed if seed is not None else 0)
        state = BatchState(tokens, list(lens), list(lens), budgets, [False] * bsz, [None] * bsz,
                           [RowStats() for _ in range(bsz)], params, generator, k_max,
                           stats if stats is not None else DecodeStats())
        t0 = time.perf_counter()
        self.target.reset(bsz, max_len)
        width = max(lens)
        last = [n - 1 for n in lens]
        logits = self.target.forward(tokens[:, :width], [0] * bsz, last=last)  # (B, V)
        if self.draft is not None and k_max > 0:
            self.draft.reset(bsz, max_len)
            self.draft.forward(tokens[:, :width], [0] * bsz, last=last)
            state.draft_lengths = list(lens)
        first = self._choose(logits, state)
        for row in state.rows:
            row.target_calls += 1
        self._commit(state, first[:, None], [1] * bsz)
        synchronize(dev)
        state.stats.add_prefill(time.perf_counter() - t0, bsz)
        return state

    def step(self, state: BatchState, k: int) -> RoundStats:
        """One round at K drafted tokens (K = 0: a plain target step)."""
        import torch

        if k > state.k_max:
            raise DraftkitError(f"K = {k} exceeds the K the batch was started with "
                                f"({state.k_max})")
        dev = self.device
        t0 = time.perf_counter()
        active = [not d for d in state.done]
        lens = torch.tensor(state.lengths, device=dev)
        last_tok = state.tokens.gather(1, (lens - 1)[:, None])  # (B, 1)
        if k == 0 or self.draft is None:
            k = 0
            t1 = t0
            logits = self.target.forward(last_tok, [n - 1 for n in state.lengths])  # (B, 1, V)
            synchronize(dev)
            t2 = time.perf_counter()
            new = self._choose(logits[:, 0], state)[:, None]  # (B, 1)
            counts = [1] * len(active)
            acc_pos, tested_pos, beta_sum, rejections, bonus = [], [], 0.0, 0, 0
        else:
            drafted, q = self._draft(state, lens, k)  # (B, K), (B, K, V) or None
            synchronize(dev)
            t1 = time.perf_counter()
            verify_in = torch.cat([last_tok, drafted], dim=1)  # (B, K + 1)
            logits = self.target.forward(verify_in, [n - 1 for n in state.lengths])
            synchronize(dev)
            t2 = time.perf_counter()
            if state.params.greedy:
                verdict = verify_greedy(drafted, logits)
            else:
                p = probabilities(logits, state.params)  # (B, K + 1, V)
                verdict = verify_sampled(drafted, q, p, state.generator)
            n = verdict.num_accepted  # (B,)
            # committed block: d_1..d_n then the target's token at index n
            new = torch.cat([drafted, drafted[:, :1]], dim=1)
            new.scatter_(1, n[:, None], verdict.next_token[:, None])  # (B, K + 1)
            act = torch.tensor(active, device=dev)
            pos = torch.arange(k, device=dev)
            tested = (pos[None] <= n[:, None]) & act[:, None]  # (B, K) reached the test
            accepted = (pos[None] < n[:, None]) & act[:, None]
            n_host = n.tolist()
            counts = [x + 1 for x in n_host]
            acc_pos = accepted.sum(0).tolist()
            tested_pos = tested.sum(0).tolist()
            beta_sum = float((verdict.beta * tested).sum())
            rejections = sum(1 for b, x in enumerate(n_host) if active[b] and x < k)
            bonus = sum(1 for b, x in enumerate(n_host) if active[b] and x == k)
            for b, x in enumerate(n_host):
                if active[b]:
                    row = state.rows[b]
                    row.drafted += k
                    row.accepted += x
                    row.rejections += x < k
        for b, a in enumerate(active):
            if a:
                state.rows[b].target_calls += 1
        kept = self._commit(state, new, counts)
        if k:  # the draft holds every committed position below L - 2 (see _draft)
            state.draft_lengths = [n - 2 for n in state.lengths]
        synchronize(dev)
        t3 = time.perf_counter()
        r = RoundStats(k, sum(active), acc_pos, tested_pos, beta_sum, rejections, bonus, kept,
                       t1 - t0, t2 - t1, t3 - t2)
        state.stats.add_round(r)
        return r

    # --- pieces -----------------------------------------------------------------------------

    def _draft(self, state: BatchState, lens: "torch.Tensor", k: int):
        """K draft tokens per row (and their warped q unless greedy)."""
        import torch

        # Catch-up: feed each row's committed tokens from what its draft cache holds (at
        # least the last two: after a round the draft holds every position below L - 2, so the
        # bonus token of a fully accepted round and the last accepted draft token are fed
        # here; after K = 0 rounds, every token decoded since). Rows needing fewer tokens start
        # earlier, re-writing positions they already hold with the same values.
        starts = [min(d, n - 2) for d, n in zip(state.draft_lengths, state.lengths)]
        width = max(n - s for s, n in zip(starts, state.lengths))
        starts = [max(0, n - width) for n in state.lengths]
        idx = torch.tensor(starts, device=lens.device)[:, None] + torch.arange(
            width, device=lens.device)  # (B, W)
        inp = state.tokens.gather(1, idx)  # (B, W)
        last = [n - 1 - s for s, n in zip(starts, state.lengths)]
        logits = self.draft.forward(inp, starts, last=last)  # (B, V)
        tokens, qs = [], []
        for i in range(k):
            if state.params.greedy:
                d = logits.argmax(-1)
            else:
                q = probabilities(logits, state.params)  # (B, V)
                d = sample(q, state.generator)
                qs.append(q)
            tokens.append(d)
            if i < k - 1:
                logits = self.draft.forward(d[:, None], [n + i for n in state.lengths])[:, -1]
        drafted = torch.stack(tokens, dim=1)  # (B, K)
        return drafted, (torch.stack(qs, dim=1) if qs else None)

    def _choose(self, logits: "torch.Tensor", state: BatchState) -> "torch.Tensor":
        """Next token from the target's logits (B, V) -> (B,): argmax or a warped sample."""
        if state.params.greedy:
            return logits.argmax(-1)
        return sample(probabilities(logits, state.params), state.generator)

    def _commit(self, state: BatchState, new: "torch.Tensor", counts: list[int]) -> int:
        """Append the first counts[b] tokens of new[b] to each active row, stopping at EOS or
        the row's budget. new: (B, T). Returns the number of tokens kept."""
        import torch

        t = new.shape[1]
        lens = torch.tensor(state.lengths, device=new.device)
        cols = lens[:, None] + torch.arange(t, device=new.device)  # (B, T)
        # Rows that are done write past their end, where nothing is ever read.
        state.tokens.scatter_(1, cols, new)
        host = new.tolist() if self.eos else None
        kept = 0
        for b in range(len(counts)):
            if state.done[b]:
                continue
            m, reason = counts[b], None
            if host is not None:
                for j in range(m):
                    if host[b][j] in self.eos:
                        m, reason = j + 1, "eos"
                        break
            room = state.budgets[b] - (state.lengths[b] - state.prompt_lengths[b])
            if m >= room:
                reason = reason if m == room else None  # an EOS past the budget is cut off
                m, reason = room, reason or "length"
            state.finish[b] = reason
            if state.finish[b] is not None:
                state.done[b] = True
            state.lengths[b] += m
            kept += m
        return kept
