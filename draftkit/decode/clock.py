"""Wall-clock laps of a decoding round, each read after the device has finished its work.

A GPU runs queued kernels after the Python call returns, so a clock read without waiting
charges the work to whatever the host does next. :class:`RoundClock` synchronises the device
at the end of every lap, once; a round takes exactly as many synchronisations as it has laps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize(device: "torch.device") -> None:
    """Wait for queued device work so the clock reads what was actually spent."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class RoundClock:
    """Named laps since the clock was made: ``lap(name)`` waits for the device, then adds the
    time since the previous lap to ``laps[name]`` (a name may be lapped more than once)."""

    def __init__(self, device: "torch.device"):
        self.device = device
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> float:
        """End the current lap as ``name``; returns its seconds."""
        synchronize(self.device)
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        self.laps[name] = self.laps.get(name, 0.0) + seconds
        return seconds


def interleaved_ms(ways: dict[str, Callable[[], object]], rounds: int, reps: int,
                   device: "torch.device", warm: int = 2,
                   before: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Milliseconds a call of each way, per round: every round times ``reps`` calls of each way
    in turn, the order reversed every other round, so a drift in the machine's speed reaches
    all of them alike; the first ``warm`` rounds are not kept. ``before``, untimed, runs before
    each way's calls (a target's forward, so a draft's weights come from memory as when
    decoding). Returns way -> ``rounds`` times (for :func:`draftkit.metrics.median_ratio`)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(rounds + warm):
        for name in (list(ways) if r % 2 else list(reversed(ways))):
            if before is not None:
                before()
            synchronize(device)
            start = time.perf_counter()
            for _ in range(reps):
                ways[name]()
            synchronize(device)
            if r >= warm:
                times[name].append((time.perf_counter() - start) / reps * 1e3)
    return times
