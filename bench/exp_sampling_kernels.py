"""Where the sampler's device time goes, per kernel, for one parameter mix at a time.

    python bench/exp_sampling_kernels.py [B ...]   (GPU machine, repo root, after gpu_check.sh's build)

EXP_DTYPES=float32 and EXP_MIXES="bench MIX,top_p=0.9" (comma-separated names of MIXES) keep only those.
EXP_KNOBS="finish_maxnreg=0;finish_warps=16" times each mix once per knob set (';'-separated sets of
comma-separated launcher knobs, ints, given to sample_options as kernel options; an empty set: the defaults).
EXP_TIMELINE=1 also prints each call's kernels from one CUDA-graph replay in start order: start + duration
µs (bench.common.kernel_timeline) and, for a side stream's kernel, its stream (s<id>).

bench_sampling's 'llm' logits at V = 128256, B = 128 (or the batch sizes given), fp32 and bf16; every row of a batch
has the same (temperature, top_k, top_p, min_p), so each kernel's time belongs to one path
of pass 1: greedy rows (no histogram, no noise), plain rows (tile sums, then the noise of one sub-chunk),
top-k <= 128 rows (direct: no histogram, no noise), top-p / min-p / top-k > 128 rows (the
level-1 histogram), and the bench's mixed batch. Prints each kernel's device µs (torch
profiler, mean of 10 calls) and the whole sample's time from CUDA-graph replays.
(Session 29's --skip-ab, refine and collect reading only the tiles whose max reaches their
bounds against every tile, ran on branch wip/tile-skip: logs/exp_tile_skip_2026-12-02.txt.)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import MIX, make_logits, metadata  # noqa: E402
from bench.common import kernel_timeline, kernel_us, time_us  # noqa: E402
from specops.sampling import sample  # noqa: E402
from specops.sampling.topk_topp import sample_options  # noqa: E402

# EXP_DISTRIBUTION=0: the tokens-only call of bench_sampling's 'specops' rows (pivot rounds for top-p / min-p
# without top-k); default 1, with the exact thresholds (as for processed logprobs)
DISTRIBUTION = os.environ.get("EXP_DISTRIBUTION", "1") != "0"
TIMELINE = os.environ.get("EXP_TIMELINE", "0") == "1"
KNOB_SETS = [{k: int(v) for k, v in (kv.split("=") for kv in item.split(",") if kv)}
             for item in os.environ.get("EXP_KNOBS", "").split(";")]

MIXES = {
    "greedy": [(0.0, 0, 1.0, 0.0)],
    "plain T=1": [(1.0, 0, 1.0, 0.0)],
    "top_k=50": [(1.0, 50, 1.0, 0.0)],
    "top_p=0.9": [(1.0, 0, 0.9, 0.0)],
    "min_p=0.05": [(1.0, 0, 1.0, 0.05)],
    "top_k=500 top_p=0.95": [(1.0, 500, 0.95, 0.0)],
    "top_p=0.95": [(1.0, 0, 0.95, 0.0)],
    "top_k=3000": [(1.0, 3000, 1.0, 0.0)],
    "bench MIX": MIX,
}


def main() -> None:
    for B in [int(b) for b in sys.argv[1:]] or [128]:
        run(128256, B)


def run(V: int, B: int) -> None:
    print(f"{torch.cuda.get_device_name()}, V={V}, B={B}, distribution={DISTRIBUTION}, device us per kernel "
          "(mean of 10 calls)", flush=True)
    dtypes = [d for d in (torch.float32, torch.bfloat16) if str(d)[6:] in os.environ.get("EXP_DTYPES", "float32,bfloat16")]
    wanted = os.environ.get("EXP_MIXES")   # e.g. "bench MIX,top_p=0.9": only these mixes
    for dtype in dtypes:
        logits = make_logits(B, V, dtype, "llm", seed=B * 7 + V)
        for name, mix in MIXES.items():
            if wanted and name not in wanted.split(","):
                continue
            md = metadata(B, V, seeded=False, mix=mix)
            args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
            for knobs in KNOB_SETS:
                opts = sample_options(md, md.min_p, knobs, DISTRIBUTION)   # as the Sampler calls it
                call = lambda: sample(*args, backend="triton", distribution=DISTRIBUTION, **opts)  # noqa: E731
                t = time_us(call, warmup=3, iters=20, replays_per_graph=5)
                per = kernel_us(call)
                parts = ", ".join(f"{k.split('(')[0][:24]} {v:.1f}"
                                  for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
                label = ",".join(f"{k}={v}" for k, v in knobs.items()) or "defaults"
                print(f"{str(dtype)[6:]:8s} {name:22s} {label:32s} {t:7.1f} us | {parts}", flush=True)
                if TIMELINE:
                    line = kernel_timeline(call)
                    main_stream = line[0][3] if line else None
                    print("    timeline: " + ", ".join(
                        f"{k.lstrip('_')[:16]} {t0:.1f}+{d:.1f}" + ("" if s == main_stream else f" s{s}")
                        for k, t0, d, s in line), flush=True)


if __name__ == "__main__":
    main()
