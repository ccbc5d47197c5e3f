"""Experiment: the geometry of the sampler's pass 1 (_row_stats_kernel) on one GPU.

    python bench/exp_sampling_pass1.py     (GPU machine, repo root, after bench/gpu_check.sh's build)

bench_sampling's 'llm' logits at V = 128256, B = 128, fp32 and bf16, one parameter mix per
batch (greedy rows: no histogram and no noise; plain rows: the tile sums of the two-level
draw; top-p rows: the level-1 histogram; the bench's mix). For each (num_warps, maxnreg,
blocks per program) of pass 1: its median device time (profiler) and whether the whole
sample's tokens equal the default geometry's. Blocks per program never change them (each
block is reduced alone); other warps or register caps may (another layout rounds the block
sums differently, so a top-p boundary may move by an ulp of mass; NO is not an error, it
says how often). Warps and caps must stay functions of V, to keep batch invariance.
"""
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import MIX, make_logits, metadata  # noqa: E402
from bench.common import kernel_us  # noqa: E402
from specops.sampling import sample  # noqa: E402
from specops.triton_kernels import sampling_stats, sampling_topk_topp  # noqa: E402

# (num_warps, maxnreg, blocks of 2048 tokens per program, the next one prefetched: None = the
# launcher's choice by the launch's size); the first is the default. Session 7 measured other
# warps and register caps (logs/exp_sampling_pass1_2026-11-30.txt), with one program per block.
GEOMETRIES = [(4, 96, None), (4, 96, 1), (4, 96, 2), (4, 96, 4), (4, 96, 8), (4, 128, 4), (4, 128, 8), (8, 128, 4)]
if os.environ.get("EXP_GEOMETRIES"):   # e.g. "4/96/-,4/80/-": warps/maxnreg/blocks per program ('-': the launcher's)
    GEOMETRIES = [tuple(None if v == "-" else int(v) for v in g.split("/")) for g in os.environ["EXP_GEOMETRIES"].split(",")]
MIXES = {"greedy": [(0.0, 0, 1.0, 0.0)], "plain": [(1.0, 0, 1.0, 0.0)], "top_p=0.9": [(1.0, 0, 0.9, 0.0)],
         "bench MIX": MIX}
BUDGET_S = float(os.environ.get("EXP_BUDGET_S", "150"))


def main() -> None:
    V, B = 128256, 128
    t0 = time.time()
    original = sampling_stats.row_stats_pass
    print(f"{torch.cuda.get_device_name()}, V={V}, B={B}: _row_stats_kernel device us (median of 10 calls)")
    print(f"{'dtype':8s} {'mix':10s} " + " ".join(f"{w}w/{r}/{bpp or 'auto'}".rjust(12) for w, r, bpp in GEOMETRIES))
    for dtype in (torch.float32, torch.bfloat16):
        logits = make_logits(B, V, dtype, "llm", seed=B * 7 + V)
        for name, mix in MIXES.items():
            md = metadata(B, V, seeded=False, mix=mix)
            args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
            cells, ref = [], None
            for warps, maxnreg, bpp in GEOMETRIES:
                if time.time() - t0 > BUDGET_S:
                    cells.append("skipped")
                    continue
                sampling_topk_topp.row_stats_pass = functools.partial(original, num_warps=warps, maxnreg=maxnreg)
                try:
                    call = functools.partial(sample, *args, backend="triton", blocks_per_program=bpp)
                    tok = call().tokens
                    ref = tok if ref is None else ref
                    us = kernel_us(call).get("_row_stats_kernel", float("nan"))
                    cells.append(f"{us:.1f}{'' if torch.equal(tok, ref) else ' NO'}")
                finally:
                    sampling_topk_topp.row_stats_pass = original
            print(f"{str(dtype)[6:]:8s} {name:10s} " + " ".join(f"{c:>12s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
