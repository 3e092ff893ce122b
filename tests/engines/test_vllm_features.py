"""The target's features from vLLM (``teacher.features: vllm``): the hidden states entering the
head's layers, captured by vLLM's ``extract_hidden_states`` as it prefills each example, equal
to draftkit's own within bf16 rounding, in a feature cache of packed rows keyed apart from
draftkit's."""

from __future__ import annotations

import pytest
import torch

from draftkit.data import build_rows
from draftkit.distill.features import FeatureCache, VllmFeatures, feature_key
from draftkit.models import load_model, load_tokenizer
from tests.helpers import distill_config, engine_llama, make_tokenizer, save_model

pytestmark = pytest.mark.engine
LAYERS = [1, 2, 3]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    tok = make_tokenizer()
    return save_model(engine_llama(len(tok), 4, seed=5), tok,
                      tmp_path_factory.mktemp("target") / "target")


def test_captured_states_are_the_targets_at_the_tapped_layers(vllm_worker, target_dir,
                                                              tmp_path):
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    sequences = [[5, 17, 23, 42, 9, 77, 101, 64], [7, 8, 9], list(range(10, 40))]
    with VllmFeatures(target_dir, "float32", LAYERS, tmp_path / "engine",
                      worker=vllm_worker) as engine:
        captured = engine.capture(sequences)
    for seq, aux in zip(sequences, captured):
        with torch.no_grad():
            hs = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
        want = torch.cat([hs[i][0] for i in LAYERS], -1)  # (T, 3 H): entering each layer
        assert aux.shape == want.shape
        torch.testing.assert_close(aux, want, rtol=1e-4, atol=1e-3)
    assert not list((tmp_path / "engine" / "engine").glob("*.safetensors"))  # cleaned up


def test_a_feature_cache_filled_by_vllm_equals_draftkits(vllm_worker, target_dir, tmp_path):
    cfg = distill_config(tmp_path, (target_dir, None))  # packed rows: several examples a row
    rows, _ = build_rows(cfg.data, load_tokenizer(str(target_dir)), 0)
    assert (rows.position_ids[:, 1:] == 0).any(), "no packed row: a weak test"
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    ours = FeatureCache(tmp_path / "ours", rows, LAYERS, 64, "t")
    ours.build(target, rows, 4, progress=False)
    with VllmFeatures(target_dir, "float32", LAYERS, tmp_path / "engine",
                      worker=vllm_worker) as engine:
        theirs = FeatureCache(tmp_path / "theirs", rows, LAYERS, 64, "t", engine)
        theirs.build(None, rows, 4, progress=False)
    idx = torch.arange(len(rows.input_ids))
    a, b = ours.open()(idx, rows.input_ids).float(), theirs.open()(idx, rows.input_ids).float()
    # both stored in bf16: one rounding step apart at most
    torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-2)
    assert feature_key("t", LAYERS, rows, "vllm") != feature_key("t", LAYERS, rows)
