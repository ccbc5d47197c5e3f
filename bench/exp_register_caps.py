"""Experiment: a register cap (maxnreg) on each later kernel of the sampler and of rejection
sampling, the way pass 1's cap was chosen (logs/exp_pass1_maxnreg_2026-12-01.txt).

    python bench/exp_register_caps.py [sampling|rejection]   (GPU machine, repo root, after
                                                              gpu_check.sh's build)

Nsight Compute (logs/ncu_2026-12-01/) showed kernels held to few programs per SM by their
registers: the sampler's collect (119 registers, 8 warps: 2 programs per SM), refine (78, 8
warps: 3) and plan (165, 8 warps: 1), rejection's pass 1 (56, 4 warps: 9). A cap compiles the
same code into fewer registers (spilling, perhaps): outputs must stay bit for bit the same,
which this checks. Each kernel is capped alone, by wrapping its launch (`JITFunction.run`)
so that no launcher changes; the whole call is timed in CUDA-graph replays (bench_sampling's
FAST timing), the capped kernel by the profiler. fp32, V = 128256: the sampler on
bench_sampling's mixed 'llm' rows at B = 128 and 512, rejection at K = 1, B = 128 and K = 4,
B = 32, with and without draft probs (exp_rejection_pass1.make_inputs).

Run in session 18 (logs/exp_register_caps_2026-12-01.txt): collect and plan gained (adopted
after bench/exp_collect_caps.py re-timed them interleaved); the others did not.
"""
import contextlib
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_sampling import FAST, MIX, make_logits, metadata  # noqa: E402
from bench.common import kernel_us, time_us  # noqa: E402

VOCAB = 128256
# kernel -> caps to try (None: as launched today)
SAMPLER_CAPS = {"_collect_kernel": (None, 96, 80, 64), "_refine_kernel": (None, 64, 56),
                "_plan_kernel": (None, 128, 96), "_finish_kernel": (None, 96)}
REJECTION_CAPS = {"_rejection_sample_kernel": (None, 48, 40), "_rejection_finalize_kernel": (None, 48),
                  "_residual_mass_kernel": (None, 24)}


@contextlib.contextmanager
def capped(module, name: str, cap):
    """Launches of module.<name> get maxnreg=cap (nothing changes for cap None; cap 0: uncapped)."""
    fn = getattr(module, name)
    if cap is None:
        yield
        return
    def run(*args, **kwargs):                 # fn[grid](...) calls self.run
        kwargs["maxnreg"] = cap or None       # over the launcher's own cap, if any
        return type(fn).run(fn, *args, **kwargs)

    fn.run = run
    try:
        yield
    finally:
        del fn.run


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           b.view(torch.int32) if b.is_floating_point() else b)
    return all(same(getattr(a, f), getattr(b, f)) for f in ("tokens", "threshold", "row_max", "log_norm"))


def sweep(label, fn, module, caps) -> None:
    ref = fn()
    for name, values in caps.items():
        cells = []
        for cap in values:
            with capped(module, name, cap):
                out = fn()
                t = time_us(fn, **FAST)
                k = sum(v for n, v in kernel_us(fn).items() if n.startswith(name))
            cells.append(f"{cap or '-'}: {t:6.1f}/{k:5.1f}{'' if same(out, ref) else ' DIFF'}")
        print(f"{label:22s} {name:28s} " + "  ".join(cells), flush=True)


def sampler() -> None:
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels import sampling_topk_topp
    for B in (128, 512):
        logits = make_logits(B, VOCAB, torch.float32, "llm", seed=B * 7 + VOCAB)
        md = metadata(B, VOCAB, seeded=True)
        fn = functools.partial(sample, logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                               md.positions, backend="triton", **sample_options(md, md.min_p))
        sweep(f"sample MIX B={B}", fn, sampling_topk_topp, SAMPLER_CAPS)


def rejection() -> None:
    from bench.exp_rejection_pass1 import make_inputs
    from specops.spec_decode import rejection_sample
    from specops.triton_kernels import rejection_recover, rejection_sample as rs
    for k, batch in ((1, 128), (4, 32)):
        for probs in (False, True):
            a, batch, k = make_inputs(VOCAB, batch, k, probs, "cuda")
            fn = functools.partial(rejection_sample, a["logits"], a["draft_token_ids"], a["cu_num_draft_tokens"], k,
                                   a["bonus_token_ids"], target_rows=a["target_rows"], draft_probs=a["draft_probs"],
                                   temperature=a["temperature"], step=a["step"])
            caps = {n: c for n, c in REJECTION_CAPS.items() if probs or n != "_residual_mass_kernel"}
            for name, values in caps.items():
                module = rejection_recover if name == "_residual_mass_kernel" else rs
                sweep(f"rejection K={k} B={batch} p={int(probs)}", fn, module, {name: values})


def main() -> None:
    which = sys.argv[1:] or ["sampling", "rejection"]
    print(f"{torch.cuda.get_device_name()}, V={VOCAB}; cap: whole call us (graph) / capped kernel us (profiler)")
    if "sampling" in which:
        sampler()
    if "rejection" in which:
        rejection()


if __name__ == "__main__":
    main()
