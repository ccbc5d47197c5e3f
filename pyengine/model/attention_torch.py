"""Paged attention in plain torch: gather each sequence's blocks, one masked SDPA for the batch.

Works on any device and is the CPU path of the engine. The new queries of all
sequences are scattered into a padded [S, max_query_len] batch; each sequence's K/V
blocks are gathered into [S, max_seq_len]; a boolean mask keeps key j for query row i
of sequence s iff ``j <= context_len[s] + i`` (causal, which also bounds j by the
sequence length for real rows). Query heads sharing a KV head are folded into the
query-length axis, so K/V are never repeated. A step made only of decodes
(max_query_len == 1) needs no scatter at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import AttnMetadata


def _plan(attn: AttnMetadata, num_tokens: int, group: int) -> tuple:
    """Per-step index work shared by all layers: scatter indices, block columns, mask."""
    key = ("torch_plan", group)
    plan = attn.cache.get(key)
    if plan is not None:
        return plan
    dev = attn.seq_lens.device
    num_seqs, max_q, max_len = attn.num_seqs, attn.max_query_len, attn.max_seq_len
    num_blocks = -(-max_len // attn.block_size)
    blocks = attn.block_tables[:, :num_blocks].reshape(-1).long()  # [S * nb]
    seq_lens = attn.seq_lens.long()
    qsl = attn.query_start_loc.long()
    q_lens = qsl[1:] - qsl[:-1]
    ctx = seq_lens - q_lens  # [S] tokens cached before this step
    if max_q == 1:
        if num_tokens != num_seqs:
            raise ValueError(f"max_query_len=1 needs one token per sequence, got {num_tokens} tokens "
                             f"for {num_seqs} sequences")
        seq_idx = row = None
    else:
        seq_idx = torch.repeat_interleave(torch.arange(num_seqs, device=dev), q_lens, output_size=num_tokens)
        row = torch.arange(num_tokens, device=dev) - qsl[seq_idx]
    if num_seqs == 1 and max_q == 1:
        mask = None  # one decode: every cached key is visible
    elif num_seqs == 1 and max_q == max_len and group == 1:
        mask = "causal"  # one fresh prefill: plain causal (with GQA folded, rows are not positions)
    else:
        q_pos = ctx[:, None] + torch.arange(max_q, device=dev)[None, :]  # [S, max_q]
        mask = torch.arange(max_len, device=dev)[None, None, :] <= q_pos[:, :, None]  # [S, max_q, L]
        mask = mask[:, None, None].expand(num_seqs, 1, group, max_q, max_len).reshape(
            num_seqs, 1, group * max_q, max_len)
    plan = (seq_idx, row, blocks, mask)
    attn.cache[key] = plan
    return plan


def paged_attention_torch(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    attn: AttnMetadata,
    scale: float,
) -> torch.Tensor:  # [T, num_heads, head_dim]
    """Causal attention of each new token over its sequence's paged cache (K/V already written).

    Parameters
    ----------
    q : torch.Tensor
        [T, num_heads, head_dim] queries, rope applied, concatenated sequence by sequence.
    kv_cache : torch.Tensor
        [2, num_blocks, block_size, num_kv_heads, head_dim], this step's K/V included.
    attn : AttnMetadata
        The step's metadata.
    scale : float
        Softmax scale, usually ``head_dim ** -0.5``.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    num_seqs, max_q, max_len = attn.num_seqs, attn.max_query_len, attn.max_seq_len
    seq_idx, row, blocks, mask = _plan(attn, num_tokens, group)

    # One gather of K and V together: index_select copies whole blocks (advanced indexing
    # copies element by element on CPU, several times slower).
    kv = kv_cache.index_select(1, blocks).view(2, num_seqs, -1, num_kv_heads, head_dim)[:, :, :max_len]
    k, v = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [S, kvh, L, d]
    if seq_idx is None:
        qp = q.view(num_seqs, 1, num_heads, head_dim)
    else:
        qp = q.new_zeros(num_seqs, max_q, num_heads, head_dim)
        qp[seq_idx, row] = q
    # [S, max_q, kvh, g, d] -> [S, kvh, g * max_q, d]: heads kv*g .. kv*g+g-1 share KV head kv.
    qp = qp.view(num_seqs, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    qp = qp.reshape(num_seqs, num_kv_heads, group * max_q, head_dim)
    if isinstance(mask, str):
        o = F.scaled_dot_product_attention(qp, k, v, is_causal=True, scale=scale)
    else:
        o = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale)
    o = o.view(num_seqs, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)
    o = o.reshape(num_seqs, max_q, num_heads, head_dim)
    if seq_idx is None:
        return o.view(num_tokens, num_heads, head_dim)
    return o[seq_idx, row]


class TorchAttention:
    """The torch backend as a callable object (same interface as FlashInferAttention)."""

    name = "torch"

    def __call__(self, q, kv_cache, attn, scale):
        return paged_attention_torch(q, kv_cache, attn, scale)
