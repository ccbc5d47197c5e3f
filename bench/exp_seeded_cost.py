"""Experiment: what a batch of seeded rows costs against unseeded ones, and why (the rows' paths).

    python bench/exp_seeded_cost.py      (GPU machine, repo root; exits 0 without CUDA)

Session 32's sampling.md put bench_sampling's mixed fp32 V = 128256 B = 128 batch at 1.07x
seeded / unseeded (1.02x before). Seeded and unseeded rows draw other tokens, so a pivot row
may take more rounds or fall back to the exact search in one and not the other. This times
both (interleaved, median of 5 rounds), counts each batch's paths (sampling_select modes)
and prints each kernel's device µs at B = 128.
"""
import os
import sys
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import FAST, make_logits, metadata  # noqa: E402
from bench.common import kernel_us, time_us  # noqa: E402



def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    V = 128256
    for B in (32, 128, 512):
        logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)   # bench_case's logits
        fns, modes = {}, {}
        for seeded in (False, True):
            md = metadata(B, V, seeded=seeded)
            opts = sample_options(md, md.min_p, None, distribution=False)
            fns[seeded] = (lambda md=md, opts=opts: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p,
                                                           md.seeds, md.positions, backend="triton",
                                                           distribution=False, **opts))
            paths = {}
            sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                   backend="triton", distribution=False, paths=paths, **opts)
            modes[seeded] = dict(sorted(Counter(paths["mode"].tolist()).items()))
        ts = {s: [] for s in fns}
        for _ in range(5):
            for s, fn in fns.items():
                ts[s].append(time_us(fn, **FAST))
        med = {s: sorted(t)[2] for s, t in ts.items()}
        print(f"B={B}: unseeded {med[False]:.1f} us {modes[False]}, seeded {med[True]:.1f} us {modes[True]}, "
              f"ratio {med[True] / med[False]:.3f}", flush=True)
        if B == 128:
            for s, fn in fns.items():
                ks = ", ".join(f"{k.split('(')[0][:22]} {v:.1f}" for k, v in kernel_us(fn).items())
                print(f"    kernels {'seeded' if s else 'unseeded'}: {ks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
