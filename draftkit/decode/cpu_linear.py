"""Linear layers for decoding on CPU: x @ W^T in the layout that is fastest for few rows.

Decoding multiplies a few rows (1 for a plain step, K + 1 to verify, times the batch) by weights
streamed from memory, and the speed there depends on the operand layout: ``F.linear(x, W)``,
``x @ W^T`` with W^T stored contiguous or ``W @ x^T`` (all MKL), or oneDNN's matmul over W
reordered once. Which one wins depends on the CPU and the MKL build, not only on the shape.
On one 2-core AVX-512 machine the layout that read fastest for 1 row was among the slowest for
2, enough to price every K out of ``--k auto`` (the figures:
eval/results/notes/2026-12-01-reduced-head-and-cpu-decoder.md).

So :func:`tune` measures: for each row count 1..``MAX_ROWS`` (and the wider buckets below) and
each form, one pass over a model's weights in model order (so each weight streams from memory
as in a forward; the first ``SAMPLE_BYTES`` of them, plus the first of any shape not yet seen,
such as the head), and keeps per weight shape and row count the fastest of three interleaved
rounds, unless the fixed choice is within ``MARGIN`` of it (so clock noise alone never moves off
a known-good form). Models under ``MIN_TUNE_BYTES`` fit in cache, where the layout matters
little; they keep the fixed choice, which also keeps the tiny models of the tests deterministic.

A wider product can be faster than a narrower one (verifying 2 tokens has read cheaper than a
plain step), so plain decoding would leave speed on the table and a measured speedup would be
partly the kernel's, not the draft's. So a row count whose fastest form is slower than a wider
row count's (by ``MARGIN``) is padded with zero rows to that one (``pad``): plain decoding is as
fast as this engine can compute one token.

Wider products (a batch's verify, B (K + 1) rows; a prefill) are not left to ``F.linear`` on
the belief that MKL blocks them well: on some CPUs it does not, and a 9-token verify then cost
twice an 8-token one (eval/results/notes/2026-12-07-wide-products.md). So row counts past
``MAX_ROWS`` are measured too, in buckets (``WIDE_ROWS``): a product takes the form of the
smallest bucket it fits, the widest bucket's beyond it, and ``F.linear`` stays their fixed
choice, left only for a clear gain. The buckets time the two blocked products, ``F.linear`` and
oneDNN's (``WIDE_FORMS``): the matrix-vector layouts are for few rows, and two forms at two
bucket sizes keep the runner's set-up short. Results are kept per process, keyed by the shapes,
dtype and thread count, so a second runner over the same model does not measure again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from draftkit.models.reduced_head import ReducedHead

MAX_ROWS = 8  # row counts measured one by one
WIDE_ROWS = (16, 32)  # wider products, measured as buckets (:func:`bucket`)
WIDE_FORMS = ("linear", "onednn")  # the forms a bucket times: the blocked products
MEASURED_ROWS = (*range(1, MAX_ROWS + 1), *WIDE_ROWS)
MIN_TUNE_BYTES = 32 * 2**20  # weights this large stream from memory rather than cache
SAMPLE_BYTES = 128 * 2**20  # weights timed: layers repeat their shapes, a prefix stands for all
MARGIN = 0.05  # a timed form replaces the fixed choice only if this much faster
FORMS = ("linear", "x@wt", "w@xt", "onednn")

# model key -> (shape -> rows -> form, shape -> rows -> the wider row count it pads to)
_tuned: dict[tuple, tuple[dict[tuple, dict[int, str]], dict[tuple, dict[int, int]]]] = {}


def bucket(rows: int) -> int:
    """The measured row count whose form a product of ``rows`` rows takes: itself up to
    ``MAX_ROWS``, then the smallest of ``WIDE_ROWS`` it fits, the widest beyond them."""
    if rows <= MAX_ROWS:
        return rows
    return next((b for b in WIDE_ROWS if rows <= b), WIDE_ROWS[-1])


class DecodeLinear:
    """One weight (out, in) with an optional bias, multiplied in the form chosen per row count.

    On CPU, keeps a contiguous W^T beside W (one extra copy) for out >= in, where the 1-row
    matrix-vector path needs it, and drops it after tuning if no row count chose it. Off CPU
    every row count takes ``F.linear``."""

    def __init__(self, w: "torch.Tensor", b: "torch.Tensor | None" = None):
        self.w, self.b = w.contiguous(), b  # w: (out, in)
        self.packed = None  # W reordered for oneDNN: made only to be timed (:func:`tune`)
        layouts = w.device.type == "cpu" and self.w.shape[0] >= self.w.shape[1]
        self.wt = self.w.t().contiguous() if layouts else None  # (in, out)
        # the fixed choice, measured on the first machine (module docstring); off CPU, and for
        # wider products, F.linear
        self.forms = {rows: ("x@wt" if rows == 1 else "w@xt")
                      if layouts and rows <= MAX_ROWS else "linear" for rows in MEASURED_ROWS}
        self.pad: dict[int, int] = {}  # rows -> a wider row count whose product is faster

    @classmethod
    def fused(cls, *linears, head: "ReducedHead | None" = None) -> "DecodeLinear":
        """One weight for several ``nn.Linear`` that read the same input (q/k/v, gate/up):
        their rows stacked, so one larger matmul replaces several small ones. ``head``: keep
        only a reduced head's rows, (V, D) -> (N, D)."""
        w = torch.cat([m.weight.detach() for m in linears], dim=0)  # (out, in)
        biases = [m.bias for m in linears]
        b = None if all(x is None for x in biases) else torch.cat(
            [x.detach() if x is not None else torch.zeros(m.out_features, dtype=w.dtype,
                                                          device=w.device)
             for x, m in zip(biases, linears)])
        if head is not None:
            w, b = head.restrict(w, dim=0), None if b is None else head.restrict(b, dim=0)
        return cls(w, b)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    def available(self) -> tuple[str, ...]:
        return tuple(f for f in FORMS if (f != "x@wt" or self.wt is not None)
                     and (f != "onednn" or self.packed is not None))

    def pack(self) -> None:
        """Reorder W for oneDNN's matmul (a private op of torch, used by its CPU compiler, so
        the form is offered only where this torch has it and it runs)."""
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.w, None)
            self._apply("onednn", self.w.new_zeros(1, self.w.shape[1]))
        except (AttributeError, RuntimeError):
            self.packed = None

    def _apply(self, form: str, x2: "torch.Tensor") -> "torch.Tensor":
        """x2: (rows, in) -> (rows, out) in the given form."""
        if form == "x@wt":
            return torch.matmul(x2, self.wt)
        if form == "w@xt":  # contiguous: a transposed view would reach attention with
            # stride(-1) = rows, which CPU flash attention refuses (the math path is ~4x slower)
            return torch.matmul(self.w, x2.t()).t().contiguous()
        if form == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x2, self.packed, None, "none", [], "")
        return F.linear(x2, self.w)

    def __call__(self, x: "torch.Tensor") -> "torch.Tensor":
        """x: (..., in) -> (..., out)."""
        rows = x.numel() // x.shape[-1]
        wide = self.pad.get(rows, rows)
        form = self.forms.get(bucket(wide), "linear")
        if form == "linear" and wide == rows:  # any shape, bias fused: the only form off CPU
            return F.linear(x, self.w, self.b)
        x2 = x.reshape(rows, -1)
        if wide > rows:  # zero rows up to the faster width; their outputs are dropped
            x2 = F.pad(x2, (0, 0, 0, wide - rows))  # one copy, not zeros then a cat
        y = self._apply(form, x2)[:rows]
        y = y.reshape(*x.shape[:-1], self.w.shape[0])
        return y if self.b is None else y + self.b

    def set_forms(self, forms: dict[int, str], pad: dict[int, int] | None = None) -> None:
        """Use these forms (and pad these row counts); make what they need, drop what no row
        count uses."""
        self.forms, self.pad = dict(forms), dict(pad or {})
        if "onednn" in self.forms.values() and self.packed is None:
            self.pack()
            if self.packed is None:  # cannot happen where the form was measured; stay safe
                self.forms = {r: "linear" if f == "onednn" else f for r, f in self.forms.items()}
        if self.packed is not None and "onednn" not in self.forms.values():
            self.packed = None
        if self.wt is not None and "x@wt" not in self.forms.values():
            self.wt = None


