"""loss.hidden_weight: the draft's stream after a gap in its layers against the target's."""

import contextlib

import pytest
import torch

from draftkit.distill.hidden import input_norm, junctions, taps
from draftkit.distill.losses import hidden_distance
from draftkit.errors import ConfigError
from tests.helpers import distill_config, make_llama


def test_junctions_are_the_kept_layers_after_a_gap():
    assert junctions([0, 1, 2, 29]) == [(3, 29)]
    assert junctions([0, 5, 6, 10]) == [(1, 5), (3, 10)]
    assert junctions([0, 1, 2, 3]) == []  # an early exit has no gap to bridge
    assert junctions([]) == []


def test_hidden_distance_is_relative_to_the_target():
    t = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    assert hidden_distance(t, t).tolist() == [0.0, 0.0]
    assert hidden_distance(torch.zeros_like(t), t).tolist() == [1.0, 1.0]
    d = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    assert hidden_distance(d, t).tolist() == pytest.approx([16 / 25, 2.0])
    assert hidden_distance(10 * d, 10 * t).tolist() == pytest.approx([16 / 25, 2.0])


def _layer_input(model, layer, ids):
    got = {}

    def grab(module, args, kwargs):
        got["h"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
    handle = model.get_decoder().layers[layer].register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    handle.remove()
    return got["h"]  # (B, T, H)


def test_a_tap_is_the_layer_input_as_its_norm_sees_it():
    from draftkit.distill.teacher import MaskedLM

    model = make_llama(64, num_layers=4, seed=2)
    ids = torch.randint(0, 64, (2, 9))
    mask = torch.rand(2, 9) > 0.4
    norm = input_norm(model, 2)
    with torch.no_grad():
        logits, hidden = MaskedLM(model, [(2, norm)])(ids, mask)
        want = model.get_decoder().layers[2].input_layernorm(_layer_input(model, 2, ids))[mask]
        plain, none = MaskedLM(model)(ids, mask)
    assert hidden.shape == (int(mask.sum()), 1, 32)
    torch.testing.assert_close(hidden[:, 0], want)
    torch.testing.assert_close(logits, plain)
    assert none is None
    assert not any(p.requires_grad for p in norm.parameters())  # a frozen copy
    assert norm.weight is not model.get_decoder().layers[2].input_layernorm.weight


def test_draft_and_target_taps_meet_at_the_gap():
    """A draft derived from layers 0 and 3 enters its second layer with the stream layer 0
    left; the target's tap is the stream entering its layer 3, through the same norm."""
    from draftkit.models.derive import derive_by_layers

    target = make_llama(64, num_layers=4, seed=2)
    draft = derive_by_layers(target, [0, 3])
    draft_taps, target_taps = taps(target, [0, 3])
    assert [j for j, _ in draft_taps] == [1] and [j for j, _ in target_taps] == [3]
    assert draft_taps[0][1] is target_taps[0][1]
    ids = torch.randint(0, 64, (1, 7))
    torch.testing.assert_close(_layer_input(draft, 1, ids), _layer_input(target, 1, ids))


def test_the_config_refuses_what_the_term_cannot_serve(tmp_path, tiny_dirs):
    with pytest.raises(ConfigError, match="set loss.hidden_weight=0 for the control"):
        distill_config(tmp_path, tiny_dirs, **{"loss.hidden_weight": 1.0, "loss.divergence": "ce"})
    with pytest.raises(ConfigError, match=r"draft.derive_layers \[0, 1\] has none"):
        distill_config(tmp_path, tiny_dirs,
                       **{"loss.hidden_weight": 1.0, "draft.derive_layers": [0, 1]})
    with pytest.raises(ConfigError, match="this draft has none"):
        distill_config(tmp_path, tiny_dirs, **{"loss.hidden_weight": 1.0,
                                               "draft.derive_layers": None,
                                               "draft.num_layers": 2})
    with pytest.raises(ConfigError, match="key 'loss.hidden_weight' must be >= 0, got -1.0"):
        distill_config(tmp_path, tiny_dirs, **{"loss.hidden_weight": -1.0})


def test_the_cache_keeps_the_streams_the_online_teacher_gives(tmp_path, tiny_dirs):
    from draftkit.data import build_rows
    from draftkit.distill.teacher import MaskedLM, OnlineTeacher, TopKCache, cache_key
    from draftkit.distill.standalone import micro_loss
    from draftkit.distill.trainer import batch_rows
    from draftkit.models import load_model, load_tokenizer

    cfg = distill_config(tmp_path, tiny_dirs, **{"loss.hidden_weight": 0.5})
    target_dir, _ = tiny_dirs
    tok = load_tokenizer(str(target_dir))
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    rows, _ = build_rows(cfg.data, tok, 0)
    draft_taps, target_taps = taps(target, [0, 3])
    v, width = target.config.vocab_size, target.config.hidden_size
    assert cache_key("t", rows, v, 1.0, [3]) != cache_key("t", rows, v, 1.0)
    cache = TopKCache(tmp_path / "c", rows, v, 1.0, "k", target_taps, width)
    cache.build(target, rows, 4, progress=False)
    cache.open()
    assert cache.bytes_per_token == v * 6 + width * 2
    online = OnlineTeacher(target, 1.0, target_taps)
    idx = batch_rows(0, len(rows), 3, 0)
    ids, mask = rows.input_ids[idx], rows.loss_mask[idx]
    from draftkit.data import positions

    torch.testing.assert_close(cache(idx, ids, mask).hidden,
                               online(idx, ids, mask, positions(rows, idx)).hidden,
                               atol=2e-2, rtol=2e-3)  # float16 on disk

    # The loss is the divergence plus hidden_weight times the mean distance at the tap.
    from draftkit.models.derive import derive_by_layers

    draft = derive_by_layers(target, [0, 3]).float()
    student = MaskedLM(draft, draft_taps)
    with_term, n = micro_loss(student, online, rows, idx, cfg, contextlib.nullcontext)
    plain, _ = micro_loss(MaskedLM(draft), OnlineTeacher(target, 1.0), rows, idx,
                          distill_config(tmp_path, tiny_dirs), contextlib.nullcontext)
    with torch.no_grad():
        _, h_draft = student(ids, mask, positions(rows, idx))
        _, h_target = online.lm(ids, mask, positions(rows, idx))
    assert n == int(mask.sum())
    term = hidden_distance(h_draft, h_target).mean()
    assert term > 0
    assert with_term.item() == pytest.approx(plain.item() + 0.5 * term.item(), rel=1e-5)


def test_training_with_the_term_brings_the_stream_closer(tmp_path, tiny_dirs):
    """Four steps with the term leave the draft's stream at the gap nearer the target's than
    four steps on the logits alone; the run saves a plain draft."""
    from draftkit.data import build_rows, positions
    from draftkit.distill.teacher import MaskedLM
    from draftkit.distill.trainer import train
    from draftkit.models import load_model, load_tokenizer

    def distance(best):
        draft = load_model(str(best), device="cpu", dtype="float32")
        student = MaskedLM(draft, draft_taps)
        with torch.no_grad():
            _, mine = student(rows.input_ids, rows.loss_mask, positions(rows, slice(None)))
            _, want = MaskedLM(target, target_taps)(rows.input_ids, rows.loss_mask,
                                                    positions(rows, slice(None)))
        return hidden_distance(mine, want).mean().item()

    target_dir, _ = tiny_dirs
    target = load_model(str(target_dir), device="cpu", dtype="float32")
    draft_taps, target_taps = taps(target, [0, 3])
    over = {"teacher.mode": "cache", "teacher.top_k": 8, "teacher.cache_dir": str(tmp_path / "tc"),
            "eval.every": 4}
    with_term = train(distill_config(tmp_path, tiny_dirs, "with", **over,
                                     **{"loss.hidden_weight": 2.0}), progress=False)
    without = train(distill_config(tmp_path, tiny_dirs, "without", **over), progress=False)
    rows, _ = build_rows(distill_config(tmp_path, tiny_dirs).data,
                         load_tokenizer(str(target_dir)), 0)
    assert distance(with_term) < distance(without)
    assert not (with_term / "hidden.f16").exists()
    assert (tmp_path / "tc").is_dir() and len(list((tmp_path / "tc").iterdir())) == 2
