"""Experiment: what the dependent loads before pass 1's first logits load cost.

Rejection pass 1 (rejection_pass1.py) finds its row through two dependent loads before it
can load any logits: cu_num_draft_tokens[req - 1] gives the first target row j of the
request, then target_rows[j] gives the logits row. A read-only kernel with the same geometry
(grid (rows, V / 4096), one load of 4096 fp32 per program, 4 warps) takes 16.6 us at
B = 128, V = 128256 against pass 1's 17.3-17.7 (exp_read_bandwidth.py). This script times,
in a CUDA graph as the benchmarks do (bench.common.time_us):

- the chunk max and the chunk max + sum of exp(x - max) (pass 1's arithmetic, roughly), with
  0, 1 or 2 dependent loads before the logits load (row = program id; row = rows[pid];
  row = rows[cu[pid - 1] + i]);
- rejection_sample (kernels only, no draft probs, K = 1, B = 128 and K = 4, B = 32) with the
  target rows given as indices into the logits (as the benchmarks and the engine do) and on
  the same rows gathered into a contiguous tensor first (target_rows=None: one dependent
  load fewer); the profiler's pass 1 time for each.

Run from the repo root on the GPU machine (about 30 s):

    python bench/exp_pass1_prologue.py
"""

from __future__ import annotations

import os
import sys
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import copy_bandwidth, profiled, time_us  # noqa: E402

VOCAB = 128256
CHUNK = 4096


@triton.jit
def _chunk_kernel(x_ptr, rows_ptr, cu_ptr, out_ptr, V, NUM_CHUNKS, CHUNK: tl.constexpr, DEPTH: tl.constexpr,
                  SUMEXP: tl.constexpr):
    """Program (p, c): the max (and with SUMEXP the sum of exp(x - max)) of chunk c of logits row
    `row`, found through DEPTH dependent loads: 0: row = p; 1: row = rows[p]; 2: row =
    rows[cu[p - 1] + 1 - 1] (cu[p] = p + 1: one row per 'request')."""
    p = tl.program_id(0)
    c = tl.program_id(1)
    if DEPTH == 0:
        row = p
    elif DEPTH == 1:
        row = tl.load(rows_ptr + p)
    else:
        start = tl.load(cu_ptr + p - 1, mask=p > 0, other=0)
        row = tl.load(rows_ptr + start)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row.to(tl.int64) * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(out_ptr + p * NUM_CHUNKS + c, m)
    if SUMEXP:
        tl.store(out_ptr + (tl.num_programs(0) + p) * NUM_CHUNKS + c, tl.sum(tl.exp(x - m), axis=0))


def kernel_us(fn, name, iters=20) -> float:
    """Median device time of the kernel `name` over `iters` calls of fn (profiler, eager)."""
    times = sorted(e.device_time for e in profiled(fn, iters, warmup=3).events() if name in e.name and e.device_time > 0)
    return times[len(times) // 2] if times else float("nan")


def main() -> None:
    if not torch.cuda.is_available():
        print("exp_pass1_prologue needs CUDA: nothing to do")
        return
    from specops.spec_decode import rejection_sample
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, V={VOCAB}, chunk {CHUNK}, 4 warps")
    rows = 128
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2 * rows, VOCAB, device="cuda", generator=g) * 2
    floor = rows * VOCAB * 4 / bw * 1e6
    idx = torch.arange(rows, device="cuda", dtype=torch.int64) * 2       # every other row, as K=1 target rows
    cu = torch.arange(1, rows + 1, device="cuda", dtype=torch.int64)
    n = triton.cdiv(VOCAB, CHUNK)
    out = torch.empty(2 * rows * n, device="cuda")
    print(f"{'kernel':<44} {'us':>7} {'x floor':>7}   (floor {floor:.2f} us, {rows} rows)")
    for sumexp in (False, True):
        for depth in (0, 1, 2):
            src = x[::2].contiguous() if depth == 0 else x
            fn = (lambda src=src, depth=depth, sumexp=sumexp:
                  _chunk_kernel[(rows, n)](src, idx, cu, out, VOCAB, n, CHUNK=CHUNK, DEPTH=depth, SUMEXP=sumexp,
                                           num_warps=4))
            us = time_us(fn)
            name = f"chunk max{' + sumexp' if sumexp else ''}, {depth} dependent loads"
            print(f"{name:<44} {us:7.2f} {us / floor:7.2f}", flush=True)
    print(f"{'rejection_sample (kernels, no probs)':<44} {'graph us':>8} {'pass1 us':>8} {'x floor':>7}  same tokens")
    for k, batch in ((1, 128), (4, 32)):
        t = batch * k
        logits = torch.randn(batch * (k + 1), VOCAB, device="cuda", generator=g) * 2
        target_rows = (torch.arange(batch, device="cuda")[:, None] * (k + 1)
                       + torch.arange(k, device="cuda")[None, :]).flatten()
        drafts = torch.randint(0, VOCAB, (t,), device="cuda", generator=g)
        good = torch.rand(t, device="cuda", generator=g) < 0.8
        logits[target_rows[good], drafts[good]] += 15.0
        gathered = logits[target_rows].contiguous()
        cu_k = torch.arange(1, batch + 1, device="cuda") * k
        bonus = torch.randint(0, VOCAB, (batch,), device="cuda", generator=g)
        temp = torch.full((batch,), 0.8, device="cuda")
        step = torch.tensor([3], dtype=torch.int64, device="cuda")
        floor_k = t * VOCAB * 4 / bw * 1e6
        outs = []
        for label, src, tr in (("target_rows given", logits, target_rows), ("gathered, target_rows=None", gathered,
                                                                             None)):
            def fn(src=src, tr=tr):
                return rejection_sample(src, drafts, cu_k, k, bonus, target_rows=tr, temperature=temp, step=step)
            outs.append(fn())
            us = time_us(fn)
            p1 = kernel_us(fn, "_rejection_sample_kernel")
            same = "yes" if torch.equal(outs[0], outs[-1]) else "NO"
            print(f"K={k} B={batch:<4} {label:<33} {us:8.2f} {p1:8.2f} {us / floor_k:7.2f}  {same}", flush=True)


if __name__ == "__main__":
    main()
