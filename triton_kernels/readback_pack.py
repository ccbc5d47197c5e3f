"""Pack a step's tokens and logprobs into one float64 tensor for one device-to-host copy.

One launch writes what four casts and a `torch.cat` wrote before: out [2k + 2, N] float64,
one field per row of `out` (so that the host turns each field into a Python list with one
`tolist` of a contiguous row):

    out[0]            = tokens            (sampled token, -1: invalid row)
    out[1 : k + 1]    = token_ids.T       (the sampled token, then the top k - 1)
    out[k + 1]        = ranks
    out[k + 2 :]      = logprobs.T

float64 holds every int64 id and rank below 2**53 and every fp32 value exactly, so the
packing is exact (the same values as `pack_readback_torch`; NaN where it has NaN).

Optionally the same launch adds one to a [2, N] int64 key tensor (the next steady step's
token positions and generator keys, see pyengine/sampler_graph.py): the packing is the last
work of a sampling step, after every kernel that read the keys, so the step needs no
separate increment kernel.
"""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["N"])
def _pack_kernel(
    out_ptr,       # [2K + 2, N] float64
    tokens_ptr,    # [N] int64
    ids_ptr,       # [N, K] int64, contiguous
    ranks_ptr,     # [N] int64
    vals_ptr,      # [N, K] fp32, contiguous
    keys_ptr,      # [2, N] int64, contiguous: += 1 when ADVANCE
    N,
    ADVANCE: tl.constexpr,
    K: tl.constexpr,
    K_P2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    in_rows = rows < N
    tl.store(out_ptr + rows, tl.load(tokens_ptr + rows, mask=in_rows).to(tl.float64), mask=in_rows)
    tl.store(out_ptr + (K + 1) * N + rows, tl.load(ranks_ptr + rows, mask=in_rows).to(tl.float64), mask=in_rows)
    cols = tl.arange(0, K_P2)  # [K_P2]
    mask = in_rows[:, None] & (cols < K)[None, :]  # [BLOCK, K_P2]
    src = rows[:, None] * K + cols[None, :]
    dst = cols[None, :] * N + rows[:, None]
    ids = tl.load(ids_ptr + src, mask=mask)
    vals = tl.load(vals_ptr + src, mask=mask)
    tl.store(out_ptr + N + dst, ids.to(tl.float64), mask=mask)
    tl.store(out_ptr + (K + 2) * N + dst, vals.to(tl.float64), mask=mask)
    if ADVANCE:
        for j in tl.static_range(2):
            key = tl.load(keys_ptr + j * N + rows, mask=in_rows)
            tl.store(keys_ptr + j * N + rows, key + 1, mask=in_rows)


def pack_readback_triton(
    tokens: torch.Tensor,     # [N] int64
    token_ids: torch.Tensor,  # [N, k] int64
    ranks: torch.Tensor,      # [N] int64
    logprobs: torch.Tensor,   # [N, k] fp32
    out: torch.Tensor | None = None,  # [2k + 2, N] float64, written in place when given
    advance_keys: torch.Tensor | None = None,  # [2, N] int64 contiguous: incremented by one in place
) -> torch.Tensor:            # [2k + 2, N] float64
    """The packed readback (module docstring) in one launch; CUDA-graph capturable."""
    N = tokens.shape[0]
    if tokens.dim() != 1 or ranks.shape != (N,) or token_ids.dim() != 2 or token_ids.shape[0] != N \
            or logprobs.shape != token_ids.shape:
        raise ValueError(f"shapes: tokens {tuple(tokens.shape)}, token_ids {tuple(token_ids.shape)}, "
                         f"ranks {tuple(ranks.shape)}, logprobs {tuple(logprobs.shape)}")
    for name, t, dtype in (("tokens", tokens, torch.int64), ("token_ids", token_ids, torch.int64),
                           ("ranks", ranks, torch.int64), ("logprobs", logprobs, torch.float32)):
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
        if t.device != tokens.device:
            raise ValueError(f"{name} is on {t.device} but tokens on {tokens.device}")
    k = token_ids.shape[1]
    if out is None:
        out = torch.empty((2 * k + 2, N), dtype=torch.float64, device=tokens.device)
    elif out.shape != (2 * k + 2, N) or out.dtype != torch.float64 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{2 * k + 2}, {N}] float64 tensor")
    if advance_keys is not None and (advance_keys.shape != (2, N) or advance_keys.dtype != torch.int64
                                     or not advance_keys.is_contiguous() or advance_keys.device != tokens.device):
        raise ValueError(f"advance_keys must be a contiguous [2, {N}] int64 tensor on {tokens.device}")
    if N == 0:
        return out
    block = 128
    _pack_kernel[(triton.cdiv(N, block),)](
        out, tokens.contiguous(), token_ids.contiguous(), ranks.contiguous(), logprobs.contiguous(),
        advance_keys if advance_keys is not None else tokens, N, ADVANCE=advance_keys is not None,
        K=k, K_P2=max(1, triton.next_power_of_2(k)), BLOCK=block, num_warps=4)
    return out
