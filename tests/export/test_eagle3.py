"""EAGLE-3 heads in bundles: exported in the layout vLLM's and SGLang's loaders read, loaded
back the same, served with the engines' EAGLE-3 flags, checked, and refused for another
target."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftkit.cli import main
from draftkit.errors import ModelError
from draftkit.export import check_bundle, export_bundle
from draftkit.export.bundle import target_reference
from draftkit.models import resolve_model
from draftkit.models.eagle3 import from_target, load_eagle3
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import (fake_engines, make_llama, make_qwen3, make_tokenizer, reseal,
                           save_head, save_model, write_manifest)

IDS = [1, 2, 5, 9, 40, 60, 77]  # the draft vocabulary, N = 7
LAYERS = [2, 4, 5]  # the references' default for an 8-layer target: [2, L // 2, L - 3]
# What the engines load, by name (vLLM llama_eagle3.py load_weights, SGLang llama_eagle3.py
# load_weights): unprefixed, midlayer.*, no embed_tokens (both share the target's).
SERVED = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
    f"midlayer.{name}.weight" for name in (
        "input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj",
        "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")}


def _saved(tmp_path: Path, family: str = "llama", layers: int = 8, seed: int = 0,
           dtype: torch.dtype | None = None, name: str = "target"):
    """(target model, its folder, an EAGLE-3 head for it saved in ``name``-head)."""
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=layers, seed=seed) if family == "llama" else \
        make_qwen3(len(tok), layers, seed)
    target_dir = save_model(target, tok, tmp_path / name)
    head = from_target(target, ReducedHead(IDS, len(tok)))
    with torch.no_grad():  # a layer that matters: the default init barely moves the residual
        for p in head.midlayer.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    save_head(head, tmp_path / f"{name}-head", target_dir, dtype=dtype)
    return target, target_dir, tmp_path / f"{name}-head"


@pytest.fixture
def saved(tmp_path):
    return _saved(tmp_path)


def _probe(target, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(2, 9, 3 * target.config.hidden_size, generator=g)  # (B, T, 3 Ht)
    return aux, torch.randint(0, target.config.vocab_size, (2, 9), generator=g)


def _rehash(bundle: Path) -> None:
    """The manifest's hashes for the bundle's files as they are now: edits below reach the
    layout checks instead of stopping at the hash check."""
    reseal(bundle)


# --- export -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_an_exported_head_loads_back_with_the_same_logits(tmp_path, dtype):
    target, target_dir, head_dir = _saved(tmp_path, dtype=dtype)
    before = load_eagle3(head_dir, target)
    stored_as = str(dtype or torch.float32).removeprefix("torch.")
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=3,
                        dtype=stored_as)  # exported as stored: the same logits to the bit
    after = load_eagle3(out / "draft", target)
    aux, ids = _probe(target)
    with torch.no_grad():
        (logits, h), (logits2, h2) = before(aux, ids), after(aux, ids)
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)
    torch.testing.assert_close(h2, h, rtol=0, atol=0)
    assert after.reduced_head.ids.tolist() == IDS
    stored = load_file(str(out / "draft" / "model.safetensors"))
    assert stored["fc.weight"].dtype == (dtype or torch.float32)  # as the head was stored


def test_export_reads_only_the_targets_embedding(saved, tmp_path):
    """A head needs only the target's embedding: read alone from safetensors, a target stored
    otherwise loads whole."""
    from transformers import AutoConfig

    from draftkit.export.eagle3 import target_embedding

    target, target_dir, _ = saved
    config = AutoConfig.from_pretrained(target_dir)
    alone = target_embedding(target_dir, config)
    assert not hasattr(alone, "model") and alone.config is config
    assert torch.equal(alone.get_input_embeddings().weight, target.model.embed_tokens.weight)
    pickled = tmp_path / "pickled"  # a pytorch_model.bin target
    config.save_pretrained(pickled)
    torch.save(target.state_dict(), pickled / "pytorch_model.bin")
    whole = target_embedding(pickled, config)
    assert torch.equal(whole.get_input_embeddings().weight, target.model.embed_tokens.weight)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_bundles_head_is_what_vllm_and_sglang_load(tmp_path, family):
    target, target_dir, head_dir = _saved(tmp_path, family)
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=3)
    tc = target.config
    hd = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    h, nh, nkv, v, n = (tc.hidden_size, tc.num_attention_heads, tc.num_key_value_heads,
                        tc.vocab_size, len(IDS))
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1
    assert config["tie_word_embeddings"] is False
    assert (config["hidden_size"], config["target_hidden_size"]) == (h, h)
    assert (config["vocab_size"], config["draft_vocab_size"]) == (v, n)
    assert (config["num_key_value_heads"], config["head_dim"]) == (nkv, hd)  # vLLM's KV groups
    assert config["max_position_embeddings"] >= tc.max_position_embeddings
    assert config["rope_theta"] == tc.rope_parameters["rope_theta"]  # for transformers 4.x
    assert not config.get("norm_before_residual") and "norm_output" not in config
    assert config["eagle_aux_hidden_state_layer_ids"] == LAYERS  # vLLM: the layer entered
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang +1
    assert config["torch_dtype"] == "bfloat16"  # export's default: the dtype targets serve in

    state = load_file(str(out / "draft" / "model.safetensors"))
    assert set(state) == SERVED
    shapes = {"fc.weight": (h, 3 * h), "lm_head.weight": (n, h), "norm.weight": (h,),
              "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * h),
              "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * h),
              "midlayer.self_attn.v_proj.weight": (nkv * hd, 2 * h),
              "midlayer.self_attn.o_proj.weight": (h, nh * hd), "d2t": (n,), "t2d": (v,)}
    assert {k: tuple(state[k].shape) for k in shapes} == shapes
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    assert (torch.arange(n) + state["d2t"]).tolist() == IDS  # target id = i + d2t[i]
    assert state["t2d"].nonzero().flatten().tolist() == IDS
    assert {t.dtype for k, t in state.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
    # the target's tokenizer beside it, as a standalone bundle has
    assert json.loads((out / "draft" / "tokenizer.json").read_text()) == \
        json.loads((target_dir / "tokenizer.json").read_text())


def test_the_manifest_and_serving_files_name_an_eagle3_head(saved, tmp_path, capsys):
    _, target_dir, head_dir = saved
    assert main(["export", "--target", str(target_dir), "--draft", str(head_dir), "--out",
                 str(tmp_path / "bundle"), "--k", "3"]) == 0
    said = capsys.readouterr().out
    assert "HF:     cannot run an EAGLE-3 head" in said
    out = tmp_path / "bundle"
    manifest = json.loads((out / "draftkit.json").read_text())
    assert manifest["draft"]["kind"] == "eagle3"
    assert manifest["draft"]["eagle_aux_hidden_state_layer_ids"] == LAYERS
    assert manifest["draft"]["draft_vocab_size"] == len(IDS)
    assert manifest["target"]["sha256"] == \
        target_reference(resolve_model(str(target_dir))).sha256
    draft = str((out / "draft").resolve())
    assert json.loads((out / "serving" / "vllm.json").read_text()) == {
        "method": "eagle3", "model": draft, "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"}

    env = fake_engines(tmp_path)  # stand-ins for the engines: they print what they were given
    said = subprocess.run(["bash", str(out / "serving" / "vllm.sh")], env=env,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert json.loads(said[said.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": draft, "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"}
    said = subprocess.run(["bash", str(out / "serving" / "sglang.sh")], env=env,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert said[:2] == ["-m", "sglang.launch_server"]
    assert said[-1] == "--speculative-use-rejection-sampling"  # SGLang >= 0.5.14, EAGLE only
    flags = dict(zip(said[2:-1:2], said[3:-1:2]))
    assert flags == {"--model-path": str(target_dir.resolve()),
                     "--speculative-algorithm": "EAGLE3",
                     "--speculative-draft-model-path": draft,
                     "--speculative-num-steps": "3", "--speculative-eagle-topk": "1",
                     "--speculative-num-draft-tokens": "4", "--dtype": "bfloat16"}

    snippet = (out / "serving" / "hf_transformers.py").read_text()
    assert "HF transformers cannot run this bundle's draft: it is an EAGLE-3 head" in snippet
    assert f"draftkit generate --target {target_dir.resolve()} --draft BUNDLE --k 3" in snippet
    assert "assistant_model=draft)" in snippet and "load_pair(" in snippet
    compile(snippet, "hf_transformers.py", "exec")

    assert main(["check", str(out)]) == 0
    assert "EAGLE-3 head tapping target layers [2, 4, 5], K=3" in capsys.readouterr().out


@pytest.mark.slow  # starts draftkit in another Python
def test_the_hf_note_decodes_with_draftkit(saved, tmp_path):
    """The note's script runs the head in draftkit's own engine, wherever the bundle is."""
    _, target_dir, head_dir = saved
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=2)
    moved = tmp_path / "moved"
    shutil.move(out, moved)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    ran = subprocess.run([sys.executable, str(moved / "serving" / "hf_transformers.py")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "tokens kept per target forward" in ran.stdout


# --- bad input ------------------------------------------------------------------------------------

def _other_target(tmp_path: Path, **kw) -> Path:
    tok = make_tokenizer()
    return save_model(make_llama(len(tok), **kw), tok, tmp_path / "other")


def test_a_bundled_head_decodes_only_beside_the_target_it_was_exported_for(saved, tmp_path):
    """Another target of the same shape (a base model for its instruct model, say) would load
    and decode with next to no acceptance: the bundle's recorded hash refuses it in one line."""
    from draftkit.models import load_pair

    _, target_dir, head_dir = saved
    bundle = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=2)
    assert load_pair(str(target_dir), str(bundle), device="cpu").draft is not None
    twin = _other_target(tmp_path, num_layers=8, seed=5)  # same shape, other weights
    with pytest.raises(ModelError, match=r"the EAGLE-3 head in .*bundle was exported for the "
                                         r"target 'target' at .*; the head reads its target's "
                                         r"hidden states: pass that target"):
        load_pair(str(twin), str(bundle), device="cpu")
    # the loose head records its target as well, so it is refused beside the twin too
    with pytest.raises(ModelError, match="was trained for the target 'target'"):
        load_pair(str(twin), str(head_dir), device="cpu")


