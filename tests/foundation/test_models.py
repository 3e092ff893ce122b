import json
import shutil

import pytest
import torch

from draftkit.errors import DraftkitError, ModelError
from draftkit.io import sha256_file
from draftkit.models import check_compatible, load_model, load_pair, load_tokenizer, resolve_model
from draftkit.models.derive import derive_by_layers, derive_random, save_draft
from tests.helpers import make_llama, make_tokenizer, save_model, write_manifest


def test_resolve_local_dir_and_missing(tiny_dirs, tmp_path):
    target_dir, _ = tiny_dirs
    ref = resolve_model(str(target_dir))
    assert ref.kind == "local" and ref.path == target_dir.resolve()
    with pytest.raises(ModelError, match="not found: no such directory"):
        resolve_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="holds no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_hub_id_offline_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE is set"):
        resolve_model("SomeOrg/some-model-that-is-not-cached", "draft")


def test_bad_gguf_is_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelError, match="could not parse GGUF"):
        resolve_model(str(bad))
    # Nothing half-written is left in the cache.
    assert not any(p.name.endswith("config.json")
                   for p in (tmp_path / "cache").rglob("*"))


def test_bundle_resolution(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    bundle = tmp_path / "bundle"
    shutil.copytree(draft_dir, bundle / "draft")
    files = {p.relative_to(bundle).as_posix(): sha256_file(p)
             for p in sorted((bundle / "draft").iterdir())}
    write_manifest(bundle, target={"name": "tiny", "path": str(target_dir)}, files=files)
    assert resolve_model(str(bundle), "draft").path == (bundle / "draft").resolve()
    assert resolve_model(str(bundle), "target").path == target_dir.resolve()
    # a bundle is plain files: a link would have the checks read outside it
    shutil.rmtree(bundle / "draft")
    (bundle / "draft").symlink_to(draft_dir, target_is_directory=True)
    with pytest.raises(ModelError, match="holds a symbolic link, draft; a bundle is plain"):
        resolve_model(str(bundle), "draft")


def test_derive_layers_equals_hand_built(tmp_path):
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=4, seed=3)
    draft = derive_by_layers(target, [0, 3])
    # The same model built by hand: a 2-layer config and the chosen layers' weights copied.
    hand = make_llama(len(tok), num_layers=2, seed=99)
    hand.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
    hand.model.norm.load_state_dict(target.model.norm.state_dict())
    hand.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    hand.model.layers[1].load_state_dict(target.model.layers[3].state_dict())
    ids = torch.tensor([[5, 9, 17, 33, 2, 64]])
    with torch.no_grad():
        torch.testing.assert_close(draft(ids).logits, hand(ids).logits, rtol=0, atol=0)
    # It saves as a plain HF directory that AutoModelForCausalLM loads back unchanged.
    out = save_draft(draft, tok, tmp_path / "draft")
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(out)
    assert again.config.num_hidden_layers == 2
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, hand(ids).logits)
    assert load_tokenizer(str(out)).get_vocab() == tok.get_vocab()
    with pytest.raises(DraftkitError, match="already exists"):
        save_draft(draft, tok, out)


def test_derive_layers_out_of_range():
    tok = make_tokenizer()
    with pytest.raises(DraftkitError, match="layers 0..3"):
        derive_by_layers(make_llama(len(tok), num_layers=4), [0, 4])


