"""Logprob statistics in one read of every scores row: logsumexp, top-1 and the chosen token's rank.

Pass 1, grid (rows, chunks): each program reads one chunk of a row (BLOCK * ITERS tokens;
usually one block of 2048) and writes its partials:

- the chunk max over non-NaN values and the first index holding it;
- sum exp(x - chunk max) over non-NaN values (relative to 0 when the chunk max is -inf);
- the first NaN index (BIG if none);
- the number of values strictly greater than the row's chosen value scores[r, tokens[r]].

Pass 2, grid (rows,): combines the chunks of a row and writes the sampled token's column
(id, value, rank) and, with TOP1, the top-1 column (argmax, max) straight into the
LogprobsTensors outputs, and the row's logsumexp.

The number of chunks depends on V only, never on the number of rows, so a row's result
does not depend on the batch it is in. Values follow torch (specops.sampling.logprobs,
torch path): logsumexp is NaN on a row with a NaN, +inf on a row with +inf, -inf on an
all -inf row; the top-1 of a row with a NaN is its first NaN (torch.topk orders NaN above
everything); ties at the max give the first index. Tokens outside [0, V) are invalid rows:
id -1, NaN values, rank -1. No host sync, no value-dependent allocation: CUDA-graph safe.
"""

import torch
import triton
import triton.language as tl

_BIG = tl.constexpr(2147483647)
BLOCK = 2048          # tokens per block: one block per program at common vocabularies
MAX_CHUNKS = 256      # programs per row, at most (more vocabulary: several blocks per program)


