"""Sampling: the plan kernel, one program per row after pass 1.

It combines pass 1's block partials (row max m, normaliser Z; an invalid row gets token -1),
takes the argmax of greedy rows, draws rows without a filter (a two-level exponential race),
decides or marks the small top-k rows (sampling_direct.py), leaves rows of top-p / min-p
alone to the pivot rounds (sampling_pivot.py) and gives the other filtered rows a bracket
of their thresholds (sampling_select.plan_filtered).
"""

import triton
import triton.language as tl

from .rng import SUB_STREAM, exponential, random_words
from .sampling_common import pdl_start, select_word, token_noise
from .sampling_direct import _direct_top_k, _spread_plan
from .sampling_select import DIRECT, DONE, DRAW, FALLBACK, PIVOT_PENDING, PIVOTED, SPREAD, plan_filtered
from .sampling_tiles import _BIG, _first_argmax


@triton.jit
def _combine_chunks(part_f_ptr, r, S, S_P2: tl.constexpr):
    """Row max m, normaliser Z = sum exp(x - m) and the number of finite tokens, from pass 1's
    S block partials (the count only on rows with a histogram: 0 on the others)."""
    si = tl.arange(0, S_P2)
    sm = si < S
    pb = (r * S + si).to(tl.int64)
    m_s = tl.load(part_f_ptr + pb * 4 + 0, mask=sm, other=float("-inf"))
    z_s = tl.load(part_f_ptr + pb * 4 + 1, mask=sm, other=0.0)
    n_fin = tl.sum(tl.load(part_f_ptr + pb * 4 + 3, mask=sm, other=0.0), axis=0).to(tl.int32)
    m = tl.max(m_s, axis=0)
    w_s = tl.exp(m_s - tl.where(m == float("-inf"), 0.0, m))
    z = tl.sum(z_s * w_s, axis=0)
    return m, z, n_fin


@triton.jit
def _pairwise_row_sums(w, NC: tl.constexpr, N: tl.constexpr):
    """Row sums [NC] of w [NC, N] (N a power of two) by a fixed tree of pairwise sums:
    (w0 + w1) + (w2 + w3), ... A sum of two floats is the same whichever order the threads
    add them in, so the result does not depend on the thread layout the compiler gives w (a
    plain tl.sum's order does, and the layout can differ between variants of one kernel)."""
    for i in tl.static_range(16):
        if (N >> i) > 1:
            w = tl.sum(tl.reshape(w, [NC, N >> (i + 1), 2]), axis=2)
    return tl.reshape(w, [NC])


@triton.jit
def _draw_unfiltered(row, tm_row, ts_row, NT, V, scale, m, seed, pos, stream,
                     TILE: tl.constexpr, NT_P2: tl.constexpr, SUB: tl.constexpr):
    """The draw of a row without top-k / top-p / min-p: a two-level exponential race.

    Sub-chunk c (tokens [c * SUB, (c + 1) * SUB)) has the mass M_c = sum of exp(x - m) over
    its tiles (pass 1's tile sums, exp(tile max - m) each); the race argmax_c M_c / E_c (E_c:
    word c % 4 of index c // 4 on stream + SUB_STREAM) picks c with probability M_c / Z, then
    argmax over c's tokens of exp(x - m) / E_t (the token noise of stream) picks t with
    probability exp(x_t - m) / M_c: t is drawn with probability exp(x_t - m) / Z, with the
    noise of SUB tokens only. Ties go to the lowest sub-chunk, then the lowest token. M_c is
    summed in a fixed order (`_pairwise_row_sums`), so every variant of the plan kernel (with or
    without filters, pivot rounds, search) draws a seeded row's same token.
    """
    TPS: tl.constexpr = SUB // TILE                 # tiles per sub-chunk
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    ts = tl.load(ts_row + t, mask=t < NT, other=0.0)
    w = tl.where(tm > float("-inf"), ts * tl.exp(tm - m), 0.0)
    if TPS <= NT_P2:
        NC: tl.constexpr = NT_P2 // TPS
        mass = _pairwise_row_sums(tl.reshape(w, [NC, TPS]), NC, TPS)   # [NC]: a sub-chunk's tiles are consecutive
    else:
        NC: tl.constexpr = 1
        mass = _pairwise_row_sums(tl.reshape(w, [1, NT_P2]), 1, NT_P2)   # one sub-chunk holds the row
    c = tl.arange(0, NC)
    w0, w1, w2, w3 = random_words(seed, pos, stream + SUB_STREAM, c >> 2)
    score = tl.where(mass > 0.0, mass / exponential(select_word(w0, w1, w2, w3, c & 3)), -1.0)
    best = tl.max(score, axis=0)
    c_win = tl.min(tl.where(score == best, c, NC), axis=0)
    offs = c_win * SUB + tl.arange(0, SUB)
    x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * scale
    sc = tl.where(x > float("-inf"), tl.exp(x - m) / token_noise(seed, pos, stream, offs), -1.0)
    bs = tl.max(sc, axis=0)
    return tl.min(tl.where(sc == bs, offs, _BIG), axis=0)


