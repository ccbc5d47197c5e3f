"""Experiment: is a seeded batch dearer than an unseeded one, or is one draw's cost just luck?

    python bench/exp_seeded_draws.py [DRAWS]     (GPU machine, repo root; exits 0 without CUDA)

A tokens-only draw of rows with top-p / min-p and no top-k takes a data-dependent number of
pivot rounds (sampling_pivot.py): which candidates the noise picks decides how many rows stay
pending for rounds 2 and 3. bench_sampling times one set of random streams for the unseeded
batch (engine seed 12345, step 3) and one for the seeded batch (seeds 1000 + row), so its
seeded / unseeded ratio mixes the cost of seeding with the luck of two draws. Here each kind
takes DRAWS (default 8) stream sets (bench_sampling.metadata's `draw`: seeds 1000 * (d + 1)
+ row, or step 3 + d), on bench_sampling's mixed fp32 V = 128256 'llm' rows, timed interleaved
(seeded and unseeded of draw d back to back); prints every draw's µs and each kind's mean,
median, min and max, and the ratio of the means.
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import FAST, make_logits, metadata  # noqa: E402
from bench.common import time_us  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    V = 128256
    for B in (8, 32, 128, 512):
        logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)   # bench_case's logits
        times = {False: [], True: []}
        for d in range(draws):
            for seeded in (False, True):
                md = metadata(B, V, seeded=seeded, draw=d)
                opts = sample_options(md, md.min_p, None, distribution=False)
                fn = (lambda md=md, opts=opts: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p,
                                                      md.seeds, md.positions, backend="triton",
                                                      distribution=False, **opts))
                times[seeded].append(float(time_us(fn, **FAST)))
        for seeded, ts in times.items():
            print(f"B={B:3d} {'seeded  ' if seeded else 'unseeded'}: " + " ".join(f"{t:6.1f}" for t in ts)
                  + f" | mean {statistics.mean(ts):6.1f} median {statistics.median(ts):6.1f}"
                  f" min {min(ts):6.1f} max {max(ts):6.1f}", flush=True)
        print(f"B={B:3d} seeded / unseeded: mean {statistics.mean(times[True]) / statistics.mean(times[False]):.3f}, "
              f"median {statistics.median(times[True]) / statistics.median(times[False]):.3f}, draw 0 alone "
              f"{times[True][0] / times[False][0]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
