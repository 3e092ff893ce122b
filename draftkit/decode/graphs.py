"""CUDA graphs of the decoding forwards: captured once per shape, replayed every round.

At batch 1 a decoding step of a 1B model launches hundreds of small kernels, and on a GPU the
time to launch them from Python exceeds the time to run them: the step is launch-bound, far
above the time to read the weights once. A CUDA graph records the kernels of one forward and
replays them with one launch, which is how static-cache decoders approach the memory floor
(gpt-fast captures its one-token step with ``torch.compile(mode="reduce-overhead")``). A graph
replays fixed shapes on fixed buffers, so the forward it records
(:meth:`~draftkit.decode.runners.LlamaRunner.static_forward`) is static:

- the batch is a bucket: the live rows sit at their own cache rows in a batch of the first B
  cache rows, B the smallest bucket (a power of two, or the cache's whole batch) that holds
  them; every other row is padding that writes only the cache's scratch position and leaves
  its pointer alone, so its cache stays as it was;
- attention spans a fixed key length under a mask built on the device from the positions, so
  it does not grow with every token: a bucket too, the smallest power of two from
  ``MIN_KEYS`` (or the whole cache) that holds the positions written, so a step reads at most
  about twice the keys it needs however long the cache a server sized for its context;
- inputs are copied into the graph's own buffers before a replay (tokens, start positions),
  and nothing inside reads a value back to the host.

A shape is captured on its second call (the first runs eagerly, so one-off shapes such as a
catch-up of some width cost no capture), per runner: the target's one-token step and its
(K + 1)-token verify, the draft's steps, each per batch bucket. Prefill (long, ragged prompts)
stays eager. Capturing needs a CUDA device; on a CPU, with ``DRAFTKIT_CUDA_GRAPHS=0`` or where
a capture fails, the runner runs its eager forward and says why (``runner.last_path``,
``runner.last_reason``, counted per round in :class:`~draftkit.decode.stats.DecodeStats`).
"""

from __future__ import annotations

import os
import sys

import torch

from draftkit.decode.k import K_MAX

ENV = "DRAFTKIT_CUDA_GRAPHS"  # 0 / off: eager everywhere
GRAPH = "cuda-graph"
EAGER = "eager"
MAX_TOKENS = K_MAX + 1  # the longest decoding forward: a verify at K_MAX
MAX_GRAPHS = 64  # per runner; shapes beyond run eagerly
MIN_KEYS = 256  # the shortest key length a graph attends over
WARMUP = 2  # eager runs on a side stream before capture, as CUDA graph capture asks


def eager_reason(device: "torch.device") -> str | None:
    """Why decoding on ``device`` cannot use CUDA graphs; None where it can."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return f"turned off ({ENV}={os.environ[ENV]})"
    if device.type != "cuda":
        return f"the model is on {device.type}: CUDA graphs need a CUDA device"
    return None


def buckets(slots: int) -> list[int]:
    """The batch sizes graphs are captured at for a cache of ``slots`` rows."""
    out, b = [], 1
    while b < slots:
        out.append(b)
        b *= 2
    return out + [slots]


def bucket(rows_needed: int, slots: int) -> int:
    """The smallest bucket holding cache rows [0, rows_needed)."""
    return next(b for b in buckets(slots) if b >= rows_needed)


def key_bucket(keys_needed: int, cache_len: int) -> int:
    """The key length a static forward attends over: keys [0, keys_needed) are written."""
    n = MIN_KEYS
    while n < keys_needed:
        n *= 2
    return min(n, cache_len)


def pad(tokens: "torch.Tensor", start: list[int], rows: list[int] | None, size: int,
        pad_position: int) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """The live rows placed in a bucket of ``size`` cache rows: tokens (B, T) and start (B,),
    each input row at its cache row, the others padding (token 0 at ``pad_position``); and the
    index (b,) of the live rows in it."""
    dev = tokens.device
    b, t = tokens.shape
    take = torch.tensor(rows if rows is not None else list(range(b)), device=dev)
    padded = torch.zeros(size, t, dtype=tokens.dtype, device=dev)
    padded[take] = tokens
    starts = torch.full((size,), pad_position, dtype=torch.long, device=dev)
    starts[take] = torch.tensor(start, device=dev)
    return padded, starts, take


def forward_path(runner) -> tuple[str, str | None]:
    """How ``runner``'s last forward ran: (``cuda-graph`` or ``eager``, why eager)."""
    path = getattr(runner, "last_path", EAGER)
    why = getattr(runner, "last_reason", f"{type(runner).__name__} has no CUDA-graph path")
    return path, (None if path == GRAPH else why)


