"""Logprob statistics in one read of every scores row: logsumexp, the top n and the chosen token's rank.

Pass 1, grid (rows, chunks): each program reads one chunk of a row (BLOCK * ITERS tokens;
usually one block of 2048) and writes its partials:

- the chunk max over non-NaN values and the first index holding it;
- sum exp(x - chunk max) over non-NaN values (relative to 0 when the chunk max is -inf);
- the first NaN index (BIG if none);
- the number of values strictly greater than the row's chosen value scores[r, tokens[r]];
- with TOPN (2 <= n <= MAX_TOP_N), the chunk's n largest values as int32 keys ordered as
  torch.topk orders values (NaN above +inf) and their tokens: n rounds of a max over the
  block and the running list (the lowest token first among equal keys).

Pass 2, grid (rows,): combines the chunks of a row and writes the sampled token's column
(id, value, rank) and, with TOP1, the top-1 column (argmax, max) or, with TOPN, the top n
(n rounds over the chunks' lists: largest first, the lowest index first among ties)
straight into the LogprobsTensors outputs, and the row's logsumexp.

`processed_logprob_stats` runs the same two passes for the processed modes: pass 1 reads
the scores as the Sampler's scale_logits makes them (x * 1/T on random rows, unchanged on
greedy rows: the same fp32 product) and, with WIDEN, sums exp only over values >= the chosen
one (the mass a drawn token below its row's threshold widens the kept set to); pass 2 masks the
values below the row's threshold and subtracts row_max + log_norm of the draw's distribution,
which it takes from the caller instead of a logsumexp. With WIDEN, a row whose valid token
lies below its threshold gets the threshold lowered to the token's value and log_norm summed
again over that wider set (sampler_torch.keep_drawn_tokens, fused); other rows keep both
bit for bit.

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

from .sampling_common import float_key, key_float

_BIG = tl.constexpr(2147483647)
_NO_KEY = tl.constexpr(-2147483648)   # below every value's key (-inf included): an empty slot
BLOCK = 2048          # tokens per block: one block per program at common vocabularies
MAX_CHUNKS = 256      # programs per row, at most (more vocabulary: several blocks per program)
MAX_TOP_N = 32        # top-n lists made by the kernels; a larger n takes torch.topk
PASS1_WARPS = 4       # warps of pass 1 (every launch alike: the sums are added in one order whatever n)


@triton.jit
def _value_key(x):
    """fp32 -> int32 key ordered as torch.topk orders values: every NaN above +inf."""
    return tl.where(x != x, 2147483647, float_key(x))


@triton.jit
def _key_value(k):
    """Inverse of `_value_key`: NaN for the NaN key; +0.0 for the key that -0.0 and +0.0 share."""
    return tl.where(k == 2147483647, float("nan"), key_float(k))


@triton.jit
def _scale(x, inv_t, SCALED: tl.constexpr):
    """x as scale_logits makes it: x * 1/T where 1/T > 0 (random rows), x itself otherwise."""
    if SCALED:
        x = tl.where(inv_t > 0, x * inv_t, x)
    return x


@triton.jit
def _chosen_value(scores_ptr, stride_row, tokens_ptr, r, V, inv_t, SCALED: tl.constexpr):
    """(row pointer, token, whether it lies in [0, V), its value as fp32 (NaN when invalid),
    scaled with SCALED) of row r."""
    row = scores_ptr + r.to(tl.int64) * stride_row
    tok = tl.load(tokens_ptr + r)
    valid = (tok >= 0) & (tok < V)
    chosen = tl.load(row + tl.where(valid, tok, 0), mask=valid, other=float("nan")).to(tl.float32)
    return row, tok, valid, _scale(chosen, inv_t, SCALED)


@triton.jit
def _merge_top(keys, offs, top_k, top_i, num_top, TOPN: tl.constexpr):
    """The num_top largest of a block (keys [BLOCK], token offs) and a running list (top_k,
    top_i [TOPN], _NO_KEY where empty), largest first, the lowest token first among equal keys."""
    jj = tl.arange(0, TOPN)
    new_k = tl.full([TOPN], _NO_KEY, tl.int32)
    new_i = tl.full([TOPN], _BIG, tl.int32)
    for j in range(0, num_top):
        best = tl.maximum(tl.max(keys, axis=0), tl.max(top_k, axis=0))
        idx = tl.minimum(tl.min(tl.where(keys == best, offs, _BIG), axis=0),
                         tl.min(tl.where(top_k == best, top_i, _BIG), axis=0))
        keys = tl.where(offs == idx, _NO_KEY, keys)
        top_k = tl.where(top_i == idx, _NO_KEY, top_k)
        new_k = tl.where(jj == j, best, new_k)
        new_i = tl.where(jj == j, idx, new_i)
    return new_k, new_i


@triton.jit
def _store_top_n(part_t_ptr, r, S, S_P2: tl.constexpr, num_top, TOPN: tl.constexpr, row, inv_t, ids, vals, valid,
                 thr, offset, SCALED: tl.constexpr, MASK: tl.constexpr, OFFSET: tl.constexpr):
    """Columns 1..num_top of row r: the num_top largest of its chunks' lists (pass 1), largest
    first, the lowest token first among equal values. Values: x (scaled with SCALED), -inf
    below thr (MASK), minus offset (OFFSET). x comes from its key, except a zero: -0.0 and +0.0
    share a key, so a zero is read again from the row (-0.0 stays -0.0; a row without a zero
    among its top n loads nothing)."""
    c = tl.arange(0, S_P2)[:, None]
    jj = tl.arange(0, TOPN)
    ok = (c < S) & (jj[None, :] < num_top)
    base = ((r.to(tl.int64) * S + c) * TOPN + jj[None, :]) * 2
    keys = tl.load(part_t_ptr + base, mask=ok, other=_NO_KEY)
    toks = tl.load(part_t_ptr + base + 1, mask=ok, other=_BIG)
    top_k = tl.zeros([TOPN], tl.int32)
    top_i = tl.zeros([TOPN], tl.int32)
    for j in range(0, num_top):
        best = tl.max(tl.max(keys, axis=1), axis=0)
        idx = tl.min(tl.min(tl.where(keys == best, toks, _BIG), axis=1), axis=0)
        keys = tl.where(toks == idx, _NO_KEY, keys)
        top_k = tl.where(jj == j, best, top_k)
        top_i = tl.where(jj == j, idx, top_i)
    listed = jj < num_top
    v = _key_value(top_k)
    zero = listed & (v == 0.0)
    v = tl.where(zero, _scale(tl.load(row + top_i, mask=zero, other=0.0).to(tl.float32), inv_t, SCALED), v)
    if MASK:
        v = tl.where(v >= thr, v, float("-inf"))
    if OFFSET:
        v = v - offset
    tl.store(ids + 1 + jj, tl.where(valid, top_i, -1).to(tl.int64), mask=listed)
    tl.store(vals + 1 + jj, tl.where(valid, v, float("nan")), mask=listed)


@triton.jit
def _partials_kernel(
    scores_ptr, stride_row,     # [R, V] fp32/bf16/fp16, unit column stride
    tokens_ptr,                 # [R] int64, -1 = invalid row
    inv_t_ptr,                  # [R] fp32 1/T, <= 0 (or NaN) on greedy rows (SCALED)
    part_f_ptr,                 # [R, S, 2] fp32 out: chunk max (NaN ignored), sum exp(x - max)
    part_i_ptr,                 # [R, S, 3] int32 out: first index of the max, first NaN index, count above chosen
    part_t_ptr,                 # [R, S, TOPN, 2] int32 out (TOPN > 0): the chunk's top num_top (key, token)
    V, S, ITERS, num_top,
    BLOCK: tl.constexpr,
    SCALED: tl.constexpr,       # x = scores * 1/T where 1/T > 0 (scale_logits)
    FROM_CHOSEN: tl.constexpr,  # sum exp(x - max) only over x >= the chosen value
    TOPN: tl.constexpr,         # 0, or a power of 2 >= num_top: list the chunk's num_top largest
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    inv_t = 1.0
    if SCALED:
        inv_t = tl.load(inv_t_ptr + r)
    row, _, _, chosen = _chosen_value(scores_ptr, stride_row, tokens_ptr, r, V, inv_t, SCALED)

    cols = tl.arange(0, BLOCK)
    start = s * ITERS * BLOCK
    m = tl.full([], float("-inf"), tl.float32)      # running max (NaN ignored)
    z = tl.full([], 0.0, tl.float32)                # sum exp(x - m), m read as 0 while it is -inf
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_idx = tl.full([BLOCK], _BIG, tl.int32)       # first index of lane_max in the lane
    nan_idx = tl.full([BLOCK], _BIG, tl.int32)
    above = tl.zeros([BLOCK], tl.int32)
    top_k = tl.full([max(TOPN, 1)], _NO_KEY, tl.int32)
    top_i = tl.full([max(TOPN, 1)], _BIG, tl.int32)
    for it in range(0, ITERS):
        offs = start + it * BLOCK + cols
        ok = offs < V
        x = _scale(tl.load(row + offs, mask=ok, other=float("-inf")).to(tl.float32), inv_t, SCALED)
        if TOPN > 0:
            top_k, top_i = _merge_top(tl.where(ok, _value_key(x), _NO_KEY), offs, top_k, top_i, num_top, TOPN)
        is_nan = x != x
        nan_idx = tl.minimum(nan_idx, tl.where(is_nan, offs, _BIG))
        above += (x > chosen).to(tl.int32)               # NaN compares false, as in torch
        x = tl.where(is_nan, float("-inf"), x)
        better = x > lane_max                            # strict: a lane keeps its first index
        lane_idx = tl.where(better, offs, lane_idx)
        lane_max = tl.where(better, x, lane_max)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.exp(x - ref)
        if FROM_CHOSEN:
            e = tl.where(x >= chosen, e, 0.0)
        z = z * tl.exp(m - ref) + tl.sum(e, axis=0)
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
    if TOPN > 0:
        jj = tl.arange(0, TOPN)
        tl.store(part_t_ptr + (base * TOPN + jj) * 2, top_k, mask=jj < num_top)
        tl.store(part_t_ptr + (base * TOPN + jj) * 2 + 1, top_i, mask=jj < num_top)


@triton.jit
def _combine_kernel(
    scores_ptr, stride_row,     # [R, V] fp32/bf16/fp16 (PROCESSED: the processed logits, before temperature)
    tokens_ptr,                 # [R] int64
    inv_t_ptr,                  # [R] fp32 1/T, <= 0 on greedy rows (PROCESSED)
    thr_ptr, row_max_ptr, log_norm_ptr,   # [R] fp32 each (PROCESSED): the draw's distribution
    part_f_ptr, part_i_ptr,     # [R, S, 2] fp32, [R, S, 3] int32 (pass 1; FROM_CHOSEN when WIDEN)
    part_t_ptr,                 # [R, S, TOPN, 2] int32 (pass 1, TOPN > 0)
    ids_ptr, vals_ptr,          # [R, W] int64 / fp32 out: column 0 the sampled token, then the top-1 (TOP1) or top num_top (TOPN)
    stride_ids, stride_vals,
    ranks_ptr,                  # [R] int64 out
    lse_ptr,                    # [R] fp32 out (not PROCESSED): logsumexp of the row
    thr_out_ptr, log_norm_out_ptr,        # [R] fp32 out (WIDEN): the distribution widened to the token
    V, S, num_top,
    S_P2: tl.constexpr,
    PROCESSED: tl.constexpr,    # values of x = scale_logits(scores), -inf below the threshold; else the scores
    OFFSET: tl.constexpr,       # subtract the normaliser (logprobs): row_max + log_norm, or the logsumexp
    TOP1: tl.constexpr, WIDEN: tl.constexpr, TOPN: tl.constexpr,
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
    top_v = tl.where(has_nan, float("nan"), m)
    top_i = tl.where(has_nan, nan_first, first)

    inv_t = 1.0
    if PROCESSED:
        inv_t = tl.load(inv_t_ptr + r)
    row, tok, valid, chosen = _chosen_value(scores_ptr, stride_row, tokens_ptr, r, V, inv_t, PROCESSED)
    if TOP1:
        # -0.0 and +0.0 compare equal: the max may be either while top_i names the first of them,
        # so a zero is read again from the row (a row whose max is not zero loads nothing)
        zero = valid & (top_v == 0.0)
        top_v = tl.where(zero, _scale(tl.load(row + top_i, mask=zero, other=0.0).to(tl.float32), inv_t, PROCESSED),
                         top_v)
    thr = float("-inf")
    if PROCESSED:
        thr = tl.load(thr_ptr + r)
        row_max = tl.load(row_max_ptr + r)
        log_norm = tl.load(log_norm_ptr + r)
        if WIDEN:
            # keep_drawn_tokens: the kept set widened to a drawn token below the threshold; pass 1
            # summed exp(x - chunk max) over x >= the token's value
            w = tl.where(m_c == float("-inf"), 0.0, z_c * tl.exp(m_c - row_max))
            widen = valid & (chosen < thr)          # a NaN threshold (invalid row) never widens
            thr = tl.where(widen, chosen, thr)
            log_norm = tl.where(widen, tl.log(tl.sum(w, axis=0)), log_norm)
            tl.store(thr_out_ptr + r, thr)
            tl.store(log_norm_out_ptr + r, log_norm)
        chosen = tl.where(chosen >= thr, chosen, float("-inf"))
        top_v = tl.where(top_v >= thr, top_v, float("-inf"))
        offset = row_max + log_norm
    else:
        # torch.logsumexp: the max is replaced by 0 where it is infinite
        ref = tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)
        w = tl.where(m_c == float("-inf"), 0.0, z_c * tl.exp(m_c - ref))
        lse = ref + tl.log(tl.sum(w, axis=0))
        lse = tl.where(m == float("inf"), float("inf"), lse)
        lse = tl.where(has_nan, float("nan"), lse)
        tl.store(lse_ptr + r, lse)
        offset = lse
    if OFFSET:
        chosen = chosen - offset
        top_v = top_v - offset
    ids = ids_ptr + r.to(tl.int64) * stride_ids
    vals = vals_ptr + r.to(tl.int64) * stride_vals
    tl.store(ids, tl.where(valid, tok, -1))
    tl.store(vals, tl.where(valid, chosen, float("nan")))
    tl.store(ranks_ptr + r, tl.where(valid, tl.sum(k_c, axis=0) + 1, -1).to(tl.int64))
    if TOP1:
        tl.store(ids + 1, tl.where(valid, top_i, -1).to(tl.int64))
        tl.store(vals + 1, tl.where(valid, top_v, float("nan")))
    if TOPN > 0:
        _store_top_n(part_t_ptr, r, S, S_P2, num_top, TOPN, row, inv_t, ids, vals, valid, thr, offset,
                     SCALED=PROCESSED, MASK=PROCESSED, OFFSET=OFFSET)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def chunk_geometry(vocab_size: int, block: int = BLOCK, max_chunks: int = MAX_CHUNKS) -> tuple[int, int, int]:
    """(block, blocks per program ITERS, chunks per row S): a function of V only (batch invariance)."""
    block = max(16, min(block, _next_pow2(vocab_size)))
    blocks = -(-vocab_size // block)
    iters = -(-blocks // max_chunks)
    return block, iters, -(-blocks // iters)


def _run_pass1(scores, tokens, inv_temperature, ids, vals, ranks, top1, top_n, from_chosen, block, max_chunks):
    """The checks both launchers share and pass 1 (scaled by inv_temperature [R] fp32 when given):
    (S, part_f, part_i, part_t, TOPN) for the combine kernel, or None for an empty batch."""
    R, V = scores.shape
    assert scores.dtype in (torch.float32, torch.bfloat16, torch.float16), scores.dtype
    assert scores.stride(1) == 1 or V == 1, "scores need a unit column stride"
    assert tokens.shape == (R,) and tokens.dtype == torch.int64 and tokens.is_contiguous()
    if inv_temperature is not None:
        t = inv_temperature
        assert t.shape == (R,) and t.dtype == torch.float32 and t.is_contiguous()
    assert ids.shape[0] == R and vals.shape == ids.shape and ids.shape[1] >= 1 + max(int(top1), top_n)
    assert ids.dtype == torch.int64 and vals.dtype == torch.float32
    assert ids.stride(1) == 1 and vals.stride(1) == 1
    assert ranks.shape == (R,) and ranks.is_contiguous()
    assert V >= 1 and V < 2**31 - 1
    assert top_n == 0 or (2 <= top_n <= min(MAX_TOP_N, V) and not top1), top_n
    if R == 0:
        return None
    blk, iters, S = chunk_geometry(V, block, max_chunks)
    part_f = torch.empty(R, S, 2, dtype=torch.float32, device=scores.device)
    part_i = torch.empty(R, S, 3, dtype=torch.int32, device=scores.device)
    topn = _next_pow2(top_n) if top_n else 0
    part_t = torch.empty(R, S, topn, 2, dtype=torch.int32, device=scores.device) if topn else part_i
    scaled = inv_temperature is not None
    _partials_kernel[(R, S)](scores, scores.stride(0), tokens, inv_temperature if scaled else part_f, part_f, part_i,
                             part_t, V, S, iters, top_n, BLOCK=blk, SCALED=scaled, FROM_CHOSEN=from_chosen,
                             TOPN=topn, num_warps=PASS1_WARPS)
    return S, part_f, part_i, part_t, topn


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
    top_n: int = 0,
    block: int = BLOCK,
    max_chunks: int = MAX_CHUNKS,
) -> None:
    """Fill column 0 of ids/vals (sampled token), ranks, lse and, with `top1`, column 1 (argmax)
    or, with 2 <= top_n <= MAX_TOP_N, columns 1..top_n (the top n, largest first, the lowest
    index first among ties, NaN above everything as torch.topk has it).

    With `log_norm` the values are logprobs (value - logsumexp of the row), otherwise the
    scores themselves. `block` and `max_chunks` are tuning knobs (tests shrink them to
    reach several blocks per program at small vocabularies).
    """
    R, V = scores.shape
    assert lse.shape == (R,) and lse.is_contiguous()
    pass1 = _run_pass1(scores, tokens, None, ids, vals, ranks, top1, top_n, False, block, max_chunks)
    if pass1 is None:
        return
    S, part_f, part_i, part_t, topn = pass1
    unused = part_f                     # the processed modes' pointers: never read or written here
    _combine_kernel[(R,)](scores, scores.stride(0), tokens, unused, unused, unused, unused, part_f, part_i, part_t,
                          ids, vals, ids.stride(0), vals.stride(0), ranks, lse, unused, unused, V, S, top_n,
                          S_P2=max(16, _next_pow2(S)), PROCESSED=False, OFFSET=log_norm, TOP1=top1, WIDEN=False,
                          TOPN=topn, num_warps=4)


def processed_logprob_stats(
    scores: torch.Tensor,           # [R, V] fp32/bf16/fp16 processed logits (before temperature), unit column stride
    tokens: torch.Tensor,           # [R] int64, -1 (or any id outside [0, V)) = invalid row
    inv_temperature: torch.Tensor,  # [R] fp32: 1/T on random rows (finite), <= 0 on greedy rows
    threshold: torch.Tensor,        # [R] fp32: the draw's kept set is x >= threshold
    row_max: torch.Tensor,          # [R] fp32
    log_norm: torch.Tensor,         # [R] fp32
    ids: torch.Tensor,              # [R, W] int64 out, W >= 1 (>= 2 with top1); unit column stride
    vals: torch.Tensor,             # [R, W] fp32 out; unit column stride
    ranks: torch.Tensor,            # [R] int64 out
    threshold_out: torch.Tensor,    # [R] fp32 out (widen): threshold lowered to a drawn token below it
    log_norm_out: torch.Tensor,     # [R] fp32 out (widen): log_norm of that kept set
    *,
    logprobs: bool,
    top1: bool,
    widen: bool,
    top_n: int = 0,
    block: int = BLOCK,
    max_chunks: int = MAX_CHUNKS,
) -> None:
    """The processed modes' column 0 and, with `top1`, column 1 or, with `top_n`, columns
    1..top_n, from one read of the scores.

    Values are those of x = scale_logits(scores, inv_temperature), -inf below the row's
    threshold, minus row_max + log_norm with `logprobs` ("processed_logprobs"); ranks count
    x over every token. With `widen`, threshold_out / log_norm_out get the distribution
    widened to the token (sampler_torch.keep_drawn_tokens) and the values use it. `top_n` as
    in `logprob_stats` (the top n of x, their values as the token's).
    """
    R, V = scores.shape
    for t in (threshold, row_max, log_norm, threshold_out, log_norm_out):
        assert t.shape == (R,) and t.dtype == torch.float32 and t.is_contiguous()
    pass1 = _run_pass1(scores, tokens, inv_temperature, ids, vals, ranks, top1, top_n, widen, block, max_chunks)
    if pass1 is None:
        return
    S, part_f, part_i, part_t, topn = pass1
    _combine_kernel[(R,)](scores, scores.stride(0), tokens, inv_temperature, threshold, row_max, log_norm,
                          part_f, part_i, part_t, ids, vals, ids.stride(0), vals.stride(0), ranks,
                          part_f, threshold_out, log_norm_out, V, S, top_n, S_P2=max(16, _next_pow2(S)),
                          PROCESSED=True, OFFSET=logprobs, TOP1=top1, WIDEN=widen, TOPN=topn, num_warps=4)
