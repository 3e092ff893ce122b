"""The runner of an EAGLE-3 head: its decoder layers over a static KV cache.

The head (:class:`~draftkit.models.eagle3.Eagle3Draft`, arXiv 2503.01840) drafts from the
target's own features, which the target's runner leaves in ``runner.aux`` on each verify pass
(:mod:`draftkit.decode.runners`); this runner keeps the head's keys and values, rolled back by
position like the target's cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftkit.decode.cache import StaticKVCache, WriteIndex
from draftkit.decode.cpu_linear import DecodeLinear, tune
from draftkit.decode.runners import sdpa_backends

# A head's weights are timed for their fastest layouts from this size on: the embedded
# target's head (hidden 576, N 4096) is about 30 MB and streams from memory each step, while
# the tiny heads of the tests fit in cache and keep the fixed, deterministic layouts.
TUNE_BYTES = 8 * 2**20


class _Layer:
    """One layer's weights as the runner multiplies them: q/k/v and gate/up fused, each in the
    layout fastest for few rows (:mod:`draftkit.decode.cpu_linear`)."""

    def __init__(self, layer):
        a, mlp = layer.self_attn, layer.mlp
        self.qkv = DecodeLinear.fused(a.q_proj, a.k_proj, a.v_proj)
        self.o = DecodeLinear.fused(a.o_proj)
        self.gate_up = DecodeLinear.fused(mlp.gate_proj, mlp.up_proj)
        self.down = DecodeLinear.fused(mlp.down_proj)
        self.act, self.post_norm = mlp.act_fn, layer.post_attention_layernorm
        self.input_norm = layer.input_layernorm  # a deeper layer's: over the stream

    def linears(self) -> list[DecodeLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def finish(self, o: "torch.Tensor", residual: "torch.Tensor") -> "torch.Tensor":
        """As :meth:`~draftkit.models.eagle3_layer.Eagle3Layer.finish`: o (b, nh, T, hd) and
        residual (b, T, H) -> h (b, T, H)."""
        b, _, t, _ = o.shape
        h = residual + self.o(o.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, -1)
        return h + self.down(self.act(gate) * up)


class Eagle3Runner:
    """An EAGLE-3 head (:class:`~draftkit.models.eagle3.Eagle3Draft`) over a
    :class:`~draftkit.decode.cache.StaticKVCache` of its layers, rolled back by position like
    the target's.

    It reads (hidden, token) pairs, not tokens: draft position t reads the hidden state after
    token t (the target's fused feature, or the head's own output at position t - 1) and token
    t + 1, and scores token t + 2. In the first layer a position's keys and values depend on its
    own inputs only, so with one layer positions whose output nobody needs are only written
    (:meth:`feed`) and :meth:`forward` computes the output at one position per row; a deeper
    head's later layers read the layer below's outputs, which every written position computes.

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
        self.vocab = self.head  # the logits are over it
        self.cache: StaticKVCache | None = None
        self._prepare_weights()
        if model.parallel:
            self._prepare_placeholder()

    def _prepare_weights(self) -> None:
        """The layers' matmuls as the target's runner does them (:class:`_Layer`). A head
        streams all its weights once per drafted token, so how it multiplies is most of c."""
        m = self.model
        self.w_fc = DecodeLinear.fused(m.fc)
        self.layers = [_Layer(m.midlayer), *(_Layer(x) for x in m.deeper)]
        self.w_qkv = self.layers[0].qkv
        self.w_head = DecodeLinear.fused(m.lm_head)
        tune([self.w_fc, *(w for x in self.layers for w in x.linears()), self.w_head],
             min_bytes=TUNE_BYTES)

    def _prepare_placeholder(self) -> None:
        """A parallel head's placeholder as positions 2..K read it, computed once: its fused
        feature (H,) and its first layer's q/k/v before RoPE ((nh + 2 nkv) hd,). Nothing in
        either depends on the sequence, so a round computes fc and those q/k/v for the
        target's features alone, not the K - 1 placeholder rows as well
        (eval/results/notes/2026-12-06-peagle-engine.md measured the saving)."""
        with torch.no_grad():
            token, hidden = self.model.placeholder()  # its token id, its fused feature (H,)
            x = self.model.layer_input(torch.tensor([[token]], device=self.param.device),
                                       hidden[None, None])  # (1, 1, 2H)
            self.placeholder_hidden, self.placeholder_qkv = hidden, self.w_qkv(x)[0, 0]

    def reset(self, batch: int, max_len: int) -> None:
        if self.cache is None or self.cache.batch != batch or self.cache.max_len < max_len:
            self.cache = StaticKVCache(len(self.layers), batch, self.kv_heads, max_len,
                                       self.head_dim, self.param.dtype, self.param.device)
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
        start[b] + t of cache row rows[b], in every layer."""
        self._stack(hidden, self._qkv(hidden, tokens), start, rows, None, 0)

    def forward(self, hidden: "torch.Tensor", tokens: "torch.Tensor", start: list[int],
                last: list[int], rows: list[int] | None = None
                ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """:meth:`feed`, then the head's output at index last[b] of each row: logits (b, N)
        over the draft vocabulary (:attr:`head`) and the layer output h (b, H)."""
        logits, h = self.forward_span(hidden, tokens, start, last, 1, rows)
        return logits[:, 0], h[:, 0]

    def forward_span(self, hidden: "torch.Tensor", tokens: "torch.Tensor", start: list[int],
                     first: list[int], span: int, rows: list[int] | None = None
                     ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """:meth:`feed`, then the head's outputs at indices first[b] .. first[b] + span - 1 of
        each row, each attending causally to its row's keys: logits (b, span, N) and h
        (b, span, H)."""
        h = self._stack(hidden, self._qkv(hidden, tokens), start, rows, first, span)
        return self.w_head(self.model.norm(h)), h

    def forward_parallel(self, hidden: "torch.Tensor", tokens: "torch.Tensor", start: list[int],
                         counts: list[int], k: int, rows: list[int] | None = None
                         ) -> "torch.Tensor":
        """A parallel head's round: the first counts[b] positions of hidden (b, W, H) and
        tokens (b, W) fed as :meth:`forward_span` feeds them, behind them K - 1 placeholders
        (:meth:`_prepare_placeholder`), and the outputs at the last of those features and at
        the placeholders: logits (b, K, N), d_1..d_K's."""
        qkv = self._qkv(hidden, tokens)  # (b, W, D)
        b, w = tokens.shape
        if all(n == w for n in counts):  # no row padded (batch 1): the placeholders follow
            qkv = torch.cat([qkv, self.placeholder_qkv.expand(b, k - 1, -1)], 1)
            hidden = torch.cat([hidden, self.placeholder_hidden.expand(b, k - 1, -1)], 1)
        else:  # each row's placeholders right after its own features
            width = max(counts) + k - 1
            t = torch.arange(width, device=tokens.device)
            c = torch.tensor(counts, device=tokens.device)[:, None]
            at = ((t >= c) & (t < c + k - 1))[..., None]  # (b, width, 1): the placeholders
            qkv = torch.where(at, self.placeholder_qkv, F.pad(qkv, (0, 0, 0, width - w)))
            hidden = torch.where(at, self.placeholder_hidden,
                                 F.pad(hidden, (0, 0, 0, width - w)))
        h = self._stack(hidden, qkv, start, rows, [n - 1 for n in counts], k)
        return self.w_head(self.model.norm(h))

    def _stack(self, hidden, qkv, start, rows, first, span):
        """Every layer over the written positions: the first layer's q/k/v ``qkv`` (b, T, D)
        with its residual ``hidden`` (b, T, H), written at start[b] + t; returns the last
        layer's outputs h (b, span, H) at indices first[b] .. first[b] + span - 1 of each row,
        or None where ``first`` is None (a feed). A layer below another computes its output at
        every written position, as the next layer's keys read them."""
        index = self._index(start, qkv.shape[1], rows)
        every = [0] * qkv.shape[0], qkv.shape[1]
        h = hidden
        for i, layer in enumerate(self.layers):
            if i:  # a deeper layer's q/k/v over the stream
                qkv = layer.qkv(layer.input_norm(h))
            q = self._write(qkv, index, i)
            top = i == len(self.layers) - 1
            if top and first is None:
                return None
            at, n = (first, span) if top else every
            o, picked = self._attend(q, index, start, at, n, i)
            h = layer.finish(o, h[picked])
        return h

    def _attend(self, q, index, start, first, span, layer):
        """Attention of the queries at indices first[b] .. first[b] + span - 1 of each row
        (q (b, nh, T, hd) of the written positions) over the layer's cache: o (b, nh, span,
        hd), and the (rows, indices) picked, to take the residual at them."""
        b, dev = q.shape[0], q.device
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
        k_all, v_all = self.cache.view(layer, kv_len, index)  # (b, nkv, S, hd)
        with sdpa_backends(self.param.device):
            o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask,
                                               enable_gqa=self.kv_heads != self.num_heads)
        return o, (bi, at)

    def _qkv(self, hidden, tokens):
        """The first layer's q/k/v before RoPE (b, T, (nh + 2 nkv) hd) of hidden (b, T, H) read
        with tokens (b, T), fused, from Eagle3Draft.layer_input as attention_inputs computes
        them."""
        return self.w_qkv(self.model.layer_input(tokens, hidden))

    def _index(self, start, t, rows):
        """Where T tokens per row write, at start[b] + t of cache row rows[b]: a slice where no
        padding needs clamping to the cache's last position, a scatter else."""
        limit = self.cache.max_len - 1
        start_t = torch.tensor(start, device=self.param.device)
        uniform = start[0] if all(s == start[0] for s in start) and start[0] + t <= limit else None
        return WriteIndex(start_t, t, uniform, rows, limit=limit)

    def _write(self, qkv, index, layer):
        """Apply RoPE to qkv (b, T, (nh + 2 nkv) hd) at the index's positions and write the
        keys and values of ``layer``; returns q (b, nh, T, hd)."""
        bsz, t, _ = qkv.shape
        nh, nkv, hd = self.num_heads, self.kv_heads, self.head_dim
        q = qkv[..., :nh * hd].view(bsz, t, nh, hd).transpose(1, 2)
        k = qkv[..., nh * hd:(nh + nkv) * hd].view(bsz, t, nkv, hd).transpose(1, 2)
        v = qkv[..., (nh + nkv) * hd:].view(bsz, t, nkv, hd).transpose(1, 2)
        pos = index.positions  # (b, T)
        q, k = apply_rotary_pos_emb(q, k, self.cos[pos], self.sin[pos])
        self.cache.write(layer, k, v, index)
        return q
