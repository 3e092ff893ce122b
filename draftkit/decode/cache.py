"""A preallocated KV cache with a position pointer per row (as gpt-fast does).

Keys and values for every layer live in one tensor sized for the longest sequence the batch
can reach. Row b's valid entries are positions [0, lengths[b]). Rolling back after a rejection
is moving the pointer: the rejected entries stay in memory and are overwritten by the next
write at those positions, and the causal mask (key position <= query position) never lets a
query see an entry beyond its own position. No tensor is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class StaticKVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: "torch.dtype", device: "torch.device | str"):
        import torch

        shape = (num_layers, batch, kv_heads, max_len, head_dim)  # (L, B, Hkv, S, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # the pointers
        self.max_len = max_len

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def rollback(self, lengths: "torch.Tensor") -> None:
        """Keep positions [0, lengths[b]) of each row. lengths: (B,). Moves pointers only."""
        self.lengths.copy_(lengths)

    def write(self, layer: int, k: "torch.Tensor", v: "torch.Tensor", index: "WriteIndex") -> None:
        """Store new keys/values. k, v: (B, Hkv, T, D) at positions index.positions (B, T)."""
        if index.uniform_start is not None:  # every row writes the same slots: a plain slice
            s = index.uniform_start
            self.k[layer, :, :, s:s + k.shape[2]] = k
            self.v[layer, :, :, s:s + k.shape[2]] = v
        else:  # rows at different positions: one scatter per tensor
            self.k[layer][index.rows, :, index.positions] = k.transpose(1, 2)
            self.v[layer][index.rows, :, index.positions] = v.transpose(1, 2)

    def view(self, layer: int, kv_len: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Keys and values of positions [0, kv_len): (B, Hkv, kv_len, D) views, no copy."""
        return self.k[layer, :, :, :kv_len], self.v[layer, :, :, :kv_len]


class WriteIndex:
    """Where a forward of T tokens per row writes, computed once and shared by all layers."""

    def __init__(self, start: "torch.Tensor", num_tokens: int, uniform_start: int | None):
        import torch

        # start: (B,) first position of each row's new tokens
        self.positions = start[:, None] + torch.arange(num_tokens, device=start.device)  # (B, T)
        self.rows = torch.arange(start.shape[0], device=start.device)[:, None].expand_as(
            self.positions)  # (B, T)
        self.uniform_start = uniform_start
