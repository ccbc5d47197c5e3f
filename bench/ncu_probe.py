"""One sampler or rejection call for Nsight Compute to profile (hardware counters per kernel).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \
        python bench/ncu_probe.py CASE        (GPU machine, repo root, after gpu_check.sh's build)

Every kernel is compiled and run a few times first; only the last call runs between
cudaProfilerStart and cudaProfilerStop, so ncu (with --profile-from-start off) sees one
call's kernels. Cases (fp32, V = 128256, bench_sampling's 'llm' logits and bench_rejection's
inputs): s_<mix><B> for the sampler (mix: greedy, plain, topp, topk, widek = top_k 500 with
top_p 0.95, the rows whose collect launch reads at 4x the floor at B = 512, mix = bench_sampling's
mixed rows), r_k<K>b<B>[p] for rejection sampling (p: with draft probs).
"""
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import MIX, make_logits, metadata  # noqa: E402

VOCAB = 128256
MIXES = {"greedy": [(0.0, 0, 1.0, 0.0)], "plain": [(1.0, 0, 1.0, 0.0)], "topp": [(1.0, 0, 0.9, 0.0)],
         "topk": [(1.0, 50, 1.0, 0.0)], "widek": [(1.0, 500, 0.95, 0.0)], "mix": MIX}


def sampler_call(mix: str, batch: int):
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    logits = make_logits(batch, VOCAB, torch.float32, "llm", seed=batch * 7 + VOCAB)
    md = metadata(batch, VOCAB, seeded=False, mix=MIXES[mix])
    args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    opts = sample_options(md, md.min_p)
    return lambda: sample(*args, backend="triton", **opts)


def rejection_call(k: int, batch: int, with_probs: bool):
    from bench.exp_rejection_pass1 import make_inputs
    from specops.spec_decode import rejection_sample
    a, batch, k = make_inputs(VOCAB, batch, k, with_probs, "cuda")
    return lambda: rejection_sample(a["logits"], a["draft_token_ids"], a["cu_num_draft_tokens"], k,
                                    a["bonus_token_ids"], target_rows=a["target_rows"],
                                    draft_probs=a["draft_probs"], temperature=a["temperature"], step=a["step"])


def main() -> None:
    case = sys.argv[1]
    if m := re.fullmatch(r"s_([a-z]+)(\d+)", case):
        fn = sampler_call(m.group(1), int(m.group(2)))
    elif m := re.fullmatch(r"r_k(\d+)b(\d+)(p?)", case):
        fn = rejection_call(int(m.group(1)), int(m.group(2)), m.group(3) == "p")
    else:
        raise SystemExit(f"unknown case {case!r}: s_<greedy|plain|topp|topk|widek|mix><B> or r_k<K>b<B>[p]")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"ncu_probe {case}: done", flush=True)


if __name__ == "__main__":
    main()
