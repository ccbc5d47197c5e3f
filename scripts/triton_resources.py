"""Compile specops' Triton kernels for the H200 (sm_90) on a machine without a GPU, and print
each kernel's registers, stack and local memory (spills) per thread.

    python scripts/triton_resources.py [--op sample] [--cap 1024] [--batch 8] [--vocab 128256] [--dtype fp32]
        [--no-filters] [--pivot [--pivot-round1]] [--spread-kmax K] [--ttgir DIR]
    python scripts/triton_resources.py --op rejection [--batch 8] [--vocab 128256] [--dtype fp32]
    python scripts/triton_resources.py --op logprobs [--batch 8] [--vocab 128256] [--dtype fp32]

--op sample: every launch of one sample() call (the Sampler's top-k / top-p / min-p pipeline);
--op rejection: the expand kernel and the rejection passes with draft probabilities (pass 1,
finalize, recover) and without (pass 1 and finalize), K = 4 drafts per request;
--op logprobs: the logprob kernels in the four modes (raw / processed, logprobs / logits;
processed with and without the drawn-token widening), top 1, 5 and 20.

Why: device time is short; a change that only moves registers (a larger `cap`, another sort
size) can be checked here first. How: a stand-in driver reports an sm_90 target, every
launch compiles (`JITFunction.run(.., warmup=True)`) instead of running, and cuobjdump (in
Triton's wheel) reads the cubin's resource usage. The local Triton may not be the GPU
machine's (3.6 there), so its numbers are a guide, never a measurement; nothing here runs a
kernel. Launch arguments are CPU tensors; outputs are never read.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402
from triton.runtime import driver as triton_driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Sm90Driver(CudaDriver):
    """CudaDriver without libcuda: an sm_90 target, device 0, stream 0."""

    def __init__(self):  # noqa: D107 (CudaDriver's own __init__ loads libcuda)
        self.utils = None

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def resource_usage(cubin: bytes) -> str:
    """cuobjdump's 'REG:.. STACK:.. SHARED:.. LOCAL:..' line of the cubin's one function."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    line = next((ln.strip() for ln in out.splitlines() if ln.strip().startswith("REG:")), "?")
    return " ".join(line.split()[:5])


def compile_sample(R: int, V: int, dtype: torch.dtype, cap: int, pivot: bool = False,
                   spread_kmax: int | None = None, filters: bool = True, pivot_round1: bool = False) -> None:
    """Every launch of one sample() call on [R, V] logits with mixed top-k / top-p / min-p rows
    (`pivot`: the tokens-only call, whose rows of top-p alone take the pivot rounds;
    `spread_kmax`: the launcher's, default its own; 0 compiles the plain collect launch;
    `filters=False`: no filter tensor at all, the Sampler's plain batches; `pivot_round1`: with
    `pivot`, the collect launch sums the pivot rows' round 1, `pivot_round1_in_collect=True`)."""
    from specops.triton_kernels.sampling_topk_topp import sample_top_k_top_p_triton

    rows = torch.arange(R)
    top_k, top_p, min_p = ((rows % 3 * 20).to(torch.int32), torch.full((R,), 0.9), torch.full((R,), 0.02)) \
        if filters else (None, None, None)
    sample_top_k_top_p_triton(torch.zeros(R, V, dtype=dtype), torch.ones(R), top_k, top_p, min_p, rows.long(),
                              rows.long(), cap=cap, pivot=pivot,
                              **(dict(pivot_round1_in_collect=True, search=True) if pivot_round1 else {}),
                              **({} if spread_kmax is None else dict(spread_kmax=spread_kmax)))


