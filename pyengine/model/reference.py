"""Ground truth for tests: a straightforward full-sequence forward, no cache, no paging.

It reads the model's weights but none of its forward code: q/k/v are sliced from the
fused weights, rotary embedding is computed with complex numbers (interleaved) or the
HF rotate-half formula, attention is one causal SDPA with K/V heads repeated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .llama import LlamaForCausalLM, rope_inv_freq


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                    interleaved: bool) -> torch.Tensor:
    """x [L, heads, d] rotated by position; computed in fp64 and cast back."""
    angles = positions.double()[:, None] * inv_freq.double()[None, :]  # [L, d/2]
    xd = x.double()
    if interleaved:
        pairs = torch.view_as_complex(xd.reshape(*x.shape[:-1], -1, 2).contiguous())
        rotated = pairs * torch.polar(torch.ones_like(angles), angles)[:, None, :]
        return torch.view_as_real(rotated).flatten(-2).to(x.dtype)
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None, :]
    sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None, :]
    half = x.shape[-1] // 2
    rotate_half = torch.cat((-xd[..., half:], xd[..., :half]), -1)
    return (xd * cos + rotate_half * sin).to(x.dtype)


@torch.inference_mode()
def reference_forward(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:  # [len, vocab] fp32
    """Logits of every position of one sequence, by a plain causal forward over the whole sequence.

    Parameters
    ----------
    model : LlamaForCausalLM
        Its weights and config are used; its forward code is not.
    token_ids : list[int]
        One sequence (non-empty).

    Returns
    -------
    torch.Tensor
        [len(token_ids), vocab] float32 logits; row i predicts token i + 1.
    """
    if not token_ids:
        raise ValueError("token_ids must be a non-empty list of ints")
    c = model.config
    dev = model.device
    ids = torch.tensor(token_ids, dtype=torch.int64, device=dev)
    pos = torch.arange(len(token_ids), device=dev)
    inv_freq = rope_inv_freq(c).to(dev)
    n = len(token_ids)
    qs, kvs = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    x = model.embed_tokens.weight[ids]
    for layer in model.layers:
        h = _rms_norm(x, layer.input_norm.weight, c.rms_norm_eps)
        w, b = layer.qkv_proj.weight, layer.qkv_proj.bias
        q = h @ w[:qs].T + (b[:qs] if b is not None else 0)
        k = h @ w[qs:qs + kvs].T + (b[qs:qs + kvs] if b is not None else 0)
        v = h @ w[qs + kvs:].T + (b[qs + kvs:] if b is not None else 0)
        q = _rope_reference(q.view(n, c.num_heads, c.head_dim), pos, inv_freq, c.rope_interleaved)
        k = _rope_reference(k.view(n, c.num_kv_heads, c.head_dim), pos, inv_freq, c.rope_interleaved)
        v = v.view(n, c.num_kv_heads, c.head_dim)
        group = c.num_heads // c.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + o.transpose(0, 1).reshape(n, qs) @ layer.o_proj.weight.T
        if layer.o_proj.bias is not None:
            x = x + layer.o_proj.bias
        h = _rms_norm(x, layer.post_norm.weight, c.rms_norm_eps)
        gate_up = h @ layer.gate_up_proj.weight.T
        gate, up = gate_up[:, :c.intermediate_size], gate_up[:, c.intermediate_size:]
        x = x + (F.silu(gate) * up) @ layer.down_proj.weight.T
    x = _rms_norm(x, model.norm.weight, c.rms_norm_eps)
    head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    return (x @ head.T).float()
