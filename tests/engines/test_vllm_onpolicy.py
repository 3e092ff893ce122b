"""The draft's on-policy answers from vLLM (``data.regime: on_policy`` with
``data.generate.engine: vllm``): the draft's current weights, loaded before each on-policy
step, give the tokens HF ``generate`` gives, over its reduced head. (A recipe's wiring of the
engine into on-policy steps: tests/distill/test_trainer.py; a recipe starting vLLM engines for
the target's answers and features: test_vllm_topology.py.)"""

from __future__ import annotations

import random

import pytest
import torch

from draftkit.data.generate import answers_in_memory
from draftkit.distill.onpolicy import VllmDraftAnswers
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import ROW_WORDS, engine_llama, make_tokenizer

pytestmark = pytest.mark.engine


def test_the_drafts_answers_follow_its_weights_and_its_head(vllm_worker, tmp_path):
    tok = make_tokenizer()
    draft = engine_llama(len(tok), 2, seed=4)
    rng = random.Random(0)
    prompts = [tok.encode(" ".join(rng.sample(ROW_WORDS, 4))) for _ in range(6)]
    head = ReducedHead([i for i in range(len(tok)) if i % 3], len(tok))  # two thirds of it
    stop, seeds = [2], list(range(6))
    engine = VllmDraftAnswers(tmp_path / "engine", "float32", 64, worker=vllm_worker)
    try:
        for change in range(2):  # the weights a step later: the engine must follow them
            if change:
                with torch.no_grad():
                    for p in draft.parameters():
                        p.add_(torch.randn_like(p) * 0.1)
            ours = answers_in_memory(draft, prompts, 12, 0.0, stop, seeds, head)
            theirs = engine.answers(draft, prompts, 12, 0.0, stop, seeds, head)
            assert theirs == ours, f"after {change} change(s), on {vllm_worker.info.label}"
            assert all(t in set(head.ids.tolist()) for a in theirs for t in a)
    finally:
        engine.close()
