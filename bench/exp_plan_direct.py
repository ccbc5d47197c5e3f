"""Experiment: latency knobs of the sampler's small top-k path (`_direct_top_k` in the plan).

    python bench/exp_plan_direct.py [--variants a,b,..] [--batches 8,32] [--params engine,mix,k500]
                                    [--tokens-only]
    (GPU machine, repo root; exits 0 without CUDA. Every variant's kernels are first compiled
    in parallel worker processes (Triton's disk cache), for each batch size, then measured.
    Session 9 compiled at batch 8 only: the other batch sizes compiled again while measured,
    and 480 s covered 13 rows.)

V = 128256 fp32 "llm" logits (bench_sampling.make_logits, as exp_sampling_direct.py),
seeded rows, two parameter sets: "engine" (every row T 0.8, top-k 50, top-p 0.9, min-p
0.02) and "mix" (bench_sampling.MIX cycled), B = 1, 8, 32, 128; "k500" (every row top-k 500,
top-p 0.95: MIX's slowest row) on request. --tokens-only times the bench's call
(distribution=False: no thresholds to compare, the tokens only). For each variant of
`sample_top_k_top_p_triton`'s knobs (plan_warps, direct_top, direct_group, direct_pipe,
direct_small, direct_in):

- whether tokens, thresholds, row max, log_norm and the paths taken are bit-identical to
  the default call ("same"; kmax=0 has no direct path: tokens / thresholds / log_norm only);
- device µs per call of _plan_kernel, of the collect launch (where direct_in="collect"
  decides the direct rows and "spread" reads their top tiles), of the finish (where
  "spread" sorts their candidates) and of every kernel together (torch.profiler, 10 calls);
- µs of the whole call replayed in a CUDA graph (bench.common.time_us).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

V = 128256
BATCHES = (1, 8, 32, 128)
ENGINE = [(0.8, 50, 0.9, 0.02)]
VARIANTS = {                       # name -> sample_top_k_top_p_triton keyword arguments
    "default": {},
    "w4": dict(plan_warps=4),
    "w16": dict(plan_warps=16),
    "top": dict(direct_top=True),                      # topk of (max, id) keys, 64 tiles a load
    "top-g32": dict(direct_top=True, direct_group=32),
    "top-g128": dict(direct_top=True, direct_group=128),
    "top-w4": dict(direct_top=True, plan_warps=4),
    "top-w16": dict(direct_top=True, plan_warps=16),
    "pipe": dict(direct_pipe=True),                    # tile list, pipelined groups of 16 tiles
    "g64": dict(direct_group=64),                      # tile list, groups of 64 tiles
    "g64-pipe": dict(direct_group=64, direct_pipe=True),
    "ds64": dict(direct_small=64),                     # <= 64 candidates: a sort of 64 keys
    "ds128": dict(direct_small=128),
    "g64-ds64": dict(direct_group=64, direct_small=64),
    "top-ds64": dict(direct_top=True, direct_small=64),
    "top-ds128": dict(direct_top=True, direct_small=128),
    "plan": dict(direct_in="plan"),                    # decided in the plan (the default above DEFER_ROWS rows)
    "defer": dict(direct_in="collect"),                # decided in the collect launch
    "defer-top": dict(direct_in="collect", direct_top=True),
    "spread": dict(direct_in="spread"),                # plan lists the top tiles, collect reads, finish sorts
    "spread-top": dict(direct_in="spread", direct_top=True),
    "kmax=0": dict(kmax=0),                            # no direct path (the plan / refine / collect)
    # session 42: top_k up to 512 / 1024 on the direct path (the search launches skipped for them)
    "kmax=512": dict(kmax=512),
    "kmax=512-g64": dict(kmax=512, direct_group=64),
    "kmax=1024-g64": dict(kmax=1024, direct_group=64),
    "kmax=512-g64-pipe": dict(kmax=512, direct_group=64, direct_pipe=True),
    # session 54 (not yet run on a GPU): top_k up to 512 spread over the collect launch's programs, not
    # one program a row: no histogram in pass 1 and no refine for them (top_k 500 + top_p 0.95 on
    # the 'llm' rows under the interpreter: 690-730 candidates, the same tokens and thresholds)
    "kmax=512-spread": dict(kmax=512, direct_in="spread"),
}
K500 = [(1.0, 500, 0.95, 0.0)]     # every row top_k 500 + top_p 0.95 (bench MIX's slowest row)
SAMPLE_KW: dict = {}               # --tokens-only: dict(distribution=False), bench_sampling's timed call
# spilling hundreds of bytes (bench/aot_check_sampling.py): left out unless asked for
SPILLING = ("top-g128", "top-w4", "g64-pipe")
TIMING = dict(warmup=2, iters=10, replays_per_graph=5)


def _compile(job: tuple[str, int]) -> str:
    """One small call of a variant at one batch size, in a worker process: fills Triton's
    on-disk cache. Each batch size compiles anew: the metadata's per-row tensors are views of
    one [k, B] tensor, so their pointers' 16-byte alignment (a Triton specialisation) follows B."""
    from bench.bench_sampling import MIX, make_logits, metadata
    from specops.sampling import sample

    variant, B = job
    for mix in (ENGINE, MIX, K500):
        md = metadata(B, V, seeded=True, mix=mix)
        logits = make_logits(B, V, torch.float32, "llm", seed=1)
        for kw in ({}, dict(distribution=False)):
            sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                   backend="triton", **kw, **VARIANTS[variant])
    torch.cuda.synchronize()
    return variant


