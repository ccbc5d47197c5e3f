"""Experiment: the small top-k path of the sort-free sampler (sampling_direct._direct_top_k).

    python bench/exp_sampling_direct.py      (GPU machine, repo root; < 60 s; exits 0 without CUDA)

V = 128256 fp32 "llm" logits of bench_sampling.py, B = 1, 8, 32, 128, two parameter sets:
(a) "engine": every row T 0.8, top-k 50, top-p 0.9, min-p 0.02 (the engine benchmark),
(b) "mix": bench_sampling.MIX cycled over the rows.
For each: how many rows took the direct path; tokens and thresholds against the same call
without it (kmax=0, today's plan / refine / collect / finish: must be equal), tokens against
select=False (the exact single-program search) and the torch reference (fp64 top-p boundary:
at most a near-tie may differ); then µs of `sample(..., backend="triton")` with and without
the direct path (bench.common.time_us: CUDA-graph replay). At B = 32 a per-kernel breakdown
(torch.profiler) of both, for each parameter set. The first run compiles the changed kernels
(about half a minute); a second run measures only.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

V = 128256
BATCHES = (1, 8, 32, 128)
ENGINE = [(0.8, 50, 0.9, 0.02)]
TIMING = dict(warmup=3, iters=20, replays_per_graph=5)


def run_case(name: str, B: int, mix) -> None:
    from bench.bench_sampling import make_logits, metadata
    from bench.common import time_us
    from specops.sampling import sample, sample_torch
    from specops.triton_kernels import sampling_select as sel

    logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)
    md = metadata(B, V, seeded=True, mix=mix)
    args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    paths = {}
    a = sample(*args, backend="triton", paths=paths)
    old = sample(*args, backend="triton", kmax=0)
    search = sample(*args, backend="triton", select=False)
    ref = sample_torch(*args)
    direct = int((paths["mode"] == int(sel.DIRECT.value)).sum())
    d_old = int((a.tokens != old.tokens).sum())
    t_old = int(((a.threshold != old.threshold) & ~torch.isnan(old.threshold)).sum())
    d_search = int((a.tokens != search.tokens).sum())
    d_ref = int((a.tokens != ref.tokens).sum())
    lnorm = float((a.log_norm - old.log_norm).abs().nan_to_num(0.0).max())
    status = "ok" if d_old == 0 and t_old == 0 and d_search <= 1 and d_ref <= 1 else "CHECK"
    us_new = time_us(lambda: sample(*args, backend="triton"), **TIMING)
    us_old = time_us(lambda: sample(*args, backend="triton", kmax=0), **TIMING)
    print(f"{name:6s} B={B:3d}: direct {us_new:7.1f} us, without {us_old:7.1f} us ({us_old / us_new:4.2f}x);"
          f" {direct}/{B} rows direct; against kmax=0: {d_old} tokens, {t_old} thresholds differ,"
          f" |d log_norm| <= {lnorm:.1e}; tokens != select=False {d_search}, != torch {d_ref}: {status}",
          flush=True)


def kernel_breakdown(mix, B: int = 32) -> None:
    """Average device µs per kernel of one sample call, with and without the direct path."""
    from torch.profiler import ProfilerActivity, profile

    from bench.bench_sampling import make_logits, metadata
    from specops.sampling import sample

    logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)
    md = metadata(B, V, seeded=True, mix=mix)
    args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    n = 20
    for kmax in (128, 0):
        sample(*args, backend="triton", kmax=kmax)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                sample(*args, backend="triton", kmax=kmax)
            torch.cuda.synchronize()
        parts = []
        for e in prof.key_averages():
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            if "kernel" in e.key and total > 0:     # Triton kernels by name, torch's by their template
                parts.append((total / n, e.key if len(e.key) < 40 else e.key[:37] + "..."))
        parts.sort(reverse=True)
        body = ", ".join(f"{k} {t:.1f}" for t, k in parts)
        print(f"kernels B={B} kmax={kmax}: total {sum(t for t, _ in parts):.1f} us: {body}", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("exp_sampling_direct: no CUDA device, nothing to do")
        return 0
    from bench.bench_sampling import MIX
    print(f"{torch.cuda.get_device_name()}, V={V} fp32 llm logits, seeded rows", flush=True)
    for name, mix in (("engine", ENGINE), ("mix", MIX)):
        for B in BATCHES:
            run_case(name, B, mix)
    kernel_breakdown(ENGINE)
    kernel_breakdown(MIX)
    return 0


if __name__ == "__main__":
    sys.exit(main())
