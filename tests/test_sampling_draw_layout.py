"""Batch invariance at the last bit: the plan kernel's sub-chunk masses of a row without a
filter (`sampling_plan._draw_unfiltered`) must be added in the same order whichever variant of
the plan a batch compiles. A plain `tl.sum` adds in the order of the thread layout Triton
picks, and that layout is chosen over the whole kernel: session 62's audit
(bench/results/logs/audit_reduce_layouts_2026-12-06_s62.txt) found the [64, 16] masses with
sizePerThread [1, 2] / threadsPerWarp [4, 8] in the plan of a batch without filters and
[1, 1] / [2, 16] in the plan of a batch whose direct rows are deferred (DEFER=1). Another order
rounds the masses differently, so in a near tie a seeded plain row could draw another
sub-chunk, and so another token, depending on its neighbours.

This test compiles both batches for the H200 (sm_90) without a GPU (scripts/triton_resources.py)
and compares the layouts of the masses' sums in their TTGIR. It is a strict xfail on main:
the fix (a fixed pairwise tree, bench/unmeasured/plain_plan.patch) has not run on a GPU yet;
the patch turns this test into a plain one.
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


def plan_ttgir(tmp_path, *flags) -> str:
    """The TTGIR of the plan kernel of one sample() call at batch 8 (fp32, V=128256)."""
    out = tmp_path / "_".join(f.strip("-") for f in flags) if flags else tmp_path / "mixed"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, SCRIPT, "--op", "sample", "--batch", "8", "--ttgir", str(out), *flags],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    (name,) = [f for f in os.listdir(out) if f.endswith("__plan_kernel.ttgir")]
    return (out / name).read_text()


def draw_sums(ttgir: str) -> list[tuple[str, str, str]]:
    """(shape, axis, layout) of each float sum of the draw's masses in the plan: the reductions of
    a multi-dimensional operand named mass or w (`_draw_unfiltered`'s names), with the layout's
    definition spelled out, or "pairwise" where the summed axis has 2 entries (a sum of two
    floats is the same in either order, so its layout does not matter)."""
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    found = []
    for m in re.finditer(r'= "tt\.reduce"\(%(?:mass|w)\w*\) <\{axis = (\d+) : i32\}> \(\{(.*?)\}\) : '
                         r'\(tensor<(\d+(?:x\d+)+)xf32, (#[\w.]+(?:<[^()]*?>)?)>\)', ttgir, re.S):
        axis, body, shape, layout = m.groups()
        if "arith.addf" in body:
            pairwise = shape.split("x")[int(axis)] == "2"
            found.append((shape, axis, "pairwise" if pairwise else defs.get(layout, layout)))
    return found


@pytest.mark.skipif(torch.cuda.is_available(), reason="compiles for sm_90 through a stand-in driver (no GPU)")
@pytest.mark.skipif(not _have_nvidia_backend(), reason="Triton without its NVIDIA backend tools")
@pytest.mark.xfail(strict=True, reason="layout-dependent sum in _draw_unfiltered; fixed by "
                                       "bench/unmeasured/plain_plan.patch, not yet run on a GPU")
def test_unfiltered_draw_sums_in_one_order_in_every_plan_variant(tmp_path):
    plain = draw_sums(plan_ttgir(tmp_path, "--no-filters"))     # DEFER = 0
    mixed = draw_sums(plan_ttgir(tmp_path))                     # the direct rows deferred: DEFER = 1
    assert plain and mixed, "no float sum of the draw's masses found in the TTGIR"
    assert plain == mixed