class StaticForward:
    """One static shape of a runner's forward: its input buffers, and the CUDA graph that
    replays it (``capture``), or the same static forward run eagerly (no GPU: what the
    padding and the static shapes do is tested on a CPU this way)."""

    def __init__(self, runner, size: int, tokens: int, last: bool, kv_len: int, capture: bool,
                 pool=None):
        dev = runner.param.device
        self.runner, self.last, self.kv_len = runner, last, kv_len
        self.tokens = torch.zeros(size, tokens, dtype=torch.long, device=dev)
        self.start = torch.full((size,), runner.cache.pad_position, dtype=torch.long,
                                device=dev)
        self.graph = None
        self.out: tuple["torch.Tensor", "torch.Tensor | None"] | None = None
        self.capture, self.pool = capture, pool

    def __call__(self, tokens: "torch.Tensor", start: "torch.Tensor"
                 ) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        self.tokens.copy_(tokens)
        self.start.copy_(start)
        if not self.capture:
            return self.runner.static_forward(self.tokens, self.start, self.last, self.kv_len)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.out

    def _capture(self) -> None:
        """Warm up on a side stream, then record (CUDA only). The warm-up runs are real
        forwards on the real inputs: they write the same keys and values the replay writes."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.runner.static_forward(self.tokens, self.start, self.last, self.kv_len)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.out = self.runner.static_forward(self.tokens, self.start, self.last, self.kv_len)
        self.graph = graph


class DecodeGraphs:
    """A runner's static forwards, keyed by (batch bucket, tokens per row, last position only,
    the layers whose features it captures, key bucket), for the cache the runner holds now.

    ``capture``: None decides by the device (:func:`eager_reason`); False with ``static``
    runs the static forward eagerly on every decoding shape (how a CPU test exercises the
    padding without a GPU)."""

    def __init__(self, runner, capture: bool | None = None, static: bool | None = None):
        self.runner = runner
        self.reason = eager_reason(runner.param.device) if capture is None else (
            None if capture else "capture turned off")
        self.capture = self.reason is None
        self.static = self.capture if static is None else static
        self.forwards: dict[tuple, StaticForward] = {}
        self.seen: dict[tuple, int] = {}
        self.failed: dict[tuple, str] = {}
        self.pool = None

    @property
    def path(self) -> str:
        return GRAPH if self.capture else EAGER

    def clear(self) -> None:
        """Forget every graph (the cache they were captured over is gone)."""
        self.forwards.clear()
        self.seen.clear()
        self.failed.clear()

    def forward(self, tokens: "torch.Tensor", start: list[int], last: list[int] | None,
                rows: list[int] | None) -> "torch.Tensor | None":
        """The logits of a decoding shape from its static forward, or None (run eagerly; the
        runner's ``last_reason`` says why)."""
        key, why = self._key(tokens, start, last, rows)
        if key is None:
            self.runner.last_reason = why
            return None
        fwd = self.forwards.get(key) or self._make(key)
        if fwd is None:
            return None
        size = key[0]
        padded, starts, take = pad(tokens, start, rows, size, self.runner.cache.pad_position)
        try:
            logits, aux = fwd(padded, starts)
        except RuntimeError as e:  # a capture CUDA refused: this shape stays eager
            if fwd.graph is not None or not fwd.capture:
                raise
            return self._give_up(key, f"capture failed ({str(e).splitlines()[0]})")
        self.runner.aux = None if aux is None else aux.index_select(0, take)
        self.runner.last_path = GRAPH if fwd.capture else EAGER
        self.runner.last_reason = None if fwd.capture else self.reason
        return logits.index_select(0, take)  # a copy: the buffer is rewritten next replay

    def _key(self, tokens, start, last, rows) -> tuple[tuple | None, str | None]:
        if not self.static:
            return None, self.reason
        cache, (b, t) = self.runner.cache, tokens.shape
        if t > MAX_TOKENS:
            return None, "not a decoding shape (prefill or a long catch-up)"
        if last is not None and any(i != t - 1 for i in last):
            return None, "not a decoding shape (ragged prompts)"
        if cache is None or max(start) + t > cache.max_len:
            return None, "beyond the cache"
        needed = (max(rows) if rows is not None else b - 1) + 1
        capture = tuple(self.runner.capture) if self.runner.capture else None
        keys = key_bucket(max(start) + t, cache.k.shape[3])
        return (bucket(needed, cache.batch), t, last is not None, capture, keys), None

    def _make(self, key: tuple) -> StaticForward | None:
        if key in self.failed:
            self.runner.last_reason = self.failed[key]
            return None
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.capture and self.seen[key] < 2:
            self.runner.last_reason = "first call at this shape (captured on the next)"
            return None
        if len(self.forwards) >= MAX_GRAPHS:
            self.runner.last_reason = f"more than {MAX_GRAPHS} shapes captured"
            return None
        if self.capture and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()  # the runner's graphs share memory
        size, t, last, _, keys = key
        fwd = StaticForward(self.runner, size, t, last, keys, self.capture, self.pool)
        self.forwards[key] = fwd
        return fwd

    def _give_up(self, key: tuple, why: str) -> None:
        del self.forwards[key]
        self.failed[key] = why
        self.runner.last_reason = why
        print(f"draftkit: CUDA graph at batch {key[0]}, {key[1]} tokens: {why}; running eagerly",
              file=sys.stderr)
        return None
