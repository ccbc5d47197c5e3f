"""Argument checks shared by the Python launchers (shapes, dtypes, devices; never values,
which would sync the host)."""

import torch


def check_1d(name: str, t, length: int, dtypes, device) -> None:
    """Raise TypeError/ValueError naming `name` unless `t` is a [length] tensor of `dtypes` on `device`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"{name} must have shape [{length}], got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def dense(t):
    """`t` with unit stride (the kernels index 1-D arguments as t_ptr + i), None stays None.

    A strided view, e.g. ``torch.topk(x, k).values[:, -1]``, would otherwise be read from
    the wrong elements; .contiguous() is free when the tensor is dense already.
    """
    return t if t is None or not isinstance(t, torch.Tensor) else t.contiguous()
