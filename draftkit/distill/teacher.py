"""The target's distribution for each training position: online, or from a top-k cache on disk.

- :class:`OnlineTeacher` runs the target forward every step (exact, costs a target forward).
- :class:`TopKCache` runs the target once over the training rows and keeps, per trained
  position, the ``top_k`` log-probabilities (float16) and their token ids (int32) in
  memory-mapped files. Later epochs, and later runs with the same target, rows, ``top_k``
  and ``temperature``, read them instead of running the target; the losses add a tail bucket
  for the mass outside the top k (see :func:`draftkit.distill.losses.sparse_logprobs`).

Only positions with a loss (``loss_mask``) are stored, in row order, so the cache costs
``top_k * 6`` bytes per trained token; a building run killed mid-way resumes from the last
finished batch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftkit.data import Rows, positions
from draftkit.distill.losses import dense_logprobs
from draftkit.errors import DraftkitError
from draftkit.io import atomic_write_json


class MaskedLM(torch.nn.Module):
    """Logits only where the loss is taken: the LM head over a large vocabulary is most of a
    small draft's cost, and prompt positions need none. Wrapping the model keeps DDP's hooks.
    """

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        # input_ids, mask, position_ids: (B, T) -> logits (N, V) at the N positions where mask
        # is true. Positions restarting inside a row keep packed examples apart (data/pack.py).
        decoder = self.model.get_decoder()
        hidden = decoder(input_ids=input_ids, position_ids=position_ids,
                         use_cache=False).last_hidden_state  # (B, T, H); no cache: see pack.py
        logits = self.model.get_output_embeddings()(hidden[mask])  # (N, V)
        return final_logits(self.model, logits)


def final_logits(model: Any, logits: torch.Tensor) -> torch.Tensor:
    """What some ``*ForCausalLM.forward`` do to the head's output before returning it, which
    calling the decoder and the head directly skips: Gemma 2/3 soft-cap the logits, Granite
    divides them by ``logits_scaling``, Cohere multiplies them by ``logit_scale``. Without
    it the teacher's distribution would not be the target's."""
    cfg = model.config.get_text_config()
    scale = getattr(cfg, "logit_scale", None)  # Cohere
    if scale is not None:
        logits = logits * scale
    scaling = getattr(cfg, "logits_scaling", None)  # Granite
    if scaling is not None:
        logits = logits / scaling
    cap = getattr(cfg, "final_logit_softcapping", None)  # Gemma 2 / 3
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


class OnlineTeacher:
    """Log-probabilities of the target at ``temperature``, computed each step."""

    def __init__(self, model: Any, temperature: float):
        self.lm = MaskedLM(model)
        self.temperature = temperature

    @torch.no_grad()
    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """(p_logp (N, V), None): dense log-probs at the masked positions."""
        return dense_logprobs(self.lm(input_ids, mask, position_ids), self.temperature), None


def cache_key(target_id: str, rows: Rows, top_k: int, temperature: float) -> str:
    h = hashlib.sha256()
    h.update(f"{target_id}|{top_k}|{temperature}|v2".encode())
    h.update(rows.input_ids.numpy().tobytes())
    h.update(rows.loss_mask.numpy().tobytes())
    h.update(positions(rows, slice(None)).numpy().tobytes())
    return h.hexdigest()[:16]


class TopKCache:
    """Top-k teacher log-probs of every trained position of ``rows``, on disk."""

    def __init__(self, directory: Path, rows: Rows, top_k: int, temperature: float, key: str):
        self.dir = Path(directory)
        self.top_k, self.temperature, self.key = top_k, temperature, key
        counts = rows.loss_mask.sum(1)  # trained positions per row
        # offsets[i]: where row i's positions start in the flat position arrays
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        self.n_positions = int(self.offsets[-1])
        self.n_rows = len(rows)
        self.meta_path = self.dir / "meta.json"

    # --- building ---------------------------------------------------------------------------

    def _arrays(self, mode: str):
        shape = (max(1, self.n_positions), self.top_k)
        files = {"logp.f16": np.float16, "ids.i32": np.int32}
        if mode != "w+":  # files of an earlier build: a truncated one would fail deep in mmap
            for name, dtype in files.items():
                path = self.dir / name
                want = shape[0] * shape[1] * np.dtype(dtype).itemsize
                have = path.stat().st_size if path.is_file() else None
                if have != want:
                    raise DraftkitError(
                        f"teacher cache {self.dir} is damaged ({name} has "
                        f"{'no file' if have is None else f'{have} bytes'}, expected {want}); "
                        f"delete {self.dir} and rerun to rebuild it")
        return tuple(np.memmap(self.dir / name, dtype=dtype, mode=mode, shape=shape)
                     for name, dtype in files.items())

    def filled_rows(self) -> int:
        if not self.meta_path.is_file():
            return 0
        try:
            meta = json.loads(self.meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return 0
        if meta.get("key") != self.key:
            raise DraftkitError(f"teacher cache {self.dir} belongs to other rows or settings; "
                                f"delete it or set teacher.cache_dir elsewhere")
        return int(meta.get("filled_rows", 0))

    def build(self, model: Any, rows: Rows, batch_size: int, progress: bool = True) -> None:
        """Run the target over the rows not cached yet (resumes after a kill)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        start = self.filled_rows()
        if start >= self.n_rows:
            return
        lm = MaskedLM(model)
        dev = next(model.parameters()).device  # the rows live on the CPU, beside the files
        logp_mm, ids_mm = self._arrays("r+" if start > 0 else "w+")
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=self.n_rows, initial=start, desc="teacher cache", unit="row",
                       dynamic_ncols=True)
        for b in range(start, self.n_rows, batch_size):
            e = min(b + batch_size, self.n_rows)
            mask = rows.loss_mask[b:e]
            if mask.any():
                with torch.no_grad():
                    logits = lm(rows.input_ids[b:e].to(dev), mask.to(dev),
                                positions(rows, slice(b, e)).to(dev))
                    p_logp = dense_logprobs(logits, self.temperature)
                    top = p_logp.topk(self.top_k, dim=-1)  # (N, k)
                lo, hi = int(self.offsets[b]), int(self.offsets[e])
                logp_mm[lo:hi] = top.values.to(torch.float16).cpu().numpy()
                ids_mm[lo:hi] = top.indices.to(torch.int32).cpu().numpy()
                logp_mm.flush()
                ids_mm.flush()
            self._write_meta(e)  # only after the data is on disk
            if bar is not None:
                bar.update(e - b)
        if bar is not None:
            bar.close()

    def _write_meta(self, filled: int) -> None:
        atomic_write_json(self.meta_path, {
            "key": self.key, "filled_rows": filled, "rows": self.n_rows,
            "positions": self.n_positions, "top_k": self.top_k,
            "temperature": self.temperature, "bytes_per_token": self.bytes_per_token})

    @property
    def bytes_per_token(self) -> float:
        """Disk bytes per trained token: float16 log-prob + int32 id per kept entry."""
        return self.top_k * (2 + 4)

    @property
    def total_bytes(self) -> int:
        return self.n_positions * self.bytes_per_token

    # --- reading ----------------------------------------------------------------------------

    def open(self) -> "TopKCache":
        if self.filled_rows() < self.n_rows:
            raise DraftkitError(f"teacher cache {self.dir} is incomplete; rerun to finish it")
        self._logp, self._ids = self._arrays("r")
        return self

    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(p_logp_topk (N, k), ids (N, k)) for the masked positions of rows ``rows_idx``.

        The positions come out in the same order as ``tensor[mask]`` (row-major), since each
        row's trained positions were stored in order.
        """
        spans = [np.arange(int(self.offsets[i]), int(self.offsets[i + 1])) for i in rows_idx]
        flat = np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)
        return (torch.from_numpy(np.asarray(self._logp[flat], dtype=np.float32)),
                torch.from_numpy(np.asarray(self._ids[flat], dtype=np.int64)))


def default_cache_dir(key: str) -> Path:
    from draftkit.models.embedded import cache_root

    return cache_root() / "teacher" / key
