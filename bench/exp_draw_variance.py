"""Experiment: how much the mixed-batch time depends on the logits drawn, and through which rows.

    python bench/exp_draw_variance.py      (GPU machine, repo root; exits 0 without CUDA)

Session 35's table had bf16 V = 151936 batch 128 at 142.4 µs (logits seed B * 7 + V), while
session 36's exp_refine_prefetch timed the same shape at 102.5 µs on other logits (seed
B * 13 + V) and batch 32 at 96.4 (the table: 64.6). So the time depends on the draw of the
logits. For each case and several logits seeds this prints the time of bench_sampling's
tokens-only call (CUDA graphs), the device µs per kernel, and for each row of MIX (cycled over
the batch) the paths its rows took (sampling_select's modes) and, for rows that collected
candidates, the largest candidate count (what the finish sorts).
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import FAST, MIX, make_logits, metadata, tokens_only_calls  # noqa: E402
from bench.common import kernel_line, time_us  # noqa: E402

CASES = ((torch.bfloat16, 151936, 32), (torch.bfloat16, 151936, 128), (torch.float32, 128256, 128),
         (torch.float32, 128256, 512))
SEEDS = (7, 13, 1, 2, 3, 4)      # logits seed B * s + V (7: bench_sampling's table, 13: the experiments')
MODES = {0: "done", 1: "draw", 2: "ref-count", 3: "ref-mass", 4: "collect", 5: "FALLBACK", 6: "direct",
         7: "spread", 8: "pivot-pending", 9: "pivoted"}


def paths_line(logits, md) -> str:
    """Per MIX slot: its rows' modes (count) and the largest candidate count of its rows."""
    paths: dict = {}
    tokens_only_calls(logits, md, {"p": dict(paths=paths)})["p"]()
    st_i = paths["mode"]._base if paths["mode"]._base is not None else None   # [R, 4] row states
    mode = paths["mode"].tolist()
    n_cand = st_i[:, 1].tolist() if st_i is not None and st_i.dim() == 2 else [0] * len(mode)
    out = []
    for s, params in enumerate(MIX):
        rows = range(s, len(mode), len(MIX))
        if not len(rows):
            continue
        c = Counter(MODES.get(mode[r], str(mode[r])) for r in rows)
        out.append(f"{params[1:]}: " + "/".join(f"{k}x{v}" for k, v in c.items())
                   + f" ncand<={max(n_cand[r] for r in rows)}")
    return "; ".join(out)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    print(f"{torch.cuda.get_device_name()}: sample(..., distribution=False) on MIX, per logits seed", flush=True)
    for dtype, V, B in CASES:
        md = metadata(B, V, seeded=False, mix=MIX)
        for s in SEEDS:
            logits = make_logits(B, V, dtype, "llm", seed=B * s + V)
            call = tokens_only_calls(logits, md, {"d": {}})["d"]
            us = time_us(call, **FAST)
            print(f"{str(dtype)[6:]:8s} V={V} B={B:4d} seed=B*{s}+V: {us:7.1f} us | {kernel_line(call)}", flush=True)
            print(f"    {paths_line(logits, md)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
