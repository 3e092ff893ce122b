"""The batched verify-and-accept decoder that generation, evaluation and serving run on.

The engine holds the models: the target's runner, the draft's drafter (drafters.py: the kind
of draft is the drafter's, not the engine's), the stop tokens and the context the pair decodes
exactly. A batch (:class:`~draftkit.decode.batch.Batch`) holds the decode: the engine opens it
on those, and it runs admission, the prefill and the round (Leviathan et al., arXiv
2211.17192, Algorithm 1: draft, verify, accept, commit; batch.py) over its own state
(state.py), which no method here takes.

An EAGLE-3 head has the target's forwards capture the hidden states it reads
(``runner.capture``), and keeps them per row until it reads them.

Rows of different lengths each keep their own position pointer, so a row's tokens do not
depend on the other rows (under greedy decoding they equal decoding it alone). A round
computes only the rows still decoding; finished rows (EOS or their token budget) stay in the
batch, idle, until the batch ends.

Slots (continuous batching, as a server runs it): :meth:`SpeculativeEngine.open` returns a
:class:`~draftkit.decode.batch.Batch` of N empty slots with caches sized for the context
window, whose doors are the only way in and out: ``admit`` prefills new rows into free slots
(only their cache rows are written) while the other rows keep their state, ``step`` runs one
round over the live rows at the K its :class:`~draftkit.decode.choice.KChoice` picks,
``release`` frees a slot, ``free_slots`` says how many rows may join now and ``output`` reads
a slot. :meth:`~SpeculativeEngine.start` is ``open`` plus ``admit`` of a fixed batch, and
:meth:`~SpeculativeEngine.generate` steps it to the end. The Llama-family fast path admits at
any round; the general transformers path cannot write one row of a ``DynamicCache``, so it
admits only into an empty batch (cohorts) and every round computes the whole cohort
(``Batch.free_slots``). A server takes a new draft between batches
(:meth:`SpeculativeEngine.swap_draft`, then ``open``): a batch never holds rows of two drafts;
what it needs of the engine it reads in :meth:`SpeculativeEngine.describe`.

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

from dataclasses import dataclass

import torch

from draftkit.decode.batch import Batch, no_grad
from draftkit.decode.choice import PLAIN, KChoice, resolve_k
from draftkit.decode.drafters import make_drafter
from draftkit.decode.k import AUTO, K_MAX, KValue
from draftkit.decode.runners import make_runner
from draftkit.decode.sampling_params import PROBABILISTIC, TOKEN, SamplingParams
from draftkit.decode.state import Result, round_margin, row_budget
from draftkit.decode.stats import DecodeStats
from draftkit.errors import DraftkitError
from draftkit.models.facts import (decoding_context, sliding_window, stop_token_ids, text_config,
                                   token_ids)


@dataclass(frozen=True)
class EngineInfo:
    """What a server needs to know of an engine (:meth:`SpeculativeEngine.describe`), in place
    of reading its runners."""

    vocab_size: int  # the target's: a prompt's token ids lie in [0, vocab_size)
    has_draft: bool  # False: plain decoding, no draft to swap
    context: int | None  # positions the pair decodes exactly (None: the config names none)
    continuous: bool  # rows join a batch at any round; False: in cohorts (the general path)
    device: "torch.device"
    kv_cache_bytes: int  # the static KV caches the latest open() allocated (the fast path's)


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
        params = SamplingParams(temperature, top_k, top_p, draft_sample_method, verify)
        choice = k if isinstance(k, KChoice) else resolve_k(
            k, k_max, has_draft=self.draft is not None)
        if self.one_row_cohorts and len(prompts) > 1:  # one policy learns from every row
            for i, p in enumerate(prompts):  # each fits, named by its index, before any runs
                row_budget(len(p), max_new_tokens, self.context, choice.k_max, i)
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

    @no_grad
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
        budgets = [row_budget(n, max_new_tokens, self.context, k.k_max, i)
                   for i, n in enumerate(lens)]
        max_len = max(n + b for n, b in zip(lens, budgets)) + round_margin(k.k_max)
        batch = self.open(len(prompts), k, max_len, stats,
                          seed=None if params.greedy else (seed if seed is not None else 0))
        batch.admit(prompts, params, budgets)
        return batch

    @no_grad
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
        # the one place that says whether the draft is in use: a batch that drafts nothing
        # (K = 0 every round) runs no drafter
        drafter = self.draft if k.k_max > 0 else None
        return Batch(slots, max_len, k, target=self.target, drafter=drafter, eos=self.eos,
                     device=self.device, slotted=self.slotted,
                     one_row_cohorts=self.one_row_cohorts, stats=stats, seed=seed)

    def describe(self) -> EngineInfo:
        """What a server needs to know of this engine now (its KV caches as the latest
        :meth:`open` allocated them)."""
        caches = [getattr(r, "cache", None) for r in (self.target, self.draft)]
        kv = sum(c.k.numel() * c.k.element_size() * 2 for c in caches
                 if c is not None and hasattr(c, "k"))
        return EngineInfo(vocab_size=self.target.vocab_size, has_draft=self.draft is not None,
                          context=self.context, continuous=self.slotted, device=self.device,
                          kv_cache_bytes=kv)
