"""Sampling: the finish kernel, one program per row after the search launches.

It decides the rows the collect launch narrowed (sampling_candidates.py), the spread direct
rows, and every row left in mode FALLBACK (sampling_exact.py), then writes the token, the
threshold and log_norm. Launched with ONLY = DIRECT_LATE or PIVOT_LATE (sample_top_k_top_p_triton's
`side_finish`) it runs the same exact search on those rows only: the side stream that left them
finishes them itself, so that the main finish need not wait for it. The same code and layout,
so the same results as the main finish would have given them.
"""

import triton
import triton.language as tl

from .rng import PIVOT_STREAM
from .sampling_candidates import _finish_collected_sized
from .sampling_common import pdl_start
from .sampling_exact import _draw_tiles, _resolve_filtered
from .sampling_pivot import PIVOT_ROUNDS
from .sampling_select import (COLLECT, DIRECT, DIRECT_LATE, DONE, DRAW, FALLBACK, PIVOT_LATE, PIVOT_PENDING, PIVOTED,
                              REFINE_COUNT, REFINE_MASS, SPREAD, merge_best)
from .sampling_tiles import _BIG

PIVOT_FALLBACK_STREAM = tl.constexpr(PIVOT_ROUNDS * PIVOT_STREAM)   # a pivot row's exact search: fresh noise
_GUESS_UNITS = tl.constexpr(2.0 ** 40)   # fixed-point units per 1 of the exact search's top-p guess (NT_P2 <= 2^20)


