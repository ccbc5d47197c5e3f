"""Experiment: sub-chunks per program in the pivot rounds' mass launch.

    python bench/exp_pivot_group.py      (GPU machine, repo root; exits 0 without CUDA)

Session 32's exp_pivot_minp.py profile (bench/results/logs/exp_pivot_minp_2026-12-03.txt)
put the three rounds' mass launches at 31-33 µs of a B = 128 call whether 128 rows or 32
were pending: one program per (row, sub-chunk of 2048 tokens) is 8064 programs a round, most
of which only test their row's mode and tile maxima, so the launch is a chain of waves of
round trips. `pivot_group` gives each program several sub-chunks (the same sums, so the same
tokens). This times, with CUDA graphs (bench.common.time_us) and interleaved variants, fp32
V = 128256 'llm' logits, `sample(..., distribution=False)` at group 1, 2, 4, 8 and the
default (`sampling_pivot.pivot_group`), checks every variant's tokens against group 1's, and
prints per-kernel device time of group 1 and the default at B = 128 and 512.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import FAST, MIN_P_MIX, MIX, TOP_P_MIX, make_logits, metadata, tokens_only_calls  # noqa: E402
from bench.common import interleaved_medians, kernel_line  # noqa: E402

BATCHES = (1, 8, 32, 128, 512)
KINDS = (("top-p", TOP_P_MIX), ("min-p", MIN_P_MIX), ("mix", MIX))
GROUPS = (1, 2, 4, 8, None)
ROUNDS = 3


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    from specops.triton_kernels.sampling_pivot import pivot_group
    from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk
    V = 128256
    nc = -(-V // draw_sub_chunk(V))
    print(f"{torch.cuda.get_device_name()}: sample(..., distribution=False), fp32 V={V} ({nc} sub-chunks), "
          f"median us of {ROUNDS} interleaved rounds", flush=True)
    print("kind    B    | " + " ".join(f"{'g' + str(g) if g else 'auto':>7s}" for g in GROUPS)
          + " | auto group | tokens = g1's", flush=True)
    for kind, mix in KINDS:
        for B in BATCHES:
            logits = make_logits(B, V, torch.float32, "llm", seed=B * 11 + V)
            md = metadata(B, V, seeded=False, mix=mix)
            fns = tokens_only_calls(logits, md, {g: dict(pivot_group=g) for g in GROUPS})
            toks = {g: fn().tokens.clone() for g, fn in fns.items()}
            same = all(torch.equal(toks[1], t) for t in toks.values())
            med = interleaved_medians(fns, ROUNDS, **FAST)
            print(f"{kind:6s} {B:4d} | " + " ".join(f"{med[g]:7.1f}" for g in GROUPS)
                  + f" | {pivot_group(B, nc):10d} | {same}", flush=True)
            if B in (128, 512):
                for g in (1, None):
                    print(f"    kernels {'g1' if g else 'auto'}: {kernel_line(fns[g])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