def precompile(variants: list[str], batches: list[int]) -> None:
    """Compile the variants' kernels in parallel processes (each one is seconds of one core)."""
    import multiprocessing as mp

    jobs = [(v, B) for v in variants for B in batches]
    with mp.get_context("spawn").Pool(min(len(jobs), os.cpu_count() or 1)) as pool:
        pool.map(_compile, jobs)


def equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit for bit, up to the sign of zero; NaN equals NaN."""
    both_nan = x.isnan() & y.isnan() if x.is_floating_point() else torch.zeros_like(x, dtype=torch.bool)
    return bool(((x == y) | both_nan).all())


def same(a, b, pa, pb, paths: bool) -> str:
    """"same", or which of tokens / thresholds / log_norm (/ row max / paths) differ."""
    fields = [("tok", a.tokens, b.tokens)]
    if a.threshold is not None:      # a tokens-only call returns no thresholds
        fields += [("thr", a.threshold, b.threshold), ("lnorm", a.log_norm, b.log_norm)]
    if paths:
        fields += [("rmax", a.row_max, b.row_max), ("path", pa["mode"], pb["mode"])]
    bad = [n for n, x, y in fields if not equal(x, y)]
    return "same" if not bad else "DIFF:" + "/".join(bad)


def run(name: str, mix, B: int, variants: list[str]) -> None:
    from bench.bench_sampling import make_logits, metadata
    from bench.common import kernel_us, time_us
    from specops.sampling import sample
    from specops.triton_kernels import sampling_select as sel

    logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)
    md = metadata(B, V, seeded=True, mix=mix)
    args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    pa = {}
    a = sample(*args, backend="triton", paths=pa, **SAMPLE_KW)
    n_direct = int((pa["mode"] == int(sel.DIRECT.value)).sum())
    for v in variants:
        kw = {**VARIANTS[v], **SAMPLE_KW}
        pb = {}
        b = sample(*args, backend="triton", paths=pb, **kw)
        eq = same(a, b, pa, pb, paths="kmax" not in kw)
        ks = kernel_us(lambda: sample(*args, backend="triton", **kw))
        plan = sum(t for k, t in ks.items() if "_plan_kernel" in k)
        coll = sum(t for k, t in ks.items() if "_collect" in k)
        fin = sum(t for k, t in ks.items() if "_finish_kernel" in k)
        us = time_us(lambda: sample(*args, backend="triton", **kw), **TIMING)
        print(f"{name:6s} {B:4d} {n_direct:4d}  {v:10s} {plan:6.1f} {coll:7.1f} {fin:6.1f} {sum(ks.values()):7.1f}"
              f" {us:7.1f}  {eq}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=",".join(v for v in VARIANTS if v not in SPILLING))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--params", default="engine,mix", help="parameter sets: engine, mix, k500")
    ap.add_argument("--tokens-only", action="store_true", help="distribution=False (pivot rows; no thresholds)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("exp_plan_direct: no CUDA device, nothing to do")
        return 0
    from bench.bench_sampling import MIX
    import triton
    variants = [v for v in a.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    batches = [int(b) for b in a.batches.split(",")]
    t0 = time.time()
    precompile(variants, batches)
    print(f"compiled / loaded every variant in {time.time() - t0:.0f} s", flush=True)
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, V={V} fp32 llm logits, seeded rows; "
          f"µs per call: plan / collect / finish / all kernels (profiler), graph = whole call in a CUDA graph; "
          f"dir = rows that take the direct path", flush=True)
    print(f"{'params':6s} {'B':>4s} {'dir':>4s}  {'variant':10s} {'plan':>6s} {'collect':>7s} {'finish':>6s} "
          f"{'kernels':>7s} {'graph':>7s}  vs default", flush=True)
    if a.tokens_only:
        SAMPLE_KW["distribution"] = False
    for name, mix in (("engine", ENGINE), ("mix", MIX), ("k500", K500)):
        if name not in a.params.split(","):
            continue
        for B in batches:
            run(name, mix, B, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
