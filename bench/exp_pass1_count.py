"""Pass 1 with and without the finite-token count on rows that get no histogram.

    python bench/exp_pass1_count.py          (GPU machine, repo root, after gpu_check.sh's build)

Times sample() (CUDA-graph replays) and its pass-1 kernel (torch profiler, mean of 10 calls) on
bench_sampling's 'llm' logits, V = 128256, B = 128 and 512, fp32 and bf16, one parameter mix
per batch. Run it once per version of triton_kernels/sampling_stats.py: the device call that
made logs/exp_pass1_count_2026-12-01.txt ran it on the new, old and new version in turn.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import MIX, make_logits, metadata  # noqa: E402
from bench.common import kernel_us, time_us  # noqa: E402
from specops.sampling import sample  # noqa: E402
from specops.sampling.topk_topp import sample_options  # noqa: E402

MIXES = {"greedy": [(0.0, 0, 1.0, 0.0)], "plain T=1": [(1.0, 0, 1.0, 0.0)], "top_k=50": [(1.0, 50, 1.0, 0.0)],
         "top_p=0.9": [(1.0, 0, 0.9, 0.0)], "bench MIX": MIX}


def main() -> None:
    V = 128256
    for B in (128, 512):
        for dtype in (torch.float32, torch.bfloat16):
            logits = make_logits(B, V, dtype, "llm", seed=B * 7 + V)
            for name, mix in MIXES.items():
                md = metadata(B, V, seeded=False, mix=mix)
                args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
                opts = sample_options(md, md.min_p)
                t = time_us(lambda: sample(*args, backend="triton", **opts), warmup=3, iters=30, replays_per_graph=5)
                per = kernel_us(lambda: sample(*args, backend="triton", **opts))
                p1 = sum(v for k, v in per.items() if k.startswith("_row_stats_kernel"))
                print(f"B={B:4d} {str(dtype)[6:]:9s} {name:12s} sample {t:7.1f} us  pass 1 {p1:6.1f} us", flush=True)


if __name__ == "__main__":
    main()
