"""Rejection sampling, pass 1: one read of every target row, then accept/reject per request.

Grid (num_reqs * MAX_K, NUM_SPLITS): program (r, i, c) reads chunk c (CHUNK vocabulary
entries) of the target row of draft i of request r (one running max / argmax / sum per lane,
the lanes combined once at the end: _chunk_stats_lanes) and writes chunk partials: the max
and argmax of the scaled logits x = l * (1/T) (tokens below the row's optional threshold,
e.g. top-k / top-p / min-p, count as -inf), the sum of exp relative to that max, the same
sum over each of its sub-chunks, for the sub-chunk holding a valid draft token without
draft probs that sum without the token (summed directly: no cancellation) and, when
FUSE_RACE, each sub-chunk's best recovered-token candidate. A second launch, one
program per request, combines the partials of all its rows, decides acceptance and writes
the request's whole output row [K + 1] (a separate launch rather than "the last program
to finish": no ordering between programs to rely on). With programmatic dependent launch
it reads everything that is an input (draft ids, keys, uniforms, 1/T, threshold, the
drafts' own logits l_x and q(x)) before waiting for pass 1, so that after the wait it
reads pass 1's partials in one round trip (and, to race, one sub-chunk of a rejected row).

- greedy rows accept draft x while x == argmax of the row; the first mismatch writes the
  argmax and stops;
- random rows accept x when p(x) >= u * q(x) (q = draft prob, 1 without draft probs),
  u = uniform_open(word 0 of random_words(seed, pos, STREAM_ACCEPT, 0));
- a draft id outside [0, V) is rejected unconditionally;
- every draft accepted: the bonus token is appended.

The recovered token of a random row is drawn from the residual w (without draft probs:
p with x removed; with them: max(0, p - q)) by a two-level exponential race over the row's
sub-chunks (SUB = sub_chunk_size(V) tokens, CHUNK / SUB of them in each chunk), exact
because P(t) = P(sub-chunk k) P(t | k) = (M_k / M) (w_t / M_k) with M_k the mass of k:

1. sub-chunk k = argmax_k log(M_k) - log(E_k), E_k Exp(1) from word k % 4 of
   random_words(seed, pos, STREAM_RECOVER_CHUNK, k // 4) (a stream no per-token draw uses);
2. within sub-chunk k only, the per-token race: argmax_{t in k, t != x} (x_t - log E_t), or
   argmax_{t in k} w_t / E_t with draft probs, E_t Exp(1) from word t % 4 of
   random_words(seed, pos, STREAM_RECOVER, t // 4).

Pass 1 writes, besides the chunk partials, the sum of exp(x - m_c) over each sub-chunk of
chunk c (m_c the chunk's max; each sum added directly over its own tokens, in an order
fixed by V) and the same sum without the draft token for the sub-chunk holding it. Without
draft probs these are the sub-chunk masses (M_k = e^{m_c} s_k up to the row's normaliser),
so nothing re-reads the row: the finalize kernel runs level 1 for the request's rejected
row, then level 2 over the chosen sub-chunk (one read of SUB tokens, in one step by
default) or, with FUSE_RACE, takes that sub-chunk's winner of the per-token race that
pass 1 ran everywhere. With draft probs, rejection_recover.py sums the residual of each
sub-chunk of the rejected row, then runs both levels. The same sub-chunks and noise, and
so the same tokens, as specops.spec_decode.rejection_torch. SUB = CHUNK is the one-level
chunk race of earlier versions (other tokens, the same law).

Draft ids are read as given (int32 or int64): an id outside [0, V) is invalid (-1) before
any narrowing, so an int64 id past 2**31 cannot wrap into the vocabulary.

Per-row keys follow specops.rng.row_keys with the target rows as rows: a seeded request
uses (seed, positions[r] + i), an unseeded one (engine_seed, ((j + 1) << 32) | step)
with j the global target row. CHUNK and SUB depend on the vocabulary only (chunk_size,
sub_chunk_size), so every row is reduced and raced in the same order whatever the batch:
seeded requests are batch invariant.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specops.triton_kernels.sampling_common import NO_FP_FUSION, pdl_kwargs, pdl_launch, pdl_start, pdl_wait
from specops.triton_kernels.rng import (STREAM_ACCEPT, STREAM_RECOVER, STREAM_RECOVER_CHUNK, exponential, random_words,
                                        uniform_open)

_INT_MAX = tl.constexpr(2147483647)

# Every rejection launch compiles without fma contraction (NO_FP_FUSION), and 1/T of a per-request temperature
# is the correctly rounded quotient (div_rn, as torch's 1 / T): so x = l * (1/T) is rounded
# once whichever way the kernel gets its scale (a temperature, or the processed rows' 1/T) and
# whether a threshold follows, and a seeded request's tokens do not depend on whether a
# neighbour in its batch needed its rows processed. (With contraction, x - max became
# fma(l, 1/T, -max) in some variants only, and an approximate 1/T differed in its last bit.)


@triton.jit
def _row_key(seeded, seed, position, engine_seed, step, i, j):
    """Seed and position of target row j (draft i of its request), as specops.rng.row_keys."""
    seed_r = tl.where(seeded, seed, engine_seed)
    lane = (j + 1).to(tl.int64) << 32
    pos_r = tl.where(seeded, position + i, lane | (step & 0xFFFFFFFF))
    return seed_r, pos_r


@triton.jit
def _request_greedy(greedy_ptr, req, GREEDY_MODE: tl.constexpr):
    """Whether request req is greedy: its flag (GREEDY_MODE 0), else the batch's mode (1: all greedy)."""
    if GREEDY_MODE == 0:
        greedy = tl.load(greedy_ptr + req) != 0
    else:
        greedy = tl.full([], GREEDY_MODE == 1, tl.int1)
    return greedy


@triton.jit
def _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req, HAS_SEEDS: tl.constexpr):
    """(seeded, seed, position, step) of request req for _row_key; without HAS_SEEDS, unseeded."""
    if HAS_SEEDS:
        seeded = tl.load(has_seed_ptr + req) != 0
        seed = tl.load(seeds_ptr + req).to(tl.int64)
        position = tl.load(positions_ptr + req).to(tl.int64)
    else:
        seeded = tl.full([], False, tl.int1)
        seed = tl.full([], 0, tl.int64)
        position = tl.full([], 0, tl.int64)
    step = tl.load(step_ptr).to(tl.int64)
    return seeded, seed, position, step


@triton.jit
def _row_scale(temp_ptr, threshold_ptr, req, j, greedy, TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr):
    """(1/T, threshold) of target row j of request req; greedy rows: (1, -inf). A random row's
    1/T that is not finite and > 0 (T <= 0, NaN or +-inf: not checked on the host, no sync)
    comes out NaN, which makes the row invalid."""
    inv_t = tl.full([], 1.0, tl.float32)
    if TEMP_MODE == 1:
        inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.load(temp_ptr + req).to(tl.float32)))
    if TEMP_MODE == 2:
        inv_t = tl.where(greedy, 1.0, tl.load(temp_ptr + j).to(tl.float32))
    inv_t = tl.where((inv_t > 0.0) & (inv_t < float("inf")), inv_t, float("nan"))
    thr = tl.full([], float("-inf"), tl.float32)
    if HAS_THRESHOLD:
        thr = tl.where(greedy, float("-inf"), tl.load(threshold_ptr + j).to(tl.float32))
    return inv_t, thr


