"""How long the quickstart's stages will take on this machine, said before they start.

The quickstart does fixed work (the recipe's steps, the eval's prompts), so on a slower machine
it takes longer rather than doing less. How much longer is measured, not guessed: a probe
times what each stage is made of on this machine, and each stage of a reference run (a
committed ``timing.json``, the run whose figures the README quotes) is scaled by how much
slower or faster the same operation is here:

- the target's answers and the teacher and feature caches, the evaluation and the export
  are target forwards: scaled by the plain decoding step (batch 1, greedy, K = 0), and the
  evaluation also by its decodes (domains x prompts x tokens) against the reference's;
- training is the head's forward and backward over the training-time-test steps: scaled by
  one such step, timed here on random features of the recipe's shape, and by the steps.

A busy machine that stays busy is seen by the probe; a load that comes or goes later is not,
which is why the quickstart prints the estimate beside the actual time when it ends and keeps
both in ``timing.json``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftkit.decode.clock import synchronize
from draftkit.decode.engine import SpeculativeEngine
from draftkit.distill.eagle3 import Unrolled
from draftkit.distill.ttt import step_masks
from draftkit.evaluate.floor import read_bytes_per_second
from draftkit.io import atomic_write_json, read_json
from draftkit.records import Record

FILE = "timing.json"
STAGES = ("set-up", "data", "distill", "evaluate", "export")
# what each stage's time scales with: the probe's plain step, or its training step
TRAINING = ("distill",)


@dataclass(kw_only=True)
class Probe(Record):
    """This machine's speed at what the quickstart's stages are made of."""

    plain_step_ms: float  # the target's greedy decoding step at batch 1
    train_step_s: float  # the head's forward and backward on one batch of the recipe's shape
    read_gb_per_s: float  # the rate memory is read (evaluate/floor.py)


@dataclass(kw_only=True)
class Timing(Record):
    """``timing.json``: the probe, the work done, each stage's estimate and actual minutes."""

    probe: Probe
    steps: int  # training steps
    decodes: int  # evaluation tokens decoded: domains x prompts x new tokens
    estimate_minutes: dict[str, float] = field(default_factory=dict)
    actual_minutes: dict[str, float] = field(default_factory=dict)
    reference: str | None = None  # the run whose timing.json the estimate was scaled from
    reference_probe: Probe | None = None  # that run's machine

    @property
    def total_estimate(self) -> float:
        return sum(self.estimate_minutes.values())

    @property
    def total_actual(self) -> float:
        return sum(self.actual_minutes.values())


def probe(target: Any, head: Any, batch_size: int, seq_len: int, ttt_steps: int) -> Probe:
    """Time this machine: ``target`` decoding plainly, and the EAGLE-3 ``head`` training one
    batch of ``batch_size`` x ``seq_len`` positions over ``ttt_steps`` steps (random features
    and tokens: the cost, not the values, is measured). A few seconds."""
    device = next(target.parameters()).device
    return Probe(plain_step_ms=1000 * _plain_step(target),
                 train_step_s=_train_step(head, batch_size, seq_len, ttt_steps),
                 read_gb_per_s=read_bytes_per_second(device) / 1e9)


def _plain_step(target: Any, tokens: int = 24) -> float:
    """Seconds a greedy token takes at batch 1 (after an untimed warm-up)."""
    engine = SpeculativeEngine(target, None, eos_token_id=None)  # never stops early
    prompt = list(range(1, 17))
    engine.generate([prompt], k=0, max_new_tokens=4)
    synchronize(next(target.parameters()).device)
    start = time.perf_counter()
    engine.generate([prompt], k=0, max_new_tokens=tokens)
    synchronize(next(target.parameters()).device)
    return (time.perf_counter() - start) / tokens


def _train_step(head: Any, batch_size: int, seq_len: int, steps: int, repeats: int = 3) -> float:
    """The median seconds of ``repeats`` optimizer steps of ``head`` (after one untimed), as
    distillation runs them: unrolled over ``steps`` steps, backward, AdamW."""
    head = head.float()
    student = Unrolled(head)
    device = next(head.parameters()).device
    g = torch.Generator().manual_seed(0)
    width = 3 * head.config.target_hidden_size
    aux = torch.randn(batch_size, seq_len, width, generator=g).to(device)  # (B, T, 3 Ht)
    ids = torch.randint(0, head.config.vocab_size, (batch_size, seq_len), generator=g
                        ).to(device)  # (B, T)
    pos = torch.arange(seq_len, device=device)[None].expand(batch_size, seq_len)  # (B, T)
    masks = step_masks(torch.ones_like(ids, dtype=torch.bool), pos, steps)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        logits = student(aux, ids, pos, masks)  # (N_i, N) each
        loss = sum(torch.logsumexp(x, dim=-1).mean() for x in logits)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_timing(path: Path) -> Timing | None:
    """A run's ``timing.json`` (the reference's), or None where there is none."""
    file = Path(path) / FILE
    if not file.is_file():
        return None
    return Timing.from_dict(read_json(file, "timing record", "delete it"))


def estimate(here: Probe, steps: int, decodes: int, reference: Timing) -> dict[str, float]:
    """Minutes per stage on this machine: each of ``reference``'s actual minutes scaled by
    how much slower this machine's probe is at what the stage is made of (module
    docstring), and by the work: training ``steps`` and ``decodes`` evaluation tokens."""
    ref = reference.probe
    plain = here.plain_step_ms / ref.plain_step_ms
    train = here.train_step_s / ref.train_step_s
    out = {}
    for stage, minutes in reference.actual_minutes.items():
        if stage in TRAINING:
            out[stage] = minutes * train * steps / max(1, reference.steps)
        elif stage == "evaluate":
            out[stage] = minutes * plain * decodes / max(1, reference.decodes)
        else:
            out[stage] = minutes * plain
    return out


def estimate_text(minutes: dict[str, float], reference: Timing, here: Probe,
                  already: float) -> str:
    """The lines the quickstart prints before its long stages."""
    ref = reference.probe
    lines = [f"this machine: a plain step of the target {here.plain_step_ms:.1f} ms, a training "
             f"step {here.train_step_s:.2f} s, memory read at {here.read_gb_per_s:.1f} GB/s; "
             f"the reference run ({reference.reference or 'README'}): {ref.plain_step_ms:.1f} "
             f"ms, {ref.train_step_s:.2f} s, {ref.read_gb_per_s:.1f} GB/s"]
    for stage in STAGES:
        if stage in minutes:
            lines.append(f"  {stage:<9} about {minutes[stage]:5.1f} min")
    total = already + sum(v for k, v in minutes.items() if k != "set-up")
    lines.append(f"  total     about {total:5.1f} min (the data stage is shorter where an "
                 f"earlier run's answers and caches are reused)")
    return "\n".join(lines)


def write_timing(out: Path, timing: Timing) -> None:
    atomic_write_json(Path(out) / FILE, timing.to_dict())
