"""Pass 1's register cap chosen by the launch (64 without histogram rows, 80 with them:
sampling_stats.pass1_maxnreg) against the fixed 96 of session 16, on the whole sample() call.

    python bench/exp_pass1_maxnreg.py     (GPU machine, repo root, after gpu_check.sh's build)

bench_sampling's 'llm' logits, V = 128256, B = 128 and 512, fp32 and bf16: plain rows called
as bench_plain calls them (no filter tensors), greedy rows, and the bench's mixed rows; the
two versions interleaved (96, new, 96, new), CUDA-graph replays (bench_sampling's FAST timing);
'same' = tokens, thresholds, maxima and log-normalisers bit for bit equal. FlashInfer's
sampling_from_logits on the plain rows for reference.
"""
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import FAST, MIX, flashinfer_sampling, make_logits, metadata  # noqa: E402
from bench.common import time_us  # noqa: E402
from specops.sampling import sample  # noqa: E402
from specops.sampling.topk_topp import sample_options  # noqa: E402
from specops.triton_kernels import sampling_stats, sampling_topk_topp  # noqa: E402


def bits(t):
    return t.view(torch.int32) if t.is_floating_point() else t


def main() -> None:
    V = 128256
    fs = flashinfer_sampling()
    original = sampling_stats.row_stats_pass
    versions = {"96": functools.partial(original, maxnreg=96), "new": original}
    print(f"{torch.cuda.get_device_name()}, V={V}: sample() us (graph replay), pass 1 at maxnreg 96 vs the new choice")
    for B in (128, 512):
        for dtype in (torch.float32, torch.bfloat16):
            logits = make_logits(B, V, dtype, "llm", seed=B + 1)
            for name in ("plain", "greedy", "MIX"):
                md = metadata(B, V, seeded=False, mix={"plain": [(1.0, 0, 1.0, 0.0)], "greedy": [(0.0, 0, 1.0, 0.0)],
                                                        "MIX": MIX}[name])
                if name == "plain":
                    fn = functools.partial(sample, logits, md.inv_temperature, None, None, None, md.seeds,
                                           md.positions, backend="triton")
                else:
                    fn = functools.partial(sample, logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                                           md.positions, backend="triton", **sample_options(md, md.min_p))
                ts, outs = {"96": [], "new": []}, {}
                try:
                    for v in ("96", "new", "96", "new"):
                        sampling_topk_topp.row_stats_pass = versions[v]
                        outs[v] = fn()
                        ts[v].append(time_us(fn, **FAST))
                finally:
                    sampling_topk_topp.row_stats_pass = original
                same = all(torch.equal(bits(getattr(outs["96"], f)), bits(getattr(outs["new"], f)))
                           for f in ("tokens", "threshold", "row_max", "log_norm"))
                fi = ""
                if name == "plain" and fs is not None:
                    fi = f"  flashinfer {time_us(lambda: fs.sampling_from_logits(logits), **FAST):6.1f}"
                print(f"B={B:3d} {str(dtype)[6:]:8s} {name:6s} 96: {ts['96'][0]:6.1f} {ts['96'][1]:6.1f}  "
                      f"new: {ts['new'][0]:6.1f} {ts['new'][1]:6.1f}  new/96 {min(ts['new']) / min(ts['96']):.3f}  "
                      f"same {same}{fi}", flush=True)


if __name__ == "__main__":
    main()
