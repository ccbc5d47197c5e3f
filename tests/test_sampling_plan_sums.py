"""The plan's sub-chunk masses (`sampling_plan._pairwise_row_sums`) are summed in one fixed
order, so that a seeded row without a filter draws the same token in every variant of the plan
kernel (a plain tl.sum adds in the order of the thread layout the compiler picks, and that
layout differed between the filter-less launch and the others: two layouts of the same [64, 16]
masses in the sm_90 TTGIR, session 62). The kernel's sums must equal, bit for bit, the same
pairwise tree computed here in float32, under the interpreter and on CUDA, whatever the warps."""

import os

import pytest
import torch
import triton
import triton.language as tl

from specops.triton_kernels.sampling_plan import _pairwise_row_sums

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@triton.jit
def _row_sums_kernel(w_ptr, out_ptr, NC: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, NC)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(out_ptr + tl.arange(0, NC), _pairwise_row_sums(tl.load(w_ptr + offs), NC, N))


def pairwise_tree(w: torch.Tensor) -> torch.Tensor:
    """[NC, N] float32 -> [NC]: (w0 + w1) + (w2 + w3), ... level by level, in float32."""
    while w.shape[1] > 1:
        w = w[:, 0::2] + w[:, 1::2]
    return w[:, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nc, n, warps", [(64, 16, 8), (64, 16, 4), (64, 16, 16), (1, 1024, 8), (8, 2, 8),
                                           (16, 1, 4)])
def test_pairwise_row_sums_are_the_fixed_tree(device, nc, n, warps):
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors need the Triton interpreter (conftest sets it without CUDA)")
    gen = torch.Generator().manual_seed(nc * 1000 + n)
    # masses of very different sizes, so that another order of the sums rounds differently
    w = (torch.rand(nc, n, generator=gen) * torch.exp(torch.randn(nc, n, generator=gen) * 8)).to(device)
    out = torch.empty(nc, dtype=torch.float32, device=device)
    _row_sums_kernel[(1,)](w, out, NC=nc, N=n, num_warps=warps)
    want = pairwise_tree(w.cpu())
    assert torch.equal(out.cpu(), want)
    # and the check can fail: a left-to-right sum of the same values differs somewhere
    if n >= 16:
        sequential = w.cpu()[:, 0].clone()
        for j in range(1, n):
            sequential += w.cpu()[:, j]
        assert not torch.equal(sequential, want)
