"""A live server on tiny random models: the app in-process, uvicorn in a background thread."""

from __future__ import annotations

import pytest

from tests.helpers import make_llama, make_tokenizer, noisy_copy, start_server


@pytest.fixture(scope="session")
def tiny_models():
    """(tokenizer, target, draft): a 3-layer target and a noisy copy of it as the draft, so
    rounds accept several tokens."""
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=3, seed=0)
    return tok, target, noisy_copy(target)


@pytest.fixture(scope="module")
def server(tiny_models):
    """Fixed K = 2, 8 slots."""
    s = start_server(tiny_models, k=2, max_batch=8, max_tokens_limit=64)
    yield s
    s.stop()