@triton.jit
def _target_row(logits_ptr, logits_stride, target_rows_ptr, j, HAS_TARGET_ROWS: tl.constexpr):
    """Pointer to the logits of target row j (row target_rows[j] with HAS_TARGET_ROWS, else row j)."""
    if HAS_TARGET_ROWS:
        row = tl.load(target_rows_ptr + j).to(tl.int64)
    else:
        row = j.to(tl.int64)
    return logits_ptr + row * logits_stride


@triton.jit
def _checked_target_row(logits_ptr, logits_stride, target_rows_ptr, j, num_logits, HAS_TARGET_ROWS: tl.constexpr):
    """(pointer to the logits of target row j, whether that row exists): with HAS_TARGET_ROWS a
    row index outside [0, num_logits) gives row 0's pointer (in bounds: the host refuses empty
    logits) and False, so that the caller reads row 0 instead of out of bounds and replaces
    what it found by an empty row's statistics (the row then shows as invalid); without target
    rows row j (< T == num_logits) always exists."""
    if HAS_TARGET_ROWS:
        row = tl.load(target_rows_ptr + j).to(tl.int64)
        ok = (row >= 0) & (row < num_logits)
        return logits_ptr + tl.where(ok, row, 0) * logits_stride, ok
    return logits_ptr + j.to(tl.int64) * logits_stride, j >= 0


@triton.jit
def _request_span(cu_ptr, req, num_target_rows):
    """Draft rows [start, end) of request req from the inclusive cumulative counts, both
    clamped into [0, T] before narrowing to int32: a negative, decreasing or too large count
    (not checked on the host: no sync) then never indexes outside the T draft rows."""
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0)
    end = tl.load(cu_ptr + req)
    start = tl.minimum(tl.maximum(start, 0), num_target_rows).to(tl.int32)
    end = tl.minimum(tl.maximum(end, 0), num_target_rows).to(tl.int32)
    return start, end


@triton.jit
def _valid_draft(x, vocab_size):
    """Draft id x (int32 or int64, as stored) -> int32 id, or -1 when outside [0, V): the test
    is made before any narrowing, so an int64 id past 2**31 cannot wrap into the vocabulary."""
    return tl.where((x >= 0) & (x < vocab_size), x, -1).to(tl.int32)


@triton.jit
def _load_scaled(row_ptr, t, limit, inv_t, thr, HAS_THRESHOLD: tl.constexpr):
    """Mask t < limit and scaled logits l * (1/T) of tokens t (any shape): -inf outside the mask
    and, with HAS_THRESHOLD, below thr (a NaN stays NaN: it makes its row invalid)."""
    mask = t < limit
    v = tl.load(row_ptr + t, mask=mask, other=float("-inf")).to(tl.float32) * inv_t
    if HAS_THRESHOLD:
        v = tl.where((v >= thr) | (v != v), v, float("-inf"))
    return mask, v


@triton.jit
def _scaled_block(row_ptr, base, kk, ww, vocab_size, inv_t, thr, HAS_THRESHOLD: tl.constexpr):
    """Tokens t = base + 4 * kk + ww [BLOCK // 4, 4], their mask t < V and scaled logits l * (1/T)
    (-inf outside the vocabulary and, with HAS_THRESHOLD, below thr)."""
    t = base + kk[:, None] * 4 + ww
    mask, v = _load_scaled(row_ptr, t, vocab_size, inv_t, thr, HAS_THRESHOLD)
    return t, mask, v


@triton.jit
def _argmax_combine(k1, i1, k2, i2):
    """Combine of (key, index) pairs: the larger key, the lower index on ties; a NaN key loses
    to any other (as a max that ignores NaN). Associative and commutative, so one tuple
    reduction gives what a max and then a min over the indices at the max gave."""
    take2 = (k2 > k1) | ((k2 == k1) & (i2 < i1)) | ((k1 != k1) & (k2 == k2))
    return tl.where(take2, k2, k1), tl.where(take2, i2, i1)


@triton.jit
def _argmax_lowest(key, idx, axis: tl.constexpr):
    """(max of key along axis, the lowest idx where key is that max): one reduction of the pair
    (one exchange across warps instead of two). When every key is NaN: (NaN, the lowest idx)."""
    return tl.reduce((key, idx), axis, _argmax_combine)


@triton.jit
def _merge_block_max(v, t, best, best_t):
    """Running (max, token) updated with the block v [N, 4] of tokens t: the block's max
    (lowest token on ties) replaces the running one when strictly larger."""
    bm, bi = _argmax_lowest(v, t, 1)
    bm, bi = _argmax_lowest(bm, bi, 0)
    return tl.maximum(best, bm), tl.where(bm > best, bi, best_t)


@triton.jit
def _max3(v):
    """Max of a 3-D block."""
    return tl.max(tl.max(tl.max(v, 2), 1), 0)


@triton.jit
def _token_noise(seed_r, pos_r, quad, ww):
    """Exp(1) noise of tokens 4 * quad + ww (quad [..., 1], ww [..., 4]): word ww of
    random_words(seed_r, pos_r, STREAM_RECOVER, quad)."""
    w0, w1, w2, w3 = random_words(seed_r, pos_r, STREAM_RECOVER, quad)
    return exponential(tl.where(ww == 0, w0, tl.where(ww == 1, w1, tl.where(ww == 2, w2, w3))))


