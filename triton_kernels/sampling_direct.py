"""Sampling: rows with a small top-k (1 <= top_k <= kmax) decided from their top tiles, and
the spread rows (kmax < top_k <= spread_kmax) collected from them.

The k tiles with the largest maxima bound the k-th largest value from below, so the tokens
the filters can keep lie in the few tiles whose max reaches that bound: one program reads
them and finishes the row as a complete candidate set (`_direct_top_k`). Where it runs is a
launcher knob with the same results (sampling_topk_topp.sample_top_k_top_p_triton's
`direct_in`): in the plan, in a kernel of its own (`_direct_rows_kernel`), in the collect
launch (`_collect_direct_kernel`), or spread over the collect launch's programs. Wider
rows up to spread_kmax always take that last way (`_spread_plan`, `_spread_collect`, and
the finish's sort, with `_finish_direct_sized`'s arguments): one program would read their
hundreds of tiles alone.
"""

import triton
import triton.language as tl

from .sampling_candidates import _finish_collected, _finish_collected_sized
from .sampling_common import pack_key, pdl_start, unpack_key
from .sampling_select import (DIRECT, DIRECT_LATE, FALLBACK, PIVOT_PENDING, SPREAD, collect_program,
                              pivot_collect_program)
from .sampling_tiles import _BIG, _collect, _group_x, _select_tiles

BOUND_SLACK = 16           # `_tile_bound`: a second round only while more than k + BOUND_SLACK tiles reach lo


@triton.jit
def _top_tiles(tm_row, NT, k, TOPT: tl.constexpr, NT_P2: tl.constexpr):
    """(t_k, ids [TOPT] int32, n_sel) from one `tl.topk` of the tiles' (max, id) keys.

    t_k is the k-th largest tile max (-inf with fewer than k tiles; needs k <= TOPT or
    k > NT_P2), exactly the value at k - 1 of the sorted maxima: the keys order the tiles
    by (max, id), so the k-th key holds the k-th largest max (-0.0 is read as +0.0, which
    compares equal). ids: the tiles of the TOPT largest keys, largest first; n_sel: the
    tiles whose max is >= max(t_k, -FLT_MAX). When n_sel <= TOPT those are exactly ids[:n_sel]
    (every such tile's key is above every other tile's), so no list of them is built.
    """
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    tx, tid = unpack_key(tl.topk(pack_key(tm, t), TOPT))
    lo = tl.max(tl.where(tl.arange(0, TOPT) == k - 1, tx, float("-inf")), axis=0)
    n_sel = tl.sum((tm >= tl.maximum(lo, -3.4028234663852886e38)).to(tl.int32), axis=0)
    return lo, tid, n_sel


@triton.jit
def _bound_round(tm, lo, hi, k, P: tl.constexpr):
    """One round of `_tile_bound`: the P probes hi - (hi - lo) (j + 1) / P (the last one lo
    itself) counted against the tile maxima tm at once; returns the new (lo, hi) and how many
    tiles reach the new lo."""
    j = tl.arange(0, P)
    probes = tl.where(j == P - 1, lo, hi - (hi - lo) * ((j + 1).to(tl.float32) * (1.0 / P)))
    cnt = tl.sum((tm[None, :] >= probes[:, None]).to(tl.int32), axis=1)      # [P], falls as the probe rises
    reach = cnt >= k
    lo_new = tl.maximum(lo, tl.max(tl.where(reach, probes, float("-inf")), axis=0))
    hi_new = tl.minimum(hi, tl.min(tl.where(reach, float("inf"), probes), axis=0))
    return lo_new, hi_new, tl.min(tl.where(reach, cnt, _BIG), axis=0)


