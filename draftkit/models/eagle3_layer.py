"""The decoder layers of an EAGLE-3 head: the fused first layer, and the plain layers a deeper
head stacks on it.

The first layer (EAGLE-3, arXiv 2503.01840) attends over [input_layernorm(embedding) ;
hidden_norm(feature)], 2H wide, with the feature as its residual. A deeper head (P-EAGLE's
drafters stack four: arXiv 2602.01469, and AWS's published GPT-OSS-20B head) adds plain Llama
pre-norm layers over the residual stream::

    x = input_layernorm(h)
    h = h + o_proj(attention(q, k, v of x, RoPE at t))
    h = h + mlp(post_attention_layernorm(h))

which is what vLLM's ``llama_eagle3.py`` computes for ``num_hidden_layers`` > 1 (its layers
after the first add the residual inside ``input_layernorm``). Each layer leaves attention to its
caller, as the head does (:mod:`draftkit.models.eagle3`): :meth:`Eagle3Layer.qkv` and
:meth:`Eagle3Layer.finish` are the two halves around it.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb


class Eagle3Layer(nn.Module):
    """One decoder layer of a head: ``fused`` the first (attention reads [embedding ; hidden],
    both normed, 2H), else a plain pre-norm layer over the residual stream (H)."""

    def __init__(self, config, fused: bool = True):
        super().__init__()
        h, hd = config.hidden_size, config.head_dim
        width = 2 * h if fused else h
        self.num_heads, self.kv_heads, self.head_dim = (config.num_attention_heads,
                                                        config.num_key_value_heads, hd)
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        if fused:
            self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(width, self.num_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(width, self.kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(width, self.kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(self.num_heads * hd, h, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    @property
    def fused(self) -> bool:
        return hasattr(self, "hidden_norm")

    def attention_input(self, h: torch.Tensor) -> torch.Tensor:
        """What a plain layer's attention reads (B, T, H) from the residual stream h."""
        return self.input_layernorm(h)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q (B, nh, T, hd) and k, v (B, nkv, T, hd) of the attention input x (B, T, 2H | H),
        RoPE applied with cos, sin (B, T, hd)."""
        bsz, t, _ = x.shape
        a = self.self_attn
        q = a.q_proj(x).view(bsz, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(bsz, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(bsz, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def finish(self, o: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The layer's output (B, T, H) from attention's ``o`` (B, nh, T, hd) and the residual
        (B, T, H) it adds to: the fused feature for the first layer, the stream for others."""
        bsz, _, t, _ = o.shape
        h = residual + self.self_attn.o_proj(o.transpose(1, 2).reshape(bsz, t, -1))
        return h + self.mlp(self.post_attention_layernorm(h))