@triton.jit
def _partials_kernel(
    scores_ptr, stride_row,     # [R, V] fp32/bf16/fp16, unit column stride
    tokens_ptr,                 # [R] int64, -1 = invalid row
    part_f_ptr,                 # [R, S, 2] fp32 out: chunk max (NaN ignored), sum exp(x - max)
    part_i_ptr,                 # [R, S, 3] int32 out: first index of the max, first NaN index, count above chosen
    V, S, ITERS,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = scores_ptr + r.to(tl.int64) * stride_row
    tok = tl.load(tokens_ptr + r)
    valid = (tok >= 0) & (tok < V)
    chosen = tl.load(row + tl.where(valid, tok, 0), mask=valid, other=float("nan")).to(tl.float32)

    cols = tl.arange(0, BLOCK)
    start = s * ITERS * BLOCK
    m = tl.full([], float("-inf"), tl.float32)      # running max (NaN ignored)
    z = tl.full([], 0.0, tl.float32)                # sum exp(x - m), m read as 0 while it is -inf
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_idx = tl.full([BLOCK], _BIG, tl.int32)       # first index of lane_max in the lane
    nan_idx = tl.full([BLOCK], _BIG, tl.int32)
    above = tl.zeros([BLOCK], tl.int32)
    for it in range(0, ITERS):
        offs = start + it * BLOCK + cols
        ok = offs < V
        x = tl.load(row + offs, mask=ok, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        nan_idx = tl.minimum(nan_idx, tl.where(is_nan, offs, _BIG))
        above += (x > chosen).to(tl.int32)               # NaN compares false, as in torch
        x = tl.where(is_nan, float("-inf"), x)
        better = x > lane_max                            # strict: a lane keeps its first index
        lane_idx = tl.where(better, offs, lane_idx)
        lane_max = tl.where(better, x, lane_max)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        z = z * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    # all -inf (or all NaN) chunk: its first index, like torch.argmax on equal values
    idx = tl.min(tl.where(lane_max == m, lane_idx, _BIG), axis=0)
    idx = tl.where(m == float("-inf"), start, idx)
    base = (r * S + s).to(tl.int64)
    tl.store(part_f_ptr + base * 2 + 0, m)
    tl.store(part_f_ptr + base * 2 + 1, z)
    tl.store(part_i_ptr + base * 3 + 0, idx)
    tl.store(part_i_ptr + base * 3 + 1, tl.min(nan_idx, axis=0))
    tl.store(part_i_ptr + base * 3 + 2, tl.sum(above, axis=0))


@triton.jit
def _combine_kernel(
    scores_ptr, stride_row,     # [R, V] fp32/bf16/fp16
    tokens_ptr,                 # [R] int64
    part_f_ptr, part_i_ptr,     # [R, S, 2] fp32, [R, S, 3] int32 (pass 1)
    ids_ptr, vals_ptr,          # [R, W] int64 / fp32 out: column 0 the sampled token, column 1 the top-1 (TOP1)
    stride_ids, stride_vals,
    ranks_ptr,                  # [R] int64 out
    lse_ptr,                    # [R] fp32 out: logsumexp of the row
    V, S,
    S_P2: tl.constexpr, LOG_NORM: tl.constexpr, TOP1: tl.constexpr,
):
    r = tl.program_id(0)
    c = tl.arange(0, S_P2)
    okc = c < S
    base = r.to(tl.int64) * S + c
    m_c = tl.load(part_f_ptr + base * 2 + 0, mask=okc, other=float("-inf"))
    z_c = tl.load(part_f_ptr + base * 2 + 1, mask=okc, other=0.0)
    i_c = tl.load(part_i_ptr + base * 3 + 0, mask=okc, other=_BIG)
    n_c = tl.load(part_i_ptr + base * 3 + 1, mask=okc, other=_BIG)
    k_c = tl.load(part_i_ptr + base * 3 + 2, mask=okc, other=0)
    m = tl.max(m_c, axis=0)
    first = tl.min(tl.where(m_c == m, i_c, _BIG), axis=0)
    nan_first = tl.min(n_c, axis=0)
    has_nan = nan_first < _BIG
    # torch.logsumexp: the max is replaced by 0 where it is infinite
    ref = tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)
    w = tl.where(m_c == float("-inf"), 0.0, z_c * tl.exp(m_c - ref))
    lse = ref + tl.log(tl.sum(w, axis=0))
    lse = tl.where(m == float("inf"), float("inf"), lse)
    lse = tl.where(has_nan, float("nan"), lse)
    top_v = tl.where(has_nan, float("nan"), m)
    top_i = tl.where(has_nan, nan_first, first)

    tok = tl.load(tokens_ptr + r)
    valid = (tok >= 0) & (tok < V)
    chosen = tl.load(scores_ptr + r.to(tl.int64) * stride_row + tl.where(valid, tok, 0),
                     mask=valid, other=float("nan")).to(tl.float32)
    if LOG_NORM:
        chosen = chosen - lse
        top_v = top_v - lse
    ids = ids_ptr + r.to(tl.int64) * stride_ids
    vals = vals_ptr + r.to(tl.int64) * stride_vals
    tl.store(ids, tl.where(valid, tok, -1))
    tl.store(vals, tl.where(valid, chosen, float("nan")))
    tl.store(ranks_ptr + r, tl.where(valid, tl.sum(k_c, axis=0) + 1, -1).to(tl.int64))
    tl.store(lse_ptr + r, lse)
    if TOP1:
        tl.store(ids + 1, tl.where(valid, top_i, -1).to(tl.int64))
        tl.store(vals + 1, tl.where(valid, top_v, float("nan")))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def chunk_geometry(vocab_size: int, block: int = BLOCK, max_chunks: int = MAX_CHUNKS) -> tuple[int, int, int]:
    """(block, blocks per program ITERS, chunks per row S): a function of V only (batch invariance)."""
    block = max(16, min(block, _next_pow2(vocab_size)))
    blocks = -(-vocab_size // block)
    iters = -(-blocks // max_chunks)
    return block, iters, -(-blocks // iters)


def logprob_stats(
    scores: torch.Tensor,       # [R, V] fp32/bf16/fp16, unit column stride, any row stride
    tokens: torch.Tensor,       # [R] int64, -1 (or any id outside [0, V)) = invalid row
    ids: torch.Tensor,          # [R, W] int64 out, W >= 1 (>= 2 with top1); unit column stride
    vals: torch.Tensor,         # [R, W] fp32 out; unit column stride
    ranks: torch.Tensor,        # [R] int64 out
    lse: torch.Tensor,          # [R] fp32 out
    *,
    log_norm: bool,
    top1: bool,
    block: int = BLOCK,
    max_chunks: int = MAX_CHUNKS,
) -> None:
    """Fill column 0 of ids/vals (sampled token), ranks, lse and, with `top1`, column 1 (argmax).

    With `log_norm` the values are logprobs (value - logsumexp of the row), otherwise the
    scores themselves. `block` and `max_chunks` are tuning knobs (tests shrink them to
    reach several blocks per program at small vocabularies).
    """
    R, V = scores.shape
    assert scores.dtype in (torch.float32, torch.bfloat16, torch.float16), scores.dtype
    assert scores.stride(1) == 1 or V == 1, "scores need a unit column stride"
    assert tokens.shape == (R,) and tokens.dtype == torch.int64 and tokens.is_contiguous()
    assert ids.shape[0] == R and vals.shape == ids.shape and ids.shape[1] >= (2 if top1 else 1)
    assert ids.dtype == torch.int64 and vals.dtype == torch.float32
    assert ids.stride(1) == 1 and vals.stride(1) == 1
    assert ranks.shape == (R,) and lse.shape == (R,) and ranks.is_contiguous() and lse.is_contiguous()
    assert V >= 1 and V < 2**31 - 1
    if R == 0:
        return
    blk, iters, S = chunk_geometry(V, block, max_chunks)
    part_f = torch.empty(R, S, 2, dtype=torch.float32, device=scores.device)
    part_i = torch.empty(R, S, 3, dtype=torch.int32, device=scores.device)
    _partials_kernel[(R, S)](scores, scores.stride(0), tokens, part_f, part_i, V, S, iters,
                             BLOCK=blk, num_warps=4)
    _combine_kernel[(R,)](scores, scores.stride(0), tokens, part_f, part_i,
                          ids, vals, ids.stride(0), vals.stride(0), ranks, lse, V, S,
                          S_P2=max(16, _next_pow2(S)), LOG_NORM=log_norm, TOP1=top1, num_warps=4)
