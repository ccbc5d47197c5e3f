"""Argument checks shared by the Python launchers (shapes, dtypes, devices; never values,
which would sync the host) and by the host-side builders (ints and reals given as host values)."""

import math
import numbers

import torch

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The logits (and draft probs) dtypes every op takes."""


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


def unit_stride_rows(t: torch.Tensor) -> torch.Tensor:
    """The 2-D `t` with stride 1 over its last dimension, as the kernels read rows: `t` itself,
    a contiguous copy, or, when `t` holds nothing, a fresh empty tensor (torch calls every empty
    tensor contiguous, so .contiguous() keeps strides such as (1, 0) of ``randn(V, 0).t()``)."""
    if t.stride(1) == 1:
        return t
    return t.contiguous() if t.numel() else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def check_real(name: str, v, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False) -> float:
    """`v` as a finite float, raising TypeError / ValueError naming `name` unless it is a real
    number (numpy scalars too, never a bool) within [lo, hi] (lo excluded with lo_open)."""
    # numbers.Real takes numpy scalars too (np.float32 is no Python float; np.float64 is)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    try:
        v = float(v)
    except OverflowError:   # an int past the float range (e.g. 10**400 from JSON)
        raise ValueError(f"{name} must be a finite float, got an int of {int(v).bit_length()} bits") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def check_int(name: str, v, lo: int | None = None, hi: int | None = None) -> int:
    """`v` as an int, raising TypeError / ValueError naming `name` unless it is an int (a numpy
    integer too, never a bool) within [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np
            if isinstance(v, np.integer):
                v = int(v)
        except ImportError:  # pragma: no cover
            pass
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be <= {hi}, got {v}")
    return v


def check_seed(name: str, v) -> int:
    """`v`, an engine seed in [-2^63, 2^64) as torch.manual_seed takes it, as the signed int64
    with the same 64 bits (2^64 - 1 and -1 key the same noise); TypeError / ValueError naming
    `name` otherwise."""
    v = check_int(name, v)
    if not -(1 << 63) <= v < (1 << 64):
        raise ValueError(f"{name} must be an int in [-2^63, 2^64), got {v}")
    return v - (1 << 64) if v >= 1 << 63 else v


def as_device(name: str, device) -> torch.device:
    """torch.device(device), or a ValueError naming the argument (torch's own error names neither;
    the meta device, which holds no data, is refused too)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', "
                         f"got {device!r}") from None
    if dev.type == "meta":
        raise ValueError(f"{name} must be a device that holds data (such as 'cpu' or 'cuda:0'), got 'meta'")
    return dev


def as_data_device(name: str, device) -> torch.device:
    """`as_device`, refusing also a device that specops cannot put data on here: a type other
    than cpu or cuda (torch's own error, a RuntimeError or an AssertionError, names neither
    the argument nor the device), cuda on a torch without a CUDA device, and a cuda index past
    the last device."""
    dev = as_device(name, device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a cpu or cuda device (the devices specops runs on), got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {device!r}: this torch has no CUDA device")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def check_not_meta(name: str, t: torch.Tensor) -> None:
    """ValueError naming `name` when the tensor `t` is on the meta device (shapes, no data: the
    ops compute values; torch.compile's fake tensors report their real device and pass)."""
    if t.device.type == "meta":
        raise ValueError(f"{name} is on the meta device, which holds no data: give a tensor on cpu or cuda")