@triton.jit
def _tile_bound(tm_row, NT, m, k, NT_P2: tl.constexpr, P: tl.constexpr = 16, ROUNDS: tl.constexpr = 2,
                SLACK: tl.constexpr = BOUND_SLACK):
    """(lo, n_sel): a lower bound lo of t_k, the k-th largest tile max, found by counting
    instead of sorting, and the number of tiles whose max is >= max(lo, -FLT_MAX).

    A bracket [lo, hi) with count(lo) >= k tiles (count(x): tiles whose max is >= x) starts at
    [smallest finite tile max, row max m] and shrinks up to ROUNDS times: the P probes hi -
    (hi - lo) (j + 1) / P (the last one lo itself) are counted at once; lo becomes the largest
    probe counted >= k times, hi the smallest counted fewer. count(lo) >= k means lo <= t_k,
    so the tiles reaching lo hold every tile reaching t_k; they exceed k only by the tiles
    whose max lies in [lo, t_k), a bracket (m - smallest tile max) / P**rounds wide. A round
    after the first runs only while more than k + SLACK tiles reach lo (on peaked logits one
    round usually leaves a few tiles more than k, and a round costs about 1 µs on the H200).
    With fewer than k finite tiles, lo = -inf (every finite tile). A function of the tile
    maxima and k only (so of the row, never of its batch).
    """
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    n_fin = tl.sum((tm > float("-inf")).to(tl.int32), axis=0)
    enough = n_fin >= k
    lo = tl.where(enough, tl.min(tl.where(tm > float("-inf"), tm, float("inf")), axis=0), m)
    hi = m
    lo, hi, n_lo = _bound_round(tm, lo, hi, k, P)
    for _ in tl.static_range(ROUNDS - 1):
        if enough & (n_lo > k + SLACK):
            lo, hi, n_lo = _bound_round(tm, lo, hi, k, P)
    lo = tl.where(enough, lo, float("-inf"))
    n_sel = tl.sum((tm >= tl.maximum(lo, -3.4028234663852886e38)).to(tl.int32), axis=0)
    return lo, n_sel


