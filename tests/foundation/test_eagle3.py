"""EAGLE-3 heads: built for a target, saved in the layout vLLM and SGLang load, loaded back."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draftkit.errors import ModelError
from draftkit.models.eagle3 import (default_aux_layers, eagle3_config, from_target, load_eagle3,
                                    save_eagle3)
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import make_llama, make_mistral, make_tokenizer

IDS = [60, 1, 5, 9, 20, 33, 40, 41]


@pytest.fixture
def target():
    return make_llama(len(make_tokenizer()), num_layers=6)


def test_default_layers_are_low_middle_high():
    assert default_aux_layers(30) == [2, 15, 27]  # the outputs of layers 1, 14 and 26
    assert default_aux_layers(32) == [2, 16, 29]
    assert default_aux_layers(6) == [1, 3, 5]  # too shallow for the reference's choice
    with pytest.raises(ModelError, match="three distinct layers"):
        default_aux_layers(2)


def test_vocabulary_maps_are_the_engines_offsets_and_mask(target):
    v = target.config.vocab_size
    draft = from_target(target, ReducedHead(IDS, v))
    ids = sorted(IDS)
    assert draft.d2t.tolist() == [t - i for i, t in enumerate(ids)]  # target id = i + d2t[i]
    assert draft.t2d.nonzero().flatten().tolist() == ids and draft.t2d.shape == (v,)
    assert draft.reduced_head.ids.tolist() == ids
    assert torch.equal(draft.embed_tokens.weight, target.model.embed_tokens.weight)
    assert not draft.embed_tokens.weight.requires_grad
    # the head starts as the target's own rows for the draft vocabulary
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight[ids])


def test_saved_head_has_the_served_layout_and_loads_back_the_same(target, tmp_path):
    draft = from_target(target, ReducedHead(IDS, target.config.vocab_size))
    aux = torch.randn(2, 5, 3 * target.config.hidden_size)
    tokens = torch.randint(0, target.config.vocab_size, (2, 5))
    logits, h = draft(aux, tokens)
    save_eagle3(draft, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert "embed_tokens.weight" not in state  # both engines share the target's
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
            "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight"} <= set(state)
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * target.config.hidden_size
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["draft_vocab_size"], config["num_hidden_layers"]) == (len(IDS), 1)
    assert config["tie_word_embeddings"] is False and config["rope_theta"] == 10000.0
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]  # vLLM: the layer entered
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]  # SGLang
    assert (config["num_key_value_heads"], config["head_dim"]) == (
        target.config.num_key_value_heads, target.config.hidden_size // 4)
    loaded = load_eagle3(tmp_path, target)
    again, h2 = loaded(aux, tokens)
    torch.testing.assert_close(again, logits, rtol=0, atol=0)
    torch.testing.assert_close(h2, h, rtol=0, atol=0)


def test_a_head_is_for_its_own_target_and_whole(target, tmp_path):
    save_eagle3(from_target(target, ReducedHead(IDS, target.config.vocab_size)), tmp_path)
    other = make_llama(target.config.vocab_size, num_layers=6, hidden_size=48, heads=4)
    with pytest.raises(ModelError, match="hidden size 32; this target has .* and 48: pass the "
                                         "target it was trained on"):
        load_eagle3(tmp_path, other)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["fc.weight"]
    from safetensors.torch import save_file
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelError, match="missing fc.weight; re-export the head"):
        load_eagle3(tmp_path, target)


def test_only_llama_family_targets_and_their_vocabulary(target):
    head = ReducedHead(IDS, target.config.vocab_size)
    with pytest.raises(ModelError, match="vocabulary is over 200 ids; the target has"):
        eagle3_config(target, ReducedHead(IDS, 200))
    target.config.model_type = "gpt2"
    with pytest.raises(ModelError, match="Llama-family targets .* this target is 'gpt2'"):
        eagle3_config(target, head)
    mistral = make_mistral(4, 0, window=4096, vocab=100)
    config = eagle3_config(mistral, ReducedHead([1, 2], 100), aux_layers=[1, 2, 3])
    assert config.eagle_aux_hidden_state_layer_ids == [1, 2, 3] and config.num_hidden_layers == 1
    for layers in ([1, 1, 2], [1, 2, 4], [3, 2, 1]):  # repeated, past the last layer, unordered
        with pytest.raises(ModelError, match=r"give three distinct layer ids .* within 1..3"):
            eagle3_config(mistral, ReducedHead([1, 2], 100), aux_layers=layers)