def tune(linears: list[DecodeLinear], reps: int = 3, min_bytes: int | None = None) -> bool:
    """Choose each weight shape's form per row count by timing (module docstring). Returns
    whether it measured (False off CPU or for weights under ``min_bytes``, default
    ``MIN_TUNE_BYTES``, where the fixed choice stays)."""
    if not linears or linears[0].w.device.type != "cpu":
        return False
    floor = MIN_TUNE_BYTES if min_bytes is None else min_bytes
    if sum(lin.w.nbytes for lin in linears) < floor:
        return False
    key = (tuple(lin.shape for lin in linears), linears[0].w.dtype, torch.get_num_threads())
    if key not in _tuned:
        _tuned[key] = _measure(_sample(linears), reps)
    forms, pads = _tuned[key]
    for lin in linears:
        lin.set_forms(forms[lin.shape], pads[lin.shape])
    return True


def _sample(linears: list[DecodeLinear]) -> list[DecodeLinear]:
    """The first ``SAMPLE_BYTES`` of weights in model order, and the first of every shape."""
    out, seen, total = [], set(), 0
    for lin in linears:
        if total < SAMPLE_BYTES or lin.shape not in seen:
            out.append(lin)
            seen.add(lin.shape)
            total += lin.w.nbytes
    return out


