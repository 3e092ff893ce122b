"""The real target: greedy speculative decoding equals HF greedy decoding, batched too."""

import pytest

pytestmark = pytest.mark.embedded


def test_embedded_greedy_equals_hf_generate(embedded_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftkit.chat import encode_prompt
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.models.derive import derive_by_layers
    from tests.helpers import hf_greedy

    target = AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    draft = derive_by_layers(target, [0, 1, 2, 29])
    prompts = [encode_prompt(tok, "What is the capital of France?"),
               encode_prompt(tok, "Write a Python function that adds two numbers.")]
    n = 8
    threads = torch.get_num_threads()
    # Batch-1 decoding is matrix-vector work; one thread avoids OpenMP stalls on a shared CPU.
    torch.set_num_threads(1)
    try:
        ref = [hf_greedy(target, p, n, eos_token_id=tok.eos_token_id) for p in prompts]
        engine = SpeculativeEngine(target, draft)
        for k in (0, 3):
            assert [r.tokens for r in engine.generate(prompts, k=k, max_new_tokens=n)] == ref
        assert engine.generate(prompts[1:], k=2, max_new_tokens=n)[0].tokens == ref[1]
    finally:
        torch.set_num_threads(threads)