@triton.jit
def _sub_chunk_log_noise(kk, seed_r, pos_r):
    """log E_k of level 1 for sub-chunks kk (any shape, with seed_r / pos_r broadcast to it):
    E_k = Exp(1) from word k % 4 of random_words(seed_r, pos_r, STREAM_RECOVER_CHUNK, k // 4)."""
    w0, w1, w2, w3 = random_words(seed_r, pos_r, STREAM_RECOVER_CHUNK, kk // 4)
    w = kk % 4
    word = tl.where(w == 0, w0, tl.where(w == 1, w1, tl.where(w == 2, w2, w3)))
    return tl.log(exponential(word))


@triton.jit
def _race_chunks_by_noise(log_mass, log_noise, kk):
    """Level 1 of the recovered-token draw with its noise given: the sub-chunk argmax_k
    log(M_k) - log(E_k) over sub-chunks kk [SUB_BLOCK] (lowest on ties). Returns (sub-chunk,
    its key); the key is -inf when no sub-chunk has mass."""
    best, c = _argmax_lowest(log_mass - log_noise, kk, 0)
    return c, best


@triton.jit
def _race_chunks(log_mass, kk, seed_r, pos_r):
    """Level 1 of the recovered-token draw: _race_chunks_by_noise with the noise of row key
    (seed_r, pos_r) (_sub_chunk_log_noise)."""
    return _race_chunks_by_noise(log_mass, _sub_chunk_log_noise(kk, seed_r, pos_r), kk)


@triton.jit
def _race_chunk_tokens(row_ptr, c, excluded, inv_t, thr, seed_r, pos_r, vocab_size, SUB: tl.constexpr,
                       BLOCK: tl.constexpr, HAS_THRESHOLD: tl.constexpr):
    """Level 2 of the recovered-token draw (no draft probs): the token of sub-chunk c (SUB
    tokens) winning the per-token race argmax over t != excluded of l_t * (1/T) - log E_t; lowest
    token on ties, 0 when every key is -inf. E_t: word t % 4 of
    random_words(seed_r, pos_r, STREAM_RECOVER, t // 4)."""
    kk = tl.arange(0, BLOCK // 4)
    ww = tl.arange(0, 4)[None, :]
    kb = tl.full([], float("-inf"), tl.float32)
    kbi = tl.full([], 0, tl.int32)
    sub0 = c * SUB
    limit = tl.minimum(vocab_size, sub0 + SUB)
    for off in range(0, SUB, BLOCK):
        base = sub0 + off
        t, mask, v = _scaled_block(row_ptr, base, kk, ww, limit, inv_t, thr, HAS_THRESHOLD)
        key = v - tl.log(_token_noise(seed_r, pos_r, base // 4 + kk[:, None], ww))
        key = tl.where(mask & (t != excluded), key, float("-inf"))
        kb, kbi = _merge_block_max(key, t, kb, kbi)
    return kbi


@triton.jit
def _request_rows(cu_ptr, draft_ids_ptr, req, num_target_rows, vocab_size, MAX_K: tl.constexpr,
                  OUT_BLOCK: tl.constexpr):
    """The draft rows of request req: (rr [OUT_BLOCK] draft index = output column, start, n,
    rmask = rr < n, jj = start + rr their target rows, x [OUT_BLOCK] their valid draft ids or -1,
    too_many: more than MAX_K drafts, so that the bonus token (drawn after all of them) cannot
    follow the first MAX_K). Inputs only: readable before pdl_wait."""
    rr = tl.arange(0, OUT_BLOCK)
    start, end = _request_span(cu_ptr, req, num_target_rows)
    n = tl.maximum(tl.minimum(end - start, MAX_K), 0)
    rmask = rr < n
    jj = start + rr
    x = _valid_draft(tl.load(draft_ids_ptr + jj, mask=rmask, other=-1), vocab_size)
    return rr, start, n, rmask, jj, x, end - start > MAX_K


@triton.jit
def _draft_rows(target_rows_ptr, temp_ptr, threshold_ptr, req, jj, rmask, greedy,
                TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr, HAS_TARGET_ROWS: tl.constexpr):
    """Per draft row jj [OUT_BLOCK] of request req: (logits row index, 1/T, threshold); greedy
    requests: 1/T = 1, no threshold. Inputs only: readable before pdl_wait. (The draft's scaled
    logit l_x * (1/T) is read from pass 1, not recomputed here.)"""
    if HAS_TARGET_ROWS:
        rows = tl.load(target_rows_ptr + jj, mask=rmask, other=0).to(tl.int64)
    else:
        rows = jj.to(tl.int64)
    inv_t = tl.full(jj.shape, 1.0, tl.float32)
    if TEMP_MODE == 1:
        inv_t = inv_t * tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.load(temp_ptr + req).to(tl.float32)))
    if TEMP_MODE == 2:
        inv_t = tl.where(greedy, 1.0, tl.load(temp_ptr + jj, mask=rmask, other=1.0).to(tl.float32))
    thr = tl.full(jj.shape, float("-inf"), tl.float32)
    if HAS_THRESHOLD:
        thr = tl.where(greedy, float("-inf"), tl.load(threshold_ptr + jj, mask=rmask, other=0.0).to(tl.float32))
    return rows, inv_t, thr


@triton.jit
def _accept_uniforms(rr, jj, seeded, seed, position, engine_seed, step):
    """u [OUT_BLOCK] of the draft rows: uniform_open of word 0 of
    random_words(seed_r, pos_r, STREAM_ACCEPT, 0). Inputs only: computable before pdl_wait."""
    seed_r, pos_r = _row_key(seeded, seed, position, engine_seed, step, rr.to(tl.int64), jj)
    w0, _, _, _ = random_words(seed_r, pos_r, STREAM_ACCEPT, tl.zeros_like(rr))
    return uniform_open(w0)


@triton.jit
def _accept_rows(part_m_ptr, part_s_ptr, part_idx_ptr, rr, n, rmask, jj, x, lx, q_x, u, greedy,
                 NUM_SPLITS: tl.constexpr, OUT_BLOCK: tl.constexpr, GREEDY_MODE: tl.constexpr):
    """Acceptance of a request's draft rows from pass 1's chunk partials: greedy rows accept x
    == argmax, random ones p(x) >= u q(x) with p(x) = exp(l_x * (1/T) - row max) / row sum.
    An invalid row (a NaN or +inf scaled logit, or none above -inf; on a random row a valid
    draft's prob q(x) < 0, NaN or +inf) accepts nothing: it ends its request's output (the
    caller writes -1 there). Returns (num_accepted, rejected, first_rej, rej_ok: that row is
    valid (False without a rejection), argmax, row max (0 for an all -inf row), row sum); the
    last three [OUT_BLOCK]."""
    # One column (chunk) at a time, row-wise operations only: no reduction across threads comes
    # before the last load of the partials, so that all of them are issued together after the
    # PDL wait (a tl.max over the [OUT_BLOCK, NUM_SPLITS] tile put a barrier, and so a second
    # round trip, between its load and the others). Max and min are exact in any order; the
    # sums are added in chunk order (a tl.sum over the tile would add them in an order set by
    # the compiler's layout of that tile, which may change with OUT_BLOCK: the batch's K).
    row_max = tl.full(jj.shape, float("-inf"), tl.float32)
    for k in tl.static_range(NUM_SPLITS):
        row_max = tl.maximum(row_max, tl.load(part_m_ptr + jj * NUM_SPLITS + k, mask=rmask, other=float("-inf")))
    m_safe = tl.where(row_max == float("-inf"), 0.0, row_max)
    argmax = tl.full(jj.shape, _INT_MAX, tl.int32)
    row_sum = tl.zeros_like(m_safe)
    nan_flags = tl.zeros(jj.shape, tl.int32)
    for k in tl.static_range(NUM_SPLITS):
        pm_k = tl.load(part_m_ptr + jj * NUM_SPLITS + k, mask=rmask, other=float("-inf"))
        pidx_k = tl.load(part_idx_ptr + jj * NUM_SPLITS + k, mask=rmask, other=_INT_MAX)
        argmax = tl.minimum(argmax, tl.where(pm_k == row_max, pidx_k, _INT_MAX))
        ps_k = tl.load(part_s_ptr + jj * NUM_SPLITS + k, mask=rmask, other=0.0)
        if GREEDY_MODE == 1:
            nan_flags += (ps_k != ps_k).to(tl.int32)     # pass 1 stored NaN flags instead of sums
        else:
            row_sum = row_sum + ps_k * tl.exp(pm_k - m_safe)
    valid = x >= 0
    acc_greedy = valid & (x == argmax)
    if GREEDY_MODE == 1:
        # +inf and all -inf show in the max (a NaN max, where a max propagates NaN, fails too)
        row_ok = (nan_flags == 0) & (row_max > float("-inf")) & (row_max < float("inf"))
        accepted = acc_greedy & row_ok
    else:
        row_sum = tl.where(rmask, row_sum, 1.0)
        # NaN (a NaN or +inf logit) and 0 (every logit -inf) fail, and on a random row a valid
        # draft's prob q(x) that is negative, NaN or +inf (draft probs: not checked on the host)
        row_ok = (row_sum > 0.0) & (greedy | (x < 0) | ((q_x >= 0.0) & (q_x < float("inf"))))
        p_x = tl.exp(lx - m_safe) / row_sum
        acc_random = valid & (p_x > 0.0) & (p_x >= u * q_x)
        accepted = tl.where(greedy, acc_greedy, acc_random) & row_ok
    # the first rejected row and the first invalid one in one reduction: rows before the first
    # rejection were accepted, so valid, and that row is valid iff the first invalid comes later
    first_rej, first_bad = tl.reduce((tl.where(rmask & (accepted == 0), rr, OUT_BLOCK),
                                      tl.where(rmask & (row_ok == 0), rr, OUT_BLOCK)), 0, _min2)
    rej_ok = first_bad != first_rej
    return tl.minimum(first_rej, n), first_rej < n, first_rej, rej_ok, argmax, m_safe, row_sum


@triton.jit
def _min2(a1, b1, a2, b2):
    return tl.minimum(a1, a2), tl.minimum(b1, b2)


@triton.jit
def _max2(a1, b1, a2, b2):
    return tl.maximum(a1, a2), tl.maximum(b1, b2)


@triton.jit
def _max8_combine(a1, b1, c1, d1, e1, f1, g1, h1, a2, b2, c2, d2, e2, f2, g2, h2):
    return (tl.maximum(a1, a2), tl.maximum(b1, b2), tl.maximum(c1, c2), tl.maximum(d1, d2), tl.maximum(e1, e2),
            tl.maximum(f1, f2), tl.maximum(g1, g2), tl.maximum(h1, h2))


@triton.jit
def _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K: tl.constexpr):
    """Request req's output row [MAX_K + 1]: its accepted drafts, then `token` after a rejection
    or the bonus token, then -1."""
    row = tl.where(rr < num_accepted, x, -1)
    row = tl.where(rr == num_accepted, tl.where(rejected, token, bonus), row)
    tl.store(out_ptr + req.to(tl.int64) * out_stride + rr, row, mask=rr < MAX_K + 1)


@triton.jit
def _reduce_tile(t, mask, v, x, seed_r, pos_r, base, bb, kk, ww, sub_of, ls, m, s_sub, sx, am, kb, kbi, greedy,
                 BLOCK: tl.constexpr, SB: tl.constexpr, GREEDY_MODE: tl.constexpr, NEED_SX: tl.constexpr,
                 FUSE_RACE: tl.constexpr):
    """One block of pass 1, the tile t = base + SB * bb + 4 * kk + ww [NB, SB // 4, 4] whose row b
    lies in sub-chunk sub_of[b] [NB] of the chunk, folded into the chunk's running max m /
    argmax am, the sums of exp s_sub [SPC] of its sub-chunks (indices ls [SPC]), the same sums
    sx [SPC] without the draft token x (NEED_SX; summed directly, never as a difference) and,
    with FUSE_RACE, each sub-chunk's best race key kb / token kbi [SPC] over t != x."""
    bm = tl.max(tl.max(tl.max(v, 2), 1), 0)
    bi = tl.min(tl.min(tl.min(tl.where(v == bm, t, _INT_MAX), 2), 1), 0)
    am = tl.where(bm > m, bi, am)
    m_new = tl.maximum(m, bm)
    hit = ls[:, None] == sub_of[None, :]                            # [SPC, NB]
    if GREEDY_MODE != 1:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale = tl.exp(m - m_safe)
        e = tl.exp(v - m_safe)
        bsub = tl.sum(tl.sum(e, 2), 1)                              # [NB]: one sum per tile row
        s_sub = s_sub * scale + tl.sum(tl.where(hit, bsub[None, :], 0.0), 1)
        if NEED_SX:
            if (x >= base) & (x < base + BLOCK):
                bsub_x = tl.sum(tl.sum(tl.where(t != x, e, 0.0), 2), 1)
            else:
                bsub_x = bsub
            sx = sx * scale + tl.sum(tl.where(hit, bsub_x[None, :], 0.0), 1)
    if FUSE_RACE:
        if not greedy:
            quad = (base + bb[:, None] * SB) // 4 + kk[None, :]      # [NB, SB // 4]
            key = v - tl.log(_token_noise(seed_r, pos_r, quad[:, :, None], ww))
            key = tl.where(mask & (t != x), key, float("-inf"))
            bk = tl.max(tl.max(key, 2), 1)                          # [NB]
            bki = tl.min(tl.min(tl.where(key == bk[:, None, None], t, _INT_MAX), 2), 1)
            ck = tl.max(tl.where(hit, bk[None, :], float("-inf")), 1)   # [SPC]
            cki = tl.max(tl.where(hit, bki[None, :], -1), 1)
            kbi = tl.where(ck > kb, cki, kbi)
            kb = tl.maximum(kb, ck)
    return m_new, s_sub, sx, am, kb, kbi


@triton.jit
def _chunk_stats_lanes(row_ptr, chunk0, limit, x, inv_t, thr, CHUNK: tl.constexpr, SUB: tl.constexpr,
                       BLOCK: tl.constexpr, LANES: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
                       GREEDY_MODE: tl.constexpr, NEED_SX: tl.constexpr):
    """Pass 1's chunk statistics (max m, its lowest token am, the sums of exp(x - m) of the
    chunk's SPC sub-chunks s_sub [SPC] and, with NEED_SX, of x's sub-chunk without x, sx)
    with one running state per lane: lane l of L = min(LANES, step) folds tokens l, l + L,
    l + 2L, ... of the chunk into its own max / argmax / sums (no cross-thread reduction
    inside the loop), and the lanes are combined once at the end. A step is min(BLOCK, SUB)
    tokens, so it lies in one sub-chunk. With NEED_SX the lanes leave x out of their sums
    (sx is summed directly: no cancellation) and x's term is added to its sub-chunk's sum
    at the end. All greedy (GREEDY_MODE 1, no sums), nan_seen says whether a token is NaN
    (the sums carry that otherwise: NaN)."""
    STEP: tl.constexpr = min(BLOCK, SUB)
    L: tl.constexpr = min(LANES, STEP)
    SPC: tl.constexpr = CHUNK // SUB
    # 2-D tiles [rows, L]: each thread's lanes hold the same columns of every row, so the
    # reductions over the rows (axis 0) stay in the thread. The lanes are written as runs of 4
    # (lane // 4 * 4 + lane % 4) so that every logits dtype loads 4 per thread (16 B fp32, 8 B
    # bf16) in one layout: the lanes are then combined in one order whatever the dtype.
    rr = tl.arange(0, STEP // L)[:, None]
    lane = tl.arange(0, L) // 4 * 4 + tl.arange(0, L) % 4
    ls = tl.arange(0, SPC)
    m_l = tl.full([L], float("-inf"), tl.float32)
    am_l = tl.zeros([L], tl.int32)
    s_l = tl.zeros([SPC, L], tl.float32)
    nan_l = tl.zeros([L], tl.int32)
    for off in range(0, CHUNK, STEP):
        base = chunk0 + off
        pos = rr * L + lane[None, :]                        # [STEP // L, L] tokens base + pos
        mask, v = _load_scaled(row_ptr + base, pos, limit - base, inv_t, thr, HAS_THRESHOLD)
        bm = tl.max(v, 0)
        if GREEDY_MODE != 2:
            # the lane's lowest token at the step's max: its first row there
            bi = base + tl.min(tl.where(v == bm[None, :], rr, STEP // L), 0) * L + lane
            am_l = tl.where(bm > m_l, bi, am_l)
        m_new = tl.maximum(m_l, bm)
        if GREEDY_MODE == 1:
            nan_l = tl.maximum(nan_l, tl.max((v != v).to(tl.int32), 0))
        else:
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            e = tl.exp(v - m_safe[None, :])
            if NEED_SX:
                if (x >= base) & (x < base + STEP):
                    e = tl.where(pos != x - base, e, 0.0)
            s_l = s_l * tl.exp(m_l - m_safe)[None, :] + tl.where(ls[:, None] == off // SUB, tl.sum(e, 0)[None, :],
                                                                 0.0)
        m_l = m_new
    m = tl.max(m_l, 0)
    am = tl.min(tl.where(m_l == m, am_l, _INT_MAX), 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s_sub = tl.sum(s_l * tl.exp(m_l - m_safe)[None, :], 1)                     # [SPC]
    sx = tl.zeros([], tl.float32)
    if NEED_SX:
        x_k = tl.where(x >= chunk0, x - chunk0, CHUNK) // SUB                   # x's sub-chunk here, or SPC
        sx = tl.sum(tl.where(ls == x_k, s_sub, 0.0), 0)
        if x_k < SPC:
            _, vx = _load_scaled(row_ptr, x, limit, inv_t, thr, HAS_THRESHOLD)
            s_sub = tl.where(ls == x_k, sx + tl.exp(vx - m_safe), s_sub)
    return m, am, s_sub, sx, tl.max(nan_l, 0)


@triton.jit(do_not_specialize=["num_target_rows", "num_logits", "engine_seed"])
def _rejection_sample_kernel(
    out_ptr, out_stride,                      # [num_reqs, MAX_K + 1] int32
    logits_ptr, logits_stride,                # [num_logits, V] target logits (rows via target_rows)
    target_rows_ptr,                          # [T] int, row of logits for each draft (HAS_TARGET_ROWS)
    draft_ids_ptr,                            # [T] int
    cu_ptr,                                   # [num_reqs] inclusive cumulative drafts
    bonus_ptr,                                # [num_reqs] int
    temp_ptr,                                 # TEMP_MODE 1: [num_reqs] T; 2: [T] 1/T (fp32)
    threshold_ptr,                            # [T] fp32: scaled logits below are dropped (HAS_THRESHOLD)
    greedy_ptr,                               # [num_reqs] bool (GREEDY_MODE == 0)
    seeds_ptr, has_seed_ptr, positions_ptr,   # [num_reqs] int64, bool, int64 (HAS_SEEDS)
    step_ptr, engine_seed,                    # [1] int64, int
    part_m_ptr, part_s_ptr, part_idx_ptr,     # [T * NUM_SPLITS]
    part_sub_ptr,                             # [T * NUM_SUBS] fp32 sub-chunk sums of exp(x - chunk max)
    part_kidx_ptr,                            # [T * NUM_SUBS] int32 sub-chunk race winners (FUSE_RACE)
    part_lx_ptr,                              # [T] fp32 l_x * (1/T) of the draft (-inf below the threshold)
    part_sx_ptr,                              # [T] fp32 sum of x's sub-chunk without x (NEED_SX)
    rec_j_ptr,                                # [num_reqs] int32: -1 for a request without drafts (WRITE_REC)
    num_target_rows, num_logits, vocab_size,
    MAX_K: tl.constexpr, GRID_K: tl.constexpr, NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr,
    SUB: tl.constexpr, NUM_SUBS: tl.constexpr,
    BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr,
    HAS_TARGET_ROWS: tl.constexpr,
    TEMP_MODE: tl.constexpr,                  # 0: none, 1: per-request temperature, 2: per-row 1/T
    HAS_THRESHOLD: tl.constexpr,
    GREEDY_MODE: tl.constexpr,                # 0: per-request flags, 1: all greedy, 2: all random
    HAS_SEEDS: tl.constexpr, FUSE_RACE: tl.constexpr,
    NEED_SX: tl.constexpr,                    # sums without the draft token (n-gram drafts, random rows)
    PREFETCH: tl.constexpr,                   # load the next block before reducing this one
    WRITE_REC: tl.constexpr,                  # the recover pass follows (draft probs, random rows)
    LANES: tl.constexpr = 0,                  # > 0: per-lane running statistics (_chunk_stats_lanes)
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    req = pid // GRID_K
    i = pid % GRID_K
    start, end = _request_span(cu_ptr, req, num_target_rows)
    n = tl.maximum(tl.minimum(end - start, MAX_K), 0)

    greedy = _request_greedy(greedy_ptr, req, GREEDY_MODE)
    seeded, seed, position, step = _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req, HAS_SEEDS)
    engine_seed = engine_seed.to(tl.int64)

    if i < n:
        j = start + i
        row_ptr, row_exists = _checked_target_row(logits_ptr, logits_stride, target_rows_ptr, j, num_logits,
                                                  HAS_TARGET_ROWS)
        inv_t, thr = _row_scale(temp_ptr, threshold_ptr, req, j, greedy, TEMP_MODE, HAS_THRESHOLD)
        x = _valid_draft(tl.load(draft_ids_ptr + j), vocab_size)
        seed_r, pos_r = _row_key(seeded, seed, position, engine_seed, step, i.to(tl.int64), j)

        # a block is a tile [NB, SB // 4, 4]: row b holds SB consecutive tokens of one sub-chunk
        SB: tl.constexpr = min(SUB, BLOCK)
        NB: tl.constexpr = BLOCK // SB
        SPC: tl.constexpr = CHUNK // SUB        # sub-chunks per chunk
        bb = tl.arange(0, NB)
        kk = tl.arange(0, SB // 4)
        ww = tl.arange(0, 4)[None, None, :]
        ls = tl.arange(0, SPC)
        m = tl.full([], float("-inf"), tl.float32)
        s_sub = tl.zeros([SPC], tl.float32)
        sx = tl.zeros([SPC], tl.float32)
        am = tl.full([], 0, tl.int32)
        kb = tl.full([SPC], float("-inf"), tl.float32)
        kbi = tl.zeros([SPC], tl.int32)
        chunk0 = split * CHUNK
        limit = tl.minimum(vocab_size, chunk0 + CHUNK)   # t < limit: in the vocabulary and the chunk
        nan_seen = tl.full([], 0, tl.int32)     # GREEDY_MODE 1: a NaN token in the chunk
        if LANES > 0:
            m, am, s_lanes, sx_lanes, nan_seen = _chunk_stats_lanes(row_ptr, chunk0, limit, x, inv_t, thr, CHUNK,
                                                                    SUB, BLOCK, LANES, HAS_THRESHOLD, GREEDY_MODE,
                                                                    NEED_SX)
            s_sub = s_lanes
            sx = tl.where(ls == (x % CHUNK) // SUB, sx_lanes, 0.0)
        elif PREFETCH:
            # load block i + 1 before reducing block i: the same reductions in the same order
            t = chunk0 + bb[:, None, None] * SB + kk[None, :, None] * 4 + ww
            mask, v = _load_scaled(row_ptr, t, limit, inv_t, thr, HAS_THRESHOLD)
            for off in range(0, CHUNK, BLOCK):
                base = chunk0 + off
                maskn, vn = _load_scaled(row_ptr, t + BLOCK, limit, inv_t, thr, HAS_THRESHOLD)
                m, s_sub, sx, am, kb, kbi = _reduce_tile(t, mask, v, x, seed_r, pos_r, base, bb, kk, ww,
                                                         (off + bb * SB) // SUB, ls, m, s_sub, sx, am, kb, kbi,
                                                         greedy, BLOCK, SB, GREEDY_MODE, NEED_SX, FUSE_RACE)
                if GREEDY_MODE == 1:
                    nan_seen = tl.maximum(nan_seen, _max3((v != v).to(tl.int32)))
                t, mask, v = t + BLOCK, maskn, vn
        else:
            for off in range(0, CHUNK, BLOCK):
                base = chunk0 + off
                t = base + bb[:, None, None] * SB + kk[None, :, None] * 4 + ww
                mask, v = _load_scaled(row_ptr, t, limit, inv_t, thr, HAS_THRESHOLD)
                m, s_sub, sx, am, kb, kbi = _reduce_tile(t, mask, v, x, seed_r, pos_r, base, bb, kk, ww,
                                                         (off + bb * SB) // SUB, ls, m, s_sub, sx, am, kb, kbi,
                                                         greedy, BLOCK, SB, GREEDY_MODE, NEED_SX, FUSE_RACE)
                if GREEDY_MODE == 1:
                    nan_seen = tl.maximum(nan_seen, _max3((v != v).to(tl.int32)))
        if HAS_TARGET_ROWS:
            # a target row outside the logits was read as row 0: its partials are an empty row's
            # (no logit above -inf: invalid). Selected after the loop, not by masking the loads:
            # the masked loads cost pass 1 2 us at K = 1, B = 128 with draft probs on the H200
            # (bench/results/logs/exp_index_bounds_2026-12-04.txt)
            m = tl.where(row_exists, m, float("-inf"))
            s_sub = tl.where(row_exists, s_sub, 0.0)
            sx = tl.where(row_exists, sx, 0.0)
            nan_seen = tl.where(row_exists, nan_seen, 0)
        p = j * NUM_SPLITS + split
        tl.store(part_m_ptr + p, m)
        tl.store(part_idx_ptr + p, am)
        ps = j * NUM_SUBS + split * SPC + ls
        smask = split * SPC + ls < NUM_SUBS
        if GREEDY_MODE != 1:
            tl.store(part_s_ptr + p, tl.sum(s_sub, 0))   # the chunk's sum: its sub-chunks', in a fixed order
            tl.store(part_sub_ptr + ps, s_sub, mask=smask)
        else:
            tl.store(part_s_ptr + p, tl.where(nan_seen > 0, float("nan"), 1.0))   # no sums: NaN flags only
        if FUSE_RACE:
            tl.store(part_kidx_ptr + ps, kbi, mask=smask)
        if split == 0:
            # stored, so rounded once, as pass 1's max and the torch reference round it
            lx = tl.load(row_ptr + tl.where(x >= 0, x, 0)).to(tl.float32) * inv_t
            if HAS_TARGET_ROWS:
                lx = tl.where(row_exists, lx, float("-inf"))
            if HAS_THRESHOLD:
                lx = tl.where(lx >= thr, lx, float("-inf"))
            tl.store(part_lx_ptr + j, lx)
        if NEED_SX:
            # x's sub-chunk without x, for level 1 (the other sums without x are not needed)
            if (x >= 0) & (x // CHUNK == split):
                tl.store(part_sx_ptr + j + ls * 0, sx, mask=ls == (x % CHUNK) // SUB)
    else:
        if (i == 0) & (split == 0):
            # a request without drafts: its output is the bonus token
            rr = tl.arange(0, OUT_BLOCK)
            bonus = tl.load(bonus_ptr + req).to(tl.int32)
            tl.store(out_ptr + req.to(tl.int64) * out_stride + rr, tl.where(rr == 0, bonus, -1),
                     mask=rr < MAX_K + 1)
            if WRITE_REC:
                tl.store(rec_j_ptr + req, -1)   # no recovered token to draw (the finalize skips it)


@triton.jit(do_not_specialize=["num_target_rows", "engine_seed"])
def _rejection_finalize_kernel(
    out_ptr, out_stride,                      # [num_reqs, MAX_K + 1] int32
    draft_ids_ptr, bonus_ptr, cu_ptr, greedy_ptr,
    seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, engine_seed,
    part_m_ptr, part_s_ptr, part_idx_ptr,     # [T * NUM_SPLITS] from pass 1
    part_sub_ptr, part_kidx_ptr,              # [T * NUM_SUBS] from pass 1 (RACE; part_kidx: FUSE_RACE)
    part_lx_ptr,                              # [T] from pass 1
    part_sx_ptr,                              # [T] from pass 1 (RACE)
    rec_j_ptr, rec_ms_ptr,                    # [num_reqs] int32, [num_reqs, 2] fp32 out (HAS_DRAFT_PROBS)
    logits_ptr, logits_stride, target_rows_ptr, temp_ptr, threshold_ptr,   # as in pass 1
    draft_probs_ptr, draft_probs_stride,      # [T, V] (HAS_DRAFT_PROBS)
    num_target_rows, vocab_size,
    MAX_K: tl.constexpr, NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
    NUM_SUBS: tl.constexpr, OUT_BLOCK: tl.constexpr, SUB_BLOCK: tl.constexpr,
    GREEDY_MODE: tl.constexpr, HAS_SEEDS: tl.constexpr, FUSE_RACE: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,            # q(x) from the draft probs; rejection_recover draws the tokens
    RACE: tl.constexpr,                       # draw recovered tokens here (no draft probs, random rows)
    RACE_BLOCK: tl.constexpr, HAS_TARGET_ROWS: tl.constexpr, TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_wait)
):
    """One program per request, after every chunk partial is written (a separate launch: no
    inter-program ordering to rely on): acceptance, the output row and, with RACE, the
    recovered token; with draft probs, the rejected row and its softmax statistics for
    rejection_recover, which writes the recovered token.

    Everything that is an input (draft ids, keys, uniforms, scales, q(x)) is read before
    pdl_wait, so that after it only pass 1's partials (one round trip) and, for a rejected
    random row, one sub-chunk of its logits are read. Every program waits, requests without
    drafts too: this launch then ends only after pass 1 has, which the recover pass (waiting
    on this launch only) relies on to read what pass 1 wrote."""
    req = tl.program_id(0)
    rr, start, n, rmask, jj, x, too_many = _request_rows(cu_ptr, draft_ids_ptr, req, num_target_rows, vocab_size,
                                                         MAX_K, OUT_BLOCK)
    greedy = _request_greedy(greedy_ptr, req, GREEDY_MODE)
    seeded, seed, position, step = _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req, HAS_SEEDS)
    engine_seed64 = engine_seed.to(tl.int64)
    u = _accept_uniforms(rr, jj, seeded, seed, position, engine_seed64, step)
    rows, inv_t, thr = _draft_rows(target_rows_ptr, temp_ptr, threshold_ptr, req, jj, rmask, greedy, TEMP_MODE,
                                   HAS_THRESHOLD, HAS_TARGET_ROWS)
    bonus = tl.load(bonus_ptr + req).to(tl.int32)
    q_x = tl.full(x.shape, 1.0, tl.float32)
    if HAS_DRAFT_PROBS:
        q_rows = draft_probs_ptr + jj.to(tl.int64) * draft_probs_stride
        q_x = tl.load(q_rows + tl.where(x >= 0, x, 0), mask=rmask, other=1.0).to(tl.float32)
    pdl_wait(PDL)
    pdl_launch(PDL)
    if n > 0:
        lx = tl.load(part_lx_ptr + jj, mask=rmask, other=float("-inf"))
        if RACE:
            # level 1's inputs for every row, in the same round trip as the acceptance partials:
            # log of each sub-chunk's mass m_c + log(s_k) (chunk c = k // SPC), with the sum without
            # the draft token for the sub-chunk holding it
            kk = tl.arange(0, SUB_BLOCK)
            tmask = rmask[:, None] & (kk < NUM_SUBS)[None, :]
            sub_m = tl.load(part_m_ptr + jj[:, None] * NUM_SPLITS + kk[None, :] // (CHUNK // SUB), mask=tmask,
                            other=float("-inf"))
            sub_s = tl.load(part_sub_ptr + jj[:, None] * NUM_SUBS + kk[None, :], mask=tmask, other=0.0)
            sx = tl.load(part_sx_ptr + jj, mask=rmask & (x >= 0), other=0.0)
        else:
            sx = tl.zeros(jj.shape, tl.float32)
        num_accepted, rejected, first_rej, rej_ok, argmax, m_safe, row_sum = _accept_rows(
            part_m_ptr, part_s_ptr, part_idx_ptr, rr, n, rmask, jj, x, lx, q_x, u, greedy,
            NUM_SPLITS, OUT_BLOCK, GREEDY_MODE)
        # more drafts than MAX_K (inconsistent metadata, not checked on the host: no sync): the
        # output is empty (-1), as for an invalid first row
        num_accepted = tl.where(too_many, 0, num_accepted)
        rejected = rejected | too_many
        first_rej = tl.where(too_many, 0, first_rej)
        rej_ok = rej_ok & (too_many == 0)
        # everything the rest needs of the first rejected row, in one reduction: each value a
        # max over the rows, every other row's set to the lowest value
        sel = rr == first_rej
        x_rej, sx_rej, row_rej, inv_t_rej, thr_rej, argmax_rej, m_rej, sum_rej = tl.reduce(
            (tl.where(sel, x, -1), tl.where(sel, sx, -1.0), tl.where(sel, rows, -1),
             tl.where(sel, inv_t, float("-inf")), tl.where(sel, thr, float("-inf")), tl.where(sel, argmax, -1),
             tl.where(sel, m_safe, float("-inf")), tl.where(sel, row_sum, float("-inf"))), 0, _max8_combine)
        recovered = tl.full([], 0, tl.int32)                       # no mass: as torch.argmax
        if HAS_DRAFT_PROBS:
            recovered = tl.full([], -1, tl.int32)                  # -1: rejection_recover writes it
        if RACE:
            # no draft probs: the two-level race of the rejected random row right here (its
            # sub-chunk masses are pass 1's partials), level 2 over the chosen sub-chunk's tokens,
            # or that sub-chunk's winner which pass 1 already found (FUSE_RACE)
            if rejected & (greedy == 0) & rej_ok:
                j_rej = start + first_rej
                x_sub = tl.where(x_rej >= 0, x_rej // SUB, -1)
                s_k, m_k = tl.reduce((tl.where(sel[:, None], sub_s, -1.0),
                                      tl.where(sel[:, None], sub_m, float("-inf"))), 0, _max2)
                s_k = tl.where(kk == x_sub, sx_rej, s_k)
                log_mass = tl.where(s_k > 0.0, m_k + tl.log(tl.where(s_k > 0.0, s_k, 1.0)), float("-inf"))
                seed_j, pos_j = _row_key(seeded, seed, position, engine_seed64, step, first_rej.to(tl.int64), j_rej)
                c, best = _race_chunks(log_mass, kk, seed_j, pos_j)
                if best > float("-inf"):
                    if FUSE_RACE:
                        recovered = tl.load(part_kidx_ptr + j_rej * NUM_SUBS + c)
                    else:
                        recovered = _race_chunk_tokens(logits_ptr + row_rej * logits_stride, c, x_rej, inv_t_rej,
                                                       thr_rej, seed_j, pos_j, vocab_size, SUB, RACE_BLOCK,
                                                       HAS_THRESHOLD)
        token = tl.where(rej_ok, tl.where(greedy, argmax_rej, recovered), -1)   # an invalid row ends the output
        _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K)
        if HAS_DRAFT_PROBS:
            # the one row whose recovered token rejection_recover must draw, and its softmax
            # statistics (-inf without a rejection: not read then); picked by a max, not a sum, so
            # that no float sum's order depends on the launch (num_warps)
            tl.store(rec_j_ptr + req, tl.where(rejected & (greedy == 0) & rej_ok, start + first_rej, -1))
            tl.store(rec_ms_ptr + req * 2, m_rej)
            tl.store(rec_ms_ptr + req * 2 + 1, sum_rej)


def temp_mode_of(temperature, inv_temperature, dummy):
    """(TEMP_MODE, pointer argument) of the launchers."""
    if temperature is not None:
        return 1, temperature
    if inv_temperature is not None:
        return 2, inv_temperature
    return 0, dummy


class Pass1Result(NamedTuple):
    """What pass 1 and the finalize kernel leave for the recover pass (rejection_recover.py)."""
    rec_j: torch.Tensor    # [num_reqs] int32 target row of the request's recovered-token draw, or -1
    #                        (written only when the recover pass follows: draft probs, random rows)
    rec_ms: torch.Tensor   # [num_reqs, 2] fp32 max and sum of exp of that row (softmax statistics)
    part_m: torch.Tensor   # [T * num_chunks] fp32 chunk max of each target row's scaled logits
    part_s: torch.Tensor   # [T * num_chunks] fp32 chunk sum of exp(x - chunk max)
    part_sub: torch.Tensor  # [T * num_subs] fp32 sub-chunk sum of exp(x - max of its chunk)


# Pass 1 keeps one running state per lane (_chunk_stats_lanes) instead of reducing every block
# (fuse_race and prefetch keep the block reductions). On the H200 (V = 128256, B = 128, chunk
# 8192, exp_rejection_pass1.py --lanes-table, 2026-11-30): 19.1 against 20.0 us at K = 1,
# 123.4 against 135.1 at K = 8, 17.9 against 19.3 with draft probs.
LANE_STATS = True


def chunk_size(vocab: int) -> int:
    """Vocabulary entries per program of pass 1: 4096, or about a quarter of a small vocabulary.

    A function of the vocabulary only, so a row is reduced in the same order whatever
    the batch (batch invariance of seeded requests). On the H200 (V = 128256, B = 128,
    exp_rejection_pass1.py --lanes-table, 2026-11-30) pass 1 with per-lane statistics took
    17.5 / 120.1 us at K = 1 / 8 in chunks of 4096 against 19.1 / 123.4 in chunks of 8192.
    """
    return min(4096, max(64, triton.next_power_of_2(triton.cdiv(vocab, 4))))


def sub_chunk_size(vocab: int) -> int:
    """Tokens per sub-chunk of the recovered-token race (>= 32): 4096 from V = 16385 on (one
    sub-chunk per chunk), else half a chunk. A function of the vocabulary only, like
    chunk_size, so every row is raced in the same groups whatever the batch. On the H200, with
    chunks of 8192, sub-chunks of 2048 / 4096 / 8192 took 33.1 / 31.0 / 31.3 us at K = 1, B = 128 and
    200.7 / 181.2 / 177.6 at K = 8 (exp_rejection_pass1.py --breakdown --sub, 2026-11-30)."""
    return min(4096, max(32, triton.next_power_of_2(triton.cdiv(vocab, 4)) // 2))


def check_sub_chunk(sub_chunk: int, chunk: int) -> None:
    """A sub-chunk size the kernels take: a power of two in [16, chunk]."""
    if not (isinstance(sub_chunk, int) and 16 <= sub_chunk <= chunk and sub_chunk & (sub_chunk - 1) == 0):
        raise ValueError(f"sub_chunk must be a power of two in [16, {chunk}], got {sub_chunk!r}")


def rejection_sample_pass(
    out: torch.Tensor,                   # [num_reqs, max_spec_len + 1] int32 (written whole)
    logits: torch.Tensor,                # [num_logits, V] fp32/bf16/fp16, unit stride over V
    target_rows: torch.Tensor | None,    # [T] int, or None: logits rows are the target rows
    draft_token_ids: torch.Tensor,       # [T] int
    draft_probs: torch.Tensor | None,    # [T, V] or None (n-gram drafts: q = one-hot)
    cu_num_draft_tokens: torch.Tensor,   # [num_reqs] int32/int64
    bonus_token_ids: torch.Tensor,       # [num_reqs] int
    temperature: torch.Tensor | None,    # [num_reqs] fp32 T, or None
    inv_temperature: torch.Tensor | None,  # [T] fp32 1/T per target row, or None (not both)
    threshold: torch.Tensor | None,      # [T] fp32 kept set {scaled logit >= threshold}, or None
    is_greedy: torch.Tensor | bool,      # [num_reqs] bool, or True / False for the whole batch
    seeds: torch.Tensor | None,          # [num_reqs] int64 (None: no seeded request)
    has_seed: torch.Tensor | None,       # [num_reqs] bool
    positions: torch.Tensor | None,      # [num_reqs] int64, sequence position of draft 0
    step: torch.Tensor,                  # [1] int64 engine step counter
    engine_seed: int,
    fuse_race: bool,
    chunk: int,
    sub_chunk: int | None = None,
    block: int | None = None,
    num_warps: int | None = None,
    prefetch: bool = False,
    race_block: int | None = None,
    race_warps: int = 8,
    lanes: bool | None = None,
) -> Pass1Result:
    """Launch pass 1 and the finalize kernel; returns what the recover pass reads.

    Inputs are checked by specops.spec_decode.rejection; this launcher only asserts layout.
    Without draft probs, the finalize kernel also draws the recovered tokens (the recover
    pass is then not needed). ``sub_chunk`` (default min(chunk, sub_chunk_size(V))) is the unit
    of the race's level 2: it changes which tokens are drawn (not their law), so keep it a
    function of V, as the torch reference's. ``block`` (entries per load, default min(chunk, 4096)),
    ``num_warps``, ``lanes`` (default LANE_STATS: per-lane running statistics; fuse_race and
    prefetch reduce in blocks) and ``prefetch`` change speed only: a row's reductions are in an
    order fixed by (V, chunk, block, num_warps, lanes), so callers keep them functions of V
    (batch invariance).
    ``race_block`` (tokens per step of the level-2 race, default sub_chunk) and
    ``race_warps`` (the finalize kernel's warps when it races) change speed only.
    """
    num_reqs, width = out.shape
    max_k = width - 1
    num_target_rows = draft_token_ids.shape[0]
    vocab = logits.shape[1]
    assert logits.stride(1) == 1 and out.is_contiguous()
    assert chunk >= 16 and chunk & (chunk - 1) == 0, "chunk must be a power of two >= 16"
    assert draft_probs is None or draft_probs.stride(1) == 1
    dev = logits.device
    num_splits = triton.cdiv(vocab, chunk)
    sub = min(chunk, sub_chunk_size(vocab)) if sub_chunk is None else sub_chunk
    check_sub_chunk(sub, chunk)
    num_subs = triton.cdiv(vocab, sub)
    # Blocks of up to 4096 entries (32 fp32 per thread) with 4 warps. On the H200 (V = 128256,
    # B = 128, 8192-entry chunks, exp_rejection_pass1.py, 2026-11-30) the block reductions took
    # 20.2 / 135.2 us at K = 1 / 8 against 24.8 / 174.8 for a whole chunk per load with 8 warps;
    # per-lane statistics were slower on 8 warps than on 4 (21.1 against 19.1 us at K = 1).
    block = min(chunk, 4096) if block is None else block
    assert block >= 16 and block & (block - 1) == 0 and chunk % block == 0
    if num_warps is None:
        num_warps = 4
    if lanes is None:
        lanes = LANE_STATS
    greedy_mode = 0 if isinstance(is_greedy, torch.Tensor) else (1 if is_greedy else 2)
    recover = draft_probs is not None and greedy_mode != 1   # rejection_recover_pass follows
    race = draft_probs is None and greedy_mode != 1
    nt = max(num_target_rows, 1)
    f, g = nt * num_splits, nt * num_subs
    ws_f = torch.empty(2 * f + g + 2 * nt + 2 * num_reqs, dtype=torch.float32, device=dev)
    ws_i = torch.empty(f + g + num_reqs, dtype=torch.int32, device=dev)
    part_m, part_s, part_sub = ws_f[:f], ws_f[f:2 * f], ws_f[2 * f:2 * f + g]
    part_lx, part_sx = ws_f[2 * f + g:2 * f + g + nt], ws_f[2 * f + g + nt:2 * f + g + 2 * nt]
    rec_ms = ws_f[2 * f + g + 2 * nt:].view(num_reqs, 2)
    part_idx, part_kidx, rec_j = ws_i[:f], ws_i[f:f + g], ws_i[f + g:]
    temp_mode, temp_arg = temp_mode_of(temperature, inv_temperature, logits)
    dummy = draft_token_ids
    grid = (num_reqs * max(max_k, 1), num_splits)
    pdl = pdl_kwargs(logits)
    _rejection_sample_kernel[grid](
        out, out.stride(0),
        logits, logits.stride(0),
        target_rows if target_rows is not None else dummy,
        draft_token_ids,
        cu_num_draft_tokens, bonus_token_ids,
        temp_arg, threshold if threshold is not None else logits,
        is_greedy if greedy_mode == 0 else dummy,
        seeds if seeds is not None else step, has_seed if has_seed is not None else step,
        positions if positions is not None else step,
        step, engine_seed,
        part_m, part_s, part_idx, part_sub, part_kidx, part_lx, part_sx,
        rec_j,
        num_target_rows, logits.shape[0], vocab,
        MAX_K=max_k, GRID_K=max(max_k, 1), NUM_SPLITS=num_splits, CHUNK=chunk, SUB=sub, NUM_SUBS=num_subs,
        BLOCK=block,
        OUT_BLOCK=triton.next_power_of_2(max_k + 1),
        HAS_TARGET_ROWS=target_rows is not None,
        TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None, GREEDY_MODE=greedy_mode,
        HAS_SEEDS=seeds is not None, FUSE_RACE=fuse_race,
        NEED_SX=race, PREFETCH=prefetch, WRITE_REC=recover,
        LANES=128 * num_warps if lanes and not fuse_race and not prefetch else 0,
        num_warps=num_warps, **pdl, **NO_FP_FUSION,
    )
    # the whole sub-chunk (4096 tokens) in one step with 8 warps: 5.4 / 11.9 us for the finalize at
    # K = 1 / 8, B = 128 on the H200 against 6.0 / 13.7 with 16 warps and 6.8 / 12.4 for 2 steps of
    # 2048 with 8 (exp_rejection_pass1.py --race, logs/exp_rejection_race_2026-11-30b.txt)
    race_block = min(sub, 8192) if race_block is None else race_block
    assert race_block >= 16 and race_block & (race_block - 1) == 0 and sub % race_block == 0
    _rejection_finalize_kernel[(num_reqs,)](
        out, out.stride(0), draft_token_ids, bonus_token_ids, cu_num_draft_tokens,
        is_greedy if greedy_mode == 0 else dummy,
        seeds if seeds is not None else step, has_seed if has_seed is not None else step,
        positions if positions is not None else step, step, engine_seed,
        part_m, part_s, part_idx, part_sub, part_kidx, part_lx, part_sx, rec_j, rec_ms,
        logits, logits.stride(0), target_rows if target_rows is not None else dummy,
        temp_arg, threshold if threshold is not None else logits,
        draft_probs if draft_probs is not None else logits, draft_probs.stride(0) if draft_probs is not None else 0,
        num_target_rows, vocab,
        MAX_K=max_k, NUM_SPLITS=num_splits, CHUNK=chunk, SUB=sub, NUM_SUBS=num_subs,
        OUT_BLOCK=triton.next_power_of_2(max_k + 1),
        SUB_BLOCK=triton.next_power_of_2(num_subs),
        GREEDY_MODE=greedy_mode, HAS_SEEDS=seeds is not None, FUSE_RACE=fuse_race,
        HAS_DRAFT_PROBS=draft_probs is not None, RACE=race, RACE_BLOCK=race_block,
        HAS_TARGET_ROWS=target_rows is not None, TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None,
        num_warps=race_warps if race and not fuse_race else 4, **pdl, **NO_FP_FUSION,
    )
    return Pass1Result(rec_j, rec_ms, part_m, part_s, part_sub)
