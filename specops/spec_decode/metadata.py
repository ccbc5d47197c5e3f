"""Spec-decode metadata: where the target, bonus and draft rows sit in one step's logits.

A request that verifies K drafts schedules 1 + K tokens this step: the token sampled
last step followed by its K drafts. The forward keeps the logits of those 1 + K
positions: the first K verify the drafts (target rows), the last one gives the bonus
token when every draft is accepted. A request without drafts (plain decode or the
last chunk of a prefill) keeps only its last position, which is a bonus row.

Worked example (5 requests scheduling 4/100/3/100/2 tokens, drafts 3/0/2/0/1)::

    cu_num_scheduled_tokens  [  4, 104, 107, 207, 209]
    num_draft_tokens         [  3,   0,   2,   0,   1]
    cu_num_draft_tokens      [  3,   3,   5,   5,   6]
    logits_indices           [  0,   1,   2,   3, 103, 104, 105, 106, 206, 207, 208]
    target_logits_indices    [  0,   1,   2,   5,   6,   9]
    bonus_logits_indices     [  3,   4,   7,   8,  10]

target/bonus indices point into the gathered logits (``logits[logits_indices]``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specops._arg_checks import as_data_device, check_not_meta

MAX_SPEC_LEN = 128
"""Largest number of drafts per request (K) that the builder and the rejection kernels accept."""
_MAX_INDEX = 2**31 - 1   # the index tensors are int32


@dataclass
class SpecDecodeMetadata:
    """Row layout of one speculative step (device tensors, int32 but for the draft ids; host
    ints where noted).

    Attributes
    ----------
    draft_token_ids : torch.Tensor or None
        [num_draft_tokens_total], drafts of all requests concatenated, with the dtype of the
        step's input ids (int32 or int64: never narrowed, so that an id outside the
        vocabulary stays outside it and is rejected), when the builder was given them.
    num_draft_tokens : list[int]
        Host copy of the drafts per request.
    cu_num_draft_tokens : torch.Tensor
        [num_reqs] int32, inclusive cumulative drafts per request.
    logits_indices : torch.Tensor
        [num_draft_tokens_total + num_reqs] int32, positions of the scheduled tokens
        whose logits the forward must keep.
    target_logits_indices : torch.Tensor
        [num_draft_tokens_total] int32, target rows within ``logits[logits_indices]``.
    bonus_logits_indices : torch.Tensor
        [num_reqs] int32, bonus rows within ``logits[logits_indices]``.
    max_spec_len : int
        Host int, the largest draft count of the step (output has max_spec_len + 1 columns),
        at most MAX_SPEC_LEN.
    """

    draft_token_ids: torch.Tensor | None
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor
    logits_indices: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    max_spec_len: int

    @property
    def num_reqs(self) -> int:
        return len(self.num_draft_tokens)

    @property
    def total_draft_tokens(self) -> int:
        return int(sum(self.num_draft_tokens))


def _host_ints(name: str, values) -> np.ndarray:
    """`values` as a one-dimensional int64 array; raises on non-integers and on values that
    int64 cannot hold (naming the value: a cast would wrap it)."""
    if isinstance(values, torch.Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {values.dtype}")
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.size == 0:
        arr = arr.reshape(0).astype(np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(arr.shape)}")
    if arr.dtype == object:   # Python ints past int64 (or other objects)
        for v in arr:
            if not isinstance(v, numbers.Integral):
                raise TypeError(f"{name} must hold integers, got {v!r} ({type(v).__name__})")
        for v in arr:
            if not -2**63 <= int(v) < 2**63:
                raise ValueError(f"{name} must hold values that fit in int64, got {int(v)}")
    elif arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got {arr.dtype}")
    elif arr.size and arr.dtype == np.uint64 and int(arr.max()) >= 2**63:
        raise ValueError(f"{name} must hold values that fit in int64, got {int(arr.max())}")
    return arr.astype(np.int64)


def build_spec_decode_metadata(
    num_draft_tokens: Sequence[int] | np.ndarray | torch.Tensor,         # [num_reqs] host ints
    cu_num_scheduled_tokens: Sequence[int] | np.ndarray | torch.Tensor,  # [num_reqs] host ints
    input_ids: torch.Tensor | None = None,  # [num_scheduled_tokens] int, the step's input ids
    device: torch.device | str | None = None,
) -> SpecDecodeMetadata:
    """Compute the spec-decode row layout from the scheduler's per-request counts.

    Parameters
    ----------
    num_draft_tokens : sequence of int
        Drafts scheduled per request (0 for requests that do not speculate).
    cu_num_scheduled_tokens : sequence of int
        Inclusive cumulative count of scheduled tokens per request. A request with K
        drafts must schedule at least K + 1 tokens.
    input_ids : torch.Tensor, optional
        The step's input ids; when given, ``draft_token_ids`` is gathered from it on its
        device and keeps its dtype (the drafts are the scheduled tokens after each target
        position). Ids are not checked here: one outside the vocabulary is rejected by the
        rejection sampler.
    device : torch.device or str, optional
        Device of the index tensors; defaults to ``input_ids.device`` or CPU.

    Returns
    -------
    SpecDecodeMetadata

    Raises
    ------
    ValueError
        On mismatched lengths, negative or too many drafts, non-increasing cumulative
        counts, more than 2**31 scheduled tokens (the indices are int32), more than
        ``MAX_SPEC_LEN`` (128) drafts for one request, or counts that int64 cannot hold.
    TypeError
        On counts that are not integers, or input_ids that are not an int32 / int64 tensor.

    Examples
    --------
    >>> md = build_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209])
    >>> md.bonus_logits_indices.tolist()
    [3, 4, 7, 8, 10]
    """
    nd = _host_ints("num_draft_tokens", num_draft_tokens)
    cu = _host_ints("cu_num_scheduled_tokens", cu_num_scheduled_tokens)
    if nd.shape != cu.shape:
        raise ValueError(f"num_draft_tokens and cu_num_scheduled_tokens must have the same length, "
                         f"got {nd.size} and {cu.size}")
    if (nd < 0).any():
        raise ValueError(f"num_draft_tokens must be >= 0, got {nd.tolist()}")
    if nd.size and int(nd.max()) > MAX_SPEC_LEN:
        raise ValueError(f"num_draft_tokens must be <= MAX_SPEC_LEN={MAX_SPEC_LEN}, got {int(nd.max())}")
    num_sched = np.diff(cu, prepend=0)
    if (num_sched < 1).any():
        raise ValueError("cu_num_scheduled_tokens must be strictly increasing from a first value >= 1, "
                         f"got {cu.tolist()}")
    if cu.size and int(cu[-1]) > _MAX_INDEX + 1:
        raise ValueError(f"cu_num_scheduled_tokens must end at most at 2**31 (the indices are int32), got "
                         f"{int(cu[-1])}")
    if (nd + 1 > num_sched).any():
        bad = int(np.argmax(nd + 1 > num_sched))
        raise ValueError(f"request {bad} schedules {int(num_sched[bad])} tokens but has {int(nd[bad])} "
                         f"drafts: num_draft_tokens[r] + 1 <= scheduled tokens of r is required")
    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"input_ids must be int32 or int64 token ids, got {input_ids.dtype}")
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must be one-dimensional, got shape {tuple(input_ids.shape)}")
        check_not_meta("input_ids", input_ids)
        if cu.size and input_ids.shape[0] < cu[-1]:
            raise ValueError(f"input_ids has {input_ids.shape[0]} tokens, cu_num_scheduled_tokens "
                             f"needs {int(cu[-1])}")
    device = (torch.device("cpu") if input_ids is None else input_ids.device) if device is None else \
        as_data_device("device", device)
    if input_ids is not None and input_ids.device != device and not (
            device.type == "cuda" and device.index is None and input_ids.device.type == "cuda"):
        raise ValueError(f"input_ids must be on device {device}, got {input_ids.device}")

    rows = nd + 1                                   # logits rows kept per request
    cu_rows = np.cumsum(rows)
    first_row = cu_rows - rows                      # first kept row of each request
    # logits_indices: the last (K + 1) scheduled positions of each request
    within = np.arange(int(rows.sum())) - np.repeat(first_row, rows)
    logits_indices = np.repeat(cu - rows, rows) + within
    # target rows: the first K kept rows of each request; bonus: the last one
    is_target = within < np.repeat(nd, rows)
    target_logits_indices = np.nonzero(is_target)[0]
    bonus_logits_indices = cu_rows - 1

    def dev(a: np.ndarray) -> torch.Tensor:   # through pinned memory: a pageable copy may wait on the stream
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

    target_t = dev(target_logits_indices)
    logits_t = dev(logits_indices)
    draft = None
    if input_ids is not None:
        # the ids keep their width: narrowing int64 to int32 could wrap an id outside the
        # vocabulary (e.g. 2**32 + 3) into it, where the kernels would accept it
        draft = input_ids[logits_t[target_t.long() + 1].long()]
    return SpecDecodeMetadata(
        draft_token_ids=draft,
        num_draft_tokens=[int(v) for v in nd],
        cu_num_draft_tokens=dev(np.cumsum(nd)),
        logits_indices=logits_t,
        target_logits_indices=target_t,
        bonus_logits_indices=dev(bonus_logits_indices),
        max_spec_len=int(nd.max()) if nd.size else 0,
    )
