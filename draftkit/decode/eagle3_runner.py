"""The runner of an EAGLE-3 head: its one decoder layer over a static KV cache.

The head (:class:`~draftkit.models.eagle3.Eagle3Draft`, arXiv 2503.01840) drafts from the
target's own features, which the target's runner leaves in ``runner.aux`` on each verify pass
(:mod:`draftkit.decode.runners`); this runner keeps the head's keys and values, rolled back by
position like the target's cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftkit.decode.cache import StaticKVCache, WriteIndex
from draftkit.decode.cpu_linear import DecodeLinear, tune
from draftkit.decode.runners import sdpa_backends

if TYPE_CHECKING:
    import torch

# A head's weights are timed for their fastest layouts from this size on: the embedded
# target's head (hidden 576, N 4096) is about 30 MB and streams from memory each step, while
# the tiny heads of the tests fit in cache and keep the fixed, deterministic layouts.
TUNE_BYTES = 8 * 2**20


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
        self._prepare_weights()

    def _prepare_weights(self) -> None:
        """The layer's matmuls as the target's runner does them: q/k/v and gate/up fused, each
        weight in the layout fastest for few rows (:mod:`draftkit.decode.cpu_linear`). A head
        streams all its weights once per drafted token, so how it multiplies is most of c."""
        m, layer = self.model, self.model.midlayer
        a, mlp = layer.self_attn, layer.mlp
        self.w_fc = DecodeLinear.fused(m.fc)
        self.w_qkv = DecodeLinear.fused(a.q_proj, a.k_proj, a.v_proj)
        self.w_o = DecodeLinear.fused(a.o_proj)
        self.w_gate_up = DecodeLinear.fused(mlp.gate_proj, mlp.up_proj)
        self.w_down = DecodeLinear.fused(mlp.down_proj)
        self.w_head = DecodeLinear.fused(m.lm_head)
        self.act = mlp.act_fn
        tune([self.w_fc, self.w_qkv, self.w_o, self.w_gate_up, self.w_down, self.w_head],
             min_bytes=TUNE_BYTES)

    def reset(self, batch: int, max_len: int) -> None:
        import torch

        if self.cache is None or self.cache.batch != batch or self.cache.max_len < max_len:
            self.cache = StaticKVCache(1, batch, self.kv_heads, max_len, self.head_dim,
                                       self.param.dtype, self.param.device)
            # cos/sin for every position once, by the head's own rotary module (its scaling)
            pos = torch.arange(max_len, device=self.param.device)[None]
            cos, sin = self.model.rotary_emb(self.cache.k[0, :1, 0], pos)
            self.cos, self.sin = cos[0], sin[0]  # (S, hd)
        self.cache.lengths.zero_()

    def fuse(self, aux: "torch.Tensor") -> "torch.Tensor":
        """The target's tapped hidden states (b, T, 3 Ht) as the head's feature (b, T, H)
        (:meth:`~draftkit.models.eagle3.Eagle3Draft.fuse`)."""
        return self.w_fc(aux.to(self.param.dtype))

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
        logits, h = self.forward_span(hidden, tokens, start, last, 1, rows)
        return logits[:, 0], h[:, 0]

    def forward_span(self, hidden: "torch.Tensor", tokens: "torch.Tensor", start: list[int],
                     first: list[int], span: int, rows: list[int] | None = None
                     ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """:meth:`feed`, then the head's outputs at indices first[b] .. first[b] + span - 1 of
        each row, each attending causally to its row's keys: logits (b, span, V) and h
        (b, span, H). A parallel head drafts a round so, its span the K positions."""
        import torch
        import torch.nn.functional as F

        q, index = self._write(hidden, tokens, start, rows)
        b, dev = tokens.shape[0], tokens.device
        steps = torch.arange(span, device=dev)
        at = torch.tensor(first, device=dev)[:, None] + steps  # (b, span): indices in the input
        bi = torch.arange(b, device=dev)[:, None]
        q = q[bi, :, at].transpose(1, 2)  # (b, nh, span, hd)
        queries = [s + i for s, i in zip(start, first)]  # each row's first query position
        kv_len = max(queries) + span
        if span == 1 and all(p == kv_len - 1 for p in queries):
            mask = None  # every query is at the newest position: it sees every key
        else:
            pos = torch.tensor(queries, device=dev)[:, None] + steps  # (b, span)
            mask = (torch.arange(kv_len, device=dev) <= pos[..., None])[:, None]  # (b,1,span,S)
        k_all, v_all = self.cache.view(0, kv_len, index)  # (b, nkv, S, hd)
        with sdpa_backends(self.param.device):
            o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask,
                                               enable_gqa=self.kv_heads != self.num_heads)
        layer = self.model.midlayer
        # the layer's output, as Eagle3Draft.after_attention computes it
        h = hidden[bi, at] + self.w_o(o.transpose(1, 2).reshape(b, span, -1))  # (b, span, H)
        gate, up = self.w_gate_up(layer.post_attention_layernorm(h)).chunk(2, -1)
        h = h + self.w_down(self.act(gate) * up)
        return self.head.expand(self.w_head(self.model.norm(h))), h

    def _write(self, hidden, tokens, start, rows):
        """q (b, nh, T, hd) of the new positions, their keys and values written, as
        Eagle3Draft.attention_inputs computes them (from the same layer_input; q/k/v fused)."""
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        bsz, t = tokens.shape
        limit = self.cache.max_len - 1
        start_t = torch.tensor(start, device=tokens.device)
        # a slice write where no padding needs clamping to the limit, a scatter else
        uniform = start[0] if all(s == start[0] for s in start) and start[0] + t <= limit else None
        index = WriteIndex(start_t, t, uniform, rows, limit=limit)
        x = self.model.layer_input(tokens, hidden)  # (b, T, 2H)
        nh, nkv, hd = self.num_heads, self.kv_heads, self.head_dim
        qkv = self.w_qkv(x)  # (b, T, (nh + 2 nkv) hd)
        q = qkv[..., :nh * hd].view(bsz, t, nh, hd).transpose(1, 2)
        k = qkv[..., nh * hd:(nh + nkv) * hd].view(bsz, t, nkv, hd).transpose(1, 2)
        v = qkv[..., (nh + nkv) * hd:].view(bsz, t, nkv, hd).transpose(1, 2)
        pos = index.positions  # (b, T)
        q, k = apply_rotary_pos_emb(q, k, self.cos[pos], self.sin[pos])
        self.cache.write(0, k, v, index)
        return q, index
