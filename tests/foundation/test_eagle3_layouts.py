"""EAGLE-3 heads as SpecForge, vLLM's speculators and the EAGLE repository publish them: each
loads as the draftkit head it was written from, passes the pair's checks, exports in draftkit's
layout and warm-starts training; a folder in no known layout, or a variant draftkit's head does
not compute, is one clear error."""

import json
import warnings

import pytest
import torch
from safetensors.torch import save_file

from draftkit.errors import DraftkitError, ModelError
from draftkit.models.eagle3 import (ARCHITECTURE, default_aux_layers, from_target, load_eagle3,
                                    save_eagle3)
from draftkit.models.load import is_eagle3_dir
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import distill_config, make_llama, make_tokenizer, save_model

IDS = [60, 1, 5, 9, 20, 33, 40, 41]
LAYOUTS = ("specforge", "specforge-hf", "speculators", "eagle")
UNRECORDED = ("specforge-hf", "eagle")  # written without the tapped layers
# the warning those give, which test_a_published_head_loads_as_the_head_it_was_written_from
# checks
QUIET = pytest.mark.filterwarnings("ignore:.*records no tapped layers")


def _head(target, layout: str, seed: int = 0):
    """A head for ``target`` with a layer that matters, over IDS (the whole vocabulary for
    ``specforge-hf``), tapping the default layers where ``layout`` will not record them."""
    v = target.config.vocab_size
    ids = range(v) if layout == "specforge-hf" else IDS
    layers = default_aux_layers(target.config.num_hidden_layers) if layout in UNRECORDED else \
        [1, 2, 3]
    head = from_target(target, ReducedHead(list(ids), v), aux_layers=layers, seed=seed)
    with torch.no_grad():  # the default init barely moves the residual
        for p in head.midlayer.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return head.eval()


