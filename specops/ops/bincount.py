"""Per-request token histograms for the penalties: a full build from padded token rows,
and an in-place update with the newly accepted tokens only (cost independent of the
history length)."""

from __future__ import annotations

import operator

import torch

from specops import _C  # noqa: F401  (registers torch.ops.specops.*)
from specops.ops._checks import (INDEX_DTYPES, MAX_VOCAB, check_no_overlap, check_tensor, check_vocab_width,
                                 check_written_in_place)



def token_bincount(
    token_ids: torch.Tensor,  # [num_reqs, max_len] int32/int64, rows padded
    vocab_size: int,
) -> torch.Tensor:  # [num_reqs, vocab_size] int32
    """Count each token id per row.

    Parameters
    ----------
    token_ids : torch.Tensor
        ``[num_reqs, max_len]`` int32 or int64, on CPU or CUDA; rows may be strided but
        the last dimension must be contiguous. Ids outside ``[0, vocab_size)`` (padding
        such as ``-1`` or ``vocab_size``) are ignored, never written out of bounds.
    vocab_size : int
        Number of columns of the result, in ``[0, 2**31 - 2**20 - 1]`` (``MAX_VOCAB``).

    Returns
    -------
    torch.Tensor
        ``counts[r, t]`` = number of occurrences of ``t`` in ``token_ids[r]``, int32.

    Examples
    --------
    >>> token_bincount(torch.tensor([[3, 1, 3, -1]]), 4)
    tensor([[0, 1, 0, 2]], dtype=torch.int32)
    """
    vocab_size = _check_bincount("token_bincount", token_ids, vocab_size)
    return torch.ops.specops.token_bincount(token_ids, vocab_size)


def _check_bincount(op: str, token_ids, vocab_size):
    """token_bincount's checks (the wrapper's and the fake kernel's); vocab_size as an int."""
    check_tensor(op, "token_ids", token_ids, INDEX_DTYPES, 2)
    if not isinstance(vocab_size, torch.SymInt):
        try:
            if isinstance(vocab_size, bool):
                raise TypeError
            vocab_size = operator.index(vocab_size)     # ints and numpy ints; floats refused
        except TypeError:
            raise TypeError(f"{op}: vocab_size must be an int, got {type(vocab_size).__name__}") from None
    if not 0 <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"{op}: vocab_size must be in [0, {MAX_VOCAB}], got {vocab_size}")
    return vocab_size


def token_bincount_update_(
    counts: torch.Tensor,  # [num_reqs, vocab] int32, updated in place
    req_indices: torch.Tensor,  # [n] int32/int64
    token_ids: torch.Tensor,  # [n] int32/int64
) -> None:
    """Add one count per ``(req_indices[i], token_ids[i])`` pair, in place.

    Duplicated pairs are all counted (atomic adds on CUDA). Pairs whose request index is
    outside ``[0, num_reqs)`` or whose token id is outside ``[0, vocab)`` (e.g. ``-1`` for a
    rejected draft slot) are ignored. The cost depends on ``n`` only, not on how many
    tokens the requests have produced so far.

    Parameters
    ----------
    counts : torch.Tensor
        ``[num_reqs, vocab]`` int32, last dimension contiguous; updated in place.
    req_indices, token_ids : torch.Tensor
        ``[n]`` int32 or int64 each, contiguous, on the device of ``counts``.
    """
    op = "token_bincount_update_"
    _check_update(op, counts, req_indices, token_ids)
    check_no_overlap(op, "counts", counts, req_indices=req_indices, token_ids=token_ids)
    torch.ops.specops.token_bincount_update_(counts, req_indices, token_ids)


def _check_update(op: str, counts, req_indices, token_ids) -> None:
    """token_bincount_update_'s checks of types, shapes, strides and devices (wrapper and fake)."""
    check_tensor(op, "counts", counts, (torch.int32,), 2)
    check_vocab_width(op, "counts", counts)
    check_written_in_place(op, "counts", counts)
    check_tensor(op, "req_indices", req_indices, INDEX_DTYPES, 1)
    check_tensor(op, "token_ids", token_ids, INDEX_DTYPES, 1, shape=tuple(req_indices.shape),
                 shape_desc=" like req_indices")
    for name, t in (("req_indices", req_indices), ("token_ids", token_ids)):
        if t.device != counts.device:
            raise ValueError(f"{op}: {name} must be on {counts.device} (the device of counts), got {t.device}")


# The fake kernels run the wrappers' checks too: a direct torch.ops.specops call under
# torch.compile (or on meta tensors) gets the same errors instead of an output of a made-up shape.
@torch.library.register_fake("specops::token_bincount")
def _token_bincount_fake(token_ids, vocab_size):
    vocab_size = _check_bincount("token_bincount", token_ids, vocab_size)
    return token_ids.new_empty((token_ids.shape[0], vocab_size), dtype=torch.int32)


@torch.library.register_fake("specops::token_bincount_update_")
def _token_bincount_update_fake(counts, req_indices, token_ids):
    _check_update("token_bincount_update_", counts, req_indices, token_ids)
    return None


def token_bincount_torch(
    token_ids: torch.Tensor,  # [num_reqs, max_len] int32/int64
    vocab_size: int,
) -> torch.Tensor:  # [num_reqs, vocab_size] int32
    """Reference for :func:`token_bincount` (scatter_add into a spare column for padding)."""
    ids = token_ids.long()
    ids = torch.where((ids >= 0) & (ids < vocab_size), ids, vocab_size)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids))
    return counts[:, :vocab_size].to(torch.int32)


def token_bincount_update_torch(
    counts: torch.Tensor,  # [num_reqs, vocab] int32, updated in place
    req_indices: torch.Tensor,  # [n] int32/int64
    token_ids: torch.Tensor,  # [n] int32/int64
) -> None:
    """In-place reference for :func:`token_bincount_update_` (index_add into a spare slot for invalid pairs)."""
    rows, vocab = counts.shape
    r, t = req_indices.long(), token_ids.long()
    valid = (r >= 0) & (r < rows) & (t >= 0) & (t < vocab)
    flat = torch.where(valid, r * vocab + t, rows * vocab)
    added = torch.zeros(rows * vocab + 1, dtype=torch.int64, device=counts.device)
    added.index_add_(0, flat, torch.ones_like(flat))
    counts += added[:-1].view(rows, vocab).to(torch.int32)
