"""Which rows of bench_sampling's batches take the single-program FALLBACK search, and what it costs.

    python bench/exp_sampling_slow_rows.py             (GPU machine, repo root, after bench/gpu_check.sh's build)
    python bench/exp_sampling_slow_rows.py --k-sweep   (top_k 100 .. 2000 with top_p 0.95: which take FALLBACK)
    python bench/exp_sampling_slow_rows.py --k-sweep --kernels   (also top_k 40 .. 300, batch 8, and
                                                                  each call's kernels' device µs)
    python bench/exp_sampling_slow_rows.py --caps 1024,2048,4096  (the k sweep and bench_sampling's
                                                                  mixed rows at each `cap`)
        [--batches 1,32] [--mixed-batches 1,8,32,128,512] [--ks 500,1000,2000,3000,4000] [--top-p 0.95]

For each shape: the whole sample's time, the count of rows per path (paths["mode"]:
0 DONE, 1 DRAW, 4 COLLECT, 5 FALLBACK, 6 DIRECT), and for each FALLBACK row its MIX entry,
its time alone (batch 1) and the kernels' device time; then the batch without those rows.
Found on the H200 (2026-11-30): one top_k=500 / top_p=0.95 row of the bf16 V=151936 B=128
batch takes the exact search in the finish kernel, 540 us for that one program.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import make_logits, metadata, MIX
from bench.common import kernel_us, time_us
from specops.sampling import sample

SHAPES = [(151936, 128, torch.bfloat16), (128256, 128, torch.bfloat16), (151936, 512, torch.bfloat16),
          (151936, 128, torch.float32)]


def kernels(fn) -> str:
    """The seven longest kernels of one call of fn, device µs each."""
    top = sorted(kernel_us(fn, n=5).items(), key=lambda kv: -kv[1])[:7]
    return ", ".join(f"{name[:28]} {t:.1f}" for name, t in top)


def bench_shapes() -> None:
    for V, B, dtype in SHAPES:
        logits = make_logits(B, V, dtype, "llm", seed=B * 7 + V)      # bench_sampling's inputs
        md = metadata(B, V, seeded=False)
        args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
        paths = {}
        res = sample(*args, backend="triton", paths=paths)
        mode, planned, refined = paths["mode"].cpu(), paths["planned"].cpu(), paths["refined"].cpu()
        t = time_us(lambda: sample(*args, backend="triton"), warmup=3, iters=20, replays_per_graph=1)
        print(f"V={V} B={B} {dtype}: {t:.1f} us, rows per path {torch.bincount(mode, minlength=8).tolist()}")
        slow = [i for i in range(B) if int(mode[i]) == 5 or int(refined[i]) == 5]
        for i in slow[:6]:
            print(f"  row {i} mix {MIX[i % len(MIX)]} planned {int(planned[i])} refined {int(refined[i])}"
                  f" mode {int(mode[i])} thr {float(res.threshold[i]):.4f} max {float(res.row_max[i]):.3f}"
                  f" distinct values {logits[i].float().unique().numel()}")
            one = tuple(a[i:i + 1] for a in args)
            t1 = time_us(lambda: sample(*one, backend="triton"), warmup=3, iters=10, replays_per_graph=1)
            print(f"    alone (B=1): {t1:.1f} us; kernels: {kernels(lambda: sample(*one, backend='triton'))}")
        print("  kernels:", kernels(lambda: sample(*args, backend="triton")))
        if slow:
            keep = torch.tensor([i for i in range(B) if i not in slow], device="cuda")
            sub = tuple(a.index_select(0, keep) for a in args)
            t2 = time_us(lambda: sample(*sub, backend="triton"), warmup=3, iters=20, replays_per_graph=1)
            print(f"  without those rows: {t2:.1f} us")


def k_sweep(with_kernels: bool = False) -> None:
    """fp32 llm rows at V=128256, T=1, top_p=0.95 and one top_k per batch: the path and time
    (with_kernels: more top_k values and batches, and each call's longest kernels)."""
    V = 128256
    ks = (40, 100, 200, 300, 500, 1000, 2000, 0) if with_kernels else (100, 500, 1000, 2000, 0)
    for B in ((1, 8, 32) if with_kernels else (1, 32)):
        logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)
        for k in ks:
            mix = [(1.0, k, 0.95, 0.0)]
            md = metadata(B, V, seeded=False, mix=mix)
            args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
            paths = {}
            sample(*args, backend="triton", paths=paths)
            mode = torch.bincount(paths["mode"].cpu(), minlength=8).tolist()
            t = time_us(lambda: sample(*args, backend="triton"), warmup=3, iters=10, replays_per_graph=1)
            print(f"B={B:3d} top_k={k:5d} top_p=0.95: {t:7.1f} us, rows per path {mode}", flush=True)
            if with_kernels:
                print(f"    kernels: {kernels(lambda: sample(*args, backend='triton'))}", flush=True)


