"""The runner of an EAGLE-3 head: its one decoder layer over a static KV cache.

The head (:class:`~draftkit.models.eagle3.Eagle3Draft`, arXiv 2503.01840) drafts from the
target's own features, which the target's runner leaves in ``runner.aux`` on each verify pass
(:mod:`draftkit.decode.runners`); this runner keeps the head's keys and values, rolled back by
position like the target's cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftkit.decode.cache import StaticKVCache, WriteIndex
from draftkit.decode.runners import sdpa_backends

if TYPE_CHECKING:
    import torch


class Eagle3Runner:
    """An EAGLE-3 head (:class:`~draftkit.models.eagle3.Eagle3Draft`) over a one-layer
    :class:`~draftkit.decode.cache.StaticKVCache`, rolled back by position like the target's.

    It reads (hidden, token) pairs, not tokens: draft position t reads the hidden state after
    token t (the target's fused feature, or the head's own output at position t - 1) and token
    t + 1, and scores token t + 2. With one layer, a position's keys and values depend on its
    own inputs only, so positions whose output nobody needs are only written (:meth:`feed`),
    and :meth:`forward` computes the output at one position per row.

    Rows padded to a batch's longest input write their padding at the following positions,
    which no query sees before they are written again; padding that would run past the cache
    lands on its last position, which no row's real tokens reach (the round margin).
    """

    supports_rows = True

    def __init__(self, model):
        self.model = model
        layer = model.midlayer
        self.num_heads, self.kv_heads, self.head_dim = (layer.num_heads, layer.kv_heads,
                                                        layer.head_dim)
        self.param = model.fc.weight
        self.head = model.reduced_head.to(self.param.device)  # the draft vocabulary: N of V
        self.cache: StaticKVCache | None = None

    def reset(self, batch: int, max_len: int) -> None:
        if self.cache is None or self.cache.batch != batch or self.cache.max_len < max_len:
            self.cache = StaticKVCache(1, batch, self.kv_heads, max_len, self.head_dim,
                                       self.param.dtype, self.param.device)
        self.cache.lengths.zero_()

    def feed(self, hidden: "torch.Tensor", tokens: "torch.Tensor", start: list[int],
             rows: list[int] | None = None) -> None:
        """Write the keys and values of hidden (b, T, H) with tokens (b, T) at positions
        start[b] + t of cache row rows[b]."""
        self._write(hidden, tokens, start, rows)

    def forward(self, hidden: "torch.Tensor", tokens: "torch.Tensor", start: list[int],
                last: list[int], rows: list[int] | None = None
                ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """:meth:`feed`, then the head's output at index last[b] of each row: logits (b, V)
        over the draft vocabulary (-inf elsewhere) and the layer output h (b, H)."""
        import torch
        import torch.nn.functional as F

        q, index = self._write(hidden, tokens, start, rows)
        b, dev = tokens.shape[0], tokens.device
        pick = (torch.arange(b, device=dev), torch.tensor(last, device=dev))
        q = q[pick[0], :, pick[1]][:, :, None]  # (b, nh, 1, hd)
        kv_len = max(s + i for s, i in zip(start, last)) + 1
        keys = torch.arange(kv_len, device=dev)
        mask = (keys[None] <= index.positions[pick][:, None])[:, None, None]  # (b, 1, 1, S)
        k_all, v_all = self.cache.view(0, kv_len, index)  # (b, nkv, S, hd)
        with sdpa_backends(self.param.device):
            o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask,
                                               enable_gqa=self.kv_heads != self.num_heads)
        h = self.model.after_attention(o, hidden[pick][:, None])[:, 0]  # (b, H)
        return self.head.expand(self.model.logits(h)), h

    def _write(self, hidden, tokens, start, rows):
        """q (b, nh, T, hd) of the new positions, their keys and values written."""
        import torch

        start_t = torch.tensor(start, device=tokens.device)
        index = WriteIndex(start_t, tokens.shape[1], None, rows, limit=self.cache.max_len - 1)
        q, k, v = self.model.attention_inputs(tokens, hidden, index.positions)
        self.cache.write(0, k, v, index)
        return q, index
