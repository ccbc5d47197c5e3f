"""Experiment: the logprob kernels of another version (a file) against this tree's, same run.

    python bench/exp_logprob_combine_ab.py OLD_MODULE.py     (GPU machine, repo root)

OLD_MODULE.py is a copy of triton_kernels/logprob_stats.py from another commit with its relative
import made absolute, left untracked in the tree so that it travels to the GPU machine, e.g.

    git show 69b6a48:triton_kernels/logprob_stats.py | sed 's/^from [.]sampling_common/from specops.triton_kernels.sampling_common/' > bench/_ab_old_logprob_stats.py

Times compute_logprobs("raw_logprobs") and compute_processed_logprobs (widen=True, bench_logprobs'
inputs) at V = 128256, fp32 and bf16, batch 1 / 8 / 128, n in {1, 5, 20} (fewer with
EXP_BATCHES=1,8 EXP_NS=5,20), the two versions interleaved over 3 rounds (median); both are
first checked against the torch path.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_logprobs import TIMING, check, check_processed, make_inputs, make_processed  # noqa: E402
from bench.common import interleaved_medians  # noqa: E402


def main() -> int:
    import specops.triton_kernels.logprob_stats as cur
    from specops.sampling.logprobs import compute_logprobs, compute_processed_logprobs

    spec = importlib.util.spec_from_file_location("old_logprob_stats", sys.argv[1])
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    versions = {"old": (old.logprob_stats, old.processed_logprob_stats),
                "new": (cur.logprob_stats, cur.processed_logprob_stats)}
    new_fns = versions["new"]

    def use(name):
        cur.logprob_stats, cur.processed_logprob_stats = versions[name]

    print(f"{torch.cuda.get_device_name()}, V=128256; median µs per call over 3 interleaved rounds")
    print(f"{'mode':9} {'dtype':5} {'B':>4} {'n':>3} {'old':>8} {'new':>8} {'new/old':>8}")
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for B in [int(b) for b in os.environ.get("EXP_BATCHES", "1,8,128").split(",")]:
            for n in [int(k) for k in os.environ.get("EXP_NS", "1,5,20").split(",")]:
                x, tokens = make_inputs(B, 128256, dtype, seed=B + n)
                inv_t, res, ptok = make_processed(x, seed=B + n)
                for mode in ("raw", "processed"):
                    fns = {}
                    for name in versions:
                        use(name)
                        if mode == "raw":
                            check(x, tokens, n)
                            call = (lambda f=versions[name]: (setattr(cur, "logprob_stats", f[0]),
                                    compute_logprobs("raw_logprobs", n, tokens, raw_logits=x, backend="triton")))
                        else:
                            check_processed(x, inv_t, res, ptok, n)
                            call = (lambda f=versions[name]: (setattr(cur, "processed_logprob_stats", f[1]),
                                    compute_processed_logprobs("processed_logprobs", n, ptok, x, inv_t, res,
                                                               widen=True, backend="triton")))
                        fns[name] = call
                    t = interleaved_medians(fns, 3, **TIMING)
                    print(f"{mode:9} {dname:5} {B:4d} {n:3d} {t['old']:8.2f} {t['new']:8.2f} "
                          f"{t['new'] / t['old']:8.3f}", flush=True)
    cur.logprob_stats, cur.processed_logprob_stats = new_fns
    return 0


if __name__ == "__main__":
    sys.exit(main())
