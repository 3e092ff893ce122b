"""One small W&B wrapper that every stage uses.

- Offline by default: ``WANDB_MODE=offline`` unless the user set a mode (sync later with
  ``wandb sync``). Tests set ``WANDB_MODE=disabled``.
- Rank 0 only: other ranks get a tracker that does nothing.
- The whole config is logged at ``init``.
- ``wandb`` is imported only when a tracker starts, so the core imports fast.
- Given a ``run_id``, a later tracker with the same id continues that W&B run
  (``resume="allow"``), so a resumed training run is one W&B run, not one per restart. W&B
  keeps only rising steps: the steps a resume repeats (those after the last checkpoint) keep
  the values the killed run logged, which an exact resume logs again unchanged (unless the
  resume changed the recipe's lr or schedule).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from draftkit.config import to_dict
from draftkit.extras import missing, require

PROJECT = "draftkit"


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


class Tracker:
    """``with Tracker("distill", cfg, out_dir=...) as t: t.log({...}, step=...)``"""

    def __init__(self, job_type: str, config: Any = None, *, name: str | None = None,
                 group: str | None = None, out_dir: str | Path | None = None,
                 project: str | None = None, run_id: str | None = None):
        self.run = None
        if not is_rank_zero():
            return
        mode = os.environ.get("WANDB_MODE") or "offline"
        if mode == "disabled":
            return
        if missing(("wandb",)):  # logging is optional, unless it was asked for by name
            if os.environ.get("WANDB_MODE"):
                require("train", f"WANDB_MODE={mode}", ("wandb",))
            return
        import wandb  # optional extra: train

        if dataclasses.is_dataclass(config):

            config = to_dict(config)
        wandb_dir = Path(out_dir) if out_dir else None
        if wandb_dir is not None:
            wandb_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT", PROJECT),
                              name=name, group=group or os.environ.get("DRAFTKIT_WANDB_GROUP"),
                              job_type=job_type, config=config or {}, mode=mode,
                              dir=str(wandb_dir) if wandb_dir else None, reinit="finish_previous",
                              id=run_id, resume="allow" if run_id else None,
                              settings=wandb.Settings(silent=True, console="off"))

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.run is not None:
            import wandb  # optional extra: train

            self.run.log({key: wandb.Table(columns=columns, data=rows)})

    def log_image(self, key: str, path: str | Path) -> None:
        if self.run is not None:
            import wandb  # optional extra: train

            self.run.log({key: wandb.Image(str(path))})

    def log_artifact(self, path: str | Path, name: str, type: str = "model",
                     aliases: list[str] | None = None, metadata: dict | None = None) -> None:
        if self.run is None:
            return
        import wandb  # optional extra: train

        artifact = wandb.Artifact(name, type=type, metadata=metadata or {})
        path = Path(path)
        if path.is_dir():
            artifact.add_dir(str(path))
        else:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact, aliases=aliases or ["latest"])

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(values)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
