"""Attention over the paged KV cache: the per-step metadata, the cache write, backend choice.

One engine step runs the model over all scheduled tokens of all sequences at once,
concatenated sequence by sequence. Each layer writes the new tokens' K/V into the
paged cache (``slot_mapping``) and then lets every new token attend causally over its
own sequence's cache up to its own position. Two backends do the attention:

- ``"torch"`` (attention_torch.py): any device; gathers each sequence's blocks and runs
  one masked scaled-dot-product attention over the padded batch.
- ``"flashinfer"`` (attention_flashinfer.py): CUDA; one
  ``BatchPrefillWithPagedKVCacheWrapper`` plan per step serves every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttnMetadata:
    """What one engine step tells the attention layers.

    All tensors live on the model's device. A fresh object is built for every step;
    backends cache per-step work (FlashInfer's plan, the write indices) on it.

    Attributes
    ----------
    kv_caches : list[torch.Tensor]
        One per layer, [2, num_blocks, block_size, num_kv_heads, head_dim] in the model dtype.
    slot_mapping : torch.Tensor
        [T] int64: flat slot ``block * block_size + offset`` where token t's K/V goes;
        -1 means "do not write" (padding).
    query_start_loc : torch.Tensor
        [S+1] int32: cumulative counts of new tokens per sequence (starts at 0).
    seq_lens : torch.Tensor
        [S] int32: context length of each sequence including this step's tokens.
    block_tables : torch.Tensor
        [S, max_blocks_per_seq] int32, padded with 0.
    max_query_len : int
        Largest number of new tokens of one sequence this step (host int).
    max_seq_len : int
        Largest ``seq_lens`` entry (host int).
    block_size : int
        Tokens per KV block.
    cache : dict
        Per-step scratch that backends fill on first use and later layers reuse.
        A caller that knows every slot is valid may set
        ``cache["write_rows"] = (None, slot_mapping)`` so ``write_kv`` skips its check
        (the one host sync it would otherwise make per step).

    The attention backends expect ``T == query_start_loc[-1]`` (no padding tokens).
    """

    kv_caches: list
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Per-step scratch shared by all layers (write indices, backend plans); not part of equality.
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @classmethod
    def build(
        cls,
        kv_caches: list,
        context_lens: list[int],
        query_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str | None = None,
    ) -> "AttnMetadata":
        """Build the metadata from host lists (a convenience for tests and simple runners).

        Parameters
        ----------
        kv_caches : list[torch.Tensor]
            The per-layer caches from ``model.make_kv_caches``.
        context_lens : list[int]
            Per sequence, tokens already in the cache before this step.
        query_lens : list[int]
            Per sequence, new tokens this step (>= 1).
        block_tables : list[list[int]]
            Per sequence, its block ids; must cover ``context_len + query_len`` tokens.
        block_size : int
            Tokens per block.
        device : optional
            Where the tensors go; defaults to the caches' device.
        """
        if not (len(context_lens) == len(query_lens) == len(block_tables)) or not query_lens:
            raise ValueError(
                "context_lens, query_lens and block_tables must be non-empty lists of equal length, got "
                f"{len(context_lens)}, {len(query_lens)}, {len(block_tables)}")
        if any(q < 1 for q in query_lens) or any(c < 0 for c in context_lens):
            raise ValueError(f"query_lens must be >= 1 and context_lens >= 0, got {query_lens}, {context_lens}")
        device = device if device is not None else kv_caches[0].device
        seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
        slots = []
        for c, s, table in zip(context_lens, seq_lens, block_tables):
            if len(table) * block_size < s:
                raise ValueError(f"block table {table} covers fewer than {s} tokens of block_size {block_size}")
            slots += [table[p // block_size] * block_size + p % block_size for p in range(c, s)]
        width = max(len(t) for t in block_tables)
        padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        return cls(
            kv_caches=kv_caches,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            block_size=block_size,
        )


def write_kv(
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    attn: AttnMetadata,
) -> None:
    """Write the new tokens' K/V into their slots (tokens with slot -1 are skipped)."""
    flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])
    rows = attn.cache.get("write_rows")
    if rows is None:
        # Decided once per step and shared by all layers: one host sync per step at most.
        slots = attn.slot_mapping
        if bool((slots >= 0).all()):
            rows = (None, slots)
        else:
            keep = (slots >= 0).nonzero().squeeze(1)
            rows = (keep, slots[keep])
        attn.cache["write_rows"] = rows
    keep, slots = rows
    if keep is not None:
        k, v = k[keep], v[keep]
    flat[0].index_copy_(0, slots, k.to(flat.dtype))
    flat[1].index_copy_(0, slots, v.to(flat.dtype))


BACKENDS = ("torch", "flashinfer")


def flashinfer_available() -> bool:
    """Whether the FlashInfer backend can run here (CUDA and an importable flashinfer)."""
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def make_attention_backend(name: str | None, device: torch.device | str,
                           dtype: torch.dtype | None = None, head_dim: int | None = None):
    """Return an attention backend for a model on ``device``.

    ``name`` None picks FlashInfer on CUDA when it is installed and supports the model
    (bf16/fp16, head_dim 64/128/256), else torch. A backend is a callable
    ``backend(q, kv_cache, attn, scale) -> out`` with q [T, num_heads, head_dim],
    kv_cache [2, num_blocks, block_size, num_kv_heads, head_dim], out [T, num_heads, head_dim].
    """
    device = torch.device(device)
    if name is None:
        from .attention_flashinfer import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
        fits = (dtype is None or dtype in SUPPORTED_DTYPES) and (head_dim is None or head_dim in SUPPORTED_HEAD_DIMS)
        name = "flashinfer" if device.type == "cuda" and fits and flashinfer_available() else "torch"
    if name == "torch":
        from .attention_torch import TorchAttention
        return TorchAttention()
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError(f"attn_backend='flashinfer' needs a CUDA device, got {device}")
        if not flashinfer_available():
            raise ValueError("attn_backend='flashinfer' needs the flashinfer package (pip install flashinfer-python)")
        from .attention_flashinfer import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, FlashInferAttention
        if dtype is not None and dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"attn_backend='flashinfer' supports dtype {' or '.join(map(str, SUPPORTED_DTYPES))}, "
                             f"got {dtype}")
        if head_dim is not None and head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"attn_backend='flashinfer' supports head_dim {sorted(SUPPORTED_HEAD_DIMS)}, got {head_dim}")
        return FlashInferAttention(device)
    raise ValueError(f"attn_backend must be None or one of {BACKENDS}, got {name!r}")
