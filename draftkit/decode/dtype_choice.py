"""``--dtype auto`` on a CPU: float32 or bfloat16, whichever decodes faster there, measured.

On a GPU ``auto`` is bfloat16. On a CPU it depends on the chip. Without native bfloat16
arithmetic (AVX512-BF16 or AMX) bfloat16 matmuls are emulated and slow, so ``auto`` is float32.
With it, a decoding step streams half the bytes, but whether the step is also faster depends on
the kernels this CPU and this torch build have for the decoder's few-row products, which is why
the matmul layouts are timed too (:mod:`draftkit.decode.cpu_linear`). So :func:`load_decoding_pair`
loads the pair in both dtypes and times, interleaved, what a speculative round is made of: a
target step (one token after ``CONTEXT`` positions) and a draft step, on the runners the engine
decodes with, each runner's layouts tuned for its dtype. bfloat16 is kept only where its target
step plus draft step is faster by ``MARGIN``; float32 stays otherwise, as it is the reference.

Models under :data:`~draftkit.decode.cpu_linear.MIN_TUNE_BYTES` fit in cache; they stay float32
unmeasured, which also keeps the tests' tiny models on their float32 references. A choice is
kept per process (by models and thread count), so a second load does not measure again.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from draftkit.decode.cpu_linear import MIN_TUNE_BYTES
from draftkit.decode.drafters import make_drafter
from draftkit.decode.eagle3_runner import Eagle3Runner
from draftkit.decode.runners import make_runner
from draftkit.models.facts import vocab_size
from draftkit.models.load import ModelPair, default_device, dtype_name, load_pair

CONTEXT = 128  # positions before the timed step: a short chat turn
REPS = 7  # interleaved timings of each step; the median is kept
MARGIN = 0.05  # bfloat16 replaces float32 only if this much faster

_chosen: dict[tuple, "DtypeChoice"] = {}  # (target, draft, threads) -> the measured choice


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a pair decodes in and why: ``requested`` (auto, float32, ...), and under a
    measured ``auto`` the milliseconds of a target step plus a draft step in each dtype."""

    dtype: str
    requested: str
    reason: str = ""  # why auto did not measure ("" where it did, or was not asked)
    step_ms: dict[str, float] | None = None  # dtype -> target step + draft step, medians

    def describe(self) -> str | None:
        """How auto chose, one phrase for reports (``bfloat16 (auto: a target + draft step
        13.1 ms against float32's 18.2 ms)``); None where the dtype was asked for."""
        if self.requested != "auto":
            return None
        if self.step_ms is None:
            return f"{self.dtype} (auto: {self.reason})"
        other = next(d for d in self.step_ms if d != self.dtype)
        return (f"{self.dtype} (auto: a target + draft step {self.step_ms[self.dtype]:.1f} ms "
                f"against {other}'s {self.step_ms[other]:.1f} ms)")


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 products natively (AVX512-BF16 or AMX)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def load_decoding_pair(target: str, draft: str | None = None, device: str | None = None,
                       dtype: str = "auto") -> tuple[ModelPair, DtypeChoice]:
    """:func:`~draftkit.models.load.load_pair` for decoding: under ``auto`` on a CPU, in
    whichever of float32 and bfloat16 decodes faster here (module docstring)."""
    device = device or default_device()
    requested = (dtype or "auto").lower()
    fixed = _fixed(requested, device)
    if fixed is not None:
        pair = load_pair(target, draft, device, requested)
        return pair, DtypeChoice(dtype_name(pair.target), requested, fixed)
    key = (target, draft, torch.get_num_threads())  # as given: loading resolves them
    if key in _chosen:
        return load_pair(target, draft, device, _chosen[key].dtype), _chosen[key]
    pairs = {"float32": load_pair(target, draft, device, "float32")}
    if sum(p.nbytes for p in pairs["float32"].target.parameters()) < MIN_TUNE_BYTES:
        return pairs["float32"], DtypeChoice("float32", "auto", "the model fits in cache")
    pairs["bfloat16"] = load_pair(target, draft, device, "bfloat16")
    ms = time_steps(pairs)
    best = ("bfloat16" if ms["bfloat16"] < (1 - MARGIN) * ms["float32"] else "float32")
    _chosen[key] = DtypeChoice(best, "auto", step_ms=ms)
    return pairs[best], _chosen[key]


def _fixed(requested: str, device: str) -> str | None:
    """Why ``requested`` on ``device`` needs no measurement ("" where it was asked for), or
    None where auto measures."""
    if requested != "auto":
        return ""
    if torch.device(device).type != "cpu":
        return "bfloat16 off the CPU" if device.startswith("cuda") else "float32 off CUDA"
    return None if native_bf16() else "this CPU has no native bfloat16"


def time_steps(pairs: dict[str, ModelPair]) -> dict[str, float]:
    """Per dtype, the median milliseconds of a target step plus a draft step, the dtypes'
    steps interleaved so that the machine's drifts fall on each alike."""
    steps = {name: [s for s in (_target_step(p), _draft_step(p)) if s is not None]
             for name, p in pairs.items()}
    taken: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    with torch.no_grad():
        for rep in range(REPS):
            for name in order if rep % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                for step in steps[name]:
                    step()
                taken[name].append(1e3 * (time.perf_counter() - start))
    return {name: statistics.median(t) for name, t in taken.items()}


def _tokens(model) -> "torch.Tensor":
    """(1, CONTEXT) token ids on the model's device: what the timed steps follow."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, min(vocab_size(model), 1000), (1, CONTEXT), generator=gen).to(
        next(model.parameters()).device)


def _target_step(pair: ModelPair) -> Callable[[], object]:
    """A plain step of the target's runner after ``CONTEXT`` positions, primed."""
    runner = make_runner(pair.target)
    ids = _tokens(pair.target)
    runner.reset(1, CONTEXT + 2)
    with torch.no_grad():
        runner.forward(ids, [0])
    return lambda: runner.forward(ids[:, :1], [CONTEXT])


def _draft_step(pair: ModelPair) -> Callable[[], object] | None:
    """A drafting step of the draft's runner after ``CONTEXT`` positions (an EAGLE-3 head's
    on features of the target's width), primed; None without a draft."""
    if pair.draft is None:
        return None
    runner = make_drafter(pair.draft, pair.target).runner
    ids = _tokens(pair.target)
    runner.reset(1, CONTEXT + 2)
    with torch.no_grad():
        if isinstance(runner, Eagle3Runner):
            hidden = torch.randn(1, CONTEXT, runner.w_fc.shape[0], dtype=runner.param.dtype,
                                 device=runner.param.device)  # (1, CONTEXT, H)
            runner.feed(hidden, ids, [0])
            return lambda: runner.forward(hidden[:, :1], ids[:, :1], [CONTEXT], last=[0])
        runner.forward(ids, [0])
    return lambda: runner.forward(ids[:, :1], [CONTEXT])
