"""Experiment: the refine launch's parts dealt to its programs in turn (compact) or by row.

    python bench/exp_refine_compact.py      (GPU machine, repo root; exits 0 without CUDA)

bench/exp_draw_variance.py found bench_sampling's mixed bf16 V = 151936 batch 128 at 142.6 µs
on the table's logits (seed B * 7 + V) against 102-104 on five other draws: on those logits a
few rows refine, and each refining row's programs read search_group x BPP blocks one after
another (the refine launches took 41.8 µs against 3.0). `refine_compact=True` (the new
default) deals the refining rows' parts (row, c) to all the launch's programs in turn. This
times `sample(..., distribution=False)` both ways (interleaved, CUDA graphs) on the mixed rows
at several batches and logits draws, and on rows all top_k 500 + top_p 0.95, checking the
results bit for bit, and prints the per-kernel device time of both on the slow draw.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import MIX, experiment_banner, timed_variants  # noqa: E402
from bench.common import kernel_line  # noqa: E402

K500P = [(1.0, 500, 0.95, 0.0)]
CASES = (  # (name, mix, dtype, V, batch, logits seed factor s: seed B * s + V)
    ("mix", MIX, torch.bfloat16, 151936, 128, 7), ("mix", MIX, torch.bfloat16, 151936, 32, 13),
    ("mix", MIX, torch.bfloat16, 151936, 512, 7),
    ("mix", MIX, torch.float32, 128256, 8, 7), ("mix", MIX, torch.float32, 128256, 32, 7),
    ("mix", MIX, torch.float32, 128256, 128, 7), ("mix", MIX, torch.float32, 128256, 512, 7),
    ("mix", MIX, torch.float32, 128256, 512, 1),
    ("k500+p", K500P, torch.float32, 128256, 8, 7), ("k500+p", K500P, torch.float32, 128256, 512, 7),
)
if os.environ.get("EXP_CASES"):    # e.g. EXP_CASES="k500+p:512" (name:batch, space-separated)
    CASES = tuple(c for c in CASES if f"{c[0]}:{c[4]}" in os.environ["EXP_CASES"].split())
VARIANTS = {"compact": dict(refine_compact=True), "by row": dict(refine_compact=False)}
ROUNDS = 3


def main() -> int:
    if not experiment_banner(f"sample(..., distribution=False), median us of {ROUNDS} interleaved rounds"):
        return 0
    print("case    dtype     V      B    seed   | " + " ".join(f"{v:>9s}" for v in VARIANTS) + " | same results",
          flush=True)
    for kind, mix, dtype, V, B, s in CASES:
        fns, med, ok = timed_variants(B, V, dtype, mix, B * s + V, VARIANTS, ROUNDS)
        print(f"{kind:7s} {str(dtype)[6:]:8s} {V:6d} {B:4d} B*{s}+V | " + " ".join(f"{med[v]:9.1f}" for v in VARIANTS)
              + f" | {ok}", flush=True)
        if (kind, V, B, s) == ("mix", 151936, 128, 7):
            for name, fn in fns.items():
                print(f"    {name}: {kernel_line(fn)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
