"""The embedded target (SmolLM2-135M-Instruct) in vLLM: its greedy answers to training prompts
are draftkit's tokens, and the hidden states vLLM captures at an EAGLE-3 head's layers are
draftkit's within bf16 rounding."""

from __future__ import annotations

import pytest
import torch

from draftkit.chat import encode_prompt, read_prompts
from draftkit.data.generate import answer_stop_ids, engine_answers
from draftkit.distill.features import VllmFeatures, target_forward
from draftkit.evaluate.suite import builtin_suites_dir
from draftkit.models import load_model, load_tokenizer
from draftkit.models.eagle3 import default_aux_layers

pytestmark = [pytest.mark.engine, pytest.mark.embedded]


@pytest.fixture(scope="module")
def embedded(embedded_dir):
    tok = load_tokenizer(str(embedded_dir))
    model = load_model(str(embedded_dir), device="cpu", dtype="float32")
    train = builtin_suites_dir().parent / "train_prompts"
    prompts = [encode_prompt(tok, p) for name in ("code", "math")
               for p in read_prompts(train / f"{name}.jsonl")[:2]]
    return model, tok, prompts


def test_greedy_answers_from_vllm_are_draftkits(vllm_worker, embedded_dir, embedded):
    model, tok, prompts = embedded
    stop = answer_stop_ids(model, tok)
    seeds = list(range(len(prompts)))
    ours = dict(engine_answers(model, prompts, 32, 0.0, stop, seeds, 4))
    # the requests VllmAnswers sends (tests/engines/test_vllm_data.py runs it whole), on the
    # session's engine process
    vllm_worker.call("load", name="embedded", model=str(embedded_dir), dtype="float32",
                     max_model_len=512, max_num_seqs=4)
    out = vllm_worker.call("generate", name="embedded", prompts=prompts, seeds=seeds, each=False,
                           sampling={"temperature": 0.0, "max_tokens": 32,
                                     "stop_token_ids": stop, "ignore_eos": True})
    vllm_worker.call("unload", name="embedded")
    theirs = {i: o["tokens"] for i, o in enumerate(out["outputs"])}
    assert theirs == ours, vllm_worker.info.label


def test_features_from_vllm_are_draftkits_within_bf16(vllm_worker, embedded_dir, embedded,
                                                       tmp_path):
    model, _, prompts = embedded
    layers = default_aux_layers(model.config.num_hidden_layers)
    sequences = prompts[:2]
    with VllmFeatures(embedded_dir, "float32", layers, tmp_path / "engine",
                      worker=vllm_worker) as engine:
        captured = engine.capture(sequences)
    for seq, aux in zip(sequences, captured):
        with torch.no_grad():
            _, want = target_forward(model, layers, torch.tensor([seq]),
                                     torch.arange(len(seq))[None], None)
        # the feature cache stores bf16: equal after that rounding, up to one step of it
        torch.testing.assert_close(aux.bfloat16().float(), want[0].bfloat16().float(),
                                   rtol=1.6e-2, atol=1e-2)