def test_export_refuses_a_head_for_another_target(saved, tmp_path):
    _, target_dir, head_dir = saved
    for other, message in (
            (dict(num_layers=8, hidden_size=48, heads=4), "is an EAGLE-3 head for a target with "
             "hidden_size 32; this target has 48: pass the target it was trained on"),
            (dict(num_layers=5), r"taps target layers \[2, 4, 5\]; this target has 5 layers "
             r"\(ids within 1..4\): pass the target it was trained on"),
            (dict(num_layers=8, kv_heads=4), "num_key_value_heads 2; this target has 4")):
        with pytest.raises(ModelError, match=message):
            export_bundle(str(_other_target(tmp_path, **other)), str(head_dir),
                          tmp_path / "x", k=2)
        shutil.rmtree(tmp_path / "other")
        assert not (tmp_path / "x").exists()
    # the same shapes, other weights: only a bundle's recorded hash tells
    bundle = export_bundle(str(target_dir), str(head_dir), tmp_path / "b", k=2)
    same_shape = _other_target(tmp_path, num_layers=8, seed=5)
    with pytest.raises(ModelError, match=r"the EAGLE-3 head in .*b was exported for the target "
                                         r"'target' at .*; the head reads its target's hidden "
                                         r"states: pass that target"):
        export_bundle(str(same_shape), str(bundle), tmp_path / "x", k=2)
    assert export_bundle(str(target_dir), str(bundle), tmp_path / "again", k=2).is_dir()


