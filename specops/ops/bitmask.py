"""Grammar bitmask apply: logits of tokens a grammar disallows become -inf, in place, with
the semantics of ``xgrammar.apply_token_bitmask_inplace``."""

from __future__ import annotations

import operator
from typing import Sequence

import torch

from specops import _C  # noqa: F401  (registers torch.ops.specops.*)
from specops.ops._checks import (FLOAT_DTYPES, INDEX_DTYPES, check_no_overlap, check_tensor, check_vocab_width,
                                 check_written_in_place)


def apply_token_bitmask_(
    logits: torch.Tensor,  # [num_rows, vocab] fp32/bf16/fp16, updated in place
    bitmask: torch.Tensor,  # [bitmask_rows, ceil(vocab_bm / 32)] int32, packed bits
    indices: torch.Tensor | Sequence[int] | None = None,  # [n] int32/int64: rows to mask
) -> None:
    """Set ``logits[r, j] = -inf`` wherever the bitmask disallows token ``j`` for row ``r``.

    Same semantics as ``xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=indices)``:

    * Bit ``j % 32`` of word ``j // 32`` of a bitmask row is token ``j``; 1 = allowed,
      0 = disallowed (set to -inf). Allowed logits keep their exact bits (on CUDA a
      32-byte sector holding both kinds is read and written back whole).
    * Columns masked: ``min(logits.shape[1], 32 * bitmask.shape[1])``. Logits wider than
      the bitmask keep their trailing columns unmasked (allocate the bitmask for the full,
      padded vocab to mask them); bits beyond the logits width are ignored.
    * Without ``indices``, bitmask row ``r`` applies to logits row ``r`` and the row
      counts must be equal. With ``indices``, only the rows it names are masked, and
      ``indices[i]`` names a row of **both** tensors: logits row ``indices[i]`` is masked
      with bitmask row ``indices[i]`` (as in xgrammar; vLLM passes a bitmask with one
      row per logits row). Indices outside ``[0, min(logits rows, bitmask rows))`` are
      skipped; duplicates are harmless.

    Parameters
    ----------
    logits : torch.Tensor
        ``[num_rows, vocab]`` float32, bfloat16 or float16, CPU or CUDA; rows may be strided,
        the last dimension must be contiguous.
    bitmask : torch.Tensor
        int32, 2-D, on the device of ``logits``, last dimension contiguous.
    indices : torch.Tensor or sequence of int, optional
        ``[n]`` int32/int64 on the device of ``logits`` (a Python sequence is copied there).

    Examples
    --------
    >>> logits = torch.zeros(1, 4)
    >>> apply_token_bitmask_(logits, torch.tensor([[0b0101]], dtype=torch.int32))
    >>> logits
    tensor([[0., -inf, 0., -inf]])
    """
    op = "apply_token_bitmask_"
    check_tensor(op, "logits", logits, FLOAT_DTYPES, 2)   # first: host indices go to its device
    if indices is not None and not isinstance(indices, torch.Tensor):
        indices = _host_indices(op, indices).to(logits.device, non_blocking=True)
    _check_args(op, logits, bitmask, indices)
    check_no_overlap(op, "logits", logits, bitmask=bitmask, indices=indices)
    torch.ops.specops.apply_token_bitmask_(logits, bitmask, indices)


def _check_args(op: str, logits, bitmask, indices) -> None:
    """Types, shapes, strides and devices (the wrapper's checks, and the fake kernel's)."""
    check_tensor(op, "logits", logits, FLOAT_DTYPES, 2)
    check_vocab_width(op, "logits", logits)
    check_written_in_place(op, "logits", logits)
    check_tensor(op, "bitmask", bitmask, (torch.int32,), 2, like=logits)
    if indices is None:
        if bitmask.shape[0] != logits.shape[0]:
            raise ValueError(f"{op}: without indices, bitmask must have one row per logits row "
                             f"({logits.shape[0]}), got {bitmask.shape[0]}")
    else:
        check_tensor(op, "indices", indices, INDEX_DTYPES, 1, like=logits)


def _host_indices(op: str, indices: Sequence[int]) -> torch.Tensor:
    """[n] int64 of a sequence of ints (bools and floats refused); values that cannot name a
    row (negative, or past 2**62) are left out, as the op skips them anyway."""
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
        raise TypeError(f"{op}: indices must be a tensor or a sequence of ints, got {type(indices).__name__}")
    rows = []
    for i in indices:
        try:
            if isinstance(i, bool):
                raise TypeError
            i = operator.index(i)           # ints and numpy ints; floats refused, not truncated
        except TypeError:
            raise TypeError(f"{op}: indices must hold ints, got {i!r}") from None
        if 0 <= i < 2**62:
            rows.append(i)
    return torch.tensor(rows, dtype=torch.int64)


@torch.library.register_fake("specops::apply_token_bitmask_")
def _apply_token_bitmask_fake(logits, bitmask, indices=None):
    _check_args("apply_token_bitmask_", logits, bitmask, indices)   # a direct torch.ops call is checked too
    return None


def unpack_bitmask(
    bitmask: torch.Tensor,  # [rows, words] int32
    vocab: int,
) -> torch.Tensor:  # [rows, min(vocab, 32 * words)] bool, True = allowed
    """Expand packed bits: ``out[r, j]`` is bit ``j % 32`` of ``bitmask[r, j // 32]``.

    A bitmask narrower than ``vocab`` gives only its ``32 * words`` columns (it says
    nothing of the tokens past them, which :func:`apply_token_bitmask_` leaves as they are).
    """
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], 32 * bitmask.shape[1])[:, :vocab].bool()


def apply_token_bitmask_torch(
    logits: torch.Tensor,  # [num_rows, vocab] fp32/bf16/fp16, updated in place
    bitmask: torch.Tensor,  # [bitmask_rows, words] int32
    indices: torch.Tensor | None = None,  # [n] int32/int64
) -> None:
    """In-place reference for :func:`apply_token_bitmask_` (no host sync)."""
    vocab = min(logits.shape[1], 32 * bitmask.shape[1])
    valid_rows = min(logits.shape[0], bitmask.shape[0])
    if valid_rows == 0 or vocab == 0:
        return
    rows = (torch.arange(logits.shape[0], device=logits.device) if indices is None else indices.long())
    valid = (rows >= 0) & (rows < valid_rows)
    rows = rows.clamp(0, valid_rows - 1)
    disallowed = ~unpack_bitmask(bitmask[rows], vocab) & valid.unsqueeze(1)  # [n, vocab]
    hits = torch.zeros(logits.shape[0], vocab, dtype=torch.int32, device=logits.device)
    hits.index_add_(0, rows, disallowed.int())
    logits[:, :vocab].masked_fill_(hits > 0, float("-inf"))
