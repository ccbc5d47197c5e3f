"""The sampler's, the rejection sampler's and the logprob Triton kernels compile for the H200
(sm_90) on a machine without a GPU.

The interpreter (how CI runs the kernels) accepts code that the compiler rejects; this test
compiles every launch of one sample() call, of the expand kernel and the rejection passes, and
of the logprob kernels (four modes, top 1 / 5 / 20) through `scripts/triton_resources.py`
(a stand-in sm_90 driver, launches compiled and never run) in a subprocess, so the stand-in
never touches this process, and checks that each kernel came out with a register count.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "triton_resources.py")


def _have_nvidia_backend() -> bool:
    try:
        import triton
    except ImportError:
        return False
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return all(os.path.exists(os.path.join(tools, t)) for t in ("ptxas", "cuobjdump"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests compile and run every kernel")
@pytest.mark.skipif(not _have_nvidia_backend(), reason="Triton without its NVIDIA backend tools")
@pytest.mark.parametrize("op, batch, dtype, kernels", [
    ("sample", 8, "fp32", {"_row_stats_kernel", "_plan_kernel", "_refine_kernel", "_refine_combine_kernel",
                           "_collect_direct_kernel", "_finish_kernel"}),
    # 512 rows: the register caps of `later_maxnreg`; the collect launch with the spread rows' branch
    # (the Sampler's when a top_k <= SPREAD_TOP_K row may come) and without it (spread_kmax=0)
    ("sample", 512, "bf16", {"_row_stats_kernel", "_plan_kernel", "_refine_kernel", "_refine_combine_kernel",
                             "_collect_direct_kernel", "_finish_kernel"}),
    ("sample --spread-kmax 0", 512, "fp32", {"_row_stats_kernel", "_plan_kernel", "_refine_kernel",
                                             "_refine_combine_kernel", "_collect_kernel", "_finish_kernel"}),
    ("sample --pivot", 8, "fp32", {"_row_stats_kernel", "_plan_kernel", "_pivot_mass_kernel", "_pivot_draw_kernel",
                                   "_finish_kernel"}),
    ("logprobs", 8, "bf16", {"_partials_kernel", "_combine_kernel"}),
    ("rejection", 8, "bf16", {"_expand_kernel", "_rejection_sample_kernel", "_rejection_finalize_kernel",
                              "_residual_mass_kernel", "_recover_race_kernel"}),
])
def test_kernels_compile_for_sm90(op, batch, dtype, kernels):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    op, *flags = op.split()
    run = subprocess.run([sys.executable, SCRIPT, "--op", op, "--batch", str(batch), "--dtype", dtype, *flags],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    regs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+warps\s+\d+\s+REG:(\d+)", run.stdout, re.M)}
    assert kernels <= set(regs), (sorted(regs), run.stdout)
    assert all(0 < r <= 255 for r in regs.values()), regs
