"""A preallocated KV cache with a position pointer per row (as gpt-fast does).

Keys and values for every layer live in one tensor sized for the longest sequence the batch
can reach. Row b's valid entries are positions [0, lengths[b]). Rolling back after a rejection
is moving the pointer: the rejected entries stay in memory and are overwritten by the next
write at those positions, and the causal mask (key position <= query position) never lets a
query see an entry beyond its own position. No tensor is copied.

A forward may touch only some rows (the slots a server is decoding, or the one it is
prefilling): :class:`WriteIndex` names them. A contiguous run of rows is a slice (no copy);
any other set is gathered for attention, which copies those rows' keys and values once per
layer, and written back by scatter.

One position past ``max_len`` is scratch (``pad_position``): the rows a static-shape forward
(:mod:`draftkit.decode.graphs`) adds to fill its batch bucket write there, and every real
query's causal mask hides it.
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: "torch.dtype", device: "torch.device | str"):
        shape = (num_layers, batch, kv_heads, max_len + 1, head_dim)  # (L, B, Hkv, S + 1, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # the pointers
        self.max_len = max_len
        self.pad_position = max_len  # scratch: padding rows write here, no query reads it

    def head(self, rows: int) -> "StaticKVCache":
        """Rows [0, rows) as a cache of their own: views of the same storage, no copy."""
        view = object.__new__(StaticKVCache)
        view.k, view.v, view.lengths = self.k[:, :rows], self.v[:, :rows], self.lengths[:rows]
        view.max_len, view.pad_position = self.max_len, self.pad_position
        return view

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def rollback(self, lengths: "torch.Tensor") -> None:
        """Keep positions [0, lengths[b]) of each row. lengths: (B,). Moves pointers only."""
        self.lengths.copy_(lengths)

    def write(self, layer: int, k: "torch.Tensor", v: "torch.Tensor", index: "WriteIndex") -> None:
        """Store new keys/values. k, v: (b, Hkv, T, D) for the b rows the index names, at
        positions index.positions (b, T)."""
        if index.uniform_start is not None and index.span is not None:  # a plain slice
            s, r = index.uniform_start, index.span
            self.k[layer, r, :, s:s + k.shape[2]] = k
            self.v[layer, r, :, s:s + k.shape[2]] = v
        else:  # rows at different positions (or scattered rows): one scatter per tensor
            self.k[layer][index.rows, :, index.positions] = k.transpose(1, 2)
            self.v[layer][index.rows, :, index.positions] = v.transpose(1, 2)

    def view(self, layer: int, kv_len: int, index: "WriteIndex | None" = None
             ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Keys and values of positions [0, kv_len) of the index's rows (all rows without
        one): (b, Hkv, kv_len, D); views for a contiguous run of rows, a gathered copy else."""
        if index is None or index.span is not None:
            r = slice(None) if index is None else index.span
            return self.k[layer, r, :, :kv_len], self.v[layer, r, :, :kv_len]
        sel = index.row_ids
        return (self.k[layer, :, :, :kv_len].index_select(0, sel),
                self.v[layer, :, :, :kv_len].index_select(0, sel))


class WriteIndex:
    """Where a forward of T tokens per row writes, computed once and shared by all layers.

    ``rows``: the cache rows the b input rows are (None = all rows, in order). ``limit``: a
    position no row's real tokens reach; padding that would run past it is written there
    instead (rows padded to a batch's longest input, near the end of the cache).
    """

    def __init__(self, start: "torch.Tensor", num_tokens: int, uniform_start: int | None,
                 rows: list[int] | None = None, limit: int | None = None):
        dev = start.device
        # start: (b,) first position of each row's new tokens
        self.positions = start[:, None] + torch.arange(num_tokens, device=dev)  # (b, T)
        if limit is not None:
            self.positions = self.positions.clamp(max=limit)
        b = start.shape[0]
        if rows is None:
            self.span: slice | None = slice(None)
            self.row_ids = torch.arange(b, device=dev)
        else:
            first = rows[0]
            contiguous = rows == list(range(first, first + b))
            self.span = slice(first, first + b) if contiguous else None
            self.row_ids = torch.tensor(rows, device=dev)  # (b,)
        self.rows = self.row_ids[:, None].expand_as(self.positions)  # (b, T)
        self.uniform_start = uniform_start
