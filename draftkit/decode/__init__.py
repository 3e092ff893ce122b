"""Decoding: the batched verify-and-accept engine, K = 0 baseline included.

Public API (no torch import happens here; modules import it inside functions)::

    from draftkit.decode import SpeculativeEngine, SamplingParams, KPolicy, DecodeStats
    engine = SpeculativeEngine(target_model, draft_model)
    results = engine.generate(prompts_token_ids, k=3, max_new_tokens=64, temperature=0.0)
    results[0].tokens, results[0].stats.alpha, results[0].tau

A fixed batch can be driven round by round: ``state = engine.start(...)``, then
``engine.step(state, k)`` until ``state.finished``, then ``state.results()``. A server uses
slots instead (continuous batching, see draftkit/serve/scheduler.py): ``state =
engine.open(n_slots, k_max)``, ``engine.admit(state, prompts, params, max_new_tokens,
generators)`` between rounds, ``engine.step(state, k)`` over the live rows, and
``engine.release(state, slot)`` when a row finishes or its client goes away.

A draft carrying a reduced head (``draft_vocab.json``, draftkit/models/reduced_head.py)
proposes only its tokens; the output distribution is unchanged. A draft may also be an
EAGLE-3 head (draftkit/models/eagle3.py), which drafts from the target's hidden states: the
engine is the same, the kind of draft is its drafter's (drafters.py)::

    head = load_eagle3(folder, target_model)  # or load_pair(target, folder).draft
    SpeculativeEngine(target_model, head).generate(prompts_token_ids, k=3)
"""

from draftkit.decode.batch import BatchState, Result, RowStats
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.policy import KPolicy
from draftkit.decode.sampling import SamplingParams
from draftkit.decode.stats import DecodeStats, RoundStats

__all__ = ["BatchState", "DecodeStats", "KPolicy", "Result", "RoundStats", "RowStats",
           "SamplingParams", "SpeculativeEngine"]
