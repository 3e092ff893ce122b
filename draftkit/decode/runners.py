"""Model runners: one forward interface over a KV cache that rolls back by position.

``runner.forward(tokens, start)`` means: drop row b's cached positions >= start[b], then append
``tokens[b]`` at positions start[b], start[b] + 1, ... and return their logits. The engine never
copies or crops a cache to roll back; it just passes the position to continue from.

``rows=[...]`` names the cache rows the input rows are, so a server can prefill one slot, or
decode only its live slots, while the other rows' caches stay as they are. Only runners with
``supports_rows`` take an arbitrary subset; the general runner computes the whole batch it was
reset with (a cohort), so a server on it admits new requests only into an empty batch.

- :class:`LlamaRunner`: the fast path for Llama-family models (Llama, Mistral without a sliding
  window, Qwen2, Qwen3). Our own forward over the HF module weights and a
  :class:`~draftkit.decode.cache.StaticKVCache`: no per-step allocation of the cache, one mask
  per forward, rotary tables computed once; on a GPU its decoding shapes replay CUDA graphs
  (:mod:`draftkit.decode.graphs`).
- :class:`HFRunner`: any Hugging Face causal LM through the transformers cache API
  (``DynamicCache``). A rolled-back entry is masked out in the 2D attention mask (a hole) rather
  than copied away, with explicit per-row ``position_ids``; trailing columns that no row uses
  are cropped. Holes cost memory until then: it is the general fallback, not the fast path.

Both can hand an EAGLE-3 head the target's own features on the way (no extra forward): with
``runner.capture = [i, j, k]`` each forward also leaves ``runner.aux`` (B, T, 3 H), the hidden
states entering layers i, j and k (HF's ``output_hidden_states[i]``), low to high.
:class:`~draftkit.decode.eagle3_runner.Eagle3Runner` runs such a head
(:mod:`draftkit.models.eagle3`) over its own one-layer static cache.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right
from transformers import DynamicCache

from draftkit.decode.cache import StaticKVCache, WriteIndex
from draftkit.decode.cpu_linear import DecodeLinear, tune
from draftkit.decode.graphs import DecodeGraphs
from draftkit.errors import DraftkitError
from draftkit.models.eagle3 import tapped
from draftkit.models.facts import is_llama_family, sliding_window, text_config, vocab_size
from draftkit.models.reduced_head import head_of

if TYPE_CHECKING:
    from draftkit.models.reduced_head import ReducedHead


def supports_fast_path(model) -> bool:
    if not is_llama_family(model):
        return False
    if sliding_window(model):
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return layers is not None and hasattr(inner, "rotary_emb") and hasattr(inner, "embed_tokens")


def make_runner(model, fast: bool | None = None, reduced: bool = False
                ) -> "LlamaRunner | HFRunner":
    """The fast path when the model supports it (``fast=None``), else the general one.
    ``reduced``: a model carrying a reduced head returns logits over its N tokens (a draft's
    runner, sampled there: :attr:`vocab`), not over V with -inf outside them."""
    if fast is None:
        fast = supports_fast_path(model)
    if fast and not supports_fast_path(model):
        raise DraftkitError(f"the fast decoding path does not support "
                            f"{type(model).__name__}; drop the fast-path option")
    return LlamaRunner(model, reduced) if fast else HFRunner(model, reduced)


class LlamaRunner:
    """Llama-family forward with a static, pointer-indexed KV cache."""

    supports_rows = True  # any subset of cache rows per forward (slots)

    def __init__(self, model, reduced: bool = False):
        """``reduced``: as :func:`make_runner`'s."""
        self.model = model
        inner = model.model
        cfg = text_config(model)
        self.embed, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        self.num_heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.vocab_size = cfg.vocab_size
        self.cache: StaticKVCache | None = None
        self.param = next(model.parameters())
        self.capture: list[int] | None = None  # layers whose input hidden states to keep
        self.aux: "torch.Tensor | None" = None  # (B, T, len(capture) H) of the last forward
        self._prepare_weights()
        self.vocab = self.head if reduced else None  # what the logits are over (None: V)
        self.graphs = DecodeGraphs(self)  # CUDA graphs of the decoding shapes, where possible
        self.last_path, self.last_reason = "eager", self.graphs.reason

    def _prepare_weights(self) -> None:
        """Fuse q/k/v and gate/up into one matrix each (fewer, larger matmuls) and, on CPU,
        measure the fastest matmul layout per row count (:mod:`draftkit.decode.cpu_linear`)."""
        prep = DecodeLinear.fused
        self.w = []
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.w.append({"qkv": prep(a.q_proj, a.k_proj, a.v_proj), "o": prep(a.o_proj),
                           "gate_up": prep(mlp.gate_proj, mlp.up_proj), "down": prep(mlp.down_proj),
                           "act": mlp.act_fn})
        self.head = _head_on(self.model, self.param.device)
        self.w_head = prep(self.lm_head, head=self.head)
        tune(self.linears())

    def linears(self) -> list[DecodeLinear]:
        """Every weight the runner multiplies, in model order (what :func:`tune` times)."""
        return [w[name] for w in self.w for name in ("qkv", "o", "gate_up", "down")] \
            + [self.w_head]

    def reset(self, batch: int, max_len: int) -> None:
        if (self.cache is None or self.cache.batch != batch or self.cache.max_len < max_len):
            self.cache = StaticKVCache(len(self.layers), batch, self.kv_heads, max_len,
                                       self.head_dim, self.param.dtype, self.param.device)
            # cos/sin for every position once (the scratch one too); the rotary module's own
            # code computes them so any RoPE scaling the config asks for is applied the same way.
            pos = torch.arange(max_len + 1, device=self.param.device)[None]
            cos, sin = self.rotary(self.cache.k[0, :1, 0], pos)
            self.cos, self.sin = cos[0], sin[0]  # (S + 1, D)
            self.graphs.clear()  # captured over the old cache's storage
        self.cache.lengths.zero_()

    def forward(self, tokens: "torch.Tensor", start: list[int], last: list[int] | None = None,
                rows: list[int] | None = None) -> "torch.Tensor":
        """tokens: (B, T) at positions start[b] + t of cache row rows[b] (row b without
        ``rows``). Returns logits (B, T, V), or (B, V) at index ``last[b]`` of each row when
        ``last`` is given (prefill of padded prompts); over a reduced head's N tokens instead
        of V where the runner was made so (:attr:`vocab`). A decoding shape replays its CUDA graph
        where one is captured (:mod:`draftkit.decode.graphs`); ``last_path`` says which ran."""
        out = self.graphs.forward(tokens, start, last, rows)
        if out is not None:
            return out
        self.last_path = "eager"
        return self._forward_eager(tokens, start, last, rows)

    def _forward_eager(self, tokens: "torch.Tensor", start: list[int], last: list[int] | None,
                       rows: list[int] | None) -> "torch.Tensor":
        """The forward over the keys actually written: [0, max(start) + T)."""
        bsz, t = tokens.shape
        uniform = start[0] if all(s == start[0] for s in start) else None
        start_t = torch.tensor(start, device=tokens.device)
        index = WriteIndex(start_t, t, uniform, rows)
        kv_len = max(start) + t
        if uniform is not None:  # every row's queries at the same positions: plain causal
            # attention, bottom-right aligned (the new block sees all earlier keys), with no
            # mask to build; one query at the newest position needs none at all
            attend = None if t == 1 else _causal(t, kv_len)
        else:  # causal in absolute positions: stale entries beyond a row's pointer stay hidden
            attend = _position_mask(index.positions, kv_len)
        x = self._blocks(tokens, index, self.cache, kv_len, attend)  # (B, T, H)
        self.cache.lengths[index.row_ids] = start_t + t
        if last is not None:  # only the positions whose logits are needed go through the head
            x = x[torch.arange(bsz, device=x.device), torch.tensor(last, device=x.device)]
        return self._logits(x)

    def static_forward(self, tokens: "torch.Tensor", start: "torch.Tensor", last: bool,
                       kv_len: int) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        """The forward at fixed shapes with no host sync, as a CUDA graph captures it.

        tokens: (B, T) for cache rows [0, B); start: (B,) on the device, the cache's
        ``pad_position`` for a padding row (it writes only the scratch position). Attends over
        keys [0, kv_len) under a mask built on the device, so the shapes do not move as the
        sequence grows (every real row's positions lie below ``kv_len``). Returns logits
        (B, T, V), or (B, V) at the last position with ``last``, and the captured features
        (B, T, 3 H) or None."""
        t = tokens.shape[1]
        cache = self.cache.head(tokens.shape[0])
        index = WriteIndex(start, t, None, limit=cache.pad_position)
        x = self._blocks(tokens, index, cache, kv_len, _position_mask(index.positions, kv_len))
        real = start < cache.pad_position  # (B,) a padding row leaves its pointer as it is
        cache.lengths.copy_(torch.where(real, start + t, cache.lengths))
        return self._logits(x[:, -1] if last else x), self.aux

    def _blocks(self, tokens: "torch.Tensor", index: WriteIndex, cache: StaticKVCache,
                kv_len: int, attend) -> "torch.Tensor":
        """The decoder layers over ``tokens`` (B, T) written where ``index`` says; attention
        over keys [0, kv_len) under ``attend`` (a mask, a causal bias or None). Leaves the
        captured features in ``self.aux``; returns the last hidden states (B, T, H)."""
        bsz, t = tokens.shape
        pos = index.positions  # (B, T)
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # (B, 1, T, D)
        x = self.embed(tokens)  # (B, T, H)
        hd, nh, nkv = self.head_dim, self.num_heads, self.kv_heads
        nq, nk = nh * hd, nkv * hd
        entering = {}  # layer id -> the residual stream entering it (no copy: x is rebound)
        for i, layer in enumerate(self.layers):
            if self.capture and i in self.capture:
                entering[i] = x
            attn, w = layer.self_attn, self.w[i]
            qkv = w["qkv"](layer.input_layernorm(x))  # (B, T, (H + 2 Hkv) D)
            q = qkv[..., :nq].view(bsz, t, nh, hd)
            k = qkv[..., nq:nq + nk].view(bsz, t, nkv, hd)
            v = qkv[..., nq + nk:].view(bsz, t, nkv, hd).transpose(1, 2)  # (B, Hkv, T, D)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head before RoPE
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D), (B, Hkv, T, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.write(i, k, v, index)
            k_all, v_all = cache.view(i, kv_len, index)  # (B, Hkv, S, D)
            try:
                with sdpa_backends(self.param.device):
                    o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attend,
                                                       scale=attn.scaling, enable_gqa=nkv != nh)
            except RuntimeError:  # a kernel refused the causal bias (GQA, dtype): the mask
                if not isinstance(attend, CausalBias):
                    raise
                attend = _position_mask(pos, kv_len)
                o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attend,
                                                   scale=attn.scaling, enable_gqa=nkv != nh)
            x = x + w["o"](o.transpose(1, 2).reshape(bsz, t, nq))
            gate, up = w["gate_up"](layer.post_attention_layernorm(x)).chunk(2, -1)
            x = x + w["down"](w["act"](gate) * up)
        self.aux = _tapped(entering, self.capture)
        return x

    def _logits(self, x: "torch.Tensor") -> "torch.Tensor":
        logits = self.w_head(self.norm(x))  # (..., V), or (..., N) over a reduced head
        return logits if self.head is None or self.vocab is not None else self.head.expand(logits)


