"""Experiment: pass 1 of the logprob kernels at other warp counts (the top-n rounds are issue-bound).

    python bench/exp_logprob_topn.py [warps,...]     (GPU machine, repo root; default 1,2,4,8)

Times compute_logprobs("raw_logprobs", n, backend="triton") at n in {1, 5, 20}, V = 128256,
fp32 and bf16, batch 1 / 32 / 128 / 512, for each value of logprob_stats.PASS1_WARPS, the
variants interleaved twice; every variant is first checked against the torch path.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_logprobs import check, make_inputs  # noqa: E402
from bench.common import time_us  # noqa: E402


def main() -> int:
    import specops.triton_kernels.logprob_stats as ls
    from specops.sampling.logprobs import compute_logprobs

    warps = [int(w) for w in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8").split(",")]
    print(f"{torch.cuda.get_device_name()}, V=128256; µs per call (CUDA graph of 5, 50 replays), two rounds")
    print(f"{'dtype':5} {'B':>4} {'n':>3} " + " ".join(f"{f'w={w}':>15}" for w in warps))
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for B in (1, 32, 128, 512):
            for n in (1, 5, 20):
                x, tokens = make_inputs(B, 128256, dtype, seed=B + n)
                times = {w: [] for w in warps}
                for _ in range(2):
                    for w in warps:
                        ls.PASS1_WARPS = w
                        check(x, tokens, n)
                        times[w].append(time_us(lambda: compute_logprobs("raw_logprobs", n, tokens, raw_logits=x,
                                                                         backend="triton"),
                                                warmup=5, iters=50, replays_per_graph=5))
                cells = " ".join(f"{t[0]:7.1f}/{t[1]:7.1f}" for t in times.values())
                print(f"{dname:5} {B:4d} {n:3d} {cells}", flush=True)
    ls.PASS1_WARPS = 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
