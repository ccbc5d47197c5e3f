"""Experiment: programmatic dependent launch (PDL) of the sampling and rejection chains, on
and off (SPECOPS_PDL=1 / 0), timed alternately in one process on the same inputs.

    python bench/exp_pdl.py [--rounds 3]

Sampling: bench_sampling's MIX rows (and plain rows) as the Sampler calls them, fp32
V=128256. Rejection: bench_rejection's specops-kernels row. Prints, per case, the median
over rounds of each setting and the ratio on / off; checks that both give the same tokens.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_rejection import Case  # noqa: E402
from bench.bench_sampling import make_logits, metadata  # noqa: E402
from bench.common import time_us  # noqa: E402

FAST = dict(warmup=3, iters=30, replays_per_graph=5)


def sampling_case(B: int, V: int, plain: bool):
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)
    if plain:
        md = metadata(B, V, seeded=False, mix=[(1.0, 0, 1.0, 0.0)])
        return lambda: sample(logits, md.inv_temperature, None, None, None, md.seeds, md.positions, backend="triton")
    md = metadata(B, V, seeded=False)
    opts = sample_options(md, md.min_p)
    return lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                          backend="triton", **opts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    V = 128256
    cases = {}
    for B in (1, 8, 32, 128):
        cases[f"sample MIX B={B}"] = sampling_case(B, V, plain=False)
    for B in (1, 32):
        cases[f"sample plain B={B}"] = sampling_case(B, V, plain=True)
    for B, K, probs in ((128, 1, False), (32, 4, False), (128, 1, True), (32, 4, True), (8, 4, False), (1, 4, False)):
        cases[f"rejection B={B} K={K} probs={'yes' if probs else 'no'}"] = Case(V, B, K, probs, seed=B * 31 + K).ours
    print(f"{'case':34s} {'off us':>8s} {'on us':>8s} {'on/off':>7s}  same")
    for name, fn in cases.items():
        outs, times = {}, {"0": [], "1": []}
        for setting in ("0", "1"):
            os.environ["SPECOPS_PDL"] = setting
            r = fn()
            outs[setting] = r.tokens if hasattr(r, "tokens") else r
        for _ in range(args.rounds):
            for setting in ("0", "1"):
                os.environ["SPECOPS_PDL"] = setting
                times[setting].append(time_us(fn, **FAST))
        off, on = sorted(times["0"])[len(times["0"]) // 2], sorted(times["1"])[len(times["1"]) // 2]
        same = torch.equal(outs["0"], outs["1"])
        print(f"{name:34s} {off:8.2f} {on:8.2f} {on / off:7.3f}  {same}", flush=True)
    os.environ.pop("SPECOPS_PDL", None)


if __name__ == "__main__":
    main()
