"""Multi-process training: torchrun (DDP) and DeepSpeed ZeRO, both over gloo on CPU.

Launch commands (from the repository root)::

    torchrun --nproc_per_node 2 -m draftkit distill RECIPE.yaml
    deepspeed --num_gpus 8 --module draftkit distill RECIPE.yaml \
        train.deepspeed=recipes/deepspeed/zero2.json

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK; a single process leaves them unset and
nothing here is used. ``deepspeed`` is imported only when a recipe names a DeepSpeed config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftkit.distill.schedule import warmup_cosine
from draftkit.errors import ConfigError
from draftkit.io import read_json

# Keys DeepSpeed needs to size the batch and pick the ZeRO stage. "auto" is filled from train.*.
REQUIRED_DS_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                    "zero_optimization")


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

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """Join the process group the launcher describes (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch
    import torch.distributed as td

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owns = not td.is_initialized()
    if owns:
        if device.startswith("cuda"):
            torch.cuda.set_device(local_rank)  # else NCCL's barrier guesses the device
        td.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(td.get_rank(), td.get_world_size(), local_rank, owns)


def close_distributed(dist: Dist) -> None:
    """End the process group this run created, once every rank is done with it.

    Call it on success only: after an error the other ranks may be inside a collective, and
    ending the group would hang them (the launcher stops them instead). Left to interpreter
    exit, gloo's worker threads can outlive Python and abort the process ("terminate called
    without an active exception"), which fails a finished run."""
    if dist.world_size > 1 and dist.owns_group:
        import torch.distributed as td

        if td.is_initialized():
            td.barrier()
            td.destroy_process_group()


def barrier(dist: Dist) -> None:
    if dist.world_size > 1:
        import torch.distributed as td

        td.barrier()


def all_reduce_mean(value: float, dist: Dist) -> float:
    if dist.world_size == 1:
        return value
    import torch
    import torch.distributed as td

    # NCCL takes CUDA tensors only ("No backend type associated with device type cpu")
    on = f"cuda:{torch.cuda.current_device()}" if td.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.float64, device=on)
    td.all_reduce(t)
    return float(t.item()) / dist.world_size


def deepspeed_engine(model: Any, params: list, path: str, train: Any, total_steps: int,
                     warmup: int, min_lr_ratio: float):
    """Wrap the draft in a DeepSpeed engine; ``auto`` values come from ``train``."""
    import deepspeed

    ds = check_deepspeed_json(path)
    fill = {"train_micro_batch_size_per_gpu": train.batch_size,
            "gradient_accumulation_steps": train.grad_accum,
            "gradient_clipping": train.max_grad_norm}
    for key, value in fill.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value
    ds.pop("train_batch_size", None)  # derived by DeepSpeed from the two above
    ds.setdefault("bf16", {})["enabled"] = train.precision == "bf16"
    import torch

    optimizer = torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.betas),
                                  weight_decay=train.weight_decay)
    scheduler = warmup_cosine(optimizer, warmup, total_steps, min_lr_ratio)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds)
    return engine, optimizer, scheduler


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
    import contextlib

    if stage != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
