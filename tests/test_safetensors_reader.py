"""The standard-library safetensors reader against the safetensors package's writer, and bad files."""

import json
import os
import struct

import pytest
import torch
from safetensors.torch import save_file

from specops.engine.model.safetensors_reader import read_safetensors_file


def test_reads_what_safetensors_writes(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).bfloat16(),
        "fp16": torch.randn(2, 2, generator=g).half(),
        "i64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    got = read_safetensors_file(str(path))
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert torch.equal(got[name], want), name
    got["w"] += 1  # a fresh, writable tensor, not a view of something shared
    assert torch.equal(read_safetensors_file(str(path))["w"], tensors["w"])


def _file(tmp_path, header, data: bytes = b"", n: int | None = None) -> str:
    raw = json.dumps(header).encode() if isinstance(header, dict) else header
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if n is None else n) + raw + data)
    return str(path)


@pytest.mark.parametrize("make, match", [
    (lambda p: _write(p, b"abc"), "too short"),
    (lambda p: _file(p, {}, n=1 << 40), "does not fit"),
    (lambda p: _file(p, b"{not json"), "not valid JSON"),
    (lambda p: _file(p, b"[1, 2]"), "JSON object"),
    (lambda p: _file(p, {"t": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "malformed header entry"),
    (lambda p: _file(p, {"t": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
     "malformed header entry"),
    (lambda p: _file(p, {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 8), "outside"),
    (lambda p: _file(p, {"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), "needs 12"),
])
def test_bad_files_raise_clear_errors(tmp_path, make, match):
    with pytest.raises(ValueError, match=match):
        read_safetensors_file(make(tmp_path))


def _write(tmp_path, data: bytes) -> str:
    path = os.path.join(tmp_path, "short.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    return path