@triton.jit(do_not_specialize=["NT", "NBLK", "stream", "KMAX", "SK_HI"])
def _plan_kernel(
    logits_ptr, stride_row,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                      # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,              # [R] int32 / fp32
    log_min_p_ptr,                     # [R] fp32: log(min_p), -inf = off
    tile_max_ptr,                      # [R, NT] fp32 (pass 1)
    tile_sum_ptr,                      # [R, NT] fp32 (pass 1, unfiltered rows)
    part_f_ptr,                        # [R, NBLK, 4] fp32 (pass 1)
    hist_ptr, hist_top_ptr,            # [R, NBLK, HB] int16, [R, NBLK] int32 (pass 1)
    seed_ptr, pos_ptr,                 # [R] int64
    list_ptr,                          # [R, NT_P2] int32 scratch
    cand_ptr,                          # [R, CAP] int64 scratch
    tok_ptr,                           # [R] int64 out
    thr_ptr, rmax_ptr, lnorm_ptr,      # [R] fp32 out
    st_i_ptr, st_f_ptr,                # [R, 4] int32, [R, 6] fp32 out: row states
    V, NT, NBLK, stream, KMAX, SK_HI,
    TILE: tl.constexpr, NT_P2: tl.constexpr, S_P2: tl.constexpr, CAP: tl.constexpr,
    GB: tl.constexpr, SELECT: tl.constexpr, HB: tl.constexpr, G: tl.constexpr, SMALL: tl.constexpr, SUB: tl.constexpr,
    TOPT: tl.constexpr = 0, GD: tl.constexpr = 16, PIPE: tl.constexpr = False, DS: tl.constexpr = 0,
    DEFER: tl.constexpr = 0, SEARCH: tl.constexpr = True,
    SPREAD_ROWS: tl.constexpr = False,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
    PIVOT: tl.constexpr = False,              # top-p alone: first candidate of the pivot rejection
):
    """Rows without a threshold get their token here, and so do rows with 1 <= top_k <= KMAX
    (`_direct_top_k`, mode DIRECT; FALLBACK when it cannot decide: pass 1 gave them no
    histogram); the others a plan (sampling_select.py). DEFER = 1: the direct rows are only
    marked DIRECT here and decided by the collect launch (`_collect_direct_kernel`), in
    parallel with the other rows' refine and collect instead of before them. DEFER = 2 (the
    direct rows) and SPREAD_ROWS (rows with KMAX < top_k <= SK_HI < V: the launcher's
    `spread_kmax`): the plan only lists the row's top tiles (mode SPREAD, lo = a lower bound
    of t_k, hi = +inf, top tiles in the state's 4th int; FALLBACK above 2 * KMAX, resp.
    2 * SK_HI tiles); the collect launch reads them, many programs per row, and the finish
    decides the row with the same `_finish_collected` call as `_direct_top_k`. SEARCH = False
    (no refine or collect launch follows): the rows that would need the bracket search take
    the finish's exact single-program search (FALLBACK) instead. PIVOT: rows with top-p
    and / or min-p and no top-k wait in mode PIVOT_PENDING for sampling_pivot.py's rounds;
    those with one of the two filters first draw a candidate as a row without a filter does
    (top-p: to be verified; min-p: kept here, mode PIVOTED, when it reaches the threshold)."""
    pdl_start(PDL)
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    inv_t = tl.load(inv_temp_ptr + r)
    k = tl.load(top_k_ptr + r)
    p = tl.load(top_p_ptr + r)
    lmp = tl.load(log_min_p_ptr + r)
    lmp = tl.where(lmp > 0.0, 0.0, lmp)   # min_p > 1 acts as 1: the max is always kept (NaN stays off)
    has_k = (k > 0) & (k < V)
    has_p = p < 1.0
    has_mp = lmp > float("-inf")
    m, z, n_fin = _combine_chunks(part_f_ptr, r, NBLK, S_P2)
    invalid = (z != z) | (m == float("-inf")) | (m == float("inf"))

    mode = r * 0 + DONE
    tok = r * 0 - 1
    tau = tl.full([], float("nan"), tl.float32)
    lnorm = tl.full([], float("nan"), tl.float32)
    lo = tl.full([], 0.0, tl.float32)
    hi = lo
    tau_min = tl.where(has_mp, m + lmp, float("-inf"))
    t1_exact = has_mp & ~has_k
    n_top = r * 0
    cand = r * 0
    if ~invalid:
        tau = tl.full([], float("-inf"), tl.float32)
        lnorm = tl.log(z)
        if ~(inv_t > 0):  # greedy (a NaN 1/T too, as in pass 1 and the reference)
            tok = _first_argmax(logits_ptr + r64 * stride_row, tile_max_ptr + r64 * NT, NT, m, V, TILE, NT_P2)
        elif (~has_k) & (~has_p) & (~has_mp):
            tok = _draw_unfiltered(logits_ptr + r64 * stride_row, tile_max_ptr + r64 * NT, tile_sum_ptr + r64 * NT,
                                   NT, V, inv_t, m, tl.load(seed_ptr + r), tl.load(pos_ptr + r), stream,
                                   TILE, NT_P2, SUB)
        elif PIVOT & (~has_k) & (has_p | has_mp):
            # sampling_pivot.py: no candidate yet (-1), no pivot, Z_t = Z until round 1 sums it
            mode = r * 0 + PIVOT_PENDING
            cand = r * 0 - 1
            lo = tl.full([], float("-inf"), tl.float32)
            hi = z
            n_top = r * 0 - 1           # a pivot row: its fallback draws on the fallback stream
            tau = tl.full([], float("nan"), tl.float32)     # no threshold (unless the row falls back)
            lnorm = tau
            if ~(has_p & has_mp):       # one filter: a first candidate from the whole row
                c0 = _draw_unfiltered(logits_ptr + r64 * stride_row, tile_max_ptr + r64 * NT, tile_sum_ptr + r64 * NT,
                                      NT, V, inv_t, m, tl.load(seed_ptr + r), tl.load(pos_ptr + r), stream,
                                      TILE, NT_P2, SUB)
                x0 = tl.load(logits_ptr + r64 * stride_row + c0).to(tl.float32) * inv_t   # its value
                if has_p:               # top-p alone: the rounds verify it
                    cand = c0
                    lo = x0
                elif x0 >= tau_min:     # min-p alone: kept
                    tok = c0
                    mode = r * 0 + PIVOTED
        elif SELECT:
            spread = (has_k & (k > KMAX) & (k <= SK_HI)) if SPREAD_ROWS else False   # (compiled when asked)
            if spread:      # the tiles by counted bounds (TOPT 0): a topk of width k would cost more
                lo, n_top = _spread_plan(tile_max_ptr + r64 * NT, list_ptr + r64 * NT_P2, NT, m, k, 2 * SK_HI,
                                         0, NT_P2)
                mode = tl.where(n_top <= 2 * SK_HI, SPREAD, FALLBACK)
                hi = tl.full([], float("inf"), tl.float32)
            elif has_k & (k <= KMAX):
                mode = r * 0 + DIRECT
                if DEFER == 2:
                    lo, n_top = _spread_plan(tile_max_ptr + r64 * NT, list_ptr + r64 * NT_P2, NT, m, k, 2 * KMAX,
                                             TOPT, NT_P2)
                    mode = tl.where(n_top <= 2 * KMAX, SPREAD, FALLBACK)
                    hi = tl.full([], float("inf"), tl.float32)
                if DEFER == 0:
                    ok, tau_d, tok_d, mass_d = _direct_top_k(
                        logits_ptr + r64 * stride_row, tile_max_ptr + r64 * NT, list_ptr + r64 * NT_P2,
                        cand_ptr + r64 * CAP, V, NT, inv_t, m, z, k, p, tau_min, has_p, 2 * KMAX,
                        tl.load(seed_ptr + r), tl.load(pos_ptr + r), stream,
                        TILE, G, NT_P2, CAP, SMALL, TOPT, GD, PIPE, DS)
                    if ok:
                        tok = tok_d
                        tau = tau_d
                        lnorm = tl.log(mass_d)
                    else:
                        mode = r * 0 + FALLBACK
            elif SEARCH:
                mode, lo, hi, t1_exact = plan_filtered(hist_ptr + r64 * NBLK * HB, hist_top_ptr + r64 * NBLK, NBLK,
                                                       n_fin, m, z, k, p, tau_min, has_k, has_p, has_mp, CAP, GB)
            else:
                mode = r * 0 + FALLBACK
        elif (~has_k) & (~has_p):
            mode = r * 0 + DRAW
        else:
            mode = r * 0 + FALLBACK
    tl.store(tok_ptr + r, tok.to(tl.int64))
    tl.store(thr_ptr + r, tau)
    tl.store(rmax_ptr + r, tl.where(invalid, float("nan"), m))
    tl.store(lnorm_ptr + r, lnorm)
    tl.store(st_i_ptr + r * 4, mode)
    tl.store(st_i_ptr + r * 4 + 1, cand)
    tl.store(st_i_ptr + r * 4 + 2, t1_exact.to(tl.int32))
    tl.store(st_i_ptr + r * 4 + 3, n_top)
    tl.store(st_f_ptr + r * 6 + 0, m)
    tl.store(st_f_ptr + r * 6 + 1, z)
    tl.store(st_f_ptr + r * 6 + 2, lo)
    tl.store(st_f_ptr + r * 6 + 3, hi)
    tl.store(st_f_ptr + r * 6 + 4, tau_min)
    tl.store(st_f_ptr + r * 6 + 5, -1.0)
