"""EAGLE-3 heads of more than one layer in bundles: the later layers under the names vLLM loads
(``layers.1.*``, with the ``hidden_norm`` it builds into every layer), vLLM's release stated,
SGLang (whose extra layers differ) refused in one line, and the head loading back the same."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftkit.cli import main
from draftkit.errors import ModelError
from draftkit.export import check_bundle
from draftkit.engines.releases import MIN_VERSIONS
from draftkit.models.eagle3 import from_target, load_eagle3
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import make_llama, make_tokenizer, save_head, save_model


@pytest.mark.parametrize("parallel", [False, True], ids=["autoregressive", "parallel"])
def test_a_deeper_head_exports_for_vllm_and_sglang_is_refused(tmp_path, capsys, parallel):
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=8)
    target_dir = save_model(target, tok, tmp_path / "target")
    v, h = target.config.vocab_size, target.config.hidden_size
    head = from_target(target, ReducedHead(list(range(0, v, 3)), v), seed=1, parallel=parallel,
                       num_layers=3)
    head_dir = save_head(head, tmp_path / "head", target_dir)
    capsys.readouterr()
    assert main(["export", "--target", str(target_dir), "--draft", str(head_dir), "--out",
                 str(tmp_path / "bundle"), "--k", "3"]) == 0
    said = capsys.readouterr()
    refused = [line for line in said.err.splitlines() if "SGLang" in line]
    assert len(refused) == 1 and refused[0].endswith("its serving script will refuse to start")
    assert ("SGLang has no parallel drafting" if parallel else "additional_layers") in refused[0]

    out = tmp_path / "bundle"
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    state = load_file(str(out / "draft" / "model.safetensors"))
    assert tuple(state["layers.2.self_attn.q_proj.weight"].shape[1:]) == (h,)  # over the stream
    assert tuple(state["midlayer.self_attn.q_proj.weight"].shape[1:]) == (2 * h,)
    for i in (1, 2):  # what vLLM builds into every layer, which only the first reads
        assert torch.equal(state[f"layers.{i}.hidden_norm.weight"],
                           torch.ones(h, dtype=torch.bfloat16))
    exported = load_eagle3(out / "draft", target)
    assert len(exported.deeper) == 2 and exported.parallel == parallel
    torch.testing.assert_close(exported.deeper[1].mlp.down_proj.weight,
                               head.deeper[1].mlp.down_proj.weight.bfloat16().float())

    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    assert f"{'parallel ' if parallel else ''}EAGLE-3 head of 3 layers tapping" in \
        capsys.readouterr().out
    manifest = check_bundle(out)
    assert manifest.draft.num_hidden_layers == 3
    assert manifest.serving.engines.vllm.min_version == MIN_VERSIONS["vllm", "deep"][0]
    assert manifest.serving.engines.sglang.refused

    del state["layers.2.mlp.up_proj.weight"]  # a later layer's weight lost
    save_file(state, str(out / "draft" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelError, match="missing layers.2.mlp.up_proj.weight"):
        load_eagle3(out / "draft", target)
