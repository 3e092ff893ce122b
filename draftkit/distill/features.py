"""The target's features an EAGLE-3 head reads: its hidden states at three layers, online or cached.

An EAGLE-3 head (arXiv 2503.01840; draftkit/models/eagle3.py) drafts from the hidden states
entering three target layers, low, middle and high, concatenated: aux (B, T, 3 Ht). Training
needs them at every position the head reads, the prompt's included (step 0's keys are the
prompt's), beside the target's distribution where the loss is taken:

- :func:`target_forward`: one target forward gives both; :class:`OnlineFeatures` runs it on
  each step's rows;
- :class:`FeatureCache`: aux written once to disk in bf16, for each row's positions up to its
  last trained one, and read by later epochs and runs in place of the forward. The
  distribution then comes from the top-k teacher cache (distill/teacher.py), shared with
  standalone drafts of the same target and rows. A feature costs 3 * Ht * 2 bytes per token:
  24 KiB for a Llama-3.1-8B target (Ht = 4096).

A feature cache is keyed by the target (its weights and dtype), the tapped layers and the rows,
and its meta.json says which: a cache of another target or layer set found in its place is
one clear error, never read as this run's.

Where the target is too large for draftkit's process, vLLM computes the features instead
(:class:`VllmFeatures`, recipe key ``teacher.features: vllm``): its ``extract_hidden_states``
method captures the states entering the tapped layers while it prefills each example, in its
own environment and on its own devices (tensor parallelism included), and the cache is filled
from them, keyed apart from draftkit's own (equal within bf16 rounding, tested).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from draftkit.data import Rows, positions
from draftkit.distill.losses import dense_logprobs
from draftkit.distill.reduced_head import head_logits
from draftkit.distill.teacher import RowCache, TeacherOut, TopKCache, cache_key, final_logits
from draftkit.engines.vllm import VllmWorker
from draftkit.models.eagle3 import tapped


def target_forward(target: Any, layers: list[int], input_ids: torch.Tensor,
                   position_ids: torch.Tensor, mask: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward: its logits where ``mask`` (B, T) is true, (N, V) (all positions,
    (B, T, V), without a mask), and aux (B, T, 3 Ht), the hidden states entering ``layers``
    (transformers' ``hidden_states[i]``), low to high. Positions restarting inside a row keep
    packed examples apart (data/pack.py)."""
    out = target.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                               output_hidden_states=True)
    last = out.last_hidden_state if mask is None else out.last_hidden_state[mask]
    logits = final_logits(target, head_logits(target, last, None))
    return logits, tapped(out.hidden_states, layers)


class OnlineFeatures:
    """The target run on each batch: (its log-probs at ``temperature`` where the loss is taken,
    as a dense :class:`TeacherOut`, and aux (B, T, 3 Ht))."""

    def __init__(self, target: Any, layers: list[int], temperature: float):
        self.target, self.layers, self.temperature = target, list(layers), temperature

    @torch.no_grad()
    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor) -> tuple[TeacherOut, torch.Tensor]:
        logits, aux = target_forward(self.target, self.layers, input_ids, position_ids, mask)
        return TeacherOut(dense_logprobs(logits, self.temperature), None, None), aux


def read_lengths(rows: Rows) -> torch.Tensor:
    """(R,) the positions of each row a head reads: up to its last trained one, which the
    target's distribution scores but no feature of it is read (a step-i draft at t is scored at
    t + 1 + i). 0 for a row with nothing trained."""
    t = rows.loss_mask.shape[1]
    last = torch.where(rows.loss_mask, torch.arange(t), -1).max(1).values  # (R,)
    return last.clamp(min=0)


