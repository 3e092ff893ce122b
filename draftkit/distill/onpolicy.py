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
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from draftkit.data import Rows
from draftkit.data.generate import answers_in_memory, cut_at_stop, prompt_seed
from draftkit.data.pack import Tokenized, pack
from draftkit.engines.vllm import VllmWorker

if TYPE_CHECKING:
    from draftkit.models.reduced_head import ReducedHead


def is_on_policy(seed: int, step: int, lmbda: float) -> bool:
    return lmbda > 0 and random.Random(f"{seed}:onpolicy:{step}").random() < lmbda


class VllmDraftAnswers:
    """The draft's answers from vLLM (``data.generate.engine: vllm``), in its own environment
    (:mod:`draftkit.engines.vllm`): before each on-policy step the draft's current weights are
    saved to ``work_dir`` and the engine is loaded from them afresh. vLLM 0.32's in-place
    ``reload_weights`` gave other tokens than the reloaded weights do on its CPU build, so a
    load it is; on a GPU that costs seconds per on-policy step for a draft of a billion
    parameters. Each answer is sampled with its own seed; a reduced head is vLLM's
    ``allowed_token_ids``."""

    def __init__(self, work_dir: Path, dtype: str, context: int, python: str | None = None,
                 worker=None):
        """``worker``: a running :class:`~draftkit.engines.vllm.VllmWorker` to use (left
        running at the end), else one is started under ``python``."""
        self.work_dir, self.dtype, self.context, self.python = Path(work_dir), dtype, context, \
            python
        self.worker, self.owned = worker, worker is None

    def answers(self, draft: Any, prompts: list[list[int]], budget: int, temperature: float,
                stop_ids: list[int], seeds: list[int], head: "ReducedHead | None"
                ) -> list[list[int]]:
        folder = self.work_dir / "draft"
        draft.save_pretrained(folder, safe_serialization=True)
        if self.worker is None:
            self.worker = VllmWorker(self.python, log=self.work_dir / "vllm.log")
        self.worker.call("load", name="draft", model=str(folder), dtype=self.dtype,
                         max_model_len=self.context, max_num_seqs=len(prompts),
                         engine_args={"skip_tokenizer_init": True})
        sampling = {"temperature": temperature, "max_tokens": budget, "stop_token_ids": stop_ids,
                    "ignore_eos": True}
        if head is not None:
            sampling["allowed_token_ids"] = head.ids.tolist()
        out = self.worker.call("generate", name="draft", prompts=prompts, seeds=seeds,
                               each=False, sampling=sampling)
        return [cut_at_stop(o["tokens"], set(stop_ids)) for o in out["outputs"]]

    def close(self) -> None:
        """Stop the engine (or unload the draft from the caller's) and drop the saved weights;
        the engine's log stays in ``work_dir``."""
        if self.worker is not None and self.owned:
            self.worker.close()
            self.worker = None
        elif self.worker is not None:
            self.worker.call("unload", name="draft")
        shutil.rmtree(self.work_dir / "draft", ignore_errors=True)


def pick_prompts(rows: Rows, n: int, seed: int, micro_step: int, rank: int,
                 max_new_tokens: int, seq_len: int) -> tuple[list[int], list[list[int]], int]:
    """An on-policy step's ``n`` training prompts, drawn from ``seed``, the micro-step and the
    rank alone (a resumed run draws the same): (their indices, the prompts, the new tokens
    each may take within ``seq_len``)."""
    pick = random.Random(f"{seed}:prompts:{micro_step}:{rank}")
    chosen = [pick.randrange(len(rows.prompts)) for _ in range(n)]
    prompts = [rows.prompts[i] for i in chosen]
    return chosen, prompts, max(1, min(max_new_tokens, seq_len - max(len(p) for p in prompts)))


@torch.no_grad()
def draft_rows(draft: Any, rows: Rows, n: int, seed: int, micro_step: int, rank: int,
               max_new_tokens: int, temperature: float, seq_len: int, pad_id: int,
               stop_ids: list[int], head: "ReducedHead | None" = None,
               engine: VllmDraftAnswers | None = None) -> Rows:
    """``n`` rows of (training prompt + the draft's response), response tokens trained;
    ``head``: the draft's reduced head (draftkit/models/reduced_head.py), the only tokens it
    proposes when it is served. The draft answers alone (K = 0) on draftkit's engine, or with
    ``engine`` in vLLM.

    The prompts and the answers' samples come from ``seed``, the micro-step and the rank alone
    (not the global RNG), so a resumed run, on every rank, draws what the killed one would have.
    """

    chosen, prompts, budget = pick_prompts(rows, n, seed, micro_step, rank, max_new_tokens,
                                           seq_len)
    seeds = [prompt_seed(seed, f"on-policy:{micro_step}:{rank}:{j}") for j in range(n)]
    was_training = draft.training
    draft.eval()
    if engine is not None:
        answers = engine.answers(draft, prompts, budget, temperature, stop_ids, seeds, head)
    else:
        answers = answers_in_memory(draft, prompts, budget, temperature, stop_ids, seeds, head)
    draft.train(was_training)
    examples = [Tokenized(p + a, [False] * len(p) + [True] * len(a),
                          rows.domains[rows.prompt_domains[i]], "on-policy")
                for p, a, i in zip(prompts, answers, chosen)]
    return pack(examples, seq_len, pad_id, rows.domains, pack=False, truncate=True)
