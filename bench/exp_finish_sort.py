"""Experiment: what the sampler's finish costs per sort size and sort kind (H200 run:
`bench/results/logs/exp_finish_sort_2026-12-01.txt`, session 21; it led to the value sort and
the sort sizes 256 / 512 / 1024 of `_finish_collected_sized`).

    python bench/exp_finish_sort.py      (GPU machine, repo root; exits 0 without CUDA)

Why: `logs/exp_sampling_slow_rows_2026-12-01.txt` shows the finish kernel at 14 µs for every
row whose candidate set exceeds SMALL (256 keys: it sorts CAP = 1024) against about 6 µs
at or below it (fp32 V = 128256, top_p 0.95 with top_k 200 .. 1000, or top-p alone, at
batch 1, 8 and 32), while such a row at batch 8 takes 44-58 µs in all. Two cheap changes
could cut it: a middle sort size of 512 keys, and more warps for the finish; and one exact
change (the default since session 21): sorting the candidates' values alone as 32-bit keys
(`_finish_collected(.., VALUE_SORT=True)`) instead of the 64-bit (value, index) keys, the
draw then reading the candidates in their slots (the same results bit for bit).

What: `_finish_collected` (the finish's exact thresholds and draw over a complete candidate
set) in a one-program kernel, on candidates taken from bench_sampling's fp32 "llm" row
(T 1, V = 128256): the tokens >= lo, lo chosen so that about N of them exist, for N in
NS, with top_k 0.9 N and top_p 0.95; the sort sizes S >= N in SIZES, at each warp count in WARPS; µs per launch in a CUDA
graph of back-to-back launches (bench.common.time_us), minus an empty launch's, for each
sort kind (keys: `_sorted_candidates`; values: `_sorted_values`). Also the sort alone. The table says for each (N, S, warps) whether tau, the
token and the kept mass are the same bits as at (N, CAP, 8 warps), the finish's setting
for N > 256 before session 21 (the sums then run over another layout, so they may not be).
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specops.triton_kernels.sampling_common import pack_key  # noqa: E402
from specops.triton_kernels.sampling_candidates import (_finish_collected, _sorted_candidates,  # noqa: E402
                                                        _sorted_values)

V = 128256
NS = (200, 300, 450, 900)          # candidates in the set
SIZES = (256, 512, 1024)           # sort sizes (keys) tried, those >= N
WARPS = (4, 8, 16)
TOP_P = 0.95                       # top_k: 90% of the set (its k-th value inside it)


@triton.jit
def _pack_kernel(x_ptr, idx_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = pack_key(x[i], idx[i]) for i < n (the collect kernel's candidate keys)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=0.0)
    t = tl.load(idx_ptr + i, mask=mask, other=0)
    tl.store(out_ptr + i, pack_key(x, t), mask=mask)


@triton.jit
def _finish_stage_kernel(cand_ptr, n, m, z, k, p, lo, out_f, out_i, STAGE: tl.constexpr, S: tl.constexpr,
                         VS: tl.constexpr = True):
    """STAGE 0: an empty launch; 1: the sort alone (VS: of the values, `_sorted_values`; else of
    the (value, index) keys, `_sorted_candidates`); 2: `_finish_collected` (VALUE_SORT=VS) as
    the finish calls it on a complete set (nothing above hi = +inf, no min-p base known)."""
    if STAGE == 0:
        tl.store(out_i, n)
    elif STAGE == 1:
        if VS:
            sx, ux, sidx, valid, i = _sorted_values(cand_ptr, n, S)
        else:
            sx, sidx, valid, i = _sorted_candidates(cand_ptr, n, S)
        tl.store(out_f, tl.sum(tl.where(valid, sx, 0.0), axis=0))
        tl.store(out_i, tl.sum(sidx, axis=0))
    else:
        zero = tl.full([], 0.0, tl.float32)
        ok, tau, tok, mass = _finish_collected(cand_ptr, n, n * 0, zero, zero - 1.0, zero - 1.0, n * 0 + 2147483647,
                                               m, z, k, p, zero + float("-inf"), lo, zero + float("inf"),
                                               zero - 1.0, k > 0, p < 1.0, tl.full([], 1000, tl.int64),
                                               tl.full([], 17, tl.int64), 0, S, VS)
        tl.store(out_f, tau)
        tl.store(out_f + 1, mass)
        tl.store(out_i, tok)
        tl.store(out_i + 1, ok.to(tl.int32))


def candidates(x: torch.Tensor, n: int) -> tuple[torch.Tensor, float, int]:
    """Packed keys of the tokens of row x (scaled logits) >= lo, with lo the n-th largest value:
    (keys [CAP] int64, lo, how many)."""
    lo = float(x.topk(n).values[-1])
    idx = torch.nonzero(x >= lo).flatten().to(torch.int32)
    keys = torch.zeros(max(SIZES), dtype=torch.int64, device=x.device)
    # stored in a shuffled order, as the collect kernel's atomic slots leave them
    perm = torch.randperm(idx.numel(), generator=torch.Generator().manual_seed(n)).to(x.device)
    idx = idx[perm].contiguous()
    _pack_kernel[(triton.cdiv(idx.numel(), 1024),)](x[idx.long()].contiguous(), idx, keys, idx.numel(), BLOCK=1024)
    return keys, lo, idx.numel()


def main() -> int:
    if not torch.cuda.is_available():
        print("exp_finish_sort: no CUDA device, nothing measured")
        return 0
    from bench.bench_sampling import make_logits
    from bench.common import time_us

    x = make_logits(1, V, torch.float32, "llm", seed=1)[0]          # T = 1: the logits are the scaled logits
    m = float(x.max())
    z = float(torch.exp(x - m).sum())
    out_f = torch.zeros(2, device="cuda")
    out_i = torch.zeros(2, dtype=torch.int32, device="cuda")
    timing = dict(warmup=3, iters=30, replays_per_graph=20)
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}; V={V} fp32 llm row, T=1, top_k=0.9 N, "
          f"top_p={TOP_P}; µs per launch over an empty launch", flush=True)
    empty = time_us(lambda: _finish_stage_kernel[(1,)](out_i, 0, m, z, 1, TOP_P, 0.0, out_f, out_i, STAGE=0,
                                                       S=256, num_warps=4), **timing)
    print(f"  empty launch {empty:.2f} us", flush=True)
    print("  N cands  S  warps  sort of | sort  finish | tau, token, mass the same as S=1024 8 warps keys | ok",
          flush=True)
    for n_want in NS:
        keys, lo, n = candidates(x, n_want)
        k = n_want * 9 // 10

        def launch(stage, S, w, vs):
            _finish_stage_kernel[(1,)](keys, n, m, z, k, TOP_P, lo, out_f, out_i, STAGE=stage, S=S, VS=vs,
                                       num_warps=w)

        def result(S, w, vs):
            launch(2, S, w, vs)
            torch.cuda.synchronize()
            return (float(out_f[0]), int(out_i[0]), float(out_f[1])), int(out_i[1])

        ref, _ = result(max(SIZES), 8, False)
        for S in SIZES:
            if S < n:
                continue
            for w in WARPS:
                for vs in (False, True):
                    res, ok = result(S, w, vs)
                    t_sort = time_us(lambda: launch(1, S, w, vs), **timing) - empty
                    t_fin = time_us(lambda: launch(2, S, w, vs), **timing) - empty
                    print(f"  {n:6d} {S:5d} {w:3d} {'values' if vs else 'keys  '} | {t_sort:6.2f} {t_fin:6.2f} | "
                          f"{res == ref} | {ok}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
