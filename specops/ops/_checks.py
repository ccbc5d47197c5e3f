"""Argument checks shared by the op wrappers: clear errors before any kernel launch.

Only shapes, dtypes, devices and strides are inspected (never tensor values), so the
checks cost no device sync and trace cleanly under torch.compile.
"""

from __future__ import annotations

from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_VOCAB = 2**31 - 2**20 - 1   # the widest vocabulary any op takes (CUDA in-row offsets are int32)


def _names(dtypes: Sequence[torch.dtype]) -> str:
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_tensor(op: str, name: str, t: object, dtypes: Sequence[torch.dtype], ndim: int,
                 like: torch.Tensor | None = None, shape: Sequence[int] | None = None,
                 shape_desc: str = "") -> None:
    """Raise TypeError/ValueError naming `name` unless `t` is a tensor of one of `dtypes`,
    with `ndim` dimensions, a contiguous last dimension, `shape` (if given) and on the
    device of `like` (if given)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{op}: {name} must be a dense (strided) tensor, got layout {t.layout}; call .to_dense()")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} must be {_names(dtypes)}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}{shape_desc}, got {tuple(t.shape)}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{op}: {name} must be on {like.device} (the device of logits), got {t.device}")
    if t.dim() >= 1 and t.shape[-1] > 1 and t.numel() > 0 and t.stride(-1) != 1:   # an empty t reads nothing
        raise ValueError(f"{op}: {name} must have a contiguous last dimension (stride 1), "
                         f"got strides {tuple(t.stride())}; call .contiguous() first")


def check_vocab_width(op: str, name: str, t: torch.Tensor) -> None:
    """Raise ValueError unless the 2-D `t` has at most MAX_VOCAB columns."""
    if t.shape[1] > MAX_VOCAB:
        raise ValueError(f"{op}: {name} must have at most {MAX_VOCAB} columns, got {t.shape[1]}")


def check_written_in_place(op: str, name: str, t: torch.Tensor) -> None:
    """Raise ValueError unless the op may write `t` in place: no two of its elements share
    memory (a stride of 0 on a dimension of size > 1, as `expand` makes, or rows closer than
    their length: the rows would add their writes up, and race), autograd does not track it
    (the op has no backward) and it is not an inference tensor outside inference mode (its
    version cannot be bumped there: torch refuses such writes)."""
    rows_overlap = t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1 and t.stride(0) < t.shape[1]
    if rows_overlap or any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
        raise ValueError(f"{op}: {name} is written in place, so its elements must not share memory; "
                         f"got strides {tuple(t.stride())} for shape {tuple(t.shape)} (from expand or as_strided?): "
                         f"pass .clone()")
    if not torch.compiler.is_compiling() and t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{op}: {name} is an inference tensor (made under torch.inference_mode()), which "
                         f"cannot be written in place outside inference mode; call it under "
                         f"torch.inference_mode() or on {name}.clone()")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{op}: {name} is written in place without a backward, so it must not require "
                         f"grad; call it under torch.no_grad() or on {name}.detach()")


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses of `t`'s elements (t not empty)."""
    start = t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _within_one_row_gap(t: torch.Tensor, lo: int, hi: int) -> bool:
    """Whether bytes [lo, hi) lie in the gap after one row of the 2-D, row-strided `t` (last
    dimension contiguous): past that row's last element and before the next row."""
    if t.dim() != 2 or t.shape[0] <= 1 or t.stride(-1) != 1 or t.stride(0) <= t.shape[1] or lo < t.data_ptr():
        return False   # no gaps between rows
    row_bytes, used_bytes = t.stride(0) * t.element_size(), t.shape[1] * t.element_size()
    row, offset = divmod(lo - t.data_ptr(), row_bytes)
    return offset >= used_bytes and hi - t.data_ptr() <= (row + 1) * row_bytes


def check_no_overlap(op: str, name: str, t: torch.Tensor, **inputs: object) -> None:
    """Raise ValueError if `t`, which the op writes in place, shares memory with one of the
    tensors in `inputs` (read while `t` is written: a row written first would be read back
    penalised, and CPU threads would race). Same storage and intersecting byte ranges, as
    torch's own in-place ops refuse, unless the input lies in the gap between two rows of
    `t` (a staging buffer packing per-row data beside a strided view). Skipped while
    torch.compile traces (fake tensors have no memory) and for tensors without storage."""
    if torch.compiler.is_compiling() or t.numel() == 0 or t.device.type == "meta":
        return
    try:
        storage = t.untyped_storage().data_ptr()
        lo, hi = _byte_range(t)
    except (RuntimeError, NotImplementedError):   # a tensor subclass without real storage
        return
    for other_name, other in inputs.items():
        if not isinstance(other, torch.Tensor) or other.numel() == 0 or other.device != t.device:
            continue
        try:
            if other.untyped_storage().data_ptr() != storage:
                continue
            olo, ohi = _byte_range(other)
        except (RuntimeError, NotImplementedError):
            continue
        if olo < hi and lo < ohi and not _within_one_row_gap(t, olo, ohi):
            raise ValueError(f"{op}: {other_name} shares memory with {name}, which the op writes in place; "
                             f"pass a copy ({other_name}.clone())")

