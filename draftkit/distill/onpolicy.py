"""On-policy steps: the draft answers training prompts, the target scores its answers.

DistillSpec (arXiv 2310.08461, following GKD, arXiv 2306.13649) finds on-policy data best for
drafts: the draft is corrected on the sequences it actually produces, which are the ones it
will propose when serving. A step is on-policy with probability ``lmbda`` (decided from the
seed and the step, so a resumed run makes the same choices); its rows are the draft's
responses to ``batch_size`` training prompts, scored by an online target forward (a cache
cannot hold sequences that did not exist when it was written).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import torch

from draftkit.data import Rows
from draftkit.data.generate import generate_responses_in_memory, prompt_seed
from draftkit.data.pack import Tokenized, pack

if TYPE_CHECKING:
    from draftkit.models.reduced_head import ReducedHead


def is_on_policy(seed: int, step: int, lmbda: float) -> bool:
    return lmbda > 0 and random.Random(f"{seed}:onpolicy:{step}").random() < lmbda


@torch.no_grad()
def draft_rows(draft: Any, rows: Rows, n: int, seed: int, micro_step: int, rank: int,
               max_new_tokens: int, temperature: float, seq_len: int, pad_id: int,
               stop_ids: list[int], head: "ReducedHead | None" = None) -> Rows:
    """``n`` rows of (training prompt + the draft's response), response tokens trained;
    ``head``: the draft's reduced head (draftkit/models/reduced_head.py), the only tokens it
    proposes when it is served.

    The prompts and the answers' samples come from ``seed``, the micro-step and the rank alone
    (not the global RNG), so a resumed run, on every rank, draws what the killed one would have.
    """

    pick = random.Random(f"{seed}:prompts:{micro_step}:{rank}")
    chosen = [pick.randrange(len(rows.prompts)) for _ in range(n)]
    seeds = [prompt_seed(seed, f"on-policy:{micro_step}:{rank}:{j}") for j in range(n)]
    prompts = [rows.prompts[i] for i in chosen]
    budget = max(1, min(max_new_tokens, seq_len - max(len(p) for p in prompts)))
    was_training = draft.training
    draft.eval()
    answers = generate_responses_in_memory(draft, prompts, budget, temperature, pad_id, stop_ids,
                                          seeds, head)
    draft.train(was_training)
    examples = [Tokenized(p + a, [False] * len(p) + [True] * len(a),
                          rows.domains[rows.prompt_domains[i]], "on-policy")
                for p, a, i in zip(prompts, answers, chosen)]
    return pack(examples, seq_len, pad_id, rows.domains, pack=False, truncate=True)
