"""Paged attention with FlashInfer's BatchPrefillWithPagedKVCacheWrapper (CUDA).

One wrapper, planned once per engine step (on the first layer that sees a new
AttnMetadata), serves prefill chunks and decodes alike: FlashInfer's causal mask for
a sequence with ``qo_len`` new tokens and ``kv_len`` cached tokens (new ones included)
lets query i see keys ``0 .. kv_len - qo_len + i``, which is exactly our contract.
Rotary embedding is applied by the model (pos_encoding_mode "NONE"); the cache layout
is "NHD": ``kv_cache[0]`` and ``kv_cache[1]`` are [num_blocks, block_size, kv_heads, head_dim].
"""

from __future__ import annotations

import torch

from .attention import AttnMetadata

WORKSPACE_BYTES = 128 * 1024 * 1024
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def flashinfer_plan_inputs(attn: AttnMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's CSR page table from our metadata.

    Returns
    -------
    qo_indptr : [S+1] int32 (host), paged_kv_indptr : [S+1] int32 (host),
    paged_kv_indices : [num_pages_total] int32 (device), paged_kv_last_page_len : [S] int32 (host)
    """
    bs = attn.block_size
    seq_lens = attn.seq_lens.to("cpu", torch.int32)  # one host sync per step, in plan
    qo_indptr = attn.query_start_loc.to("cpu", torch.int32)
    num_pages = (seq_lens + bs - 1) // bs
    kv_indptr = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(num_pages, 0)
    last_page_len = seq_lens - (num_pages - 1) * bs
    width = attn.block_tables.shape[1]
    keep = torch.arange(width)[None, :] < num_pages[:, None]  # [S, width] host
    indices = attn.block_tables[keep.to(attn.block_tables.device)].to(torch.int32)
    return qo_indptr, kv_indptr, indices, last_page_len


class FlashInferAttention:
    """Attention backend over FlashInfer; one plan per AttnMetadata object (one per step)."""

    name = "flashinfer"

    def __init__(self, device: torch.device | str):
        import flashinfer

        self.device = torch.device(device)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # backend="fa2": "auto" picks FA3 on sm90 for query chunks over 64 tokens, a kernel
        # family the GPU machine does not have prebuilt (scripts/prepare_flashinfer.py builds
        # the FA2 modules); one backend for every step also keeps numerics uniform.
        try:
            self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        except TypeError:  # releases before the backend argument
            self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self._planned_for = None  # the AttnMetadata (and its shapes) of the current plan

    def plan(self, attn: AttnMetadata, num_heads: int, num_kv_heads: int, head_dim: int,
             dtype: torch.dtype, scale: float) -> None:
        """Plan the wrapper for this step (called automatically by the first layer)."""
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"FlashInfer attention: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"FlashInfer attention: dtype must be float16 or bfloat16, got {dtype}")
        qo_indptr, kv_indptr, indices, last_page_len = flashinfer_plan_inputs(attn)
        # The first eight arguments are positional in every FlashInfer release since 0.2
        # (head_dim was renamed head_dim_qk); the rest by keyword.
        self.wrapper.plan(
            qo_indptr, kv_indptr, indices, last_page_len,
            num_heads, num_kv_heads, head_dim, attn.block_size,
            causal=True,
            sm_scale=scale,
            q_data_type=dtype,
            kv_data_type=dtype,
        )
        self._planned_for = (attn, num_heads, num_kv_heads, head_dim, dtype, scale)

    def __call__(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        attn: AttnMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        num_heads, head_dim = q.shape[1], q.shape[2]
        key = (attn, num_heads, kv_cache.shape[3], head_dim, q.dtype, scale)
        planned = self._planned_for
        if planned is None or planned[0] is not attn or planned[1:] != key[1:]:
            self.plan(attn, num_heads, kv_cache.shape[3], head_dim, q.dtype, scale)
        return self.wrapper.run(q.contiguous(), (kv_cache[0], kv_cache[1]))
