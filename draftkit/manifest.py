"""The bundle manifest, ``draftkit.json``: read it only through here, so nothing edited in it
goes unnoticed.

A bundle's weights are hashed file by file in the manifest, and the figures serving decisions
rest on (K, alpha, tau, c, the break-even batch) live in the manifest itself. So the manifest
carries a hash of its own content (``manifest_sha256``: sha256 of the manifest without that key,
as canonical JSON: keys sorted, no spaces), written last by :func:`seal` and checked by
:func:`read_manifest` before any value is used, by ``draftkit check`` and by every command that
loads a bundle. The values are range-checked first, so an edit that breaks a range is named by
its field; any other edit is named by the hash. A manifest without the hash (an earlier
draftkit's, or one whose hash was deleted) is refused the same way: re-exporting is cheap,
trusting an edited figure is not.

Fields added later are optional, so a bundle exported before them still checks: ``serving``
(what the engines need: dtype, tensor-parallel sizes, K per batch size, releases;
:mod:`draftkit.export.engines`) and the draft's ``dtype``. Where present they are range-checked
as the rest.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from draftkit.errors import ModelError
from draftkit.io import read_json

NAME = "draftkit.json"
FORMAT = 2  # 2: the manifest hashes itself
HASH = "manifest_sha256"
_REMEDY = "re-export the bundle with `draftkit export`"


def content_hash(manifest: dict) -> str:
    """sha256 of ``manifest`` without its own hash, as canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != HASH}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(manifest: dict) -> dict:
    """``manifest`` with its own hash added last."""
    check_values(manifest, NAME)
    return {**{k: v for k, v in manifest.items() if k != HASH}, HASH: content_hash(manifest)}


def read_manifest(bundle: str | Path) -> dict:
    """The manifest of the bundle at ``bundle``, its values in range and its hash its own, or
    one ModelError line saying which field or that the hash does not match."""
    path = Path(bundle) / NAME
    manifest = read_json(path, "bundle manifest", _REMEDY, ModelError)
    check_values(manifest, str(path))
    recorded = manifest.get(HASH)
    if recorded is None:
        raise ModelError(f"{path} has no {HASH} (exported by a draftkit before format "
                         f"{FORMAT}, or the hash was removed), so its figures cannot be "
                         f"trusted; {_REMEDY}")
    if recorded != content_hash(manifest):
        raise ModelError(f"{path} was edited after export: its content does not match its "
                         f"{HASH}; {_REMEDY}")
    return manifest


# --- ranges ---------------------------------------------------------------------------------------

def check_values(manifest: dict, where: str) -> None:
    """Refuse a manifest whose structure or figures are out of range, naming the field."""
    def bad(field: str, value, want: str) -> ModelError:
        return ModelError(f"{where}: {field} is {value!r}, {want}; {_REMEDY}")

    for key in ("target", "draft", "files"):
        if not isinstance(manifest.get(key), dict):
            raise bad(key, manifest.get(key), "not a mapping")
    for rel, digest in manifest["files"].items():
        if not (isinstance(digest, str) and len(digest) == 64):
            raise bad(f"files.{rel}", digest, "not a sha256")
    k = manifest.get("num_speculative_tokens")
    if not _is_int(k) or k < 0:
        raise bad("num_speculative_tokens", k, "not a whole number of at least 0")
    be = manifest.get("break_even_batch")
    if be is not None and (not _is_int(be) or be < 1):
        raise bad("break_even_batch", be, "not a batch size of at least 1")
    domains = manifest.get("domains", {})
    if not isinstance(domains, dict):
        raise bad("domains", domains, "not a mapping")
    for name, row in domains.items():
        if not isinstance(row, dict):
            raise bad(f"domains.{name}", row, "not a mapping")
        for field, ok, want in _FIGURES:
            value = row.get(field)
            if value is not None and not (_is_number(value) and ok(value)):
                raise bad(f"domains.{name}.{field}", value, want)
        if row.get("k") is not None and (not _is_int(row["k"]) or row["k"] < 0):
            raise bad(f"domains.{name}.k", row["k"], "not a whole number of at least 0")
    if manifest.get("serving") is not None:  # added later: bundles before it have none
        _check_serving(manifest["serving"], bad)


DTYPES = ("float32", "float16", "bfloat16")


def _check_serving(serving, bad) -> None:
    """The ``serving`` entry's structure and values."""
    if not isinstance(serving, dict):
        raise bad("serving", serving, "not a mapping")
    if serving.get("dtype") not in DTYPES:
        raise bad("serving.dtype", serving.get("dtype"), f"not one of {', '.join(DTYPES)}")
    tp = serving.get("tp_sizes")
    if not (isinstance(tp, list) and all(_is_int(n) and n >= 1 for n in tp)):
        raise bad("serving.tp_sizes", tp, "not a list of sizes of at least 1")
    k = serving.get("num_speculative_tokens")
    if not _is_int(k) or k < 1:
        raise bad("serving.num_speculative_tokens", k, "not a whole number of at least 1")
    table = serving.get("k_per_batch_size")
    if table is not None and not (isinstance(table, list) and all(
            isinstance(r, list) and len(r) == 3 and all(_is_int(x) for x in r) and
            1 <= r[0] <= r[1] and r[2] >= 0 for r in table)):
        raise bad("serving.k_per_batch_size", table, "not a list of [first batch size, last, "
                  "K >= 0]")
    if not isinstance(serving.get("engines"), dict):
        raise bad("serving.engines", serving.get("engines"), "not a mapping")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FIGURES = (  # (field, in range, what it must be)
    ("alpha", lambda x: 0.0 <= x <= 1.0, "not an acceptance rate in [0, 1]"),
    ("tau", lambda x: x >= 1.0, "not an accepted length of at least 1"),
    ("c", lambda x: x >= 0.0, "not a cost ratio of at least 0"),
    ("speedup_measured", lambda x: x > 0.0, "not a speedup above 0"),
    ("speedup_predicted", lambda x: x > 0.0, "not a speedup above 0"),
)
