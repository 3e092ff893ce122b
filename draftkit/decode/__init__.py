"""Decoding: the batched verify-and-accept engine, K = 0 baseline included.

Public API (read from its modules on first use: ``draftkit COMMAND --help`` imports this
package's light module of flags, args.py, which runs this file, and must not import torch)::

    from draftkit.decode import SpeculativeEngine, SamplingParams, KPolicy, DecodeStats
    engine = SpeculativeEngine(target_model, draft_model)
    results = engine.generate(prompts_token_ids, k=3, max_new_tokens=64, temperature=0.0)
    results[0].tokens, results[0].stats.alpha, results[0].tau

A batch is driven through its doors (:class:`~draftkit.decode.batch.Batch`): a fixed one,
``batch = engine.start(prompts, params, max_new_tokens, seed, k=resolve_k(3, has_draft=True))``,
then ``batch.step()`` until ``batch.finished``, then ``batch.results()``. A server uses slots
instead (continuous batching, see draftkit/serve/scheduler.py): ``batch = engine.open(n_slots,
k)``, ``batch.admit(prompts, params, max_new_tokens, seeds)`` for as many rows as
``batch.free_slots()`` allows, ``batch.step()`` over the live rows, ``batch.output(slot)`` for
what a row decoded, and ``batch.release(slot)`` when a row finishes or its client goes away.

A draft carrying a reduced head (``draft_vocab.json``, draftkit/models/reduced_head.py)
proposes only its tokens; the output distribution is unchanged. A draft may also be an
EAGLE-3 head (draftkit/models/eagle3.py), which drafts from the target's hidden states: the
engine is the same, the kind of draft is its drafter's (drafters.py)::

    head = load_eagle3(folder, target_model)  # or load_pair(target, folder).draft
    SpeculativeEngine(target_model, head).generate(prompts_token_ids, k=3)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker reads; at run time, __getattr__ below
    from draftkit.decode.batch import Batch
    from draftkit.decode.choice import KChoice, resolve_k
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.policy import KPolicy
    from draftkit.decode.sampling_params import SamplingParams
    from draftkit.decode.state import Result, RowStats
    from draftkit.decode.stats import DecodeStats, RoundStats

__all__ = ["Batch", "DecodeStats", "KChoice", "KPolicy", "Result", "RoundStats", "RowStats",
           "SamplingParams", "SpeculativeEngine", "resolve_k"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from draftkit.decode import (batch, choice, engine, policy,  # lazy: the docstring says why
                                 sampling_params, state, stats)

    return next(getattr(m, name) for m in (batch, choice, engine, policy, sampling_params, state,
                                           stats) if hasattr(m, name))
