"""The target's distribution for each training position: online, or from a top-k cache on disk.

- :class:`OnlineTeacher` runs the target forward every step (exact, costs a target forward).
- :class:`TopKCache` runs the target once over the training rows and keeps, per trained
  position, the ``top_k`` log-probabilities (float16) and their token ids (int32) in
  memory-mapped files. Later epochs, and later runs with the same target, rows, ``top_k``
  and ``temperature``, read them instead of running the target; the losses add a tail bucket
  for the mass outside the top k (see :func:`draftkit.distill.losses.sparse_logprobs`).

Only positions with a loss (``loss_mask``) are stored, in row order, so the cache costs
``top_k * 6`` bytes per trained token, plus ``2 * hidden_size`` per tap when
``loss.hidden_weight`` matches hidden states too (draftkit/distill/hidden.py); a building run
killed mid-way resumes from the last finished batch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from draftkit.data import Rows, positions
from draftkit.distill.hidden import Tap, tapped
from draftkit.distill.losses import dense_logprobs
from draftkit.distill.reduced_head import head_logits
from draftkit.errors import DraftkitError
from draftkit.io import atomic_write_json, one_builder
from draftkit.models.embedded import cache_root
from draftkit.models.reduced_head import ReducedHead


class MaskedLM(torch.nn.Module):
    """Logits only where the loss is taken: the LM head over a large vocabulary is most of a
    small draft's cost, and prompt positions need none. Wrapping the model keeps DDP's hooks.

    ``taps``: hidden states to return beside the logits (draftkit/distill/hidden.py);
    ``head``: logits over a reduced head only (draftkit/distill/reduced_head.py).
    """

    def __init__(self, model: Any, taps: list[Tap] | None = None,
                 head: ReducedHead | None = None):
        super().__init__()
        self.model = model
        self.taps = tuple(taps or ())  # a tuple: the frozen norms stay out of the parameters
        self.head = head

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor,
                position_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # input_ids, mask, position_ids: (B, T) -> logits (N, V), or (N, |H|) over a reduced
        # head, at the N positions where mask is true, and the tapped streams there (N, P, H)
        # or None. Positions restarting inside a row keep packed examples apart (data/pack.py).
        out = self.model.get_decoder()(input_ids=input_ids, position_ids=position_ids,
                                       use_cache=False,  # no cache: see pack.py
                                       output_hidden_states=bool(self.taps))
        logits = head_logits(self.model, out.last_hidden_state[mask], self.head)
        return final_logits(self.model, logits), tapped(out.hidden_states, mask, list(self.taps))


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


class TeacherOut(NamedTuple):
    """The target at the trained positions of a batch, N of them."""

    logp: torch.Tensor  # (N, V) dense log-probs, or (N, k) those of the top-k ids
    ids: torch.Tensor | None  # (N, k) the top-k ids; None for a dense teacher
    hidden: torch.Tensor | None  # (N, P, H) the normed streams at the taps; None for no taps


class OnlineTeacher:
    """Log-probabilities of the target at ``temperature``, computed each step."""

    def __init__(self, model: Any, temperature: float, taps: list[Tap] | None = None):
        self.lm = MaskedLM(model, taps)
        self.temperature = temperature

    @torch.no_grad()
    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> TeacherOut:
        """Dense log-probs at the masked positions (and the tapped streams)."""
        logits, hidden = self.lm(input_ids, mask, position_ids)
        return TeacherOut(dense_logprobs(logits, self.temperature), None, hidden)


def cache_key(target_id: str, rows: Rows, top_k: int, temperature: float,
              hidden_layers: list[int] | None = None) -> str:
    h = hashlib.sha256()
    h.update(f"{target_id}|{top_k}|{temperature}|v2".encode())
    if hidden_layers:  # caches without hidden states keep their earlier keys
        h.update(f"|hidden{list(hidden_layers)}".encode())
    h.update(rows.input_ids.numpy().tobytes())
    h.update(rows.loss_mask.numpy().tobytes())
    h.update(positions(rows, slice(None)).numpy().tobytes())
    return h.hexdigest()[:16]


class TopKCache:
    """Top-k teacher log-probs of every trained position of ``rows``, on disk; with ``taps``,
    the target's normed streams there too (``hidden_size`` wide, float16)."""

    def __init__(self, directory: Path, rows: Rows, top_k: int, temperature: float, key: str,
                 taps: list[Tap] | None = None, hidden_size: int = 0):
        self.dir = Path(directory)
        self.top_k, self.temperature, self.key = top_k, temperature, key
        self.taps, self.hidden_size = list(taps or ()), hidden_size
        counts = rows.loss_mask.sum(1)  # trained positions per row
        # offsets[i]: where row i's positions start in the flat position arrays
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        self.n_positions = int(self.offsets[-1])
        self.n_rows = len(rows)
        self.meta_path = self.dir / "meta.json"

    # --- building ---------------------------------------------------------------------------

    def _arrays(self, mode: str) -> dict[str, np.memmap]:
        n = max(1, self.n_positions)
        files = {"logp.f16": (np.float16, (n, self.top_k)), "ids.i32": (np.int32, (n, self.top_k))}
        if self.taps:
            files["hidden.f16"] = (np.float16, (n, len(self.taps), self.hidden_size))
        if mode != "w+":  # files of an earlier build: a truncated one would fail deep in mmap
            for name, (dtype, shape) in files.items():
                path = self.dir / name
                want = int(np.prod(shape)) * np.dtype(dtype).itemsize
                have = path.stat().st_size if path.is_file() else None
                if have != want:
                    raise DraftkitError(
                        f"teacher cache {self.dir} is damaged ({name} has "
                        f"{'no file' if have is None else f'{have} bytes'}, expected {want}); "
                        f"delete {self.dir} and rerun to rebuild it")
        return {name: np.memmap(self.dir / name, dtype=dtype, mode=mode, shape=shape)
                for name, (dtype, shape) in files.items()}

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
        """Run the target over the rows not cached yet (resumes after a kill). Another run
        building the same cache (a cache is shared by runs of the same target and rows) is
        waited for, then its rows are used."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with one_builder(self.dir / "build.lock", f"teacher cache {self.dir}"):
            self._build(model, rows, batch_size, progress)

    def _build(self, model: Any, rows: Rows, batch_size: int, progress: bool) -> None:
        start = self.filled_rows()
        if start >= self.n_rows:
            return
        lm = MaskedLM(model, self.taps)
        dev = next(model.parameters()).device  # the rows live on the CPU, beside the files
        arrays = self._arrays("r+" if start > 0 else "w+")
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
                    logits, hidden = lm(rows.input_ids[b:e].to(dev), mask.to(dev),
                                        positions(rows, slice(b, e)).to(dev))
                    p_logp = dense_logprobs(logits, self.temperature)
                    top = p_logp.topk(self.top_k, dim=-1)  # (N, k)
                lo, hi = int(self.offsets[b]), int(self.offsets[e])
                arrays["logp.f16"][lo:hi] = top.values.to(torch.float16).cpu().numpy()
                arrays["ids.i32"][lo:hi] = top.indices.to(torch.int32).cpu().numpy()
                if hidden is not None:
                    arrays["hidden.f16"][lo:hi] = hidden.to(torch.float16).cpu().numpy()
                for array in arrays.values():
                    array.flush()
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
        """Disk bytes per trained token: float16 log-prob + int32 id per kept entry, and a
        float16 stream per tap."""
        return self.top_k * (2 + 4) + len(self.taps) * self.hidden_size * 2

    @property
    def total_bytes(self) -> int:
        return self.n_positions * self.bytes_per_token

    # --- reading ----------------------------------------------------------------------------

    def open(self) -> "TopKCache":
        if self.filled_rows() < self.n_rows:
            raise DraftkitError(f"teacher cache {self.dir} is incomplete; rerun to finish it")
        self._arrays_r = self._arrays("r")
        return self

    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> TeacherOut:
        """Top-k log-probs (N, k), their ids and the tapped streams (N, P, H) for the masked
        positions of rows ``rows_idx``.

        The positions come out in the same order as ``tensor[mask]`` (row-major), since each
        row's trained positions were stored in order.
        """
        spans = [np.arange(int(self.offsets[i]), int(self.offsets[i + 1])) for i in rows_idx]
        flat = np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)
        read = self._arrays_r

        def tensor(name: str, dtype: Any) -> torch.Tensor:
            return torch.from_numpy(np.asarray(read[name][flat], dtype=dtype))
        return TeacherOut(tensor("logp.f16", np.float32), tensor("ids.i32", np.int64),
                          tensor("hidden.f16", np.float32) if self.taps else None)


def default_cache_dir(key: str) -> Path:
    return cache_root() / "teacher" / key
