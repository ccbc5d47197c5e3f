"""Experiment: how fast can a kernel only read logits on this GPU? The practical floor of the
passes that read every row once (sampling pass 1, rejection pass 1).

The benchmarks' floor divides the bytes an op must move by the device-to-device copy
bandwidth (bench.common.copy_bandwidth: bytes read + written). This script times kernels that
read a [rows, V] fp32 / bf16 matrix once and write one value per chunk, in a CUDA graph as
the benchmarks time (bench.common.time_us), and prints each as TB/s and as a ratio to that
floor:

- torch.amax(x, dim=1), torch.sum(x, dim=1);
- a Triton chunk max, grid (rows, V / CHUNK), one load of CHUNK entries per program (rejection
  pass 1's geometry at CHUNK = 4096, 4 warps), for several CHUNK / warps;
- the same chunk max with programs looping over the chunks (grid: PER_SM programs per SM).

Run from the repo root on the GPU machine (about 30 s):

    python bench/exp_read_bandwidth.py
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import copy_bandwidth, time_us  # noqa: E402

VOCAB = 128256
SHAPES = [(128, torch.float32), (512, torch.float32), (128, torch.bfloat16), (512, torch.bfloat16)]
GEOMETRIES = [(4096, 4), (4096, 8), (8192, 8), (2048, 4), (16384, 8)]   # (CHUNK, warps) of the one-load kernel
PERSISTENT = [(4096, 4, 8), (4096, 4, 16), (8192, 8, 4)]                 # (CHUNK, warps, programs per SM)


@triton.jit
def _chunk_max_kernel(x_ptr, out_ptr, V, NUM_CHUNKS, CHUNK: tl.constexpr):
    """Program (r, c): out[r, c] = max of x[r, c * CHUNK : (c + 1) * CHUNK] (one load)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + r.to(tl.int64) * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    tl.store(out_ptr + r * NUM_CHUNKS + c, tl.max(x, axis=0))


@triton.jit
def _chunk_max_loop_kernel(x_ptr, out_ptr, V, NUM_CHUNKS, TOTAL, CHUNK: tl.constexpr):
    """Programs loop over the TOTAL = rows * NUM_CHUNKS chunks (chunk w, w + num_programs, ...)."""
    for w in range(tl.program_id(0), TOTAL, tl.num_programs(0)):
        r = w // NUM_CHUNKS
        c = w % NUM_CHUNKS
        offs = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + r.to(tl.int64) * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        tl.store(out_ptr + w, tl.max(x, axis=0))


def main() -> None:
    if not torch.cuda.is_available():
        print("exp_read_bandwidth needs CUDA: nothing to do")
        return
    bw = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s (read + written), V={VOCAB}")
    print(f"{'rows':>5} {'dtype':>5} {'kernel':<34} {'us':>8} {'TB/s':>6} {'x floor':>7}")
    for rows, dtype in SHAPES:
        x = torch.randn(rows, VOCAB, device="cuda").to(dtype)
        nbytes = x.numel() * x.element_size()
        floor = nbytes / bw * 1e6

        def show(name, fn):
            us = time_us(fn)
            print(f"{rows:>5} {str(dtype)[6:]:>5} {name:<34} {us:8.2f} {nbytes / us / 1e6:6.2f} {us / floor:7.2f}",
                  flush=True)
        print(f"{rows:>5} {str(dtype)[6:]:>5} {'floor (bytes / copy bandwidth)':<34} {floor:8.2f}")
        show("torch.amax(dim=1)", lambda: torch.amax(x, dim=1))
        show("torch.sum(dim=1)", lambda: torch.sum(x, dim=1))
        for chunk, warps in GEOMETRIES:
            n = triton.cdiv(VOCAB, chunk)
            out = torch.empty(rows * n, device="cuda")
            show(f"chunk max {chunk} w{warps}",
                 lambda chunk=chunk, warps=warps, n=n, out=out:
                 _chunk_max_kernel[(rows, n)](x, out, VOCAB, n, CHUNK=chunk, num_warps=warps))
        for chunk, warps, per_sm in PERSISTENT:
            n = triton.cdiv(VOCAB, chunk)
            out = torch.empty(rows * n, device="cuda")
            show(f"chunk max {chunk} w{warps} loop {per_sm}/SM",
                 lambda chunk=chunk, warps=warps, n=n, out=out, per_sm=per_sm:
                 _chunk_max_loop_kernel[(min(rows * n, per_sm * sms),)](x, out, VOCAB, n, rows * n, CHUNK=chunk,
                                                                      num_warps=warps))


if __name__ == "__main__":
    main()