def _publish(head, folder, layout: str):
    """``head`` written as ``layout`` writes one (the sources: draftkit/models/eagle3_layouts.py):

    - specforge: ``save_pretrained`` of SpecForge's LlamaForCausalLMEagle3, its config as in
      ``configs/*.json`` with the layers only as ``eagle_config``'s (the layer left), d2t / t2d
      always; specforge-hf: ``specforge export --to hf``, with the target's embedding, and here
      over the whole vocabulary (identity maps) and without the layers;
    - speculators: ``Eagle3DraftModel.save_pretrained``: the layer's config nested, the layer as
      ``layers.0.*``, the embedding shipped;
    - eagle: the EAGLE repository's Llama config with draft_vocab_size and
      ``pytorch_model.bin``, no layers."""
    folder.mkdir(parents=True)
    config = head.config.to_dict()
    layers = config.pop("eagle_aux_hidden_state_layer_ids")
    eagle_config = config.pop("eagle_config")
    state = {k: v.detach().clone().contiguous() for k, v in head.state_dict().items()
             if not k.startswith("rotary_emb.")}
    if layout == "speculators":
        layer = {k: v for k, v in config.items()
                 if k not in ("draft_vocab_size", "target_hidden_size", "architectures")}
        from transformers import LlamaConfig

        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "speculators_version": "0.3.0", "draft_vocab_size": len(IDS),
                  "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
                  "norm_output": False, "target_hidden_size": None,
                  "eagle_aux_hidden_state_layer_ids": layers, "embed_requires_grad": False,
                  "torch_dtype": "float32",
                  "transformer_layer_config": LlamaConfig(**layer).to_diff_dict(),
                  "speculators_config": {
                      "algorithm": "eagle3", "default_proposal_method": "greedy",
                      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                      "verifier": {"architectures": ["LlamaForCausalLM"],
                                   "name_or_path": "target"}}}
        state = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
    elif layout == "eagle":
        keep = ("bos_token_id", "eos_token_id", "pad_token_id", "hidden_act", "hidden_size",
                "intermediate_size", "max_position_embeddings", "model_type",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "vocab_size",
                "draft_vocab_size")
        config = {**{k: config[k] for k in keep}, "architectures": ["LlamaForCausalLM"],
                  "num_hidden_layers": 1, "tie_word_embeddings": False, "rope_theta": 10000.0,
                  "torch_dtype": "float32", "transformers_version": "4.28.1",
                  # as copied from a target config: EAGLE's attention uses hidden / heads
                  "head_dim": 2 * config["head_dim"]}
        del state["embed_tokens.weight"]
        torch.save(state, folder / "pytorch_model.bin")
    else:
        config.update(norm_output=True)  # SpecForge's: logits from the normed output
        if layout == "specforge":
            config["eagle_config"] = eagle_config
            del state["embed_tokens.weight"]
    if layout != "eagle":
        save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _probe(target, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(2, 9, 3 * target.config.hidden_size, generator=g)  # (B, T, 3 Ht)
    return aux, torch.randint(0, target.config.vocab_size, (2, 9), generator=g)


def _same(a, b, target):
    aux, ids = _probe(target)
    with torch.no_grad():
        for x, y in zip(a(aux, ids), b(aux, ids)):  # logits (B, T, N), h (B, T, H)
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def _load(folder, target, layout):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        head = load_eagle3(folder, target)
    said = [str(w.message) for w in seen if "records no tapped layers" in str(w.message)]
    assert bool(said) == (layout in UNRECORDED), said
    return head


@pytest.fixture
def target():
    return make_llama(len(make_tokenizer()), num_layers=6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_published_head_loads_as_the_head_it_was_written_from(target, tmp_path, layout):
    head = _head(target, layout)
    folder = _publish(head, tmp_path / layout, layout)
    assert is_eagle3_dir(folder)
    loaded = _load(folder, target, layout)
    _same(loaded, head, target)
    assert loaded.aux_layers == head.aux_layers
    assert loaded.reduced_head.ids.tolist() == head.reduced_head.ids.tolist()
    assert loaded.config.architectures == [ARCHITECTURE]
    assert torch.equal(loaded.embed_tokens.weight, target.model.embed_tokens.weight)
    # saved again, it is draftkit's layout and the same head
    save_eagle3(loaded, tmp_path / "again")
    _same(load_eagle3(tmp_path / "again", target), head, target)


@QUIET
@pytest.mark.parametrize("layout", ["speculators", "eagle"])
def test_a_published_head_pairs_with_its_target_and_exports_in_draftkits_layout(tmp_path,
                                                                                 layout):
    from draftkit.export import export_bundle
    from draftkit.models import load_pair

    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=6)
    target_dir = save_model(target, tok, tmp_path / "target")
    head = _head(target, layout)
    folder = _publish(head, tmp_path / layout, layout)
    from draftkit.cli import main

    # a published head records no target: the user says which one, once, and check records it
    assert main(["check", str(folder), "--target", str(target_dir), "--record-target"]) == 0
    pair = load_pair(str(target_dir), str(folder), device="cpu", dtype="float32")
    out = export_bundle(str(target_dir), str(folder), tmp_path / "bundle", k=3, dtype="float32")
    _same(pair.draft, head, target)
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    assert config["eagle_aux_hidden_state_layer_ids"] == head.aux_layers
    _same(load_eagle3(out / "draft", target), head, target)
    other = make_llama(len(tok), num_layers=6, hidden_size=48, heads=4)
    with pytest.raises(ModelError, match="pass the target it was trained on"):
        load_eagle3(folder, other)


@QUIET
def test_a_folder_in_no_known_layout_is_one_line_naming_the_layouts(target, tmp_path):
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                    "model_type": "llama"}))
    assert not is_eagle3_dir(folder)
    with pytest.raises(ModelError) as e:
        load_eagle3(folder, target)
    assert "\n" not in str(e.value)
    assert str(e.value) == (
        f"{folder} is not an EAGLE-3 head in a layout draftkit reads: its config.json has none "
        f"of architectures ['LlamaForCausalLMEagle3'] (draftkit, SGLang, SpecForge), "
        f"speculators_model_type 'eagle3' (vLLM speculators) or draft_vocab_size (the EAGLE "
        f"repository)")
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": "dflash"}))
    assert not is_eagle3_dir(folder)
    _publish(_head(target, "eagle"), tmp_path / "empty", "eagle")
    (tmp_path / "empty" / "pytorch_model.bin").unlink()
    with pytest.raises(ModelError, match="holds no model.safetensors or pytorch_model.bin"):
        load_eagle3(tmp_path / "empty", target)


