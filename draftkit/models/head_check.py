"""One check of an EAGLE-3 head, loaded, before it decodes, trains or exports, from a bundle or
a loose folder (a distillation run's ``best/``): :func:`check_head`.

A head whose files were edited loads and decodes all the same, with the wrong layers or the
wrong tokens and next to no acceptance, so what the loader reads is checked against what a head
must be and against its target:

- the tapped layers: three distinct ids, ascending, each a layer of this target
  (1..L - 1, the layer a hidden state enters, as :func:`~draftkit.models.eagle3.tapped` reads);
- the vocabulary maps: ``lm_head`` has one row per draft id, ``draft_vocab_size`` says as many,
  ``d2t`` maps draft id i to target id i + d2t[i], distinct, ascending, within the target's
  vocabulary, and ``t2d``'s true entries are those ids (:func:`check_vocab_maps`, which
  ``draftkit check`` also runs on the stored tensors);
- the target it was trained for: a bundle records its target's content hash
  (:func:`draftkit.models.load.check_bundle_target`); a loose head records its target's
  :func:`~draftkit.models.resolve.model_identity` in ``target.json`` when it is saved
  (:func:`record_target`), checked by :func:`check_recorded_target`. A head that records none
  (saved before, or published by another trainer: SpecForge, speculators, the EAGLE
  repository) is refused, as nothing says which target it reads and beside another target of
  the same shape it decodes with next to no acceptance, until the user says which target it
  was trained for: ``draftkit check HEAD --target T --record-target`` checks it against T and
  writes the record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftkit.errors import ModelError
from draftkit.io import atomic_write_json, read_json
from draftkit.models.eagle3 import load_eagle3
from draftkit.models.facts import text_config
from draftkit.models.resolve import model_identity

TARGET_FILE = "target.json"
_FIX = "re-export the head, or retrain it"


def load_head(folder: str | Path, target: Any, where: str | Path | None = None) -> Any:
    """:func:`~draftkit.models.eagle3.load_eagle3` of ``folder`` on ``target`` (a loaded model,
    or what :func:`draftkit.export.eagle3.target_embedding` gives), checked by
    :func:`check_head`: how every command loads a head."""
    head = load_eagle3(folder, target)
    check_head(head, target.config, where or folder)
    return head


def check_head(head: Any, target_config: Any, where: str | Path) -> None:
    """The loaded :class:`~draftkit.models.eagle3.Eagle3Draft` ``head`` (from ``where``) tapping
    three layers of the target of ``target_config`` and over a vocabulary its maps agree on, or
    one ModelError line naming the first thing that is not so."""
    layers, count = list(head.aux_layers), text_config(target_config).num_hidden_layers
    if not (len(layers) == 3 and all(isinstance(i, int) and 1 <= i <= count - 1 for i in layers)
            and layers == sorted(set(layers))):
        raise ModelError(f"{where} taps target layers {layers}: not three distinct ascending "
                         f"layer ids within 1..{count - 1} of this {count}-layer target; "
                         f"{_FIX}")
    rows, n = head.lm_head.weight.shape[0], head.d2t.numel()
    if rows != n:
        raise ModelError(f"{where}: lm_head has {rows} rows but d2t maps {n} draft ids; {_FIX}")
    stated = getattr(head.config, "draft_vocab_size", None)
    if stated not in (None, n):
        raise ModelError(f"{where}: config.json says draft_vocab_size {stated}, the head has "
                         f"{n} rows; {_FIX}")
    check_vocab_maps(head.d2t, head.t2d, where)


def check_vocab_maps(d2t: Any, t2d: Any, where: str | Path) -> None:
    """``d2t`` (N,) int offsets and ``t2d`` (V,) bool mask describing one draft vocabulary:
    target ids i + d2t[i] distinct, ascending, within 0..V - 1, and exactly t2d's true
    entries; or one ModelError line."""
    d2t, t2d = d2t.detach().cpu(), t2d.detach().cpu()
    ids = torch.arange(d2t.numel()) + d2t  # target id of draft id i
    if not (bool((ids[1:] > ids[:-1]).all()) and int(ids[0]) >= 0
            and int(ids[-1]) < t2d.numel()):
        raise ModelError(f"{where}: d2t does not map draft ids to distinct ascending target ids "
                         f"within 0..{t2d.numel() - 1} (target id i + d2t[i]); {_FIX}")
    if not torch.equal(t2d.bool().nonzero().flatten(), ids):
        raise ModelError(f"{where}: d2t and t2d do not describe the same draft vocabulary "
                         f"(t2d's true entries are not the target ids i + d2t[i]); {_FIX}")


def record_target(folder: str | Path, target_ref: Any) -> None:
    """``folder``/target.json: the target a head saved there reads (name, path and
    :func:`~draftkit.models.resolve.model_identity`)."""
    atomic_write_json(Path(folder) / TARGET_FILE, {
        "name": target_ref.name, "path": str(target_ref.path),
        "identity": model_identity(target_ref)})


def recorded_target(folder: str | Path) -> dict | None:
    """The target record of the loose head in ``folder`` (:func:`record_target`), if any."""
    file = Path(folder) / TARGET_FILE
    return read_json(file, "head's target record", _FIX, ModelError) if file.is_file() else None


def check_recorded_target(folder: str | Path, target_ref: Any, where: str | Path) -> None:
    """The loose head in ``folder`` beside the target ``target_ref``: refused where it records
    another target, or none (module docstring)."""
    recorded = recorded_target(folder)
    if recorded is None:
        raise ModelError(f"the EAGLE-3 head {where} records no target ({TARGET_FILE}: saved "
                         f"before draftkit recorded one, or by another trainer), so nothing "
                         f"says it reads {target_ref.path}; if it was trained for that target, "
                         f"say so once: draftkit check {where} --target {target_ref.spec} "
                         f"--record-target")
    if recorded.get("identity") != model_identity(target_ref):
        raise ModelError(f"the EAGLE-3 head {where} was trained for the target "
                         f"{recorded.get('name')!r} at {recorded.get('path')}, and "
                         f"{target_ref.path} is another (its identity differs); the head reads "
                         f"its target's hidden states: pass that target")
