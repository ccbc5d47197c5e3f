"""Read a ``.safetensors`` file with the standard library and torch alone.

The format: 8 bytes little-endian N, N bytes of JSON ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data, offsets counted
from the end of the header. Reading it here, rather than through the ``safetensors``
package, keeps the package's native code out of the loading path: on the GPU image
(safetensors 0.8.0, torch 2.11) a process loading a checkpoint through it died with
"free(): invalid pointer".
"""

from __future__ import annotations

import json
import math
import os
import struct

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 << 20  # bytes; the format's own limit


def read_safetensors_file(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of one ``.safetensors`` file, on the CPU, in its stored dtype.

    Raises ValueError naming the file and what is wrong for anything that is not a
    well-formed file (short header, bad JSON, unknown dtype, offsets outside the data,
    a byte count that does not match the shape).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: too short for a safetensors header ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: header length {n} does not fit the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: header is not valid JSON ({e})") from e
        if not isinstance(header, dict):
            raise ValueError(f"{path}: header must be a JSON object, got {type(header).__name__}")
        data_start, data_len = 8 + n, size - 8 - n
        out: dict[str, torch.Tensor] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            out[name] = _read_tensor(f, path, name, info, data_start, data_len)
    return out


def _read_tensor(f, path: str, name: str, info, data_start: int, data_len: int) -> torch.Tensor:
    """One tensor: its header entry checked, its bytes read into a fresh CPU tensor."""
    try:
        dtype = _DTYPES[info["dtype"]]
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from e
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len:
        raise ValueError(f"{path}: tensor {name!r} has shape {shape} / offsets [{begin}, {end}] outside the data")
    if end - begin != math.prod(shape) * itemsize:
        raise ValueError(f"{path}: tensor {name!r} holds {end - begin} bytes, its shape {shape} of "
                         f"{info['dtype']} needs {math.prod(shape) * itemsize}")
    f.seek(data_start + begin)
    buf = bytearray(end - begin)
    if f.readinto(buf) != len(buf):
        raise ValueError(f"{path}: tensor {name!r} is cut short")
    if not buf:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(shape)