def _position_mask(positions: "torch.Tensor", kv_len: int) -> "torch.Tensor":
    """Key j visible to the query at position p iff j <= p. positions: (B, T) -> (B, 1, T, S)."""
    keys = torch.arange(kv_len, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)


def _causal(queries: int, keys: int):
    """Causal attention for ``queries`` new positions after ``keys - queries`` cached ones,
    aligned bottom-right: query i sees keys [0, keys - queries + i]. On CUDA flash attention
    applies it without a mask; elsewhere torch builds the mask itself."""
    return causal_lower_right(queries, keys)


def _tapped(hidden_states, capture: list[int] | None) -> "torch.Tensor | None":
    """The features a forward leaves for an EAGLE-3 head (models.eagle3.tapped), if any."""
    if not capture:
        return None

    return tapped(hidden_states, capture)


def sdpa_backends(device):
    """Attention kernels for decoding. cuDNN's SDPA builds a plan per new shape (~8 ms of
    CPU per call measured on an H200), and decoding grows the key length every step, so
    it is left out; flash / memory-efficient attention have no per-shape set-up."""
    if device.type == "cpu":
        return contextlib.nullcontext()

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def _head_on(model, device) -> "ReducedHead | None":
    """The draft's reduced head (:mod:`draftkit.models.reduced_head`) on ``device``."""
    head = head_of(model)
    return None if head is None else head.to(device)


