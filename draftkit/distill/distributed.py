"""Multi-process training: torchrun (DDP) and DeepSpeed ZeRO, both over gloo on CPU.

Launch commands (from the repository root)::

    torchrun --nproc_per_node 2 -m draftkit distill RECIPE.yaml
    deepspeed --num_gpus 8 --module draftkit distill RECIPE.yaml \
        train.deepspeed=recipes/deepspeed/zero2.json

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK; a single process leaves them unset and
nothing here is used. ``deepspeed`` is imported only when a recipe names a DeepSpeed config.

A rank waits for the others at most ``$DRAFTKIT_DIST_TIMEOUT`` seconds (default 1800) to join,
at a barrier or in a collective, then fails with one line naming itself, what it waited at and
(at a barrier, on gloo) the ranks that never came; the launcher then stops the rest. The
launcher only acts on a rank that exits, so without this a stuck rank held the others for
torch's 30 minutes (eval/results/notes/2026-12-04-test-hang.md).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td
from torch.utils.cpp_extension import get_default_build_root

from draftkit.distill.schedule import warmup_cosine
from draftkit.errors import ConfigError, DraftkitError
from draftkit.extras import require
from draftkit.io import read_json

# Keys DeepSpeed needs to size the batch and pick the ZeRO stage. "auto" is filled from train.*.
REQUIRED_DS_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                    "zero_optimization")

# Seconds a rank waits for the others. 30 minutes is gloo's own default; NCCL's is 10, too
# short for rank 0 writing a large checkpoint or best/ while the others wait at a barrier.
TIMEOUT_ENV = "DRAFTKIT_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0


def dist_timeout() -> float:
    """``$DRAFTKIT_DIST_TIMEOUT`` in seconds, or the default."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds above 0; set it to "
                          f"how long a rank may wait for the others, e.g. {DEFAULT_TIMEOUT_S:g}")
    return seconds


def check_deepspeed_json(path: str | Path) -> dict:
    """Read a DeepSpeed JSON config and check the keys draftkit relies on; return it."""
    path = Path(path)
    ds = read_json(path, "DeepSpeed config", "use one of recipes/deepspeed/zero1.json, "
                   "zero2.json, zero3.json or a JSON object like them", ConfigError)
    missing = [k for k in REQUIRED_DS_KEYS if k not in ds]
    if missing:
        raise ConfigError(f"{path}: missing DeepSpeed key '{missing[0]}'")
    zero = ds["zero_optimization"]
    if not isinstance(zero, dict) or zero.get("stage") not in (0, 1, 2, 3):
        raise ConfigError(f"{path}: zero_optimization.stage must be 0, 1, 2 or 3")
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if ds[key] != "auto" and not (isinstance(ds[key], int) and ds[key] > 0):
            raise ConfigError(f"{path}: {key} must be a positive integer or \"auto\"")
    return ds


@dataclass
class Dist:
    """Where this process sits: rank 0 of 1 when not launched by torchrun/deepspeed."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # init_distributed created the process group, so it ends it
    timeout_s: float = DEFAULT_TIMEOUT_S  # how long this rank waits for the others

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """Join the process group the launcher describes (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = dist_timeout()
    owns = not td.is_initialized()
    if owns:
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)  # else NCCL's barrier guesses the device
        try:
            td.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                  timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as e:  # torch's DistStoreError: a rank never joined
            rank, world = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
            raise DraftkitError(_gave_up(f"rank {rank} of {world}", timeout, "the start "
                                         "(joining the process group)", e)) from None
    return Dist(td.get_rank(), td.get_world_size(), local_rank, owns, timeout)


def _gave_up(who: str, timeout: float, what: str, e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return (f"{who} waited {timeout:g} s for the other ranks at {what} and gave up ({first}): "
            f"a rank stopped or is stuck, see its log; if it was only slow, raise "
            f"{TIMEOUT_ENV} (seconds)")


def _where(frame: Any) -> str:
    """The caller's file, line and function: the one-line error has no traceback."""
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name})"


def close_distributed(dist: Dist) -> None:
    """End the process group this run created, once every rank is done with it.

    Call it on success only: after an error the other ranks may be inside a collective, and
    ending the group would hang them (the launcher stops them instead). Left to interpreter
    exit, gloo's worker threads can outlive Python and abort the process ("terminate called
    without an active exception"), which fails a finished run."""
    if dist.world_size > 1 and dist.owns_group:
        if td.is_initialized():
            _barrier(dist, "the end of the run")
            td.destroy_process_group()


