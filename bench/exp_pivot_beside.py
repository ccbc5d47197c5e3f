"""Experiment: the pivot rounds on a stream of their own, beside the refine and collect launches.

    python bench/exp_pivot_beside.py      (GPU machine, repo root; exits 0 without CUDA)

On bench_sampling's mixed rows the top-p-alone and min-p-alone rows take the pivot rounds
(a mass launch and a draw launch per round) after the collect launch, though no pivot row is
touched by refine or collect: at fp32 V = 128256 batch 8 the rounds took about 7 µs of the
41.8 (logs/exp_sampling_kernels_2026-12-03.txt), on the critical path. `pivot_beside=True`
forks them onto a side stream after the plan and joins before the finish. This times both
(interleaved, CUDA graphs: the fork becomes two branches of the graph) on the mixed rows,
checking the results bit for bit, and prints the per-kernel device time at batch 8.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import MIX, experiment_banner, timed_variants  # noqa: E402
from bench.common import kernel_line  # noqa: E402

CASES = (  # (dtype, V, batch)
    (torch.float32, 128256, 8), (torch.float32, 128256, 32), (torch.float32, 128256, 128),
    (torch.float32, 128256, 512), (torch.bfloat16, 151936, 8), (torch.bfloat16, 151936, 128),
)
VARIANTS = {"serial": dict(pivot_beside=False), "beside": dict(pivot_beside=True)}
ROUNDS = 3


def main() -> int:
    if not experiment_banner(f"sample(..., distribution=False) on bench_sampling's mixed rows "
                             f"(logits seed B * 7 + V), median us of {ROUNDS} interleaved rounds"):
        return 0
    print("dtype     V      B    | " + " ".join(f"{v:>9s}" for v in VARIANTS) + " | same results", flush=True)
    for dtype, V, B in CASES:
        fns, med, ok = timed_variants(B, V, dtype, MIX, B * 7 + V, VARIANTS, ROUNDS)
        print(f"{str(dtype)[6:]:8s} {V:6d} {B:4d} | " + " ".join(f"{med[v]:9.1f}" for v in VARIANTS) + f" | {ok}",
              flush=True)
        if B == 8 and dtype == torch.float32:
            for name, fn in fns.items():
                print(f"    {name}: {kernel_line(fn)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
