"""Fixtures the bundle tests share: one EAGLE-3 bundle exported per module, and a copy of it
per test to edit."""

import shutil

import pytest

from draftkit.export import export_bundle
from tests.export.test_eagle3 import _saved


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(target folder, loose head folder, bundle) built once; each test edits a copy."""
    tmp = tmp_path_factory.mktemp("integrity")
    _, target_dir, head_dir = _saved(tmp)
    bundle = export_bundle(str(target_dir), str(head_dir), tmp / "bundle", k=2)
    return target_dir, head_dir, bundle


@pytest.fixture
def bundle(exported, tmp_path):
    """A copy of the exported bundle, and its target's folder."""
    return _copy(exported[2], tmp_path / "bundle"), exported[0]


@pytest.fixture
def head(exported, tmp_path):
    """A copy of the loose head, and its target's folder."""
    return _copy(exported[1], tmp_path / "head"), exported[0]


def _copy(original, to):
    shutil.copytree(original, to)
    return to
