"""Experiment: how the collect launch slots its candidates, and its own group.

    python bench/exp_collect_slots.py      (GPU machine, repo root; exits 0 without CUDA)

Session 34's profiles put the collect launch at 9.5 µs for one top_k 500 + top_p 0.95 row at
batch 8 and 368.6 µs for 512 of them (bench/results/logs/exp_sampling_kernels_2026-12-03.txt):
such a row collects every token from the k-th value's sub-bin up, a few candidates in nearly
every block, and each block with one pays a block-wide count, an atomic add and a block-wide
scan in a row. `atomic_slots=True` gives each candidate its slot from its own relaxed atomic
add instead (sampling_select.collect_program); `collect_group` groups the collect launch's
programs apart from the refine launch's (`search_group`, which session 34 set for both). This
times, with CUDA graphs and interleaved variants, `sample(..., distribution=False)` as
bench_sampling's 'specops' rows, on the mixed batch and on rows all top_k 500 + top_p 0.95
(fp32 V = 128256; EXP_BF16=1 adds the bf16 V = 151936 mixed batch; EXP_CASES and EXP_BATCHES
pick cases and batches), checks every variant's
tokens, thresholds, row maxima and log-norms against the default's bit for bit, and prints the
per-kernel device time of the default and of `atomic_slots=True` at batch 8 and 512.

Session 35's call 2 (the log) ran it before the defaults changed: its 'default' column is the
's34' column here. EXP_REFINE_GROUPS=1 times the refine group alone (1, 2, 4, 8; collect 1,
atomic slots) against the default and session 34's launches: with EXP_BF16=1 EXP_BATCHES=128
it is the next check of bf16 V = 151936 batch 128, the one shape slower in session 35's table.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import MIX, experiment_banner, timed_variants  # noqa: E402
from bench.common import kernel_line  # noqa: E402

BATCHES = tuple(int(b) for b in os.environ.get("EXP_BATCHES", "8 32 128 512").split())
CASES = (("mix", MIX, torch.float32, 128256), ("k500+p", [(1.0, 500, 0.95, 0.0)], torch.float32, 128256))
if os.environ.get("EXP_BF16") == "1":
    CASES += (("mix", MIX, torch.bfloat16, 151936),)
if os.environ.get("EXP_CASES"):    # e.g. EXP_CASES=k500+p
    CASES = tuple(c for c in CASES if c[0] in os.environ["EXP_CASES"].split())
VARIANTS = {                       # name: sample_top_k_top_p_triton knobs (a function of the batch B)
    "default": lambda B: {},
    "s34": lambda B: dict(atomic_slots=False, search_group=session34_group(B)),   # session 34's launches
    "atomic": lambda B: dict(atomic_slots=True, search_group=session34_group(B)),
    "atomic c1": lambda B: dict(atomic_slots=True, search_group=session34_group(B), collect_group=1),
    "scan c1": lambda B: dict(atomic_slots=False, search_group=session34_group(B), collect_group=1),
    "atomic r8c1": lambda B: dict(atomic_slots=True, search_group=8, collect_group=1),
    "atomic r8c2": lambda B: dict(atomic_slots=True, search_group=8, collect_group=2),
}
if os.environ.get("EXP_REFINE_GROUPS") == "1":     # the refine group alone, at collect 1 with atomic slots
    VARIANTS = {"default": VARIANTS["default"], "s34": VARIANTS["s34"]}
    VARIANTS.update({f"r{g}c1": (lambda g: lambda B: dict(atomic_slots=True, search_group=g, collect_group=1))(g)
                     for g in (1, 2, 4, 8)})


def session34_group(B: int, programs_per_row: int = 32) -> int:
    """Session 34's default group of both launches (1, 2 or 4 by batch; 32 programs per row at
    V = 128256), which session 35's call 2 measured as 'default'."""
    want = -(-B * programs_per_row // 2048)
    return min(4, 1 << max(0, (want - 1).bit_length()))


ROUNDS = 3


def main() -> int:
    if not experiment_banner(f"sample(..., distribution=False), median us of {ROUNDS} interleaved rounds"):
        return 0
    print("case   dtype     V      B    | " + " ".join(f"{v:>11s}" for v in VARIANTS) + " | results = default's",
          flush=True)
    for kind, mix, dtype, V in CASES:
        for B in BATCHES:
            fns, med, ok = timed_variants(B, V, dtype, mix, B * 13 + V,
                                          {name: knobs(B) for name, knobs in VARIANTS.items()}, ROUNDS)
            print(f"{kind:6s} {str(dtype)[6:]:8s} {V:6d} {B:4d} | " + " ".join(f"{med[v]:11.1f}" for v in VARIANTS)
                  + f" | {ok}", flush=True)
            if dtype == torch.float32 and B in (8, 512):
                for name in ("default", "s34"):
                    print(f"    kernels {name}: {kernel_line(fns[name])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