def _measure(linears: list[DecodeLinear], reps: int
             ) -> tuple[dict[tuple, dict[int, str]], dict[tuple, dict[int, int]]]:
    dtype = linears[0].w.dtype
    inputs = {n: torch.randn(MEASURED_ROWS[-1], n, dtype=dtype)
              for n in {lin.shape[1] for lin in linears}}
    fixed = {lin.shape: lin.forms for lin in linears}
    for lin in linears:
        lin.pack()
    best: dict[tuple, dict[int, str]] = {shape: {} for shape in fixed}
    took: dict[tuple, dict[int, float]] = {shape: {} for shape in fixed}  # the chosen form's
    with torch.no_grad():
        for rows in MEASURED_ROWS:
            seconds: dict[tuple, dict[str, float]] = {shape: {} for shape in fixed}
            for _ in range(reps):
                for form in (FORMS if rows <= MAX_ROWS else WIDE_FORMS):  # interleaved, so a
                    # drift in the machine's speed reaches every form alike
                    spent: dict[tuple, float] = {}
                    for lin in linears:  # model order: each weight arrives from memory
                        if form not in lin.available():
                            continue
                        start = time.perf_counter()
                        lin._apply(form, inputs[lin.shape[1]][:rows])
                        spent[lin.shape] = spent.get(lin.shape, 0.0) + time.perf_counter() - start
                    for shape, s in spent.items():  # the fastest of the reps
                        seconds[shape][form] = min(seconds[shape].get(form, s), s)
            for shape, by_form in seconds.items():
                form = min(by_form, key=by_form.get)
                default = fixed[shape][rows]  # leave the fixed choice only for a clear gain
                if by_form[form] > (1 - MARGIN) * by_form.get(default, float("inf")):
                    form = default
                best[shape][rows] = form
                took[shape][rows] = by_form[form]
    # padding within the row counts measured one by one: a bucket stands for many counts
    return best, {shape: _pads({r: s for r, s in t.items() if r <= MAX_ROWS})
                  for shape, t in took.items()}


def _pads(took: dict[int, float]) -> dict[int, int]:
    """Row counts whose product is clearly slower than a wider one's: rows -> that width
    (the fastest wider one)."""
    pads = {}
    for rows, t in took.items():
        wider = [r for r in took if r > rows]
        if wider:
            fastest = min(wider, key=took.get)
            if took[fastest] < (1 - MARGIN) * t:
                pads[rows] = fastest
    return pads
