"""Checkpoints that a kill cannot corrupt, and an exact resume from them.

A checkpoint is ``out_dir/checkpoints/step-NNNNNNN/`` holding ``state.pt`` (the trainable
weights, the optimizer and scheduler, the data position, every RNG and the best alpha so far)
and ``manifest.json`` (its size and sha256). It is written in a temporary folder and renamed
into place, so a run killed at any moment leaves the previous checkpoint whole and loses at
most the steps since it. A checkpoint damaged after it was written (its bytes no longer
match its manifest, state.pt unreadable, the manifest gone) is passed over on resume, named,
and the run resumes from the newest one that reads whole, as if the damaged write had never
finished; the damaged folder is left as it is until the run writes that step again. Only when
none reads is resuming an error. (DeepSpeed checkpoints load collectively, one shard per rank,
so an unreadable one stays an error there rather than ranks falling back apart.)
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as td

from draftkit.errors import DraftkitError
from draftkit.io import (atomic_dir, atomic_write_json, atomic_write_text, fsync_path,
                         fsync_tree, sha256_file)


# resume=false as a quickstart user types it: the quickstart trains through this module too
QUICKSTART_FRESH = " (draftkit quickstart: --no-resume)"


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """Only what training changes: frozen weights are rebuilt identically at resume."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k in names}


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: Path, step: int, model: Any, optimizer: Any, scheduler: Any,
                    extra: dict, keep: int) -> Path:
    """Write checkpoint ``step`` atomically, then drop all but the newest ``keep``."""
    root = Path(root)
    path = root / f"step-{step:07d}"
    state = {"step": step, "model": trainable_state(model), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "rng": rng_state(), **extra}
    with atomic_dir(path, overwrite=True) as tmp:
        torch.save(state, tmp / "state.pt")
        atomic_write_json(tmp / "manifest.json", {
            "step": step, "bytes": (tmp / "state.pt").stat().st_size,
            "sha256": sha256_file(tmp / "state.pt")})
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary folders of a killed write are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


# best.json: where runs before best/best.json kept it
RUN_FILES = ("checkpoints", "metrics.jsonl", "best", "best.json", "config.yaml", "wandb_run_id")


def wandb_run_id(out: Path) -> str:
    """The W&B run id of the run in ``out``, made on its first start: every resume logs to
    that one W&B run (``resume=false`` sets the file aside with the rest, so a new run gets a
    new id)."""
    path = Path(out) / "wandb_run_id"
    if not path.is_file():
        atomic_write_text(path, secrets.token_hex(6))
    return path.read_text().strip()


def set_aside_earlier_run(out: Path) -> Path | None:
    """For ``resume=false``: move an earlier run's files in ``out`` to ``out/earlier-<time>/``,
    so the new run starts from step 0 without mixing its checkpoints and metrics with the old
    ones, and nothing written before is lost. Returns the new folder, or None if ``out`` held
    no run."""
    out = Path(out)
    if not (list_checkpoints(out / "checkpoints") or (out / "metrics.jsonl").exists()
            or (out / "best").exists() or (out / "wandb_run_id").exists()):
        return None
    aside = Path(tempfile.mkdtemp(prefix=f"earlier-{time.strftime('%Y%m%d-%H%M%S')}-", dir=out))
    for name in RUN_FILES:
        if (out / name).exists():
            (out / name).rename(aside / name)
    return aside


class UnreadableCheckpoint(DraftkitError):
    """A checkpoint damaged after it was written; resume passes over it."""


def load_checkpoint(path: Path) -> dict:
    """The state of a checkpoint, checked against its manifest."""
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        state_file = path / "state.pt"
        if state_file.stat().st_size != manifest["bytes"] or \
                sha256_file(state_file) != manifest["sha256"]:
            raise UnreadableCheckpoint(f"checkpoint {path} is corrupted (its bytes do not "
                                       f"match manifest.json)")
        return torch.load(state_file, map_location="cpu", weights_only=True)
    except UnreadableCheckpoint:
        raise
    except Exception as e:
        raise UnreadableCheckpoint(f"checkpoint {path} cannot be read "
                                   f"({type(e).__name__})") from None


def newest_state(root: Path, load: Callable[[Path], dict],
                 say: Callable[[str], None]) -> tuple[Path, dict] | None:
    """The newest checkpoint under ``root`` that reads whole, and its state (None when there is
    none). Each newer one that does not read, or has lost its manifest.json (a write killed
    midway leaves a hidden temporary folder, never a ``step-*`` one), is named through ``say``
    and passed over."""
    root = Path(root)
    finished = list_checkpoints(root)
    damaged = [p for p in sorted(root.glob("step-*")) if p.is_dir() and p not in finished]
    for path in damaged:
        say(f"checkpoint {path} has no manifest.json (damaged after it was written); "
            f"passed over")
    for path in reversed(finished):
        try:
            state = load(path)
        except UnreadableCheckpoint as e:
            say(f"{e}; passed over")
            continue
        return path, state
    if finished or damaged:
        raise DraftkitError(f"no checkpoint in {root} can be read; set resume=false"
                            f"{QUICKSTART_FRESH} to start over (the earlier run is moved "
                            f"aside, not deleted)")
    return None


def restore(state: dict, model: Any, optimizer: Any, scheduler: Any) -> None:
    """Put weights, optimizer, scheduler and RNG back exactly as they were saved."""
    missing = set(trainable_state(model)) - set(state["model"])
    if missing:
        raise DraftkitError(f"the checkpoint does not match this draft (missing "
                            f"{sorted(missing)[0]}); the recipe's draft or freeze list "
                            f"changed since it was written; use another out_dir")
    model.load_state_dict(state["model"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])


# --- DeepSpeed: every rank writes its shard; rank 0 renames the finished folder into place -----

def save_deepspeed_checkpoint(engine: Any, root: Path, step: int, extra: dict, keep: int,
                              rank: int) -> Path:
    """Collective: all ranks call it. ZeRO partitions the optimizer, so DeepSpeed writes it."""
    root = Path(root)
    final = root / f"step-{step:07d}"
    tmp = root / f".step-{step:07d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    td.barrier()
    engine.save_checkpoint(str(tmp), tag="state", client_state={"step": step, **extra})
    torch.save(rng_state(), tmp / f"rng-rank{rank}.pt")
    fsync_tree(tmp)  # every rank: its shards on disk before the folder is renamed into place
    td.barrier()
    if rank == 0:
        atomic_write_json(tmp / "manifest.json", {"step": step, "kind": "deepspeed"})
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(root)
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    td.barrier()
    return final


def load_deepspeed_checkpoint(engine: Any, path: Path, rank: int) -> dict:
    try:
        _, client = engine.load_checkpoint(str(path), tag="state")
        set_rng_state(torch.load(Path(path) / f"rng-rank{rank}.pt", weights_only=False))
    except Exception as e:
        raise DraftkitError(f"DeepSpeed checkpoint {path} cannot be read ({type(e).__name__}); "
                            f"delete it to resume from the one before, or set resume=false"
                            f"{QUICKSTART_FRESH}") \
            from None
    if client is None:
        raise DraftkitError(f"DeepSpeed checkpoint {path} is incomplete; delete it")
    return client
