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

:class:`RowCache` is what it shares with the cache of an EAGLE-3 head's features
(draftkit/distill/features.py): spans of positions per row in memory-mapped files, keyed,
resumable, built by one run and read by all; :func:`build_teacher` picks a recipe's teacher.
Each shard of a cache (:data:`SHARD_ROWS` rows) has a content hash (``sha256.bin``), written
once it is built and checked before any run reads the cache: a shard damaged on disk (zeroed,
overwritten) is named and built again, never trained on.

Long: the cache's building, hashing and reading share its offsets, files and shards; apart they
would drift.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from draftkit.data import Rows, positions
from draftkit.distill.distributed import barrier
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


def _warn(line: str) -> None:
    print(f"draftkit: warning: {line}", file=sys.stderr, flush=True)


SHARD_ROWS = 64  # rows per hashed shard of a cache: sha256.bin holds 32 bytes per shard
HASHES = "sha256.bin"


class RowCache:
    """Spans of positions per row of a run's rows, in memory-mapped files under ``directory``:
    built once (a build killed mid-way resumes from its last finished batch; one builder at a
    time) and read back by row, by every run whose ``key`` matches, each shard of
    :data:`SHARD_ROWS` rows checked against its content hash first.

    ``counts`` (R,): positions kept per row, in row order. A subclass names its files
    (:meth:`files`), fills a batch of rows (:meth:`fill`) and records its settings in
    meta.json (:meth:`settings`)."""

    what = "cache"  # in messages: "teacher cache ... is damaged"

    def __init__(self, directory: Path, counts: torch.Tensor, key: str):
        self.dir, self.key = Path(directory), key
        # offsets[i]: where row i's positions start in the flat position arrays
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        self.n_positions = int(self.offsets[-1])
        self.n_rows = len(counts)
        self.meta_path = self.dir / "meta.json"
        self.n_shards = -(-self.n_rows // SHARD_ROWS)
        self._verified = False  # every shard checked in this process

    def files(self) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """File name -> (numpy dtype, shape of one position's entry)."""
        raise NotImplementedError

    def fill(self, arrays: dict[str, np.memmap], model: Any, rows: Rows, b: int, e: int
             ) -> None:
        """Write rows b..e-1's positions into ``arrays`` (from ``self.offsets[b]`` on)."""
        raise NotImplementedError

    def settings(self) -> dict:
        """What meta.json records beside the key and the counts."""
        return {}

    @property
    def bytes_per_token(self) -> float:
        """Disk bytes per kept position."""
        return sum(np.dtype(dtype).itemsize * int(np.prod(shape))
                   for dtype, shape in self.files().values())

    @property
    def total_bytes(self) -> int:
        return int(self.n_positions * self.bytes_per_token)

    # --- building ---------------------------------------------------------------------------

    def _arrays(self, mode: str) -> dict[str, np.memmap]:
        n = max(1, self.n_positions)
        files = {name: (dtype, (n, *shape)) for name, (dtype, shape) in self.files().items()}
        if mode != "w+":  # files of an earlier build: a truncated one would fail deep in mmap
            for name, (dtype, shape) in files.items():
                path = self.dir / name
                want = int(np.prod(shape)) * np.dtype(dtype).itemsize
                have = path.stat().st_size if path.is_file() else None
                if have != want:
                    raise DraftkitError(
                        f"{self.what} {self.dir} is damaged ({name} has "
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
            raise DraftkitError(self.mismatch(meta))
        return int(meta.get("filled_rows", 0))

    def mismatch(self, meta: dict) -> str:
        """The error for a cache in this one's place that was built for something else."""
        return (f"{self.what} {self.dir} belongs to other rows or settings; delete it or set "
                f"teacher.cache_dir elsewhere")

    def build(self, model: Any, rows: Rows, batch_size: int, progress: bool = True) -> None:
        """Run ``model`` over the rows not cached yet (resumes after a kill). Another run
        building the same cache (a cache is shared by runs of the same target and rows) is
        waited for, then its rows are used."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with one_builder(self.dir / "build.lock", f"{self.what} {self.dir}"):
            self._build(model, rows, batch_size, progress)

    def _build(self, model: Any, rows: Rows, batch_size: int, progress: bool) -> None:
        start = self.filled_rows()
        if start > 0 and not (self.dir / HASHES).is_file():
            _warn(f"{self.what} {self.dir} records no content hashes (built by an earlier "
                  f"draftkit); building it again")
            start = 0
        arrays = self._arrays("r+" if start > 0 else "w+")
        hashes = self._hashes("r+" if start > 0 else "w+")
        for shard in self._bad_shards(arrays, hashes, start):
            b, e = self._shard_rows(shard)
            _warn(f"{self.what} {self.dir}: rows {b}..{e - 1} (shard {shard}) do not match "
                  f"their content hash (damaged on disk); building them again")
            for bb in range(b, e, batch_size):
                ee = min(bb + batch_size, e)
                if self.offsets[ee] > self.offsets[bb]:
                    with torch.no_grad():
                        self.fill(arrays, model, rows, bb, ee)
            for array in arrays.values():
                array.flush()
            self._seal(arrays, hashes, shard)
        self._verified = True
        if start >= self.n_rows:
            return
        bar = None
        if progress:
            bar = tqdm(total=self.n_rows, initial=start, desc=self.what, unit="row",
                       dynamic_ncols=True)
        for b in range(start, self.n_rows, batch_size):
            e = min(b + batch_size, self.n_rows)
            if self.offsets[e] > self.offsets[b]:
                with torch.no_grad():
                    self.fill(arrays, model, rows, b, e)
                for array in arrays.values():
                    array.flush()
            for shard in range(b // SHARD_ROWS, self.n_shards):  # the shards this batch ends
                if self._shard_rows(shard)[1] > e:
                    break
                if self._shard_rows(shard)[1] > b:
                    self._seal(arrays, hashes, shard)
            self._write_meta(e)  # only after the data (and its shards' hashes) is on disk
            if bar is not None:
                bar.update(e - b)
        if bar is not None:
            bar.close()

    def _write_meta(self, filled: int) -> None:
        atomic_write_json(self.meta_path, {
            "key": self.key, "filled_rows": filled, "rows": self.n_rows,
            "positions": self.n_positions, **self.settings(),
            "bytes_per_token": self.bytes_per_token})

    def ready(self, model: Any, rows: Rows, batch_size: int, dist: Any,
              progress: bool = True) -> "RowCache":
        """Built by rank 0 if it is not on disk yet, then opened by every rank."""
        if dist.is_main:
            self.build(model, rows, batch_size, progress=progress)
        barrier(dist)
        return self.open()

    # --- reading ----------------------------------------------------------------------------

    def open(self) -> "RowCache":
        if self.filled_rows() < self.n_rows:
            raise DraftkitError(f"{self.what} {self.dir} is incomplete; rerun to finish it")
        self._arrays_r = self._arrays("r")
        if not self._verified:  # another rank's build, or a cache opened without building
            if not (self.dir / HASHES).is_file():
                raise DraftkitError(f"{self.what} {self.dir} records no content hashes (built "
                                    f"by an earlier draftkit); delete it and rerun to rebuild "
                                    f"it")
            bad = self._bad_shards(self._arrays_r, self._hashes("r"), self.n_rows)
            if bad:
                b, e = self._shard_rows(bad[0])
                raise DraftkitError(f"{self.what} {self.dir}: rows {b}..{e - 1} (shard "
                                    f"{bad[0]}) do not match their content hash (damaged on "
                                    f"disk); rerun to rebuild them, or delete {self.dir}")
            self._verified = True
        return self

    # --- content hashes ----------------------------------------------------------------------

    def _shard_rows(self, shard: int) -> tuple[int, int]:
        return shard * SHARD_ROWS, min((shard + 1) * SHARD_ROWS, self.n_rows)

    def _hashes(self, mode: str) -> np.memmap:
        """(shards, 32) sha256 of each shard's entries in every file, in ``sha256.bin``."""
        path = self.dir / HASHES
        shape = (max(1, self.n_shards), 32)
        if mode != "w+" and (not path.is_file() or path.stat().st_size != 32 * shape[0]):
            raise DraftkitError(f"{self.what} {self.dir} is damaged ({HASHES} is not "
                                f"{32 * shape[0]} bytes); delete {self.dir} and rerun to "
                                f"rebuild it")
        return np.memmap(path, dtype=np.uint8, mode=mode, shape=shape)

    def _digest(self, arrays: dict[str, np.memmap], shard: int) -> bytes:
        b, e = self._shard_rows(shard)
        lo, hi = int(self.offsets[b]), int(self.offsets[e])
        h = hashlib.sha256()
        for name in sorted(arrays):
            h.update(name.encode())
            h.update(np.ascontiguousarray(arrays[name][lo:hi]).data)
        return h.digest()

    def _seal(self, arrays: dict[str, np.memmap], hashes: np.memmap, shard: int) -> None:
        hashes[shard] = np.frombuffer(self._digest(arrays, shard), dtype=np.uint8)
        hashes.flush()

    def _bad_shards(self, arrays: dict[str, np.memmap], hashes: np.memmap, filled: int
                    ) -> list[int]:
        """The shards wholly among the first ``filled`` rows whose entries no longer match
        their hash."""
        return [s for s in range(self.n_shards) if self._shard_rows(s)[1] <= filled and
                bytes(hashes[s]) != self._digest(arrays, s)]

    def read(self, name: str, rows_idx: torch.Tensor) -> np.ndarray:
        """File ``name``'s entries for rows ``rows_idx``, row after row, each row's positions
        in order."""
        spans = [np.arange(int(self.offsets[i]), int(self.offsets[i + 1])) for i in rows_idx]
        flat = np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)
        return np.asarray(self._arrays_r[name][flat])


class TopKCache(RowCache):
    """Top-k teacher log-probs of every trained position of ``rows``, on disk; with ``taps``,
    the target's normed streams there too (``hidden_size`` wide, float16)."""

    what = "teacher cache"

    def __init__(self, directory: Path, rows: Rows, top_k: int, temperature: float, key: str,
                 taps: list[Tap] | None = None, hidden_size: int = 0):
        super().__init__(directory, rows.loss_mask.sum(1), key)  # trained positions per row
        self.top_k, self.temperature = top_k, temperature
        self.taps, self.hidden_size = list(taps or ()), hidden_size

    def files(self) -> dict[str, tuple[Any, tuple[int, ...]]]:
        # float16 log-prob + int32 id per kept entry, and a float16 stream per tap
        files = {"logp.f16": (np.float16, (self.top_k,)), "ids.i32": (np.int32, (self.top_k,))}
        if self.taps:
            files["hidden.f16"] = (np.float16, (len(self.taps), self.hidden_size))
        return files

    def settings(self) -> dict:
        return {"top_k": self.top_k, "temperature": self.temperature}

    def fill(self, arrays: dict[str, np.memmap], model: Any, rows: Rows, b: int, e: int
             ) -> None:
        dev = next(model.parameters()).device  # the rows live on the CPU, beside the files
        mask = rows.loss_mask[b:e]
        logits, hidden = MaskedLM(model, self.taps)(rows.input_ids[b:e].to(dev), mask.to(dev),
                                                    positions(rows, slice(b, e)).to(dev))
        top = dense_logprobs(logits, self.temperature).topk(self.top_k, dim=-1)  # (N, k)
        lo, hi = int(self.offsets[b]), int(self.offsets[e])
        arrays["logp.f16"][lo:hi] = top.values.to(torch.float16).cpu().numpy()
        arrays["ids.i32"][lo:hi] = top.indices.to(torch.int32).cpu().numpy()
        if hidden is not None:
            arrays["hidden.f16"][lo:hi] = hidden.to(torch.float16).cpu().numpy()

    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> TeacherOut:
        """Top-k log-probs (N, k), their ids and the tapped streams (N, P, H) for the masked
        positions of rows ``rows_idx``.

        The positions come out in the same order as ``tensor[mask]`` (row-major), since each
        row's trained positions were stored in order.
        """
        def tensor(name: str, dtype: Any) -> torch.Tensor:
            return torch.from_numpy(self.read(name, rows_idx).astype(dtype))
        return TeacherOut(tensor("logp.f16", np.float32), tensor("ids.i32", np.int64),
                          tensor("hidden.f16", np.float32) if self.taps else None)


def cache_dir(cfg: Any, key: str, kind: str = "teacher") -> Path:
    """Where the cache ``key`` lives: under ``teacher.cache_dir``, else the draftkit cache's
    ``kind`` folder, shared by every run that builds the same one."""
    return Path(cfg.teacher.cache_dir) / key if cfg.teacher.cache_dir else \
        cache_root() / kind / key


def build_teacher(cfg: Any, target: Any, key: str, rows: Rows, dist: Any, progress: bool,
                  taps: list[Tap] | None = None) -> "OnlineTeacher | TopKCache":
    """The recipe's teacher: online, or the top-k cache for the target named by ``key``
    (trainer.target_id), built by rank 0 if it is not on disk yet."""
    if cfg.teacher.mode == "online" or cfg.loss.divergence == "ce":  # ce reads no teacher
        return OnlineTeacher(target, cfg.loss.temperature, taps)
    text = target.config.get_text_config()
    if cfg.teacher.top_k > text.vocab_size:
        raise DraftkitError(f"teacher.top_k={cfg.teacher.top_k} is more than the target's "
                            f"{text.vocab_size} tokens; lower it (or use teacher.mode=online)")
    layers = [layer for layer, _ in taps or ()]
    cache_id = cache_key(key, rows, cfg.teacher.top_k, cfg.loss.temperature, layers)
    cache = TopKCache(cache_dir(cfg, cache_id), rows, cfg.teacher.top_k, cfg.loss.temperature,
                      cache_id, taps, text.hidden_size)
    return cache.ready(target, rows, cfg.eval.batch_size, dist, progress)


def caches_of(source: Any) -> list[RowCache]:
    """The on-disk caches a teacher reads (none for an online one)."""
    if isinstance(source, RowCache):
        return [source]
    return list(getattr(source, "caches", []))
