"""Experiment: register caps on the sampler's collect and plan kernels, timed interleaved.

    python bench/exp_collect_caps.py   (GPU machine, repo root, after gpu_check.sh's build)

bench/exp_register_caps.py (logs/exp_register_caps_2026-12-01.txt) capped each later kernel
alone, one cap after the other: the collect kernel at 64 or 80 registers (119 uncapped)
took 197.8 -> 151.5 µs of the mixed fp32 B=512 call, and the plan at 128 (165 uncapped)
57.9 -> 45.2 µs, outputs bit for bit the same. This re-times the candidates together,
round-robin over several rounds (median per config), at more batches, both dtypes and both
vocabularies, so that a ratio to the uncapped call is not a drift between two timings.
Result: logs/exp_collect_caps_2026-12-01.txt, adopted as sampling_topk_topp.later_maxnreg.

    CAPS_CONFIGS=base,C80,C96,Cnone CAPS_SHAPES=fp32:mix:256,fp32:widek:512 python bench/exp_collect_caps.py

picks configs (Cnone: the collect launch uncapped) and shapes (dtype:rows:batch at V = 128256;
rows "mix" = bench_sampling's MIX, "widek" = every row top_k 500 + top_p 0.95 at T = 1, the rows
whose collect launch spilled at 64 registers in Nsight Compute, logs/ncu_2026-12-05/).
"""
import contextlib
import functools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import FAST, make_logits, metadata  # noqa: E402
from bench.common import time_us  # noqa: E402
from bench.exp_register_caps import capped, same  # noqa: E402

CONFIGS = {  # name -> {kernel: cap}
    "base": {},
    "C64": {"_collect_kernel": 64},
    "C72": {"_collect_kernel": 72},
    "C80": {"_collect_kernel": 80},
    "C96": {"_collect_kernel": 96},
    "Cnone": {"_collect_kernel": 0},
    "C64P128": {"_collect_kernel": 64, "_plan_kernel": 128},
    "C80P128": {"_collect_kernel": 80, "_plan_kernel": 128},
    "P128": {"_plan_kernel": 128},
}
SHAPES = [(128256, "fp32", b) for b in (8, 32, 128, 512)] + [(128256, "bf16", b) for b in (128, 512)] \
    + [(151936, "fp32", b) for b in (128, 512)]
ROUNDS = 3
WIDE_K = [(1.0, 500, 0.95, 0.0)]


def chosen_shapes() -> list[tuple[int, str, int, str]]:
    """(V, dtype, batch, rows) from CAPS_SHAPES, else SHAPES with bench_sampling's mix."""
    spec = os.environ.get("CAPS_SHAPES")
    if not spec:
        return [(V, dt, B, "mix") for V, dt, B in SHAPES]
    out = []
    for item in spec.split(","):
        dt, rows, b = item.split(":")
        out.append((128256, dt, int(b), rows))
    return out


def main() -> None:
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels import sampling_topk_topp as mod
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    print(f"{torch.cuda.get_device_name()}; whole sample() call, µs (median of {ROUNDS} interleaved rounds), "
          "ratio to base; DIFF: an output differs from base")
    configs = {n: CONFIGS[n] for n in os.environ.get("CAPS_CONFIGS", ",".join(CONFIGS)).split(",")}
    for V, dt, B, rows in chosen_shapes():
        logits = make_logits(B, V, dtypes[dt], "llm", seed=B * 7 + V)
        md = metadata(B, V, seeded=True, **({"mix": WIDE_K} if rows == "widek" else {}))
        fn = functools.partial(sample, logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                               md.positions, backend="triton", **sample_options(md, md.min_p))
        ref = fn()
        times = {name: [] for name in configs}
        diff = set()
        for _ in range(ROUNDS):
            for name, caps in configs.items():
                with contextlib.ExitStack() as stack:
                    for kernel, cap in caps.items():
                        stack.enter_context(capped(mod, kernel, cap))
                    if not same(fn(), ref):
                        diff.add(name)
                    times[name].append(time_us(fn, **FAST))
        base = statistics.median(times["base"])
        cells = [f"{n} {statistics.median(t):6.1f} ({statistics.median(t) / base:.3f}){' DIFF' if n in diff else ''}"
                 for n, t in times.items()]
        print(f"V={V} {dt} {rows} B={B:3d}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
