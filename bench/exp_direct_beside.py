"""Experiment: the small top-k rows decided by a kernel of their own on a side stream.

    python bench/exp_direct_beside.py      (GPU machine, repo root; exits 0 without CUDA)

Rows with 1 <= top_k <= 128 (mode DIRECT) are decided from their top tiles by one program
each. Up to DEFER_ROWS rows this happens in program 0 of the row in the collect launch,
above it in the plan, where at fp32 V = 128256 the plan took 14.1 / 26.9 µs at batch
128 / 512 against 5-8 µs without them: on the critical path before the refine and collect
launches of the other rows. `direct_in="beside"` leaves them to `_direct_rows_kernel` on a
side stream forked after the plan and joined before the finish (beside the pivot rounds'
stream). This times "auto" (today's default), "beside" and, at every batch, "collect" and
"plan" (interleaved, CUDA graphs), checks the results bit for bit, and prints the
per-kernel device time at batch 8 and 128.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import MIX, experiment_banner, timed_variants  # noqa: E402
from bench.common import kernel_line  # noqa: E402

CASES = (  # (dtype, V, batch)
    (torch.float32, 128256, 1), (torch.float32, 128256, 8), (torch.float32, 128256, 32),
    (torch.float32, 128256, 128), (torch.float32, 128256, 512), (torch.bfloat16, 151936, 8),
    (torch.bfloat16, 151936, 128), (torch.bfloat16, 151936, 512),
)
VARIANTS = {"auto": dict(), "beside": dict(direct_in="beside"), "collect": dict(direct_in="collect"),
            "plan": dict(direct_in="plan")}
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
        if B in (8, 128) and dtype == torch.float32:
            for name in ("auto", "beside"):
                print(f"    {name}: {kernel_line(fns[name])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
