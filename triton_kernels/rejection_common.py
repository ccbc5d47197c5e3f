"""The @triton.jit helpers of the rejection kernels: pass 1 (rejection_pass1.py), the finalize
kernel (rejection_finalize.py) and the recover pass (rejection_recover.py) share them: request
spans, keys and greedy flags, row scales and target rows, draft-id checks, scaled loads, the
(max, lowest index) combine, the race noise and level 1 of the recovered-token race (the
design: rejection_sample.py).

Draft ids are read as given (int32 or int64): an id outside [0, V) is invalid (-1) before
any narrowing, so an int64 id past 2**31 cannot wrap into the vocabulary.

Per-row keys follow specops.rng.row_keys with the target rows as rows: a seeded request
uses (seed, positions[r] + i), an unseeded one (engine_seed, ((j + 1) << 32) | step)
with j the global target row.
"""

import triton
import triton.language as tl

from specops.triton_kernels.rng import STREAM_RECOVER, STREAM_RECOVER_CHUNK, exponential, random_words

_INT_MAX = tl.constexpr(2147483647)


@triton.jit
def _row_key(seeded, seed, position, engine_seed, step, i, j):
    """Seed and position of target row j (draft i of its request), as specops.rng.row_keys."""
    seed_r = tl.where(seeded, seed, engine_seed)
    lane = (j + 1).to(tl.int64) << 32
    # a seeded row's position modulo 2**32, as row_keys: its high word stays 0, never a lane
    pos_r = tl.where(seeded, (position + i) & 0xFFFFFFFF, lane | (step & 0xFFFFFFFF))
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