@triton.jit
def _collect_top(row, tid, n_sel, cand_row, V, scale, lo,
                 TILE: tl.constexpr, TOPT: tl.constexpr, GD: tl.constexpr, CAP: tl.constexpr):
    """`_collect(.., lo, +inf)` over the tiles ids[:n_sel] ([TOPT] int32, n_sel <= TOPT) held
    in registers: stores pack_key(x, token) of the finite tokens >= lo (the first CAP of
    them) and returns how many. Groups of GD tiles; at GD = TOPT the whole set is one load.
    The stored set is the same as `_collect`'s (only the slots differ: the finish sorts it).
    """
    n = n_sel * 0
    for g in tl.static_range(0, TOPT, GD):
        if g < n_sel:
            if GD == TOPT:
                gid = tid
            else:   # group g of the ids: one masked max over the TOPT // GD rows
                rows = tl.reshape(tid, [TOPT // GD, GD])
                gid = tl.max(tl.where(tl.arange(0, TOPT // GD)[:, None] == g // GD, rows, -1), axis=0)
            gm = g + tl.arange(0, GD) < n_sel
            x, offs = _group_x(row, gid[:, None], gm, V, scale, TILE)
            c2 = ((x >= lo) & (x > float("-inf"))).to(tl.int32)
            rc = tl.sum(c2, axis=1)                                   # per tile
            pos = n + (tl.cumsum(rc, axis=0) - rc)[:, None] + tl.cumsum(c2, axis=1) - 1
            tl.store(cand_row + pos, pack_key(x, offs), mask=(c2 > 0) & (pos < CAP))
            n += tl.sum(rc, axis=0)
    tl.debug_barrier()
    return n


@triton.jit
def _spread_plan(tm_row, list_row, NT, m, k, max_tiles, TOPT: tl.constexpr, NT_P2: tl.constexpr):
    """Plan of a direct row whose tiles the collect launch reads (direct_in="spread"): (lo,
    n_sel) as `_direct_top_k` finds them; when n_sel <= max_tiles the ids of those tiles are in
    list_row[:n_sel] (their order is free: the finish sorts the candidates)."""
    if TOPT > 0:
        lo, tid, n_sel = _top_tiles(tm_row, NT, k, TOPT, NT_P2)
        if n_sel <= TOPT:
            tl.store(list_row + tl.arange(0, TOPT), tid, mask=tl.arange(0, TOPT) < n_sel)
        elif n_sel <= max_tiles:
            _select_tiles(tm_row, list_row, NT, tl.maximum(lo, -3.4028234663852886e38), NT_P2)
    else:
        lo, n_sel = _tile_bound(tm_row, NT, m, k, NT_P2)
        if n_sel <= max_tiles:
            _select_tiles(tm_row, list_row, NT, tl.maximum(lo, -3.4028234663852886e38), NT_P2)
    return lo, n_sel


@triton.jit
def _spread_collect(row, list_row, cand_row, count_ptr, n_sel, V, scale, lo, c, S3,
                    TILE: tl.constexpr, TPP: tl.constexpr, CAP: tl.constexpr):
    """Program c of a spread row in the collect launch: the listed tiles c, c + S3, ...
    (TPP at a time); appends pack_key(x, token) of their finite tokens >= lo to the row's
    candidates (slots from an atomic count, the first CAP kept)."""
    lo_fin = tl.maximum(lo, -3.4028234663852886e38)
    for j0 in range(0, n_sel, S3 * TPP):
        j = j0 + c + S3 * tl.arange(0, TPP)
        jm = j < n_sel
        x, offs = _group_x(row, tl.load(list_row + j, mask=jm, other=0)[:, None], jm, V, scale, TILE)
        c2 = ((x >= lo_fin) & (x > float("-inf"))).to(tl.int32)
        rc = tl.sum(c2, axis=1)
        nc = tl.sum(rc, axis=0)
        if nc > 0:
            first = tl.atomic_add(count_ptr, nc)
            pos = first + (tl.cumsum(rc, axis=0) - rc)[:, None] + tl.cumsum(c2, axis=1) - 1
            tl.store(cand_row + pos, pack_key(x, offs), mask=(c2 > 0) & (pos < CAP))


@triton.jit
def _finish_direct(cand_row, n, m, z, k, p, tau_min, lo, has_p, seed, pos, stream, S: tl.constexpr):
    """`_finish_collected` of a complete candidate set (every finite token >= lo), sorted as S keys."""
    zero = tl.full([], 0.0, tl.float32)
    return _finish_collected(cand_row, n, k * 0, zero, zero - 1.0, zero - 1.0, k * 0 + _BIG, m, z, k, p, tau_min, lo,
                             zero + float("inf"), zero - 1.0, k > 0, has_p, seed, pos, stream, S)


@triton.jit
def _finish_direct_sized(cand_row, n, m, z, k, p, tau_min, lo, has_p, seed, pos, stream,
                         SMALL: tl.constexpr, CAP: tl.constexpr):
    """`_finish_direct` at the sort size `_finish_collected_sized` picks for n candidates."""
    zero = tl.full([], 0.0, tl.float32)
    return _finish_collected_sized(cand_row, n, k * 0, zero, zero - 1.0, zero - 1.0, k * 0 + _BIG, m, z, k, p,
                                   tau_min, lo, zero + float("inf"), zero - 1.0, k > 0, has_p, seed, pos, stream,
                                   SMALL, CAP)


@triton.jit
def _direct_top_k(row, tm_row, list_row, cand_row, V, NT, scale, m, z, k, p, tau_min, has_p, max_tiles,
                  seed, pos, stream,
                  TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr, CAP: tl.constexpr,
                  SMALL: tl.constexpr, TOPT: tl.constexpr = 0, GD: tl.constexpr = 16, PIPE: tl.constexpr = False,
                  DS: tl.constexpr = 0, SLACK: tl.constexpr = BOUND_SLACK):
    """Exact threshold and draw of a row with a small top-k (1 <= k < V), from its top tiles.

    t_k, the k-th largest tile max, bounds the k-th largest value v_k from below: the k tiles
    with the largest maxima each hold a value >= t_k. So does any lo <= t_k, and every token
    >= lo lies in one of the tiles whose max is >= lo; once they are collected (all of them:
    hi = +inf) the candidates hold every token the top-k, min-p and top-p cuts can keep (tau
    >= t1 = max(tau_min, v_k) >= lo). `_finish_collected` then decides tau and draws exactly as
    the finish does for such a complete set. With fewer than k finite tiles, lo = -inf and the
    candidates are all finite tokens.

    TOPT = 0: lo from counting the tile maxima against probes (`_tile_bound` with SLACK, -1
    to run every round: no sort; a few tiles more than k are read), the tiles listed through
    global memory (`_select_tiles`) and read GD at a time (software-pipelined with PIPE).
    TOPT > 0 (a power of two >= min(kmax, NT_P2)): lo = t_k exactly and the top tiles' ids
    from one `tl.topk` of (max, id) keys (`_top_tiles`), the tiles read GD at a time straight
    from those ids (`_collect_top`; ties that put more than TOPT tiles at t_k take the list). The candidate sets differ only
    by tokens below v_k, which sort after the kept ones and add +0.0: the sorted candidates'
    leading positions, every sum and the draw are the same while the sort size is.

    DS > 0 (a power of two < SMALL): at most DS candidates are sorted as DS keys instead of
    SMALL. The kept tokens hold the same leading positions and the rest add +0.0, but the
    sums then run over another layout: the same results only where the experiment shows it.

    Returns (ok, tau, token, kept mass); ok is False when more than `max_tiles` tiles reach
    lo or more than CAP tokens do (ties), or a check of `_finish_collected` fails.
    """
    if TOPT > 0:
        lo, tid, n_sel = _top_tiles(tm_row, NT, k, TOPT, NT_P2)
    else:
        lo, n_sel = _tile_bound(tm_row, NT, m, k, NT_P2, SLACK=SLACK)
    lo_fin = tl.maximum(lo, -3.4028234663852886e38)      # x >= lo_fin: the finite x >= lo
    ok = n_sel <= max_tiles
    tau = tau_min
    tok = k * 0 - 1
    mass = tl.full([], 0.0, tl.float32)
    if ok:
        if TOPT > 0:
            if n_sel <= TOPT:
                n = _collect_top(row, tid, n_sel, cand_row, V, scale, lo_fin, TILE, TOPT, GD, CAP)
            else:
                n, _, _ = _collect(row, tm_row, list_row, cand_row, V, NT, scale, m, lo_fin, float("inf"),
                                   TILE, GD, NT_P2, CAP, PIPE)
        else:
            n, _, _ = _collect(row, tm_row, list_row, cand_row, V, NT, scale, m, lo_fin, float("inf"),
                               TILE, GD, NT_P2, CAP, PIPE)
        if DS > 0:
            if n <= DS:
                ok, tau, tok, mass = _finish_direct(cand_row, n, m, z, k, p, tau_min, lo, has_p, seed, pos, stream,
                                                    DS)
            else:
                ok, tau, tok, mass = _finish_direct_sized(cand_row, n, m, z, k, p, tau_min, lo, has_p, seed, pos,
                                                          stream, SMALL, CAP)
        else:                   # the finish's sort sizes: the same sums as its complete sets
            ok, tau, tok, mass = _finish_direct_sized(cand_row, n, m, z, k, p, tau_min, lo, has_p, seed, pos, stream,
                                                      SMALL, CAP)
    return ok, tau, tok, mass


@triton.jit
def _decide_direct_row(logits_ptr, stride_row, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr, tile_max_ptr,
                       st_i_ptr, st_f_ptr, cand_ptr, list_ptr, tok_ptr, thr_ptr, lnorm_ptr, r, V, NT, stream, KMAX,
                       CAP: tl.constexpr, TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr,
                       SMALL: tl.constexpr, TOPT: tl.constexpr, GD: tl.constexpr, PIPE: tl.constexpr,
                       DS: tl.constexpr, FAIL: tl.constexpr):
    """Decide row r, which the plan (launched with DEFER = 1) marked DIRECT, as the plan would
    have: the same `_direct_top_k` call on the same inputs (m, z and the min-p threshold as the
    plan stored them), the same results. A row it cannot decide goes to mode FAIL: FALLBACK (the
    finish's search) or DIRECT_LATE (the same search by a finish launch on this kernel's stream);
    the plan's stores stand for it: token -1, tau -inf, log Z."""
    r64 = r.to(tl.int64)
    k = tl.load(top_k_ptr + r)
    p = tl.load(top_p_ptr + r)
    ok, tau, tok, mass = _direct_top_k(
        logits_ptr + r64 * stride_row, tile_max_ptr + r64 * NT, list_ptr + r64 * NT_P2,
        cand_ptr + r64 * CAP, V, NT, tl.load(inv_temp_ptr + r), tl.load(st_f_ptr + r * 6 + 0),
        tl.load(st_f_ptr + r * 6 + 1), k, p, tl.load(st_f_ptr + r * 6 + 4), p < 1.0, 2 * KMAX,
        tl.load(seed_ptr + r), tl.load(pos_ptr + r), stream, TILE, G, NT_P2, CAP, SMALL, TOPT, GD, PIPE, DS)
    if ok:
        tl.store(tok_ptr + r, tok.to(tl.int64))
        tl.store(thr_ptr + r, tau)
        tl.store(lnorm_ptr + r, tl.log(mass))
    else:
        tl.store(st_i_ptr + r * 4, r * 0 + FAIL)


@triton.jit(do_not_specialize=["V", "NT", "stream", "KMAX"])
def _direct_rows_kernel(
    logits_ptr, stride_row,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                      # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,              # [R] int32 / fp32
    seed_ptr, pos_ptr,                 # [R] int64
    tile_max_ptr,                      # [R, NT] fp32 (pass 1)
    st_i_ptr, st_f_ptr,                # [R, 4] int32, [R, 6] fp32 row states
    cand_ptr,                          # [R, CAP] int64 scratch
    list_ptr,                          # [R, NT_P2] int32 scratch
    tok_ptr, thr_ptr, lnorm_ptr,       # [R] int64 / fp32 / fp32 out (direct rows)
    V, NT, stream, KMAX,
    CAP: tl.constexpr, TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr, SMALL: tl.constexpr,
    TOPT: tl.constexpr, GD: tl.constexpr, PIPE: tl.constexpr, DS: tl.constexpr,
    LATE: tl.constexpr = False,               # a row it cannot decide: DIRECT_LATE (else FALLBACK)
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """Grid (R,): program r decides row r when the plan (DEFER = 1) marked it DIRECT
    (`_decide_direct_row`); the other programs return. direct_in="beside" launches it on a
    stream of its own beside the refine and collect launches: they read and write only rows in
    the modes REFINE_COUNT / REFINE_MASS / COLLECT / DRAW, this kernel only the DIRECT rows.
    With LATE (side_finish) a row it cannot decide goes to DIRECT_LATE, which the finish launch
    after it on its stream decides; the main finish, which may then run beside it, skips DIRECT
    and DIRECT_LATE rows and writes no mode back (a spread row it decides would read as DIRECT)."""
    pdl_start(PDL)
    r = tl.program_id(0)
    if tl.load(st_i_ptr + r * 4) == DIRECT:
        _decide_direct_row(logits_ptr, stride_row, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr,
                           tile_max_ptr, st_i_ptr, st_f_ptr, cand_ptr, list_ptr, tok_ptr, thr_ptr, lnorm_ptr,
                           r, V, NT, stream, KMAX, CAP, TILE, G, NT_P2, SMALL, TOPT, GD, PIPE, DS,
                           DIRECT_LATE if LATE else FALLBACK)


@triton.jit(do_not_specialize=["V", "NT", "S3", "BPP", "stream", "KMAX"])
def _collect_direct_kernel(
    logits_ptr, stride_row,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                      # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,              # [R] int32 / fp32
    seed_ptr, pos_ptr,                 # [R] int64
    tile_max_ptr,                      # [R, NT] fp32 (pass 1)
    st_i_ptr, st_f_ptr,                # [R, 4] int32, [R, 6] fp32 row states
    cand_ptr,                          # [R, CAP] int64 (candidates)
    n_ptr, f_ptr, i_ptr,               # collect partials [R, S3] int32, [R, S3, 3] fp32, [R, S3] int32 out
    list_ptr,                          # [R, NT_P2] int32 scratch
    tok_ptr, thr_ptr, lnorm_ptr,       # [R] int64 / fp32 / fp32 out (direct rows)
    mass_ptr,                          # [R, NC] fp32 out (PIVOT_MASS): round 1's masses of the pivot rows
    V, NT, S3, BPP, stream, KMAX, NC,
    BLOCK: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr,
    SMALL: tl.constexpr, TOPT: tl.constexpr, GD: tl.constexpr, PIPE: tl.constexpr, DS: tl.constexpr,
    TPP: tl.constexpr = 8, DEFER: tl.constexpr = 1, SPREAD_ROWS: tl.constexpr = False,
    ATOMIC_SLOTS: tl.constexpr = False,       # sampling_select.collect_program's
    PIVOT_MASS: tl.constexpr = False,         # pivot rows: round 1's masses (sampling_select.pivot_collect_program)
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """The collect launch (sampling_select.collect_program) in which, with DEFER = 1, program 0
    of each row the plan marked DIRECT decides it as the plan would have: the same
    `_direct_top_k` call on the same inputs (m, z and the min-p threshold as the plan stored
    them), the same results; FALLBACK rows go on to the finish's search. With SPREAD_ROWS the
    rows the plan marked SPREAD have their listed top tiles read by all their programs
    (`_spread_collect`, TPP tiles a load); the finish decides them. (Each mode compiles only
    its own branches.) With PIVOT_MASS the programs of the rows in mode PIVOT_PENDING sum round 1
    of their pivot rounds (`pivot_collect_program`), as `_collect_kernel`'s do."""
    pdl_start(PDL)
    r = tl.program_id(0)
    c = tl.program_id(1)
    mode = tl.load(st_i_ptr + r * 4)
    spread = (mode == SPREAD) if SPREAD_ROWS else False
    direct = (mode == DIRECT) if DEFER == 1 else False
    pivot_row = (mode == PIVOT_PENDING) if PIVOT_MASS else False
    if spread:
        r64 = r.to(tl.int64)
        _spread_collect(logits_ptr + r64 * stride_row, list_ptr + r64 * NT_P2, cand_ptr + r64 * CAP,
                        st_i_ptr + r * 4 + 1, tl.load(st_i_ptr + r * 4 + 3), V, tl.load(inv_temp_ptr + r),
                        tl.load(st_f_ptr + r * 6 + 2), c, S3, TILE, TPP, CAP)
    elif direct:
        if c == 0:
            _decide_direct_row(logits_ptr, stride_row, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr,
                               tile_max_ptr, st_i_ptr, st_f_ptr, cand_ptr, list_ptr, tok_ptr, thr_ptr, lnorm_ptr,
                               r, V, NT, stream, KMAX, CAP, TILE, G, NT_P2, SMALL, TOPT, GD, PIPE, DS, FALLBACK)
    elif pivot_row:
        pivot_collect_program(logits_ptr, stride_row, inv_temp_ptr, tile_max_ptr, st_f_ptr, mass_ptr, V, NT, NC, BPP,
                              r, c, BLOCK, TILE)
    else:
        collect_program(logits_ptr, stride_row, inv_temp_ptr, seed_ptr, pos_ptr, st_i_ptr, st_f_ptr, cand_ptr,
                        n_ptr, f_ptr, i_ptr, V, S3, BPP, stream, r, c, mode, BLOCK, CAP, ATOMIC_SLOTS)
