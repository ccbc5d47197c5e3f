"""Experiment: min-p rows by pivot rejection, and the pivot rounds' sub-chunk skip.

    python bench/exp_pivot_minp.py      (GPU machine, repo root; exits 0 without CUDA)

Session 31 moved rows with min-p and no top-k (alone or with top-p) from the threshold
search to sampling_pivot.py's rejection when only the tokens are needed
(`sample(..., distribution=False)`), and let the rounds' mass kernel skip a sub-chunk whose
tile maxima (pass 1) all lie at or below the pivot. This times, with CUDA graphs
(bench.common.time_us) and interleaved variants, fp32 V = 128256 'llm' logits:

- "pivot": the default (min-p and top-p rows by pivot rejection, skip on);
- "noskip": the same with every sub-chunk read (`pivot_skip=False`: the same tokens);
- "search": `pivot=False`, the rows take the threshold search (the path before session 31).

Row kinds: min-p alone (0.05 / 0.1), top-p alone (0.9 / 0.95), bench_sampling's MIX. Each
variant's tokens are compared with the default's (pivot / noskip: equal; search: another
draw of the same law, so only counted), and per-kernel device time is printed at B = 128.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import FAST, MIN_P_MIX, MIX, TOP_P_MIX, make_logits, metadata  # noqa: E402
from bench.common import interleaved_medians, kernel_us  # noqa: E402

BATCHES = (1, 8, 32, 128, 512)
KINDS = (("min-p", MIN_P_MIX), ("top-p", TOP_P_MIX), ("mix", MIX))
ROUNDS = 3


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return 0
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    V = 128256
    print(f"{torch.cuda.get_device_name()}: sample(..., distribution=False), fp32 V={V}, median us of "
          f"{ROUNDS} interleaved rounds", flush=True)
    print("kind    B    | pivot    noskip   search  | noskip = pivot tokens | search tokens differ", flush=True)
    for kind, mix in KINDS:
        for B in BATCHES:
            logits = make_logits(B, V, torch.float32, "llm", seed=B * 11 + V)
            md = metadata(B, V, seeded=False, mix=mix)
            base = sample_options(md, md.min_p, None, distribution=False)
            variants = {"pivot": base, "noskip": dict(base, pivot_skip=False),
                        "search": sample_options(md, md.min_p, {"pivot": False}, distribution=False)}

            def call(opts):
                return lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                                      md.positions, backend="triton", distribution=False, **opts)
            fns = {name: call(o) for name, o in variants.items()}
            toks = {name: fn().tokens.clone() for name, fn in fns.items()}
            med = interleaved_medians(fns, ROUNDS, **FAST)
            same = torch.equal(toks["pivot"], toks["noskip"])
            differ = int((toks["pivot"] != toks["search"]).sum())
            print(f"{kind:6s} {B:4d} | {med['pivot']:7.1f} {med['noskip']:7.1f} {med['search']:7.1f} | "
                  f"{str(same):21s} | {differ}/{B}", flush=True)
            if B == 128:
                for name, fn in fns.items():
                    ks = ", ".join(f"{k.split('(')[0][:22]} {v:.1f}" for k, v in kernel_us(fn).items())
                    print(f"    kernels {name:6s}: {ks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
