"""Experiment: the whole rejection sampling call (pass 1, finalize and, with draft probs, the
recover pass) of the tree against other trees' kernels, in one run on the GPU.

    mkdir -p ab/NAME && git archive BRANCH triton_kernels | tar -x -C ab/NAME   # before the device call
    python bench/exp_rejection_ab.py ab/NAME [ab/OTHER ...] [--rounds=4] [--shapes=8x128x0,8x32x1]

(ab/ is ignored by git: name it in the device call's carry, beside .gpu.)

Each variant is the rejection modules (rejection_sample.py and rejection_recover.py with the
rejection_* modules they import) from DIR/triton_kernels, each taken from the tree where DIR
has none (bench/exp_rejection_timeline.py's loader). For each shape (V = 128256 fp32, the
bench_rejection inputs of bench/exp_rejection_pass1.py: K, batch, with and without draft
probs; `--shapes` replaces SHAPES by K x batch x probs triples) every module runs the call as
specops.spec_decode.rejection_sample launches it, 3 calls captured in one CUDA graph; the
graphs are replayed in interleaved rounds (tree, variants, tree, ...) and each module's median
over its rounds is printed, with the ratio to the tree's.
Every variant's output must equal the tree's (the same tokens: "DIFF" otherwise).
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import _median_events  # noqa: E402
from bench.exp_rejection_pass1 import TEMP, make_inputs  # noqa: E402
from bench.exp_rejection_timeline import load_modules, module_sources  # noqa: E402
from specops.triton_kernels import rejection_recover as tree_recover  # noqa: E402
from specops.triton_kernels import rejection_sample as tree_sample  # noqa: E402

VOCAB = 128256
SHAPES = [(1, 128, False), (4, 32, False), (1, 128, True), (4, 32, True), (8, 32, False), (4, 8, False)]


def parse_shapes(text: str) -> list[tuple[int, int, bool]]:
    """"8x128x0,8x32x1" -> [(8, 128, False), (8, 32, True)]: K x batch x draft probs."""
    shapes = []
    for item in text.split(","):
        k, batch, probs = (int(v) for v in item.split("x"))
        shapes.append((k, batch, bool(probs)))
    return shapes


def variant_modules(folder: str, prefix: str):
    """(rejection_sample, rejection_recover) of the tree at `folder` (DIR/triton_kernels/...)."""
    path = os.path.join(folder, "triton_kernels", "rejection_sample.py")
    srcs = module_sources(path)
    own = os.path.join(folder, "triton_kernels", "rejection_recover.py")
    srcs["rejection_recover"] = open(own if os.path.exists(own) else tree_recover.__file__).read()
    mods = load_modules(srcs, prefix, roots=("rejection_sample", "rejection_recover"))
    return mods["rejection_sample"], mods["rejection_recover"]


def call(sample_mod, recover_mod, inputs, out, chunk):
    """The rejection sampling call as specops.spec_decode.rejection_sample makes it (no fused race)."""
    res = sample_mod.rejection_sample_pass(out, fuse_race=False, chunk=chunk, **inputs)
    if inputs["draft_probs"] is not None:
        args = {n: v for n, v in inputs.items() if n not in ("logits", "bonus_token_ids", "is_greedy")}
        recover_mod.rejection_recover_pass(out, inputs["logits"], pass1=res, chunk=chunk, **args)


def graph_of(sample_mod, recover_mod, inputs, like, chunk):
    """(graph of 3 calls, their outputs) after 2 warm-up rounds."""
    outs = [torch.empty_like(like) for _ in range(3)]
    for _ in range(2):
        for o in outs:
            call(sample_mod, recover_mod, inputs, o, chunk)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for o in outs:
            call(sample_mod, recover_mod, inputs, o, chunk)
    return g, outs


def main() -> None:
    folders = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--rounds=")), 4)
    shapes = next((parse_shapes(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--shapes=")), SHAPES)
    if not torch.cuda.is_available():
        print("exp_rejection_ab needs CUDA: nothing to do")
        return
    mods = [("tree", tree_sample, tree_recover)]
    mods += [(os.path.basename(os.path.normpath(f)), *variant_modules(f, f"ab{i}_")) for i, f in enumerate(folders)]
    chunk = tree_sample.chunk_size(VOCAB)
    print(f"{torch.cuda.get_device_name()}, V={VOCAB} fp32, T={TEMP}; us per call "
          f"(graph of 3 calls, median of {rounds} interleaved rounds x 50 replays); ratio to the tree")
    print(f"{'K':>2} {'B':>4} {'probs':>5} " + " ".join(f"{name:>22}" for name, _, _ in mods))
    for k, batch, probs in shapes:
        inputs, batch, k = make_inputs(VOCAB, batch, k, probs, "cuda")
        ref = torch.empty(batch, k + 1, dtype=torch.int32, device="cuda")
        call(tree_sample, tree_recover, inputs, ref, chunk)
        graphs, same = [], []
        for _, sm, rm in mods:
            g, outs = graph_of(sm, rm, inputs, ref, chunk)
            g.replay()
            torch.cuda.synchronize()
            graphs.append(g)
            same.append(all(torch.equal(ref, o) for o in outs))
        times = [[] for _ in mods]
        for _ in range(rounds):
            for i, g in enumerate(graphs):
                times[i].append(_median_events(g.replay, 50) / 3)
        med = [statistics.median(t) for t in times]
        cells = [f"{m:7.2f} ({m / med[0]:5.3f}){'' if ok else ' DIFF'}" for m, ok in zip(med, same)]
        print(f"{k:>2} {batch:>4} {str(probs):>5} " + " ".join(f"{c:>22}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