def test_export_refuses_a_non_llama_target(saved, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, _, head_dir = saved
    tok = make_tokenizer()
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=8, n_head=4))
    gpt2_dir = save_model(gpt2, tok, tmp_path / "gpt2")
    with pytest.raises(ModelError, match=r"Llama-family targets .* this target is 'gpt2'"):
        export_bundle(str(gpt2_dir), str(head_dir), tmp_path / "x", k=2)
    assert not (tmp_path / "x").exists()


def test_export_refuses_a_head_the_engines_would_read_otherwise(saved, tmp_path):
    _, target_dir, head_dir = saved
    config = json.loads((head_dir / "config.json").read_text())
    (head_dir / "config.json").write_text(json.dumps({**config, "norm_before_residual": True}))
    with pytest.raises(ModelError, match="norm_before_residual is set: a variant plain "
                                         "EAGLE-3 lacks"):
        export_bundle(str(target_dir), str(head_dir), tmp_path / "x", k=2)
    assert not (tmp_path / "x").exists()
    (head_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(ModelError, match="max_position_embeddings 64 is below the target's 256"):
        export_bundle(str(target_dir), str(head_dir), tmp_path / "x", k=2)
    (head_dir / "config.json").write_text(json.dumps(config))
    state = load_file(str(head_dir / "model.safetensors"))
    del state["midlayer.hidden_norm.weight"]
    save_file(state, str(head_dir / "model.safetensors"))
    with pytest.raises(ModelError, match="missing midlayer.hidden_norm.weight"):
        export_bundle(str(target_dir), str(head_dir), tmp_path / "x", k=2)
    assert not (tmp_path / "x").exists()


def _config_edit(**changes):
    def edit(draft: Path):
        config = json.loads((draft / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key)
            else:
                config[key] = value
        (draft / "config.json").write_text(json.dumps(config))
    return edit


def _tensor_edit(change):
    def edit(draft: Path):
        state = load_file(str(draft / "model.safetensors"))
        change(state)
        save_file(state, str(draft / "model.safetensors"), metadata={"format": "pt"})
    return edit


def _flip(state):
    state["t2d"][3] = ~state["t2d"][3]


BROKEN = [  # (edit of the bundle's draft/, what check says)
    (_config_edit(tie_word_embeddings=True), "tie_word_embeddings is not false"),
    (_config_edit(norm_before_residual=True), "norm_before_residual is set"),
    (_config_edit(rope_theta=None), r"rope_theta is missing \(engines on transformers 4.x"),
    (_config_edit(head_dim=None), "head_dim is missing"),
    (_config_edit(num_hidden_layers=2), "lacks layers.1.hidden_norm.weight"),  # weights of one
    (_config_edit(num_hidden_layers=0), "num_hidden_layers is 0, not a count of layers"),
    (_config_edit(eagle_config={"eagle_aux_hidden_state_layer_ids": LAYERS}),
     r"eagle_config.eagle_aux_hidden_state_layer_ids is \[2, 4, 5\], not \[1, 3, 4\]: SGLang "
     r"adds one to each"),
    (_config_edit(eagle_aux_hidden_state_layer_ids=None), "not three ascending layer ids"),
    (_config_edit(max_position_embeddings=64), "max_position_embeddings 64 is below the "
                                               "target's 256"),
    (_config_edit(architectures=["LlamaForCausalLM"], draft_vocab_size=None,
                  speculators_model_type=None),
     "records the draft's kind as 'eagle3' but draft/ holds a 'standalone' draft"),
    (_config_edit(architectures=["LlamaForCausalLM"]),  # the EAGLE repository's layout
     r"architectures is \['LlamaForCausalLM'\], not \['LlamaForCausalLMEagle3'\]"),
    (_tensor_edit(lambda s: s.pop("midlayer.hidden_norm.weight")),
     "lacks midlayer.hidden_norm.weight: SGLang would serve that weight random"),
    (_tensor_edit(lambda s: s.update({"model.fc.weight": s["fc.weight"].clone()})),
     "holds model.fc.weight, a name neither engine loads"),
    (_tensor_edit(lambda s: s.update({"lm_head.weight": s["lm_head.weight"][:5]})),
     r"lm_head.weight has shape \(5, 32\); the config makes it \(7, 32\)"),
    (_tensor_edit(lambda s: s.update({"d2t": s["d2t"].int()})), "d2t is torch.int32"),
    (_tensor_edit(lambda s: s.update({"norm.weight": s["norm.weight"].float()})),
     r"weights stored as \['bfloat16', 'float32'\], config.json says bfloat16"),
    (_tensor_edit(_flip), "d2t and t2d do not describe the same draft vocabulary"),
]


@pytest.mark.parametrize("edit,message", BROKEN)
def test_check_names_what_the_engines_would_read_otherwise(saved, tmp_path, edit, message):
    _, target_dir, head_dir = saved
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=2)
    edit(out / "draft")
    _rehash(out)
    with pytest.raises(ModelError, match=message):
        check_bundle(out)


def test_check_refuses_another_target_and_a_stale_manifest(saved, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, target_dir, head_dir = saved
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "bundle", k=2)
    assert check_bundle(out).draft.kind == "eagle3"
    with pytest.raises(ModelError, match="hidden_size 32; this target has 48: pass the target"):
        check_bundle(out, target=str(_other_target(tmp_path, num_layers=8, hidden_size=48)))
    shutil.rmtree(tmp_path / "other")
    with pytest.raises(ModelError, match=r"taps target layers \[2, 4, 5\]; this target has 4"):
        check_bundle(out, target=str(_other_target(tmp_path, num_layers=4)))
    shutil.rmtree(tmp_path / "other")
    with pytest.raises(ModelError, match="is not the one this bundle was exported for"):
        check_bundle(out, target=str(_other_target(tmp_path, num_layers=8, seed=5)))
    tok = make_tokenizer()
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=8, n_head=4))
    with pytest.raises(ModelError, match="Llama-family targets"):
        check_bundle(out, target=str(save_model(gpt2, tok, tmp_path / "gpt2")))
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["draft"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    write_manifest(out, manifest)  # as a faulty exporter would seal it
    with pytest.raises(ModelError, match=r"records tapped layers \[1, 2, 3\] but "
                                         r"draft/config.json \[2, 4, 5\]"):
        check_bundle(out)
