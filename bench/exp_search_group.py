"""Experiment: programs c of a row per program in the refine and collect launches.

    python bench/exp_search_group.py      (GPU machine, repo root; exits 0 without CUDA)

Session 34's per-kernel profile (bench/results/logs/exp_sampling_kernels_2026-12-03.txt) put
the two refine launches of bench_sampling's mixed batch at 41.0 µs at B = 512 although only
one row in eight (top_k 500 with top_p) is refined there: 46.9 µs when every row is. One
program per (row, c) is 512 x 32 programs a launch, most of which only test their row's mode.
`search_group` gives each program several c (the same partials, so the same results). This
times, with CUDA graphs (bench.common.time_us) and interleaved variants, `sample(...,
distribution=False)` as bench_sampling's 'specops' rows at group 1, 2, 4, 8 and the default
(`sampling_select.search_group`), on the mixed batch (fp32 V = 128256; EXP_BF16=1 adds bf16
V = 151936) and on rows all top_k 500 + top_p 0.95 (fp32 V = 128256), checks every variant's tokens,
thresholds and log-norms against group 1's bit for bit, and prints per-kernel device time of
group 1 and the default at B = 128 and 512 on the mixed batch.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import MIX, experiment_banner, timed_variants  # noqa: E402
from bench.common import kernel_line  # noqa: E402

BATCHES = (32, 128, 512)
CASES = (("mix", MIX, torch.float32, 128256), ("k500+p", [(1.0, 500, 0.95, 0.0)], torch.float32, 128256))
if os.environ.get("EXP_BF16") == "1":
    CASES += (("mix", MIX, torch.bfloat16, 151936),)
GROUPS = (1, 2, 4, 8, None)
ROUNDS = 3


def main() -> int:
    if not experiment_banner(f"sample(..., distribution=False), median us of {ROUNDS} interleaved rounds"):
        return 0
    from specops.triton_kernels.sampling_select import refine_geometry, search_group
    print("case   dtype     V      B    | " + " ".join(f"{'g' + str(g) if g else 'auto':>7s}" for g in GROUPS)
          + " | auto group | results = g1's", flush=True)
    for kind, mix, dtype, V in CASES:
        s3 = refine_geometry(V)[0]
        for B in BATCHES:
            fns, med, ok = timed_variants(B, V, dtype, mix, B * 13 + V, {g: dict(search_group=g) for g in GROUPS},
                                          ROUNDS)
            print(f"{kind:6s} {str(dtype)[6:]:8s} {V:6d} {B:4d} | " + " ".join(f"{med[g]:7.1f}" for g in GROUPS)
                  + f" | {search_group(B, s3):10d} | {ok}", flush=True)
            if kind == "mix" and dtype == torch.float32 and B in (128, 512):
                for g in (1, None):
                    print(f"    kernels {'g1' if g else 'auto'}: {kernel_line(fns[g])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
