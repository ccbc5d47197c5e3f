"""Small Triton helpers shared by the sampling kernels (no kernel here).

- `pdl_start` (`pdl_wait` + `pdl_launch`) / `pdl_enabled`: programmatic dependent launch of
  the sampling and rejection chains (each kernel's launch overlaps the end of the one before it).

- `token_noise`: the Exp(1) noise of one token, exactly as specops.rng.vocab_noise draws
  it (word t % 4 of the Philox call with index t // 4).
- `pack_key` / `unpack_key`: an int64 whose order is the order of (x, token index), so
  that one `tl.sort` orders candidates by value and carries their indices along.
- `pivot_sub_chunk_mass`: one sub-chunk's mass above a pivot (sampling_pivot.py's rounds),
  shared by the pivot mass kernel and the collect launch that sums round 1 for it.
"""

import functools
import os

import torch
import triton
import triton.language as tl

from .rng import exponential, random_words

NEG_INF = float("-inf")

# Launch option of kernels whose float results must not depend on the kernel variant: without
# fma contraction, a product followed by a sum is rounded twice in every variant, instead of
# fused in the variants where the compiler chooses to (rejection_sample.py, sampling_stats.py).
NO_FP_FUSION = {"enable_fp_fusion": False}


@functools.lru_cache(maxsize=None)
def _compute_capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


# Triton has launch_pdl and gdc_wait from the same release on (3.4); older ones get neither.
_TRITON_HAS_PDL = hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")


def pdl_enabled(t: torch.Tensor) -> bool:
    """Launch the chain's kernels with programmatic dependent launch? On NVIDIA devices of
    compute capability 9.0 and up (Hopper) with a Triton that has it, unless SPECOPS_PDL=0;
    never under the Triton interpreter. Read at every launch (no host sync: a cached device
    property)."""
    if (not t.is_cuda or torch.version.hip is not None or not _TRITON_HAS_PDL
            or os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
            or os.environ.get("SPECOPS_PDL", "1") == "0"):
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _compute_capability(index) >= 9


def pdl_kwargs(t: torch.Tensor) -> dict:
    """Launch keywords of a chain kernel on the device of `t`: with pdl_enabled(t), PDL (the
    kernel's constexpr, see pdl_start) and launch_pdl (Triton's launch option); else none,
    so that a Triton without launch_pdl never sees the keyword."""
    return {"PDL": True, "launch_pdl": True} if pdl_enabled(t) else {}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """The first statement of a chain kernel that reads nothing before the wait: pdl_wait,
    then pdl_launch. The next launch thus overlaps this kernel's work instead of following
    its end."""
    pdl_wait(PDL)
    pdl_launch(PDL)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With PDL (the kernel launched with launch_pdl=True): wait until the kernel before it in
    the stream has finished and its writes are visible.

    Before the wait a kernel may read only the chain's inputs, never what an earlier chain
    kernel writes, and it writes nothing. Inputs are safe to read there in every kernel but
    the chain's first: the first kernel waits for whatever produced them before it lets the
    next one start (pdl_launch comes after its wait), so the inputs are complete by the time
    any later kernel of the chain runs."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_launch(PDL: tl.constexpr):
    """With PDL: let the next kernel of the stream be scheduled (it waits in its pdl_wait).
    Called right after pdl_wait."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def select_word(w0, w1, w2, w3, j):
    """Word j (0..3) of a Philox call, elementwise."""
    return tl.where(j == 0, w0, tl.where(j == 1, w1, tl.where(j == 2, w2, w3)))


@triton.jit
def token_noise(seed, position, stream, tok):
    """Exp(1) noise of tokens `tok` (int32 tensor, >= 0) for one row's (seed, position)."""
    w0, w1, w2, w3 = random_words(seed, position, stream, tok >> 2)
    return exponential(select_word(w0, w1, w2, w3, tok & 3))


@triton.jit
def pack_key(x, idx):
    """(fp32 value, int32 index >= 0) -> int64 ordered like (x, idx). -0.0 is read as +0.0."""
    b = (x + 0.0).to(tl.int32, bitcast=True)
    k = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)
    return (k.to(tl.int64) << 32) | idx.to(tl.int64)


@triton.jit
def unpack_key(p):
    """Inverse of `pack_key`: int64 -> (fp32 value, int32 index)."""
    k = (p >> 32).to(tl.int32)
    b = tl.where(k >= 0, k, k ^ 0x7FFFFFFF)
    return b.to(tl.float32, bitcast=True), p.to(tl.int32)


@triton.jit
def float_key(x):
    """fp32 -> int32 whose signed order is the float order; -0.0 maps to +0.0's key (they
    compare equal: a bound one key above a maximum of -0.0 must be above +0.0 too)."""
    b = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def key_float(k):
    """Inverse of `float_key`."""
    b = tl.where(k >= 0, k, k ^ 0x7FFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def pivot_sub_chunk_mass(row, inv_t, m, pivot, floor, V, c, SUB: tl.constexpr):
    """sum exp(x - m) over the tokens of sub-chunk c (SUB tokens) of a row with x = logit / T
    above `pivot` and >= `floor` (sampling_pivot.py's round masses). The one definition that
    `_pivot_mass_kernel` and the collect launch's programs of a pivot row
    (sampling_select.pivot_collect_program: round 1) both call, at SUB = 2048 on 8 warps
    either way, so that both add the same floats in the same order (one [SUB] `tl.sum`; the
    sm_90 test in tests/test_triton_sm90_compile.py compares the two layouts): a row's token
    does not depend on which launch summed its round 1."""
    offs = c * SUB + tl.arange(0, SUB)
    x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_t
    pivot_w = tl.where((x > pivot) & (x >= floor), tl.exp(x - m), 0.0)   # (the name: the sm_90 test finds the sum)
    return tl.sum(pivot_w, axis=0)