@pytest.mark.parametrize("layout, edit, error", [
    ("speculators", {"norm_before_residual": True}, "norm_before_residual is set"),
    ("speculators", {"norm_before_residual": None}, "speculators reads it as false but vLLM"),
    ("speculators", {"norm_output": True}, "norm_output is set"),
    ("speculators", {"transformer_layer_config": {"model_type": "qwen3"}},
     "a 'qwen3' layer; draftkit's head is a Llama layer"),
    ("speculators", {"transformer_layer_config": {"num_hidden_layers": 2}},
     "the head has 2 layers; draftkit's has one"),
    ("specforge", {"fc_norm": True}, "fc_norm is set"),
    ("specforge", {"norm_output": False}, "norm_output is false"),
    ("specforge", {"eagle_aux_hidden_state_layer_ids": [1, 2, 4]},
     r"\[1, 2, 4\] .* and eagle_config's \[0, 1, 2\] .* name other layers"),
])
def test_a_variant_draftkits_head_does_not_compute_is_refused(target, tmp_path, layout, edit,
                                                              error):
    folder = _publish(_head(target, layout), tmp_path / layout, layout)
    config = json.loads((folder / "config.json").read_text())
    for key, value in edit.items():
        if isinstance(value, dict):
            config[key].update(value)
        elif value is None:
            del config[key]
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=error):
        load_eagle3(folder, target)


@QUIET
@pytest.mark.parametrize("layout", ["specforge", "speculators", "eagle"])
def test_training_warm_starts_from_a_published_head_as_from_draftkits(tmp_path, tiny_dirs,
                                                                      layout):
    """draft.model=<a published head>: refused until the user records the target it was
    trained for (a published head records none), then the same run, step for step, as from
    the same head in draftkit's layout."""
    from draftkit.cli import main
    from draftkit.distill.trainer import train
    from draftkit.models import load_model
    from tests.helpers import save_head

    target = load_model(str(tiny_dirs[0]), device="cpu", dtype="float32")
    head = _head(target, layout, seed=1)
    save_head(head, tmp_path / "draftkit-head", tiny_dirs[0])
    published = _publish(head, tmp_path / f"{layout}-head", layout)

    def warm(folder):
        return {"kind": "eagle3", "ttt_steps": 3, "draft_vocab_size": None, "model": str(folder)}

    with pytest.raises(DraftkitError, match=r"draft.model: the EAGLE-3 head .* records no "
                                            r"target .* --record-target"):
        train(distill_config(tmp_path, tiny_dirs, "refused", draft=warm(published)),
              progress=False)
    assert main(["check", str(published), "--target", str(tiny_dirs[0]), "--record-target"]) == 0
    runs = {}
    for name, folder in (("ours", tmp_path / "draftkit-head"), ("theirs", published)):
        runs[name] = train(distill_config(tmp_path, tiny_dirs, name, draft=warm(folder)),
                           progress=False)
    first = [json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
             for name in runs]
    assert first[0]["tau"] == first[1]["tau"]  # step 0: the same head
    _same(load_eagle3(runs["theirs"], target), load_eagle3(runs["ours"], target), target)


def test_a_hub_head_without_safetensors_brings_its_pytorch_model_bin(tmp_path, monkeypatch):
    """The EAGLE repository's heads on the hub hold pytorch_model.bin, which the download of a
    model's safetensors and configs would leave behind."""
    import huggingface_hub

    from draftkit.models.resolve import resolve_model

    asked = []

    def snapshot_download(repo_id, local_files_only=False, allow_patterns=None):
        if local_files_only:
            raise FileNotFoundError(repo_id)  # not in the cache
        asked.append(allow_patterns)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert resolve_model("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "draft").path == tmp_path
    assert asked[-1] == ["*.bin"]
    (tmp_path / "model.safetensors").write_bytes(b"")
    asked.clear()
    resolve_model("org/head", "draft")
    assert len(asked) == 1 and "*.bin" not in asked[0]  # a model's .bin twins stay behind
