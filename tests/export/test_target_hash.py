"""A target's weights are read once, not by every command: each file's sha256 is kept in a
record keyed by the file's size, inode and modification and status-change times (issue 67),
and a file written since is read again, whatever its size and mtime say (issue 65)."""

import os
from pathlib import Path

import pytest

from draftkit import bundle_checks


@pytest.fixture
def reads(monkeypatch, tmp_path):
    """The files whose bytes target_hash reads, in order; a cache of the test's own."""
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    seen: list[str] = []
    real = bundle_checks.file_hash

    def counted(path: Path) -> str:
        seen.append(Path(path).name)
        return real(path)
    monkeypatch.setattr(bundle_checks, "file_hash", counted)
    return seen


def test_a_second_hash_reads_no_weight_and_an_edit_is_read_again(tmp_path, reads):
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    weights = folder / "model.safetensors"
    weights.write_bytes(os.urandom(1 << 16))
    first = bundle_checks.target_hash(folder)
    assert reads == ["config.json", "model.safetensors"]
    reads.clear()
    assert bundle_checks.target_hash(folder) == first and reads == []
    before = weights.stat()
    with open(weights, "r+b") as f:  # an edit in place, size and mtime set back
        f.write(bytes(8))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert bundle_checks.target_hash(folder) != first and reads == ["model.safetensors"]


def test_at_8b_scale_the_second_check_reads_nothing(tmp_path, reads):
    """A 16 GB weight file (sparse: no disk used) whose sha256 the Hugging Face cache names it
    by: the first hash takes the name, the second the record; neither reads a byte of it."""
    blobs = tmp_path / "hub" / "blobs"
    blobs.mkdir(parents=True)
    digest = "ab" * 32
    with open(blobs / digest, "wb") as f:
        f.truncate(16 << 30)
    snapshot = tmp_path / "hub" / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blobs / digest)
    (snapshot / "config.json").write_text("{}")
    first = bundle_checks.target_hash(snapshot)
    assert reads == ["config.json"]  # the 16 GB file: by its name
    reads.clear()
    assert bundle_checks.target_hash(snapshot) == first and reads == []