def barrier(dist: Dist) -> None:
    if dist.world_size > 1:
        _barrier(dist, f"the barrier in {_where(sys._getframe(1))}")


def _barrier(dist: Dist, what: str) -> None:
    """Wait for every rank; on gloo torch's monitored barrier, whose error names the ranks
    that never arrived (a plain gloo barrier only says it timed out)."""
    try:
        if td.get_backend() == "gloo":
            td.monitored_barrier(timeout=datetime.timedelta(seconds=dist.timeout_s),
                                 wait_all_ranks=True)
        else:
            td.barrier()
    except RuntimeError as e:
        raise DraftkitError(_gave_up(f"rank {dist.rank} of {dist.world_size}", dist.timeout_s,
                                     what, e)) from None


def all_reduce_mean(value: float, dist: Dist) -> float:
    if dist.world_size == 1:
        return value

    # NCCL takes CUDA tensors only ("No backend type associated with device type cpu")
    on = f"cuda:{torch.cuda.current_device()}" if td.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=on)
    try:
        td.all_reduce(t)
    except RuntimeError as e:
        raise DraftkitError(_gave_up(f"rank {dist.rank} of {dist.world_size}", dist.timeout_s,
                                     f"the mean in {_where(sys._getframe(1))}", e)) from None
    return float(t.item()) / dist.world_size


def deepspeed_engine(model: Any, params: list, path: str, train: Any, total_steps: int,
                     warmup: int, min_lr_ratio: float):
    """Wrap the draft in a DeepSpeed engine; ``auto`` values come from ``train``."""
    require("train", "DeepSpeed training", ("deepspeed",))
    import deepspeed  # optional extra: train

    _say_build_locks()
    ds = check_deepspeed_json(path)
    fill = {"train_micro_batch_size_per_gpu": train.batch_size,
            "gradient_accumulation_steps": train.grad_accum,
            "gradient_clipping": train.max_grad_norm}
    for key, value in fill.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value
    ds.pop("train_batch_size", None)  # derived by DeepSpeed from the two above
    ds.setdefault("bf16", {})["enabled"] = train.precision == "bf16"

    optimizer = torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.betas),
                                  weight_decay=train.weight_decay)
    scheduler = warmup_cosine(optimizer, warmup, total_steps, min_lr_ratio)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds)
    return engine, optimizer, scheduler


def _say_build_locks() -> None:
    """Name any torch extension build lock before DeepSpeed's start waits on it.

    DeepSpeed builds ops on first use (on CPU its comm op, about a minute); torch's FileBaton
    lets one process build and has the others wait, without a word or a timeout, until the
    lock file goes. A build killed midway (a rank SIGTERMed by the launcher because another
    failed) leaves the file, and every later start then waits forever. No age tells the two
    apart, so any lock is named; it is checked before this run's own build begins."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return  # the locks are the machine's: one rank a machine says so

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:  # with or without py311_cpu/
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:  # a live build just finished
            continue
        print(f"warning: {lock} ({age / 60:.0f} min old): DeepSpeed waits until it goes; "
              f"a build killed midway leaves it behind: if no build is running, delete it",
              file=sys.stderr, flush=True)


def zero_stage(cfg: Any) -> int:
    """The ZeRO stage a recipe's DeepSpeed config asks for (0 without one), after checking
    that the recipe's other choices work with it."""
    path = cfg.train.deepspeed
    stage = int(check_deepspeed_json(path)["zero_optimization"]["stage"]) if path else 0
    if stage == 3 and cfg.draft.lora.enabled:
        raise ConfigError(f"{path}: LoRA with ZeRO-3 is not supported here; use zero2.json")
    if stage == 3 and cfg.data.lmbda > 0:
        # each rank would generate a different number of tokens, and ZeRO-3's per-layer
        # gathers need every rank in every forward
        raise ConfigError(f"{path}: on-policy data (data.lmbda > 0) with ZeRO-3 is not "
                          f"supported; use zero2.json or data.lmbda: 0")
    return stage


def gathered(model: Any, stage: int):
    """Context in which every rank holds ``model``'s full weights.

    ZeRO-3 partitions each parameter over the ranks; reading the whole state dict (to export
    ``best/``) needs them gathered first. It is a collective: every rank must enter it.
    Other stages keep whole weights on every rank, so it does nothing there.
    """
    if stage != 3:
        return contextlib.nullcontext()
    import deepspeed  # optional extra: train

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
