"""A draft's reduced head (draftkit.models.reduced_head): choosing it, mapping logits and head
rows between the vocabulary and H, and storing it as draft_vocab.json."""

import json

import pytest
import torch

from draftkit.errors import ModelError
from draftkit.models.reduced_head import FILE, ReducedHead, attach, head_of


def test_choose_keeps_the_most_frequent_and_the_special_tokens():
    counts = torch.tensor([0, 5, 0, 9, 1, 9, 0, 0])
    head = ReducedHead.choose(counts, 4, always=[7])
    assert head.ids.tolist() == [1, 3, 5, 7]  # 3 and 5 (9 each), 1 (5), and EOS 7 whatever
    assert head.vocab_size == 8 and len(head) == 4
    # ties and the room left go to the lowest ids
    assert ReducedHead.choose(counts, 6).ids.tolist() == [0, 1, 2, 3, 4, 5]
    assert ReducedHead([3, 5], 8).coverage(counts) == pytest.approx(18 / 24)
    with pytest.raises(ModelError, match="must be in 1..8"):
        ReducedHead.choose(counts, 9)


def test_ids_must_be_unique_and_inside_the_vocabulary():
    for ids in ([], [1, 1], [-1, 2], [2, 10]):
        with pytest.raises(ModelError, match="unique and within 0..9"):
            ReducedHead(ids, 10)


def test_restrict_and_expand_map_between_the_vocabulary_and_h():
    head = ReducedHead([7, 2, 4], 9)  # in the order given: position 0 is id 7
    assert head.index.tolist() == [-1, -1, 1, -1, 2, -1, -1, 0, -1]
    logits = torch.randn(2, 3, 9)  # (B, T, V)
    sub = head.restrict(logits)  # (B, T, N)
    assert sub.shape == (2, 3, 3)
    torch.testing.assert_close(sub, logits[..., [7, 2, 4]])
    full = head.expand(sub)  # (B, T, V): round trip inside H, -inf outside
    assert full.shape == logits.shape
    inside = torch.zeros(9, dtype=torch.bool)
    inside[[2, 4, 7]] = True
    torch.testing.assert_close(full[..., inside], logits[..., inside])
    assert torch.isneginf(full[..., ~inside]).all()
    torch.testing.assert_close(head.restrict(head.expand(sub)), sub)
    # the decoder picks and samples from the expanded logits as from the subset's
    assert torch.equal(head.ids[sub.argmax(-1)], full.argmax(-1))
    torch.testing.assert_close(head.restrict(full.softmax(-1)), sub.softmax(-1))
    assert (full.softmax(-1)[..., ~inside] == 0).all()
    # a head's weight rows: (V, D) -> (N, D), the rows whose products are H's logits
    weight, hidden = torch.randn(9, 4), torch.randn(5, 4)
    torch.testing.assert_close(hidden @ head.restrict(weight, dim=0).T,
                               head.restrict(hidden @ weight.T))


def test_to_moves_a_copy():
    head = ReducedHead([1, 2], 4, 0.5, "x")
    moved = head.to("meta")
    assert moved.ids.device.type == "meta" and moved.index.device.type == "meta"
    assert head.ids.device.type == "cpu"
    assert (moved.vocab_size, moved.covered, moved.source) == (4, 0.5, "x")


def test_save_load_round_trip_and_bad_files(tmp_path):
    ReducedHead([4, 2, 9], 10, 0.5, "test").save(tmp_path)
    # the file format bundles already carry: these four keys, ids as given
    assert json.loads((tmp_path / FILE).read_text()) == {
        "token_ids": [4, 2, 9], "vocab_size": 10, "coverage": 0.5, "source": "test"}
    head = ReducedHead.load(tmp_path, 10)
    assert head.ids.tolist() == [2, 4, 9] and head.vocab_size == 10  # loaded sorted
    assert (head.covered, head.source) == (0.5, "test")
    head.save(tmp_path / "again")
    assert ReducedHead.load(tmp_path / "again", 10).ids.tolist() == [2, 4, 9]
    assert ReducedHead.load(tmp_path / "none", 10) is None
    (tmp_path / FILE).write_text(json.dumps({"token_ids": [1, 1]}))
    with pytest.raises(ModelError, match="unique"):
        ReducedHead.load(tmp_path, 10)
    (tmp_path / FILE).write_text("{")
    with pytest.raises(ModelError, match="draft_vocab.json is not valid JSON .*delete it"):
        ReducedHead.load(tmp_path, 10)
    (tmp_path / FILE).write_text(json.dumps({"ids": [1, 2]}))
    with pytest.raises(ModelError, match="not a draft vocabulary"):
        ReducedHead.load(tmp_path, 10)
    (tmp_path / FILE).write_bytes(b'{"token_ids": [1], "source": "\xe9"}')
    with pytest.raises(ModelError, match=r"draft_vocab.json:1: not UTF-8 text \(byte 0xe9\)"):
        ReducedHead.load(tmp_path, 10)


def test_a_file_written_before_the_object_still_loads(tmp_path):
    """draft_vocab.json as earlier draftkit wrote it, byte for byte."""
    (tmp_path / FILE).write_text('{\n  "token_ids": [\n    0,\n    3,\n    5\n  ],\n  '
                                 '"vocab_size": 8,\n  "coverage": 0.831207,\n  "source": '
                                 '"target tokens of 96 training rows"\n}\n')
    head = ReducedHead.load(tmp_path, 8)
    assert head.ids.tolist() == [0, 3, 5] and head.covered == 0.831207


def test_load_model_attaches_the_head_to_drafts_only(tiny_dirs, tmp_path):
    import shutil

    from draftkit.models import load_model

    _, draft = tiny_dirs
    copy = tmp_path / "draft-with-vocab"
    shutil.copytree(draft, copy)
    ReducedHead([1, 2, 3], 10_000, 1.0, "test").save(copy)
    d = load_model(str(copy), "draft", device="cpu")
    assert head_of(d).ids.tolist() == [1, 2, 3] and head_of(d).vocab_size == d.config.vocab_size
    assert head_of(load_model(str(copy), "target", device="cpu")) is None
    attach(d, None)  # decode with the whole head
    assert head_of(d) is None