def test_derive_layers_keeps_qwen2_window_layers():
    """Qwen2 makes layers from max_window_layers on sliding-window; a cut keeps which kept
    layer is which in both layer_types and that count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    target = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
        max_window_layers=3))
    draft = derive_by_layers(target, [0, 1, 4, 5])
    assert draft.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert draft.config.max_window_layers == 2


def test_derive_random_shapes(tmp_path):
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=4, hidden_size=32)
    narrow = derive_random(target, num_layers=1, hidden_size=16, intermediate_size=24)
    assert narrow.config.num_hidden_layers == 1 and narrow.config.hidden_size == 16
    assert narrow.config.vocab_size == target.config.vocab_size
    ids = torch.tensor([[5, 6, 7]])
    assert narrow(ids).logits.shape == (1, 3, len(tok))
    same_width = derive_random(target, num_layers=2, hidden_size=None, intermediate_size=None)
    assert torch.equal(same_width.model.embed_tokens.weight, target.model.embed_tokens.weight)
    with pytest.raises(DraftkitError, match="multiple of the head size"):
        derive_random(target, 1, 20, None)


def test_compat_errors_name_the_difference(tmp_path):
    tok = make_tokenizer()
    other = make_tokenizer(extra_words=("zebra",))
    with pytest.raises(ModelError, match="1 tokens only in the draft .*'zebra'"):
        check_compatible(tok, other)
    eos = make_tokenizer()
    eos.eos_token = "<pad>"
    with pytest.raises(ModelError, match="draft eos_token_id is 3 but the target's is 2"):
        check_compatible(tok, eos)
    check_compatible(tok, make_tokenizer())  # identical: no error
    # the target's template renders every prompt, so the draft's own may differ (as
    # Llama-3.2-1B-Instruct's does from Llama-3.1-8B-Instruct's)
    templ = make_tokenizer()
    templ.chat_template = "{{ messages }}"
    check_compatible(tok, templ)


def test_load_pair_refuses_mismatched_draft(tmp_path):
    tok = make_tokenizer()
    target = save_model(make_llama(len(tok)), tok, tmp_path / "t")
    bigger = make_tokenizer(extra_words=("zebra", "lion"))
    draft = save_model(make_llama(len(bigger)), bigger, tmp_path / "d")
    with pytest.raises(ModelError, match="vocab_size 140 differs from the target's 138"):
        load_pair(str(target), str(draft), device="cpu")
    pair = load_pair(str(target), str(target), device="cpu")
    assert pair.draft is not None and pair.target_ref.kind == "local"


def test_load_model_dtype(tiny_dirs):
    target_dir, _ = tiny_dirs
    model = load_model(str(target_dir), device="cpu", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model(str(target_dir), device="cpu", dtype="int3")


def test_a_device_this_machine_lacks_is_one_clear_error(tiny_dirs):
    from draftkit.models import load_model

    with pytest.raises(ModelError, match="'foo' is not a device"):
        load_model(str(tiny_dirs[0]), device="foo")
    with pytest.raises(ModelError, match="no such CUDA device"):
        load_model(str(tiny_dirs[0]), device=f"cuda:{torch.cuda.device_count()}")


def test_gguf_cache_key_follows_content_not_path(tmp_path):
    """Every virtual environment installs the wheel's GGUF in its own place; one conversion
    serves them all, and a different file never reuses another's."""
    from draftkit.models.embedded import _gguf_key

    body = bytes(range(256)) * (40 << 10)  # 10 MiB: the head and tail windows differ
    a, b, c = tmp_path / "a.gguf", tmp_path / "venv2" / "a.gguf", tmp_path / "c.gguf"
    b.parent.mkdir()
    a.write_bytes(body)
    b.write_bytes(body)
    c.write_bytes(body[:-1] + b"\x01")
    assert _gguf_key(a) == _gguf_key(b) != _gguf_key(c)


def test_saved_tokenizers_load_under_transformers_4(tmp_path):
    """transformers 5 names the class 'TokenizersBackend', unknown to 4.x (vLLM, SGLang)."""
    from draftkit.models.save import save_tokenizer

    tok = make_tokenizer()
    save_tokenizer(tok, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "def f(x):\n    return x + 1"
    assert again(text)["input_ids"] == tok(text)["input_ids"]


@pytest.mark.parametrize("rope", [
    {"rope_theta": 100000.0, "rope_type": "default"},  # SmolLM2
    {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},  # Llama 3.x
], ids=["default", "llama3"])
def test_saved_models_keep_their_rope_under_transformers_4(tmp_path, rope):
    """transformers 5 writes rope_parameters alone; 4.x (vLLM, SGLang) reads rope_theta and
    rope_scaling, and without them runs at a base of 10000. Both ways must describe one RoPE,
    and every draft folder draftkit writes (derive, best/, bundles) goes through save_model."""
    from transformers import AutoConfig

    from draftkit.models.save import save_model as save_for_both

    model = make_llama(len(make_tokenizer()), num_layers=1)
    model.config.rope_parameters = dict(rope)
    save_for_both(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["rope_theta"] == rope["rope_theta"]
    legacy = {k: v for k, v in rope.items() if k != "rope_theta"}
    assert config["rope_scaling"] == (legacy if rope["rope_type"] != "default" else None)
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert AutoConfig.from_pretrained(tmp_path / "m").rope_parameters == rope  # 5 reads it alike
    save_draft(model, make_tokenizer(), tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["rope_theta"] == \
        rope["rope_theta"]


def test_rope_written_per_layer_type_or_partial_is_written_for_transformers_4_too():
    """Phi's partial_rotary_factor and Gemma 3's per-layer-type rope_parameters, which 4.x
    reads as partial_rotary_factor, rope_theta / rope_scaling and rope_local_base_freq."""
    from draftkit.models.save import add_legacy_keys

    phi = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                               "partial_rotary_factor": 0.75}}
    add_legacy_keys(phi)
    assert (phi["rope_theta"], phi["partial_rotary_factor"], phi["rope_scaling"]) == (
        10000.0, 0.75, None)
    gemma3 = {"rope_parameters": {
        "full_attention": {"rope_theta": 1e6, "rope_type": "linear", "factor": 8.0},
        "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}
    add_legacy_keys(gemma3)
    assert (gemma3["rope_theta"], gemma3["rope_local_base_freq"]) == (1e6, 1e4)
    assert gemma3["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
