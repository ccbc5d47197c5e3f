"""How much the H200's L2 flatters the committed floor ratios: warm against cold timing.

    python bench/exp_cold_l2.py      (GPU machine, repo root, after gpu_check.sh's build)

warm: bench.common.time_us, as every committed table is timed (CUDA-graph replays of calls on
the same inputs, which stay in the 50 MB L2 when they are small). cold: one graph of n calls,
each on its own copy of the inputs (copies totalling at least 256 MB, so that a call finds
its inputs out of L2), replayed; the median replay / n. Same inputs, same parameters as the
benchmarks (bench_sampling's MIX on 'llm' logits, bench_ops' grammar bitmask, bench_rejection's
cases). Prints one line per shape: warm and cold µs, the floor and both ratios to it.
"""
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import copy_bandwidth, floor_us, time_us  # noqa: E402

MIN_TOTAL = 256 << 20
MIN_COPIES = 8     # calls per cold replay: the graph launch shared by at least as many calls as warm's 5-10
MAX_COPIES = 512


def time_cold(make_call, bytes_per_copy: int, iters: int = 20) -> float:
    """Median µs of one call when each call of a captured graph reads its own inputs.
    make_call(i) builds copy i's inputs and returns the call on them."""
    n = max(MIN_COPIES, min(MAX_COPIES, math.ceil(MIN_TOTAL / max(bytes_per_copy, 1))))
    calls = [make_call(i) for i in range(n)]
    for c in calls:
        c()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / n)
    return statistics.median(times)


def report(name: str, warm: float, cold: float, nbytes: int) -> None:
    flo = floor_us(nbytes)
    print(f"{name:58s} warm {warm:8.2f} us  cold {cold:8.2f} us  floor {flo:7.2f} us  "
          f"x floor warm {warm / flo:5.2f} cold {cold / flo:5.2f}", flush=True)


def sampling_cases(fs) -> None:
    from bench.bench_sampling import make_logits, metadata
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    V = 128256
    for dtype in (torch.float32, torch.bfloat16):
        for B in (8, 32, 128):
            base = make_logits(B, V, dtype, "llm", seed=B * 7 + V)
            md = metadata(B, V, seeded=False)
            opts = sample_options(md, md.min_p)

            def make(i, base=base, md=md, opts=opts):
                x = base.clone()
                return lambda: sample(x, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                                      md.positions, backend="triton", **opts)

            nbytes = base.numel() * base.element_size()
            tag = f"sample MIX specops {str(dtype)[6:]} B={B}"
            report(tag, time_us(make(0), warmup=3, iters=30, replays_per_graph=5), time_cold(make, nbytes), nbytes)
            if fs is not None and B >= 32:
                inv = md.inv_temperature
                k = torch.where(md.top_k > 0, md.top_k, V).to(torch.int32)
                p = md.top_p.contiguous()

                def make_fi(i, base=base, inv=inv, k=k, p=p, dtype=dtype):
                    x = (base.float() * torch.where(inv > 0, inv, torch.ones_like(inv)).unsqueeze(1)).to(dtype)
                    return lambda: fs.top_k_top_p_sampling_from_logits(x, k, p)

                report(f"sample MIX flashinfer {str(dtype)[6:]} B={B}",
                       time_us(make_fi(0), warmup=3, iters=30, replays_per_graph=5), time_cold(make_fi, nbytes), nbytes)


def bitmask_cases() -> None:
    from bench.bench_ops import bitmask_min_bytes, make_bitmask
    from specops import apply_token_bitmask_
    V = 128256
    for dtype, batches in ((torch.bfloat16, (8, 32, 128)), (torch.float32, (8, 32))):
        for B in batches:
            logits = torch.randn(B, V, device="cuda").to(dtype)
            bitmask = make_bitmask(B, V, 0.01)
            nbytes = bitmask_min_bytes(bitmask, V, dtype)

            def make(i, logits=logits, bitmask=bitmask):
                x, m = logits.clone(), bitmask.clone()
                return lambda: apply_token_bitmask_(x, m)

            copy_bytes = logits.numel() * logits.element_size() + bitmask.numel() * 4
            report(f"bitmask grammar specops {str(dtype)[6:]} B={B}", time_us(make(0)),
                   time_cold(make, copy_bytes), nbytes)


def rejection_cases() -> None:
    from bench.bench_rejection import Case
    V = 128256
    for B, K in ((128, 1), (32, 4), (8, 4)):
        base = Case(V, B, K, False, seed=B * 31 + K)
        rejected = base.rejected_requests(base.ours())
        nbytes = B * K * V * 4 + B * K * 12 + B * (K + 1) * 4
        del rejected

        def make(i, B=B, K=K):
            c = Case(V, B, K, False, seed=B * 31 + K)
            return c.ours

        copy_bytes = B * (K + 1) * V * 4
        report(f"rejection specops-kernels K={K} B={B} no probs", time_us(base.ours, iters=30, replays_per_graph=5),
               time_cold(make, copy_bytes), nbytes)


def main() -> None:
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s; cold = each call on its own "
          f"copy of the inputs (>= {MIN_TOTAL >> 20} MB of copies)", flush=True)
    try:
        import flashinfer.sampling as fs
    except Exception as exc:  # noqa: BLE001 - absent peer: its lines are left out
        print(f"FlashInfer unavailable ({type(exc).__name__}): its lines are left out")
        fs = None
    sampling_cases(fs)
    bitmask_cases()
    rejection_cases()


if __name__ == "__main__":
    main()
