"""Experiment: the Sampler's triton call (sample_top_k_top_p_triton) of the tree against other
trees' sampling kernels, in one run on the GPU.

    mkdir -p ab/NAME && git archive BRANCH triton_kernels | tar -x -C ab/NAME   # before the device call
    python bench/exp_sampling_ab.py ab/NAME [ab/OTHER ...] [tree:KNOB=VALUE,...] [--rounds=6]
        [--shapes=mix:8,k500:128:bf16] [--distribution]

(ab/ is ignored by git: name it in the device call's carry, beside .gpu.)

Each variant is DIR/triton_kernels imported as a package of its own (the sampling modules
import each other relatively), so every tree's kernels compile and run in one process. For
each shape (PARAMS name : batch [: dtype], V = 128256, bench_sampling's 'llm' logits and
unseeded rows) every tree makes the call `specops.sampling.sample` makes (the options of
`sample_options`, tokens only unless --distribution), the calls are timed in interleaved
rounds (tree, variants, tree, ...; bench_sampling's FAST graph timing) and each median is
printed with its ratio to the tree's. A variant `tree:spread_kmax=0,refine=0` is the tree's
kernels with those launcher knobs given to `sample_options` (ints; so the host's defaults
follow them). Options a variant's launcher does not take are dropped for it (an older tree).
Every variant's tokens and row maxima must equal the
tree's ("DIFF" otherwise); with --distribution the thresholds too, and the largest log_norm
difference is printed (a row whose search took another path sums its mass in another order).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_sampling import FAST, MIX, make_logits, metadata  # noqa: E402
from bench.common import interleaved_medians  # noqa: E402
from specops._arg_checks import dense  # noqa: E402
from specops.sampling.topk_topp import sample_options  # noqa: E402
from specops.triton_kernels import sampling_topk_topp as tree_launcher  # noqa: E402

VOCAB = 128256
PARAMS = {
    "mix": MIX,
    "k500": [(1.0, 500, 0.95, 0.0)],
    "k200": [(1.0, 200, 0.9, 0.0)],
    "k1000": [(1.0, 1000, 0.95, 0.0)],
    "p90": [(1.0, 0, 0.9, 0.0)],          # top-p alone: the pivot rounds (tokens-only calls)
    "minp": [(1.0, 0, 1.0, 0.05)],        # min-p alone: the pivot rounds
    "plain": [(1.0, 0, 1.0, 0.0)],        # no filter: the Sampler passes no filter tensor
}
SHAPES = "mix:1,mix:8,mix:32,mix:128,mix:512,k500:1,k500:8,k500:128,k200:32,k1000:32,mix:128:bf16"


def parse_shapes(text: str) -> list[tuple[str, int, torch.dtype]]:
    """"mix:8,k500:128:bf16" -> [("mix", 8, float32), ("k500", 128, bfloat16)]."""
    shapes = []
    for item in text.split(","):
        name, batch, *dt = item.split(":")
        if name not in PARAMS:
            raise SystemExit(f"unknown params {name!r}: one of {sorted(PARAMS)}")
        shapes.append((name, int(batch), torch.bfloat16 if dt and dt[0] == "bf16" else torch.float32))
    return shapes


def variant_launcher(folder: str, name: str):
    """sampling_topk_topp of FOLDER/triton_kernels, imported as package `name`."""
    pkg_dir = os.path.join(folder, "triton_kernels")
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg_dir, "__init__.py"),
                                                  submodule_search_locations=[pkg_dir])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module(f"{name}.sampling_topk_topp")


def call_of(launcher, logits, md, distribution: bool, knobs: dict | None = None):
    """The triton call of specops.sampling.sample on these rows, with `launcher`'s kernels
    (and `knobs` given to sample_options); options the launcher does not take are dropped."""
    opts = sample_options(md, md.min_p, knobs, distribution=distribution)
    takes = inspect.signature(launcher.sample_top_k_top_p_triton).parameters
    opts = {k: v for k, v in opts.items() if k in takes or k == "pivot"}
    pivot = opts.pop("pivot", md.top_p is not None or md.min_p is not None) and not distribution
    args = (logits, dense(md.inv_temperature), dense(md.top_k), dense(md.top_p), dense(md.min_p),
            dense(md.seeds), dense(md.positions))
    return lambda: launcher.sample_top_k_top_p_triton(*args, 0, pivot=pivot, **opts)


def compare(ref, out, distribution: bool) -> str:
    """'same' when the tokens and row maxima (and thresholds) are equal bit for bit, else DIFF."""
    tok, thr, rmax, lnorm = ref
    tok2, thr2, rmax2, lnorm2 = out
    fields = [(tok, tok2), (rmax, rmax2)] + ([(thr, thr2)] if distribution else [])
    same = all(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in fields)
    note = "same" if same else f"DIFF ({int((tok != tok2).sum())} tokens)"
    if distribution:
        d = (lnorm - lnorm2).abs().nan_to_num().max().item()
        note += f", log_norm max diff {d:.2e}"
    return note


def main() -> None:
    folders = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in sys.argv[1:] if a.startswith("--"))
    rounds = int(opts.get("rounds", 6))
    distribution = "distribution" in opts
    shapes = parse_shapes(opts.get("shapes", SHAPES))
    launchers = {"tree": tree_launcher}
    knobs = {}
    for i, folder in enumerate(folders):
        if folder.startswith("tree:"):     # the tree with launcher knobs
            launchers[folder] = tree_launcher
            knobs[folder] = {k: int(v) for k, v in (kv.split("=") for kv in folder[5:].split(","))}
        else:
            launchers[os.path.basename(os.path.normpath(folder))] = variant_launcher(folder, f"specops_ab{i}")
    print(f"{torch.cuda.get_device_name()}, V={VOCAB}, distribution={distribution}, {rounds} interleaved rounds; "
          f"graph µs (median), x tree = variant / tree", flush=True)
    for name, batch, dtype in shapes:
        logits = make_logits(batch, VOCAB, dtype, "llm", seed=batch * 7 + VOCAB)
        md = metadata(batch, VOCAB, seeded=False, mix=PARAMS[name])
        calls = {v: call_of(launcher, logits, md, distribution, knobs.get(v)) for v, launcher in launchers.items()}
        results = {v: call() for v, call in calls.items()}
        medians = interleaved_medians(calls, rounds, **FAST)
        base = medians["tree"]
        line = f"{name:6s} B={batch:<4d} {str(dtype)[6:]:9s} tree {base:8.2f}"
        for v in launchers:
            if v != "tree":
                verdict = compare(results["tree"], results[v], distribution)
                line += f" | {v} {medians[v]:8.2f} x{medians[v] / base:.3f} {verdict}"
        print(line, flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
    else:
        main()