def cap_sweep(caps: list[int], batches=(1, 32), mixed_batches=(1, 8, 32, 128, 512),
              ks=(500, 1000, 2000, 3000, 4000), top_p: float = 0.95) -> None:
    """The candidate capacity `cap` (the most candidates one program sorts; above it a row takes
    the single-program search): for each cap, fp32 V=128256 rows with T=1, top_p (0.95) and
    top_k 500 .. 4000 at batch 1 and 32 (their path and time), then bench_sampling's mixed
    fp32 llm rows at batch 1 .. 512 (the cost of a larger cap on the common rows). Tokens are
    compared with the first cap's: both are exact with the same noise, so they must agree."""
    V = 128256
    for B in batches:
        logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)
        for k in ks:
            md = metadata(B, V, seeded=False, mix=[(1.0, k, top_p, 0.0)])
            args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
            cells, ref = [], None
            for cap in caps:
                paths = {}
                tok = sample(*args, backend="triton", paths=paths, cap=cap).tokens
                ref = tok if ref is None else ref
                mode = torch.bincount(paths["mode"].cpu(), minlength=8).tolist()
                t = time_us(lambda: sample(*args, backend="triton", cap=cap), warmup=3, iters=10, replays_per_graph=1)
                cells.append(f"cap {cap}: {t:7.1f} us paths {mode} same tokens {bool(torch.equal(tok, ref))}")
            print(f"B={B:3d} top_k={k:5d} top_p={top_p} | " + " | ".join(cells), flush=True)
    for B in mixed_batches:
        logits = make_logits(B, V, torch.float32, "llm", seed=B * 7 + V)      # bench_sampling's inputs
        md = metadata(B, V, seeded=False)
        args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
        cells, ref = [], None
        for cap in caps:
            tok = sample(*args, backend="triton", cap=cap).tokens
            ref = tok if ref is None else ref
            t = time_us(lambda: sample(*args, backend="triton", cap=cap), warmup=3, iters=20, replays_per_graph=1)
            cells.append(f"cap {cap}: {t:7.1f} us same tokens {bool(torch.equal(tok, ref))}")
        print(f"mixed fp32 B={B:3d} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    def ints(flag: str, default: tuple) -> tuple:
        return tuple(int(c) for c in sys.argv[sys.argv.index(flag) + 1].split(",") if c) if flag in sys.argv else default
    if "--caps" in sys.argv:
        cap_sweep(list(ints("--caps", ())), ints("--batches", (1, 32)), ints("--mixed-batches", (1, 8, 32, 128, 512)),
                  ints("--ks", (500, 1000, 2000, 3000, 4000)),
                  float(sys.argv[sys.argv.index("--top-p") + 1]) if "--top-p" in sys.argv else 0.95)
    elif "--k-sweep" in sys.argv:
        k_sweep("--kernels" in sys.argv)
    else:
        bench_shapes()