def _rotate_half(x: "torch.Tensor") -> "torch.Tensor":
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class HFRunner:
    """Any HF causal LM: ``DynamicCache`` plus a per-column validity mask (holes on rollback).

    Every forward covers the whole batch the cache was started with; ``rows`` is accepted for
    the common interface and must name that batch (the engine passes its cohort)."""

    supports_rows = False
    last_path = "eager"
    last_reason = "the general transformers path (DynamicCache) has no static shapes to capture"

    def __init__(self, model, reduced: bool = False):
        """``reduced``: as :func:`make_runner`'s."""
        self.model = model
        self.vocab_size = vocab_size(model)
        self.param = next(model.parameters())
        self.head = _head_on(model, self.param.device)
        self.vocab = self.head if reduced else None  # what the logits are over (None: V)
        # transformers 5.x renames past_key_values to cache; older versions only know the first
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.capture: list[int] | None = None  # as LlamaRunner's
        self.aux: "torch.Tensor | None" = None

    def reset(self, batch: int, max_len: int) -> None:
        self.cache = DynamicCache(config=self.model.config)
        dev = self.param.device
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=dev)  # (B, C) column in use
        self.col_pos = torch.zeros(batch, 0, dtype=torch.long, device=dev)  # (B, C) its position

    def forward(self, tokens: "torch.Tensor", start: list[int], last: list[int] | None = None,
                rows: list[int] | None = None) -> "torch.Tensor":
        bsz, t = tokens.shape
        dev = tokens.device
        start_t = torch.tensor(start, device=dev)
        # Roll back: hide every cached column at or beyond the row's new start position.
        self.valid &= self.col_pos < start_t[:, None]
        used = self.valid.any(0).nonzero()
        keep = int(used[-1]) + 1 if used.numel() else 0
        if keep < self.valid.shape[1]:  # no row needs the tail: drop it from the cache
            self.cache.crop(keep - self.valid.shape[1])  # negative: remove that many
            self.valid, self.col_pos = self.valid[:, :keep], self.col_pos[:, :keep]
        pos = start_t[:, None] + torch.arange(t, device=dev)  # (B, T)
        new_valid = torch.ones(bsz, t, dtype=torch.bool, device=dev)
        if last is not None:  # right-padded prompts: padding is never attended to
            new_valid = torch.arange(t, device=dev)[None] <= torch.tensor(last, device=dev)[:, None]
        mask = torch.cat([self.valid, new_valid], dim=1).long()
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=pos,
                         use_cache=True, output_hidden_states=bool(self.capture),
                         **{self.cache_kwarg: self.cache})
        self.aux = _tapped(out.hidden_states, self.capture)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.col_pos = torch.cat([self.col_pos, pos], dim=1)
        logits = out.logits  # (B, T, V)
        if self.head is not None:  # no cheaper, but the same logits as the fast path's
            logits = self.head.restrict(logits)
            logits = logits if self.vocab is not None else self.head.expand(logits)
        if last is not None:
            logits = logits[torch.arange(bsz, device=dev), torch.tensor(last, device=dev)]
        return logits
