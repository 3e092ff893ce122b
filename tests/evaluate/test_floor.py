"""The memory floor: the weights' bytes, counted once, over a measured read rate."""

import torch

from draftkit.evaluate import floor
from tests.helpers import make_llama


def test_weight_bytes_counts_tied_weights_once():
    model = make_llama(64, num_layers=1)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight  # one tensor, two names
    params = {p.data_ptr(): p for p in model.parameters()}.values()
    assert floor.weight_bytes(model) == sum(p.numel() * 4 for p in params)
    half = model.to(torch.bfloat16)
    assert floor.weight_bytes(half) * 2 == sum(p.numel() * 4 for p in params)


def test_the_floor_is_the_weights_over_the_read_rate():
    rate = floor.read_bytes_per_second(torch.device("cpu"), nbytes=8 * 2**20, repeats=3)
    assert 1e8 < rate < 1e13  # a plausible memory, not a cache-sized fluke or a zero clock
    model = make_llama(64, num_layers=1)
    assert floor.floor_seconds(model, 1e9) == floor.weight_bytes(model) / 1e9
