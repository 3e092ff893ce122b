"""How far plain decoding is from the memory-bandwidth floor of the machine it ran on.

At batch 1 a decoding step reads every weight of the target once and does little arithmetic on
each, so no engine computes a token faster than the weights' bytes divided by the rate the
device reads memory. The eval report sets the plain step it measured beside that floor: a step
near the floor leaves speculation the only way to go faster, one far above it (a launch-bound
GPU loop, a slow kernel) means part of any speedup is won back from the baseline's waste, and
the baseline deserves work first. The read rate is measured, not looked up: the sum of a
buffer larger than the caches, the fastest pure read torch has on any device.
"""

from __future__ import annotations

import statistics
import time

import torch

from draftkit.decode.clock import synchronize

PROBE_BYTES = 512 * 2**20  # well past any CPU's last-level cache


def weight_bytes(model: "torch.nn.Module") -> int:
    """Bytes of the parameters a decoding step reads (tied weights counted once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def read_bytes_per_second(device: "torch.device", nbytes: int = PROBE_BYTES,
                          repeats: int = 7) -> float:
    """The rate ``device`` reads memory: the median over ``repeats`` sums of an ``nbytes``
    float32 buffer, after one untimed."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        buf.sum()
        synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    del buf
    return nbytes / statistics.median(times)


def floor_seconds(model: "torch.nn.Module", bytes_per_second: float) -> float:
    """The memory floor of one decoding step of ``model`` at batch 1."""
    return weight_bytes(model) / bytes_per_second
