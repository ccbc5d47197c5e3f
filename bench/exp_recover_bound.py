"""Experiment: what the draft-probs recovered-token pass costs, and what a recovery without
its second read of the rejected rows could save at best (session 53).

For V = 128256 fp32 (bench_rejection's inputs, T = 0.8) at (K, batch) = (1, 128), (4, 32),
(8, 32), times the whole rejection call (3 calls in one CUDA graph, median of interleaved
rounds) for:

- noprobs:       no draft probs (the finalize races the rejected rows' tokens);
- probs:         draft probs (pass 1, finalize, the residual-mass and race launches);
- probs-nowork:  the same call on inputs where every draft is accepted, so both recover
                 launches find no work: the fixed cost of launching them;
- probs-norec:   pass 1 and the finalize alone on the draft-probs inputs (the recover
                 launches left out: wrong tokens, a lower bound);
- noprobs-nowork: no draft probs, every draft accepted.

Run from the repo root on the GPU machine: python bench/exp_recover_bound.py
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import _median_events  # noqa: E402
from bench.exp_rejection_pass1 import make_inputs  # noqa: E402
from specops.triton_kernels.rejection_recover import rejection_recover_pass  # noqa: E402
from specops.triton_kernels.rejection_sample import chunk_size, rejection_sample_pass  # noqa: E402

VOCAB = 128256
SHAPES = [(1, 128), (4, 32), (8, 32)]


def all_accepted(inputs):
    """The inputs with every draft made a token the target likes far more than the draft does."""
    out = dict(inputs)
    logits = inputs["logits"].clone()
    rows = inputs["target_rows"]
    logits[rows, inputs["draft_token_ids"].long()] = 40.0
    out["logits"] = logits
    return out


def call(inputs, out, chunk, recover=True):
    res = rejection_sample_pass(out, fuse_race=False, chunk=chunk, **inputs)
    if recover and inputs["draft_probs"] is not None:
        args = {n: v for n, v in inputs.items() if n not in ("logits", "bonus_token_ids", "is_greedy")}
        rejection_recover_pass(out, inputs["logits"], pass1=res, chunk=chunk, **args)


def graph_of(fn, like):
    outs = [torch.empty_like(like) for _ in range(3)]
    for _ in range(2):
        for o in outs:
            fn(o)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for o in outs:
            fn(o)
    return g


def main() -> None:
    if not torch.cuda.is_available():
        print("exp_recover_bound needs CUDA: nothing to do")
        return
    rounds = 6
    chunk = chunk_size(VOCAB)
    print(f"{torch.cuda.get_device_name()}, V={VOCAB} fp32; us per call (graph of 3 calls, median of {rounds} "
          f"interleaved rounds x 50 replays)")
    names = ["noprobs", "probs", "probs-nowork", "probs-norec", "noprobs-nowork"]
    print(f"{'K':>2} {'B':>4} " + " ".join(f"{n:>15}" for n in names) + "   rejected (probs)")
    for k, batch in SHAPES:
        probs, batch, k = make_inputs(VOCAB, batch, k, True, "cuda")
        noprobs = dict(probs, draft_probs=None)
        cases = [(noprobs, True), (probs, True), (all_accepted(probs), True), (probs, False),
                 (all_accepted(noprobs), True)]
        like = torch.empty(batch, k + 1, dtype=torch.int32, device="cuda")
        graphs = [graph_of(lambda o, i=i, r=r: call(i, o, chunk, r), like) for i, r in cases]
        check = torch.empty_like(like)
        call(probs, check, chunk)
        rejected = int((check[:, -1] < 0).sum()) if k > 0 else 0
        nowork = torch.empty_like(like)
        call(cases[2][0], nowork, chunk)
        assert bool((nowork[:, :k] == probs["draft_token_ids"].view(batch, k)).all()), "not every draft accepted"
        times = [[] for _ in graphs]
        for _ in range(rounds):
            for i, g in enumerate(graphs):
                times[i].append(_median_events(g.replay, 50) / 3)
        med = [statistics.median(t) for t in times]
        print(f"{k:>2} {batch:>4} " + " ".join(f"{m:15.2f}" for m in med) + f"   {rejected}", flush=True)


if __name__ == "__main__":
    main()
