"""Expand per-request values to per-draft-row values (spec decoding), one program per request.

Request r owns rows [cu[r-1], cu[r]) of the draft rows; every one of them gets the
request's value, optionally with a replacement (the greedy temperature 0 -> 1, so
rows can be divided by it) and optionally plus the row's offset within the request
(positions of draft i, output lengths before draft i).
"""

import torch
import triton
import triton.language as tl

from specops._arg_checks import check_int


@triton.jit(do_not_specialize=["num_reqs", "num_tokens", "replace_from", "replace_to"])
def _expand_kernel(
    out_ptr,           # [num_tokens]
    values_ptr,        # [num_reqs]
    cu_ptr,            # [num_reqs] inclusive cumulative counts
    num_reqs,
    num_tokens,
    replace_from,
    replace_to,
    REPLACE: tl.constexpr,
    ADD_INDEX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    # clamped into [0, num_tokens]: counts that are negative or do not end at num_tokens (not
    # checked on the host: no sync) leave rows unwritten instead of storing out of bounds
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + req - 1, mask=req > 0, other=0), 0), num_tokens)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + req), 0), num_tokens)
    value = tl.load(values_ptr + req)
    if REPLACE:
        value = tl.where(value == replace_from, replace_to, value).to(value.dtype)
    offs = tl.arange(0, BLOCK)
    vals = tl.zeros([BLOCK], dtype=value.dtype) + value
    if ADD_INDEX:
        vals = vals + offs.to(value.dtype)
    tl.store(out_ptr + start + offs, vals, mask=offs < end - start)


def expand_to_draft_rows(
    values: torch.Tensor,               # [num_reqs] any numeric dtype
    cu_num_draft_tokens: torch.Tensor,  # [num_reqs] int32/int64 inclusive cumulative drafts
    num_tokens: int,
    max_spec_len: int,
    replace_from: float | int | None = None,
    replace_to: float | int | None = None,
    add_index: bool = False,
) -> torch.Tensor:                      # [num_tokens] values.dtype
    """out[cu[r-1] + i] = value[r] (replaced when equal to replace_from) (+ i when add_index).

    Parameters
    ----------
    values : torch.Tensor
        [num_reqs] per-request values.
    cu_num_draft_tokens : torch.Tensor
        [num_reqs] inclusive cumulative draft counts; every request has at most
        ``max_spec_len`` drafts and ``cu[-1] == num_tokens``. Device values, not checked
        (no host sync): the kernel clamps them into [0, num_tokens], so bad counts leave
        rows unwritten but never store outside the output.
    num_tokens : int
        Total draft rows (host int, the output length).
    max_spec_len : int
        Largest draft count of one request (host int).
    replace_from, replace_to : scalar, optional
        Values equal to ``replace_from`` become ``replace_to`` (e.g. temperature 0 -> 1).
    add_index : bool
        Add the row's index within its request (0 .. K-1).

    Returns
    -------
    torch.Tensor
        [num_tokens] with ``values.dtype``.
    """
    for name, t in (("values", values), ("cu_num_draft_tokens", cu_num_draft_tokens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [num_reqs], got {type(t).__name__}")
    num_tokens = check_int("num_tokens", num_tokens, 0)
    max_spec_len = check_int("max_spec_len", max_spec_len, 0)
    if values.dim() != 1 or cu_num_draft_tokens.dim() != 1 or values.shape != cu_num_draft_tokens.shape:
        raise ValueError(f"values and cu_num_draft_tokens must be [num_reqs], got {tuple(values.shape)} "
                         f"and {tuple(cu_num_draft_tokens.shape)}")
    if values.device != cu_num_draft_tokens.device:
        raise ValueError(f"values is on {values.device} but cu_num_draft_tokens on {cu_num_draft_tokens.device}")
    if cu_num_draft_tokens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_num_draft_tokens must be int32 or int64, got {cu_num_draft_tokens.dtype}")
    if (replace_from is None) != (replace_to is None):
        raise ValueError("replace_from and replace_to must be given together")
    out = torch.empty(num_tokens, dtype=values.dtype, device=values.device)
    num_reqs = values.shape[0]
    if num_reqs == 0 or num_tokens == 0:
        return out
    block = triton.next_power_of_2(max(max_spec_len, 1))
    _expand_kernel[(num_reqs,)](
        out, values.contiguous(), cu_num_draft_tokens.contiguous(), num_reqs, num_tokens,
        0 if replace_from is None else replace_from, 0 if replace_to is None else replace_to,
        REPLACE=replace_from is not None, ADD_INDEX=add_index, BLOCK=block, num_warps=1)
    return out
