"""Experiment: the sampler's tile size (tokens per tile of the tile maxima) at small batches.

    python bench/exp_tile.py      (GPU machine, repo root; exits 0 without CUDA)

`tile_size(V)` (sampling_stats.py) was 128 tokens, or more so that a row has at most 1024
tiles: 128 at V = 128256 (1002 tiles), 256 at V = 151936 (594 tiles). At batch 1 the sampler
spends most of its time in the plan's direct top-k path, which reads every token of the tiles
whose max reaches the k-th value: twice as many tokens per tile at V = 151936. On the H200
(session 26, logs/exp_tile_2026-12-02.txt) tiles of 128 at V = 151936 took 15.09 against
17.09 us at B = 1 fp32 (14.93 against 16.44 bf16; 512: 22.11), 18.68 against 21.40 at B = 2,
152.3 against 158.7 at B = 128, the same at B = 8, with the same tokens: `tile_size` now
allows 2048 tiles (128 up to V = 262144). This times
`specops.sampling.sample` as bench_sampling.py calls it (its MIX rows, "llm" logits, the
Sampler's kernel options), with each tile size, in a CUDA graph (bench.common.time_us), and
reports per kernel device time (profiler) at batch 1, whether the tokens equal the default
tile's and bench_sampling's check against the torch reference.

The tile is a function of V only in every variant, so any of them keeps batch invariance;
it changes the order of float sums (log_norm's last bits), not the kept set or the draw.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import make_logits, metadata  # noqa: E402
from bench.common import kernel_us, time_us  # noqa: E402

CASES = [  # (V, batch, dtype)
    (151936, 1, torch.float32), (151936, 1, torch.bfloat16), (151936, 2, torch.float32),
    (151936, 8, torch.float32), (151936, 32, torch.float32), (151936, 128, torch.float32),
    (151936, 512, torch.float32), (151936, 8, torch.bfloat16), (128256, 1, torch.float32),
]
TILES = (128, 256)
FAST = dict(warmup=3, iters=30, replays_per_graph=5)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels.sampling_stats import tile_size
    print(f"{torch.cuda.get_device_name()}: sample() per tile size (default marked *)", flush=True)
    print("     V    B dtype  tile |  graph us | same tokens as default | check | kernels at B=1 (us)", flush=True)
    for V, B, dtype in CASES:
        logits = make_logits(B, V, dtype, "llm", seed=B * 7 + V)
        md = metadata(B, V, seeded=False)
        opts = sample_options(md, md.min_p)
        default = tile_size(V)

        def call(tile):
            return lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                                  md.positions, backend="triton", tile=tile, **opts)

        ref = call(default)().tokens.clone()
        for tile in sorted(set(TILES) | {default}):
            fn = call(tile)
            same = torch.equal(fn().tokens, ref)
            us = time_us(fn, **FAST)
            status = check_tile(logits, md, tile)
            ks = ""
            if B == 1:
                ks = ", ".join(f"{k.split('(')[0][:24]} {v:.2f}" for k, v in kernel_us(fn).items())
            mark = "*" if tile == default else " "
            dn = "fp32" if dtype == torch.float32 else "bf16"
            print(f"{V:6d} {B:4d} {dn:5s} {tile:4d}{mark} | {us:9.2f} | {str(same):21s} | {status} | {ks}",
                  flush=True)
    return 0


def check_tile(logits, md, tile):
    """bench_sampling.check with the tile size forced (sample_options is wrapped for the call)."""
    import bench.bench_sampling as bs
    from specops.sampling import topk_topp
    orig = topk_topp.sample_options

    def forced(m, min_p):
        return dict(orig(m, min_p), tile=tile)
    topk_topp.sample_options = forced
    try:
        return bs.check(logits, md, f"tile {tile}")
    finally:
        topk_topp.sample_options = orig


if __name__ == "__main__":
    sys.exit(main())
