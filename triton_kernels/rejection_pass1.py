"""Rejection sampling, pass 1 (_rejection_sample_kernel): one read of every target row, and
its tile / lane reductions (_reduce_tile, _chunk_stats_lanes). Launched by
rejection_sample.rejection_sample_pass; the finalize kernel (rejection_finalize.py) reads what
it writes.

Grid (num_reqs * MAX_K, NUM_SPLITS): program (r, i, c) reads chunk c (CHUNK vocabulary
entries) of the target row of draft i of request r (one running max / argmax / sum per lane,
the lanes combined once at the end: _chunk_stats_lanes) and writes chunk partials: the max
and argmax of the scaled logits x = l * (1/T) (tokens below the row's optional threshold,
e.g. top-k / top-p / min-p, count as -inf), the sum of exp relative to that max, the same
sum over each of its sub-chunks, for the sub-chunk holding a valid draft token without
draft probs that sum without the token (summed directly: no cancellation) and, when
FUSE_RACE, each sub-chunk's best recovered-token candidate.
"""

import triton
import triton.language as tl

from specops.triton_kernels.sampling_common import pdl_start
from specops.triton_kernels.rejection_common import (_INT_MAX, _load_scaled, _request_greedy, _request_keys,
                                                     _request_span, _row_key, _row_scale, _token_noise,
                                                     _valid_draft)


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
def _max3(v):
    """Max of a 3-D block."""
    return tl.max(tl.max(tl.max(v, 2), 1), 0)


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
            bonus = _valid_draft(tl.load(bonus_ptr + req), vocab_size)   # -1 outside [0, V), before narrowing
            tl.store(out_ptr + req.to(tl.int64) * out_stride + rr, tl.where(rr == 0, bonus, -1),
                     mask=rr < MAX_K + 1)
            if WRITE_REC:
                tl.store(rec_j_ptr + req, -1)   # no recovered token to draw (the finalize skips it)
