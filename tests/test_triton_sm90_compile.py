"""The sampler's, the rejection sampler's and the logprob Triton kernels compile for the H200
(sm_90) on a machine without a GPU.

The interpreter (how CI runs the kernels) accepts code that the compiler rejects; this test
compiles every launch of one sample() call, of the expand kernel and the rejection passes, and
of the logprob kernels (four modes, top 1 / 5 / 20) through `scripts/triton_resources.py`
(a stand-in sm_90 driver, launches compiled and never run) in a subprocess, so the stand-in
never touches this process, and checks that each kernel came out with a register count.

It also checks properties of the compiled code that the interpreter cannot show: batch
invariance at the last bit of the plan's draw (test_unfiltered_draw_sums_in_one_order_in_every_plan_variant)
and of the pivot rounds' first masses, summed by the collect launch or by the pivot mass kernel
(test_pivot_round_one_sums_in_the_mass_kernels_order).
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


def run_script(*args) -> subprocess.CompletedProcess:
    """scripts/triton_resources.py with `args`, in a subprocess without the interpreter; it must succeed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


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
    op, *flags = op.split()
    run = run_script("--op", op, "--batch", str(batch), "--dtype", dtype, *flags)
    regs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+warps\s+\d+\s+REG:(\d+)", run.stdout, re.M)}
    assert kernels <= set(regs), (sorted(regs), run.stdout)
    assert all(0 < r <= 255 for r in regs.values()), regs


# Batch invariance at the last bit: the plan kernel's sub-chunk masses of a row without a
# filter (`sampling_plan._draw_unfiltered`) must be added in the same order whichever variant of
# the plan a batch compiles. A plain `tl.sum` adds in the order of the thread layout Triton
# picks, and that layout is chosen over the whole kernel: session 62's audit
# (bench/results/logs/audit_reduce_layouts_2026-12-06_s62.txt) found the [64, 16] masses with
# sizePerThread [1, 2] / threadsPerWarp [4, 8] in the plan of a batch without filters and
# [1, 1] / [2, 16] in the plan of a batch whose direct rows are deferred (DEFER=1). Another order
# rounds the masses differently, so in a near tie a seeded plain row could draw another
# sub-chunk, and so another token, depending on its neighbours.
#
# The test below compiles both batches for the H200 (sm_90) without a GPU (scripts/triton_resources.py)
# and compares the layouts of the masses' sums in their TTGIR: with `_pairwise_row_sums` every
# one of them adds two floats (the same sum in either order), in both variants.
def plan_ttgir(tmp_path, *flags) -> str:
    """The TTGIR of the plan kernel of one sample() call at batch 8 (fp32, V=128256)."""
    out = tmp_path / "_".join(f.strip("-") for f in flags) if flags else tmp_path / "mixed"
    run_script("--op", "sample", "--batch", "8", "--ttgir", str(out), *flags)
    (name,) = [f for f in os.listdir(out) if f.endswith("__plan_kernel.ttgir")]
    return (out / name).read_text()


def draw_sums(ttgir: str) -> list[tuple[str, str, str]]:
    """(shape, axis, layout) of each float sum of the draw's masses in the plan: the reductions of
    a multi-dimensional operand named mass or w (`_draw_unfiltered`'s names), with the layout's
    definition spelled out, or "pairwise" where the summed axis has 2 entries (a sum of two
    floats is the same in either order, so its layout does not matter)."""
    return float_sums(ttgir, r"(?:mass|w)", multi_dim=True, pairwise=True)


def float_sums(ttgir: str, operand: str, multi_dim: bool, pairwise: bool) -> list[tuple[str, str, str]]:
    """(shape, axis, layout) of each float sum in a TTGIR whose operand's name matches the regex
    `operand` (and is multi-dimensional with `multi_dim`), the layout's definition spelled out;
    with `pairwise`, "pairwise" for a summed axis of 2 entries."""
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    dims = r"(\d+(?:x\d+)+)" if multi_dim else r"(\d+(?:x\d+)*)"
    found = []
    # one reduce: its operand, its body (never running into the next reduce) and its operand type
    for m in re.finditer(r'= "tt\.reduce"\(%' + operand + r'\w*\) <\{axis = (\d+) : i32\}> \(\{((?:(?!"tt\.reduce").)*?)'
                         r'\}\) : \(tensor<' + dims + r'xf32, (#[\w.]+(?:<[^()]*?>)?)>\)', ttgir, re.S):
        axis, body, shape, layout = m.groups()
        if "arith.addf" in body:
            two = pairwise and shape.split("x")[int(axis)] == "2"
            found.append((shape, axis, "pairwise" if two else defs.get(layout, layout)))
    return found


@pytest.mark.skipif(torch.cuda.is_available(), reason="compiles for sm_90 through a stand-in driver (no GPU)")
@pytest.mark.skipif(not _have_nvidia_backend(), reason="Triton without its NVIDIA backend tools")
def test_unfiltered_draw_sums_in_one_order_in_every_plan_variant(tmp_path):
    plain = draw_sums(plan_ttgir(tmp_path, "--no-filters"))     # DEFER = 0
    mixed = draw_sums(plan_ttgir(tmp_path))                     # the direct rows deferred: DEFER = 1
    assert plain and mixed, "no float sum of the draw's masses found in the TTGIR"
    assert plain == mixed


# The same property for the pivot rounds' round 1 (`pivot_round1_in_collect`): the collect
# launch's programs of a pivot row sum its sub-chunk masses with `pivot_sub_chunk_mass`, which
# `_pivot_mass_kernel` calls too; a row's token must not depend on which of the two summed them
# (whether its batch has a collect launch, or the launcher's default for its batch size). The
# [2048] sums (the helper's `pivot_w`) must have one layout in both kernels: the sm_90 TTGIR of a
# 512-row call (the collect launch under its register cap) with the spread rows' collect launch
# (fp32) and the plain one (bf16, whose loads take 8 tokens a thread).
def pivot_sums(ttgir: str) -> list[tuple[str, str, str]]:
    """(shape, axis, layout) of each float sum of `pivot_sub_chunk_mass`'s `pivot_w` in a TTGIR."""
    return float_sums(ttgir, "pivot_w", multi_dim=False, pairwise=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="compiles for sm_90 through a stand-in driver (no GPU)")
@pytest.mark.skipif(not _have_nvidia_backend(), reason="Triton without its NVIDIA backend tools")
@pytest.mark.parametrize("dtype, flags, collect", [("fp32", (), "_collect_direct_kernel"),
                                                   ("bf16", ("--spread-kmax", "0"), "_collect_kernel")])
def test_pivot_round_one_sums_in_the_mass_kernels_order(tmp_path, dtype, flags, collect):
    out = tmp_path / "ttgir"
    run_script("--op", "sample", "--batch", "512", "--dtype", dtype, "--pivot", "--pivot-round1", "--ttgir", str(out),
               *flags)
    sums = {}
    for name in os.listdir(out):
        kernel = name.split("_", 1)[1][:-len(".ttgir")]
        sums.setdefault(kernel, []).extend(pivot_sums((out / name).read_text()))
    mass, coll = sums.get("_pivot_mass_kernel"), sums.get(collect)
    assert mass and coll, sorted(sums)
    assert len(set(mass)) == 1 and set(coll) == set(mass), (set(mass), set(coll))
    assert mass[0][0] == "2048"