class VllmFeatures:
    """The target's features from vLLM (:mod:`draftkit.engines.vllm`): one engine process
    holding the target with ``extract_hidden_states`` at ``layers``, each example one request
    (its tokens the prompt), its states returned through a file in ``work_dir``."""

    def __init__(self, target_dir: str | Path, dtype: str, layers: list[int], work_dir: Path,
                 tensor_parallel_size: int = 1, python: str | None = None, worker=None):
        """``worker``: a running :class:`~draftkit.engines.vllm.VllmWorker` to load the target
        in (left running at the end), else one is started under ``python``."""
        self.target_dir, self.dtype, self.layers = str(target_dir), dtype, list(layers)
        self.work_dir, self.tp, self.python = Path(work_dir), tensor_parallel_size, python
        self.worker, self.owned, self.loaded = worker, worker is None, False

    def capture(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """aux (T_i, len(layers) * Ht) float32 of each token sequence."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.worker is None:
            self.worker = VllmWorker(self.python, log=self.work_dir / "vllm.log")
        if not self.loaded:
            self.worker.call("load", name="features", model=self.target_dir, dtype=self.dtype,
                             max_model_len=max(map(len, sequences)) * 2 + 8,
                             tensor_parallel_size=self.tp,
                             hidden_states={"layers": self.layers,
                                            "dir": str(self.work_dir / "engine")})
            self.loaded = True
        out = self.work_dir / "states.safetensors"
        self.worker.call("hidden_states", name="features", sequences=sequences, out=str(out))
        data = load_file(out)
        out.unlink()
        states = data["states"].float().flatten(1)  # (sum T, layers * Ht), layer after layer
        return list(states.split(data["lengths"].tolist()))

    def close(self, remove: bool = False) -> None:
        """Stop the engine; ``remove``: its work folder too (its log with it), once the states
        it wrote are in the cache."""
        if self.worker is not None and self.owned:
            self.worker.close()
            self.worker = None
        elif self.worker is not None and self.loaded:
            self.worker.call("unload", name="features")
        self.loaded = False
        if remove:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> VllmFeatures:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def examples_of(pos: torch.Tensor, length: int) -> list[tuple[int, int]]:
    """(start, end) of each example packed in a row's first ``length`` positions: a new one
    starts where positions restart at 0 (data/pack.py)."""
    starts = [int(i) for i in (pos[:length] == 0).nonzero().flatten()] or [0]
    if starts[0] != 0:
        starts.insert(0, 0)
    return list(zip(starts, starts[1:] + [length]))


class FeatureCache(RowCache):
    """aux (3 Ht wide) at the positions :func:`read_lengths` keeps of each row, bf16 on disk
    (numpy has no bf16: the bits are stored as int16); computed by the target in this process,
    or by ``engine`` (:class:`VllmFeatures`)."""

    what = "feature cache"

    def __init__(self, directory: Path, rows: Rows, layers: list[int], hidden_size: int,
                 target_id: str, engine: VllmFeatures | None = None):
        self.engine = engine
        self.layers, self.width, self.target_id = list(layers), len(layers) * hidden_size, \
            target_id
        self.rows_key = cache_key("rows", rows, 0, 0.0)
        self.lengths = read_lengths(rows)
        super().__init__(directory, self.lengths, feature_key(target_id, self.layers, rows))

    def files(self) -> dict[str, tuple[Any, tuple[int, ...]]]:
        return {"aux.bf16": (np.int16, (self.width,))}

    def settings(self) -> dict:
        return {"target": self.target_id, "layers": self.layers, "rows_key": self.rows_key}

    def mismatch(self, meta: dict) -> str:
        if meta.get("target") != self.target_id:
            what = (f"target {meta.get('target')!r}; this run's is {self.target_id!r}")
        elif meta.get("layers") != self.layers:
            what = f"layers {meta.get('layers')}; this head taps {self.layers}"
        else:
            what = "other rows (the data, seq_len or seed differ)"
        return (f"feature cache {self.dir} holds the features of {what}: delete it or set "
                f"teacher.cache_dir elsewhere")

    def fill(self, arrays: dict[str, np.memmap], model: Any, rows: Rows, b: int, e: int
             ) -> None:
        if self.engine is not None:
            return self.fill_from_engine(arrays, rows, b, e)
        dev = next(model.parameters()).device
        width = int(self.lengths[b:e].max())  # causal: later positions change nothing here
        ids = rows.input_ids[b:e, :width].to(dev)
        _, aux = target_forward(model, self.layers, ids,
                                positions(rows, slice(b, e))[:, :width].to(dev),
                                torch.zeros_like(ids, dtype=torch.bool))
        bits = aux.to(torch.bfloat16).view(torch.int16).cpu().numpy()  # (B, width, 3 Ht)
        for r in range(b, e):
            lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
            arrays["aux.bf16"][lo:hi] = bits[r - b, :hi - lo]

    def fill_from_engine(self, arrays: dict[str, np.memmap], rows: Rows, b: int, e: int) -> None:
        """Rows b..e from the engine: each packed example one request, its states placed at
        its positions in the row."""
        spans, sequences = [], []
        for r in range(b, e):
            length = int(self.offsets[r + 1] - self.offsets[r])
            for start, end in examples_of(positions(rows, slice(r, r + 1))[0], length):
                spans.append((r, start, end))
                sequences.append(rows.input_ids[r, start:end].tolist())
        for (r, start, end), aux in zip(spans, self.engine.capture(sequences)):
            bits = aux.to(torch.bfloat16).view(torch.int16).numpy()  # (end - start, 3 Ht)
            lo = int(self.offsets[r])
            arrays["aux.bf16"][lo + start:lo + end] = bits

    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """aux (B, T, 3 Ht) of rows ``rows_idx`` (bf16; zero past each row's kept positions,
        which no trained position reads)."""
        flat = torch.from_numpy(self.read("aux.bf16", rows_idx)).view(torch.bfloat16)
        out = torch.zeros(*input_ids.shape, self.width, dtype=torch.bfloat16)
        lengths = self.lengths[rows_idx]
        keep = torch.arange(input_ids.shape[1]) < lengths[:, None]  # (B, T)
        out[keep] = flat  # row after row, each row's positions in order, as stored
        return out


class CachedFeatures:
    """Both from disk: (the top-k teacher's :class:`TeacherOut`, or None without one (the ce
    control), and aux from the feature cache)."""

    def __init__(self, teacher: TopKCache | None, features: FeatureCache):
        self.teacher, self.features = teacher, features

    @property
    def caches(self) -> list[RowCache]:
        """Its files on disk: the top-k teacher cache (if any) and the feature cache."""
        return [c for c in (self.teacher, self.features) if c is not None]

    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor) -> tuple[TeacherOut | None, torch.Tensor]:
        target = None if self.teacher is None else self.teacher(rows_idx, input_ids, mask)
        return target, self.features(rows_idx, input_ids).to(input_ids.device)


def feature_key(target_id: str, layers: list[int], rows: Rows, engine: str = "draftkit") -> str:
    """What a feature cache is keyed by: the target, the tapped layers, the rows and the engine
    that computed them (draftkit's key is the one it always had)."""
    tag = "" if engine == "draftkit" else f"{engine}|"
    h = hashlib.sha256(f"eagle3 features|{tag}{target_id}|{list(layers)}|".encode())
    h.update(cache_key("rows", rows, 0, 0.0).encode())
    return h.hexdigest()[:16]
