"""Experiment: the fewest programs of the compact refine launch (`refine_min_programs`).

    python bench/exp_refine_programs.py      (GPU machine, repo root; exits 0 without CUDA)

Session 37's sampling_top_p.md showed top-p alone with its thresholds (`distribution=True`,
every row refines) at 60.8 µs at fp32 V = 128256 batch 8 against 42.6 in session 32's table:
since session 35 the refine launch has R * ceil(32 / search_group) programs, 32 at batch 8 for
256 parts, so each program read 8 parts one after another. `sampling_select.refine_programs`
now raises the compact launch to REFINE_MIN_PROGRAMS (256) programs, at most one per part.
This times three floors (interleaved, CUDA graphs) on top-p rows with their thresholds and on
bench_sampling's mixed rows (tokens only), checking the results bit for bit.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import MIX, TOP_P_MIX, experiment_banner, timed_variants  # noqa: E402

CASES = (  # (name, mix, dtype, V, batch, logits seed factor s: seed B * s + V, distribution)
    ("top-p thr", TOP_P_MIX, torch.float32, 128256, 8, 5, True),
    ("top-p thr", TOP_P_MIX, torch.float32, 128256, 32, 5, True),
    ("top-p thr", TOP_P_MIX, torch.float32, 128256, 2, 5, True),
    ("mix", MIX, torch.float32, 128256, 8, 7, False),
    ("mix", MIX, torch.float32, 128256, 32, 7, False),
    ("top-p thr", TOP_P_MIX, torch.bfloat16, 151936, 8, 5, True),
)
VARIANTS = {"floor 256": dict(refine_min_programs=256), "no floor": dict(refine_min_programs=1),
            "all parts": dict(refine_min_programs=1 << 20)}
ROUNDS = 3


def main() -> int:
    if not experiment_banner(f"sample(...), median us of {ROUNDS} interleaved rounds; "
                             "floor 256 = the new default, no floor = session 36's launch "
                             "(R * ceil(S3 / search_group)), all parts = R * S3 programs"):
        return 0
    print("case       dtype     V      B  | " + " ".join(f"{v:>10s}" for v in VARIANTS) + " | same results",
          flush=True)
    for kind, mix, dtype, V, B, s, dist in CASES:
        _, med, ok = timed_variants(B, V, dtype, mix, B * s + V, VARIANTS, ROUNDS, distribution=dist)
        print(f"{kind:10s} {str(dtype)[6:]:8s} {V:6d} {B:4d} | " + " ".join(f"{med[v]:10.1f}" for v in VARIANTS)
              + f" | {ok}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