def compile_rejection(num_reqs: int, V: int, dtype: torch.dtype, K: int = 4) -> None:
    """The expand kernel, and the rejection passes as specops.spec_decode.rejection launches
    them, with draft probabilities (pass 1, finalize, recover) and without."""
    from specops.triton_kernels.expand import expand_to_draft_rows
    from specops.triton_kernels.rejection_recover import rejection_recover_pass
    from specops.triton_kernels.rejection_sample import chunk_size, rejection_sample_pass, sub_chunk_size

    T = num_reqs * K
    cu = torch.arange(1, num_reqs + 1) * K
    expand_to_draft_rows(torch.ones(num_reqs), cu, T, K, replace_from=0.0, replace_to=1.0)
    logits = torch.zeros(T, V, dtype=dtype)
    chunk, sub = chunk_size(V), sub_chunk_size(V)
    for probs in (torch.zeros(T, V), None):
        out = torch.empty(num_reqs, K + 1, dtype=torch.int32)
        args = dict(target_rows=None, draft_token_ids=torch.zeros(T, dtype=torch.int64), draft_probs=probs,
                    cu_num_draft_tokens=cu, temperature=torch.ones(num_reqs), inv_temperature=None, threshold=None,
                    seeds=torch.zeros(num_reqs, dtype=torch.int64), has_seed=torch.zeros(num_reqs, dtype=torch.bool),
                    positions=torch.zeros(num_reqs, dtype=torch.int64), step=torch.zeros(1, dtype=torch.int64),
                    engine_seed=0)
        pass1 = rejection_sample_pass(out, logits, bonus_token_ids=torch.zeros(num_reqs, dtype=torch.int64),
                                      is_greedy=torch.zeros(num_reqs, dtype=torch.bool), fuse_race=False,
                                      chunk=chunk, sub_chunk=sub, **args)
        if probs is not None:
            rejection_recover_pass(out, logits, pass1=pass1, chunk=chunk, sub_chunk=sub, **args)


def compile_logprobs(R: int, V: int, dtype: torch.dtype) -> None:
    """The logprob kernels as specops.sampling.logprobs launches them: raw and processed (widen
    or not), logprobs and logits, top 1, 5 and 20."""
    from specops.triton_kernels.logprob_stats import logprob_stats, processed_logprob_stats

    scores, tokens = torch.zeros(R, V, dtype=dtype), torch.zeros(R, dtype=torch.int64)
    f32 = [torch.zeros(R) for _ in range(6)]
    ranks = torch.zeros(R, dtype=torch.int64)
    for top1, top_n in ((True, 0), (False, 5), (False, 20)):
        ids, vals = torch.zeros(R, 21, dtype=torch.int64), torch.zeros(R, 21)
        for offset in (True, False):        # the *_logprobs and the *_logits modes
            logprob_stats(scores, tokens, ids, vals, ranks, f32[0], log_norm=offset, top1=top1, top_n=top_n)
            for widen in (False, True):
                processed_logprob_stats(scores, tokens, *f32[:4], ids, vals, ranks, *f32[4:], logprobs=offset,
                                        top1=top1, widen=widen, top_n=top_n)


def record_compiles() -> list:
    """Make this process compile for sm_90 without a GPU: the stand-in driver, and every Triton
    launch compiled instead of run. Returns the list each launch appends (kernel name, kernel) to."""
    triton_driver.set_active(Sm90Driver())
    compiled = []
    original_run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only
    return compiled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="sample", choices=("sample", "rejection", "logprobs"))
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--pivot", action="store_true", help="sample: the tokens-only call (pivot rounds)")
    ap.add_argument("--spread-kmax", type=int, default=None, help="sample: the launcher's spread_kmax")
    ap.add_argument("--no-filters", action="store_true", help="sample: no top_k / top_p / min_p tensor")
    ap.add_argument("--pivot-round1", action="store_true",
                    help="sample --pivot: the collect launch sums round 1 (pivot_round1_in_collect=True)")
    ap.add_argument("--ttgir", default=None, help="also write each kernel's TTGIR to DIR/<n>_<kernel>.ttgir")
    a = ap.parse_args()

    compiled = record_compiles()
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    if a.op == "sample":
        compile_sample(a.batch, a.vocab, dtype, a.cap, a.pivot, a.spread_kmax, not a.no_filters, a.pivot_round1)
        print(f"triton {triton.__version__}, sm_90, sample, cap={a.cap}, R={a.batch}, V={a.vocab}, {a.dtype}"
              + (", pivot" if a.pivot else "") + (", round 1 in collect" if a.pivot_round1 else "")
              + (", no filters" if a.no_filters else ""))
    elif a.op == "logprobs":
        compile_logprobs(a.batch, a.vocab, dtype)
        print(f"triton {triton.__version__}, sm_90, logprobs, R={a.batch}, V={a.vocab}, {a.dtype}")
    else:
        compile_rejection(a.batch, a.vocab, dtype)
        print(f"triton {triton.__version__}, sm_90, rejection, K=4, requests={a.batch}, V={a.vocab}, {a.dtype}")
    for n, (name, kernel) in enumerate(compiled):
        print(f"  {name:32s} warps {kernel.metadata.num_warps:2d}  {resource_usage(kernel.asm['cubin'])}")
        if a.ttgir:
            os.makedirs(a.ttgir, exist_ok=True)
            with open(os.path.join(a.ttgir, f"{n}_{name}.ttgir"), "w") as f:
                f.write(kernel.asm["ttgir"])


if __name__ == "__main__":
    main()
