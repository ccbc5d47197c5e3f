"""Argument checks shared by the op wrappers: clear errors before any kernel launch.

Only shapes, dtypes, devices and strides are inspected (never tensor values), so the
checks cost no device sync and trace cleanly under torch.compile.
"""

from __future__ import annotations

from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


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
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} must be {_names(dtypes)}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}{shape_desc}, got {tuple(t.shape)}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{op}: {name} must be on {like.device} (the device of logits), got {t.device}")
    if t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} must have a contiguous last dimension (stride 1), "
                         f"got strides {tuple(t.stride())}; call .contiguous() first")
