"""Choosing, storing and loading a draft's reduced vocabulary (draftkit.models.draft_vocab)."""

import json

import pytest
import torch

from draftkit.errors import ModelError
from draftkit.models import draft_vocab


def test_choose_keeps_the_most_frequent_and_the_special_tokens():
    counts = torch.tensor([0, 5, 0, 9, 1, 9, 0, 0])
    ids = draft_vocab.choose(counts, 4, always=[7])
    assert ids == [1, 3, 5, 7]  # 3 and 5 (9 each), 1 (5), and EOS 7 whatever its count
    # ties and the room left go to the lowest ids
    assert draft_vocab.choose(counts, 6) == [0, 1, 2, 3, 4, 5]
    assert draft_vocab.coverage([3, 5], counts) == pytest.approx(18 / 24)
    with pytest.raises(ModelError, match="must be in 1..8"):
        draft_vocab.choose(counts, 9)


def test_save_load_and_bad_files(tmp_path):
    draft_vocab.save(tmp_path, [4, 2, 9], 10, 0.5, "test")
    assert draft_vocab.load(tmp_path, 10) == [2, 4, 9]
    assert draft_vocab.load(tmp_path / "none", 10) is None
    (tmp_path / draft_vocab.FILE).write_text(json.dumps({"token_ids": [1, 1]}))
    with pytest.raises(ModelError, match="unique"):
        draft_vocab.load(tmp_path, 10)
    (tmp_path / draft_vocab.FILE).write_text("{")
    with pytest.raises(ModelError, match="not a draft vocabulary"):
        draft_vocab.load(tmp_path, 10)


def test_load_model_attaches_the_subset_to_drafts_only(tiny_dirs, tmp_path):
    import shutil

    from draftkit.models import load_model

    _, draft = tiny_dirs
    copy = tmp_path / "draft-with-vocab"
    shutil.copytree(draft, copy)
    draft_vocab.save(copy, [1, 2, 3], 10_000, 1.0, "test")
    d = load_model(str(copy), "draft", device="cpu")
    assert d.draft_vocab.tolist() == [1, 2, 3]
    assert not hasattr(load_model(str(copy), "target", device="cpu"), "draft_vocab")