@triton.jit(do_not_specialize=["NT", "S3", "stream"])
def _finish_kernel(
    logits_ptr, stride_row,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                      # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,              # [R] int32 / fp32
    seed_ptr, pos_ptr,                 # [R] int64
    tile_max_ptr,                      # [R, NT] fp32 (pass 1)
    st_i_ptr, st_f_ptr,                # [R, 4] int32, [R, 6] fp32 row states
    cn_ptr, cf_ptr, ci_ptr,            # collect partials [R, S3] int32, [R, S3, 3] fp32, [R, S3] int32
    list_ptr,                          # [R, NT_P2] int32 scratch
    cand_ptr,                          # [R, CAP] int64 (collected candidates; scratch of the search)
    tok_ptr,                           # [R] int64 out
    thr_ptr, lnorm_ptr,                # [R] fp32 out
    V, NT, S3, stream,
    TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr, CAP: tl.constexpr,
    GS: tl.constexpr, GUESS: tl.constexpr, SMALL: tl.constexpr, SPREAD_ROWS: tl.constexpr = False,
    ONLY: tl.constexpr = 0,                   # DIRECT_LATE / PIVOT_LATE: those rows only, by the exact search
    STORE_MODE: tl.constexpr = True,          # write the path taken back to st_i (for `paths`; ONLY = 0)
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    pdl_start(PDL)
    r = tl.program_id(0)
    mode = tl.load(st_i_ptr + r * 4)
    if ONLY != 0:
        mine = mode == ONLY
        mode = r * 0 + FALLBACK
    else:   # a side stream's rows (DIRECT, pivot rows, their late ones) are its own, even while it runs
        mine = ((mode != DONE) & (mode != DIRECT) & (mode != PIVOTED) & (mode != PIVOT_PENDING)
                & (mode != DIRECT_LATE) & (mode != PIVOT_LATE))
    if mine:
        r64 = r.to(tl.int64)
        row = logits_ptr + r64 * stride_row
        tm_row = tile_max_ptr + r64 * NT
        list_row = list_ptr + r64 * NT_P2
        cand_row = cand_ptr + r64 * CAP
        inv_t = tl.load(inv_temp_ptr + r)
        scale = tl.where(inv_t > 0, inv_t, 1.0)
        k = tl.load(top_k_ptr + r)
        p = tl.load(top_p_ptr + r)
        has_k = (k > 0) & (k < V)
        has_p = p < 1.0
        seed = tl.load(seed_ptr + r)
        pos = tl.load(pos_ptr + r)
        if tl.load(st_i_ptr + r * 4 + 3) < 0:     # a pivot row that no round accepted (sampling_pivot.py)
            stream = stream + PIVOT_FALLBACK_STREAM
        m = tl.load(st_f_ptr + r * 6 + 0)
        z = tl.load(st_f_ptr + r * 6 + 1)
        lo = tl.load(st_f_ptr + r * 6 + 2)
        hi = tl.load(st_f_ptr + r * 6 + 3)
        tau_min = tl.load(st_f_ptr + r * 6 + 4)
        target = tl.load(st_f_ptr + r * 6 + 5)
        tau = tau_min
        tok = r * 0 - 1
        mass = tl.full([], 0.0, tl.float32)
        if ONLY == 0:   # (a late row is a FALLBACK row: nothing else compiled)
            if (mode == REFINE_COUNT) | (mode == REFINE_MASS):   # a launch without the refine (refine=False)
                mode = r * 0 + FALLBACK
            spread = (mode == SPREAD) & SPREAD_ROWS   # the top tiles' candidates (collect launch)
            if (mode == COLLECT) | (mode == DRAW) | spread:
                # collect partials, in a fixed order (a spread row has none: nothing above hi = +inf)
                n_above = r * 0
                m_t1 = tl.full([], 0.0, tl.float32)
                best = tl.full([], -1.0, tl.float32)
                tok_a = r * 0 + _BIG
                if ~spread:
                    for c0 in range(0, S3, GS):
                        cc = c0 + tl.arange(0, GS)
                        cm = cc < S3
                        base = (r * S3 + cc).to(tl.int64)
                        n_above += tl.sum(tl.load(cn_ptr + base, mask=cm, other=0), axis=0)
                        mass += tl.sum(tl.load(cf_ptr + base * 3, mask=cm, other=0.0), axis=0)
                        m_t1 += tl.sum(tl.load(cf_ptr + base * 3 + 2, mask=cm, other=0.0), axis=0)
                        bs = tl.load(cf_ptr + base * 3 + 1, mask=cm, other=-1.0)
                        bi = tl.load(ci_ptr + base, mask=cm, other=_BIG)
                        best, tok_a = merge_best(bs, bi, best, tok_a, _BIG)
                if mode == DRAW:
                    tok = tok_a
                else:
                    # one call site of the sort cascade for both kinds of rows (its SASS is most of the
                    # kernel's: two sites cost up to 7% of a call at batch 128, session 58); a spread
                    # row's candidates are every token >= lo, with `_finish_direct_sized`'s arguments
                    n_cand = tl.load(st_i_ptr + r * 4 + 1)
                    t1_exact = tl.load(st_i_ptr + r * 4 + 2) != 0
                    m_min = tl.where(spread, -1.0, m_t1)
                    hi_c = tl.where(spread, float("inf"), hi)
                    target_c = tl.where(spread, -1.0, target)
                    has_k_c = tl.where(spread, k > 0, has_k & ~t1_exact)
                    # sort what is there: most brackets hold a few hundred tokens
                    ok, tau, tok, mass = _finish_collected_sized(cand_row, n_cand, n_above, mass, m_min, best, tok_a,
                                                                 m, z, k, p, tau_min, lo, hi_c, target_c, has_k_c,
                                                                 has_p, seed, pos, stream, SMALL, CAP)
                    if spread:
                        mode = tl.where(ok, DIRECT, FALLBACK)
                    elif ~ok:
                        mode = r * 0 + FALLBACK
                    if ~ok:
                        tau = tau_min
        if mode == FALLBACK:
            # the exact single-program search: guesses of lower bounds of the cuts from the sorted tile maxima
            t = tl.arange(0, NT_P2)
            stm = tl.sort(tl.load(tm_row + t, mask=t < NT, other=float("-inf")), 0, True)
            c_k = tl.max(tl.where(t == k - 1, stm, float("-inf")), axis=0)
            # the tiles' mass above each cut, each term in [0, 1] as an integer of 2^-40 units: an
            # integer scan is exact, so the guess is the same whatever the thread layout (the
            # side-stream finish at cap 2048 runs on more warps than the others)
            units = (tl.where(stm > float("-inf"), tl.exp(stm - m), 0.0) * _GUESS_UNITS).to(tl.int64)
            cmass = tl.cumsum(units, axis=0).to(tl.float32) * (1.0 / _GUESS_UNITS)
            c_p = tl.max(tl.where(t == tl.sum((cmass < p * z).to(tl.int32), axis=0), stm, float("-inf")), axis=0)
            if not GUESS:                   # test knob: start from the max, a wrong guess
                c_k = m
                c_p = m
            if has_k | has_p:
                tau, tok, mass = _resolve_filtered(row, tm_row, list_row, cand_row, V, NT, scale, m, z, k, p,
                                                   tau_min, has_k, has_p, c_k, c_p, seed, pos, stream,
                                                   TILE, G, NT_P2, CAP)
            else:   # min-p alone (the plan's FALLBACK under SEARCH=False, or a failed collect): tau is known
                tau = tau_min
                tok = r * 0 - 1
            if tok < 0:
                tok, mass = _draw_tiles(row, tm_row, list_row, V, NT, scale, m, tau, seed, pos, stream,
                                        TILE, G, NT_P2)
        tl.store(tok_ptr + r, tok.to(tl.int64))
        tl.store(thr_ptr + r, tau)
        tl.store(lnorm_ptr + r, tl.log(mass))
        # the path taken (sample_top_k_top_p_triton's `paths`). Not while a side stream may run: a
        # spread row decided here becomes DIRECT, which the direct rows' kernel would take as its
        # own; and a late row keeps its mode, which the main finish, maybe running, must skip
        if (ONLY == 0) & STORE_MODE:
            tl.store(st_i_ptr + r * 4, mode)
