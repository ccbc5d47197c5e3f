"""Sampling: exact top-k / top-p / min-p thresholds without sorting the vocabulary, and the
exponential-noise draw. The launcher `sample_top_k_top_p_triton` runs, with no host sync:

1. pass 1 (sampling_stats.py, many programs per row): per-block max / sum-exp, the max
   of every tile, the sum exp(x - tile max) of every tile of rows without a filter, and a
   count histogram of every block of rows with a filter (except rows with a small top-k);
2. plan (`_plan_kernel`, one program per row): combines the blocks: max m, normaliser Z;
   a NaN or +inf logit makes Z NaN and the row invalid (token -1), and so does a row with
   every logit -inf. Greedy rows take the argmax; rows without top-k / top-p / min-p draw
   a sub-chunk of `draw_sub_chunk(V)` tokens by its mass, then a token inside it
   (`_draw_unfiltered`: a two-level exponential race, noise from specops.rng, STREAM given
   by the caller; its sub-chunk noise on STREAM + SUB_STREAM). Rows with
   1 <= top_k <= kmax (128) are decided here (`_direct_top_k`): the
   tiles whose max reaches a lower bound of the k-th largest tile max (found by counting
   the tile maxima against probes, not by sorting them) hold every token the filters keep;
   their tokens are collected and finished as in step 4 (ties or overflow: the exact
   search of step 4); launcher knobs (see `sample_top_k_top_p_triton`) trade how this
   is done (a tl.topk of the tile maxima, bigger groups of tiles) or where (in the collect
   launch, or listed here, read by collect and sorted by the finish: mode SPREAD), with the
   same results. Other rows with a filter get a plan from their histogram
   (sampling_select.py);
3. refine (twice) and collect (sampling_select.py, many programs per row; at large batches
   each program does several of a row's parts: `search_group`): narrow the bracket of the
   thresholds and store its tokens;
4. finish (`_finish_kernel`, one program per row): sorts the collected candidates as
   (value, index) keys and decides tau exactly (kept set = {x >= tau}, ties at tau all
   kept): top-k's k-th value t1 = max(k-th value, m + log(min_p)), then the largest
   value whose mass from the top reaches top_p of the mass above t1. Every assumption of
   the plan is checked; a row that fails a check, or that the plan could not bracket,
   takes the exact single-program search kept below (`_resolve_filtered`: lower bounds
   from the sorted tile maxima, then a bisection on the value counting tokens and mass
   over the row's tiles until at most CAP tokens are left, then a sort).
5. the draw: argmax over kept tokens of exp(x - m) / E_t, ties to the smallest index;
   the noise is computed only for kept tokens' blocks (collect) or candidates (finish).
   Rows without a filter draw in two levels instead (step 2, `_draw_unfiltered`).

Outputs per row: token (int64, -1 when invalid), threshold tau (-inf when nothing is
cut), m and log(sum over kept of exp(x - m)): the processed distribution.

With `pivot=True` (a caller that needs the tokens only) rows with top-p and / or min-p and
no top-k skip steps 3-4: pass 1 gives them tile sums, the plan draws a first candidate as
for a row without a filter (mode PIVOT_PENDING; a min-p row keeps it when it is >= the
min-p threshold; a row with both starts without one), and sampling_pivot.py's rounds accept
it or draw again above it before the finish; their threshold and log_norm are not computed.
"""

import torch
import triton
import triton.language as tl

from .rng import PIVOT_STREAM, SUB_STREAM, exponential, random_words
from .sampling_common import (float_key, key_float, pack_key, pdl_kwargs, pdl_start, select_word, token_noise,
                             unpack_key)
from .sampling_pivot import PIVOT_ROUNDS, pivot_rounds
from .sampling_select import (COLLECT, DIRECT, DONE, DRAW, FALLBACK, PIVOT_PENDING, PIVOTED, SPREAD, STATE_F, STATE_I,
                              REFINE_MIN_PROGRAMS, SUB_BINS, _collect_kernel, _refine_combine_kernel, _refine_kernel,
                              collect_program, merge_best, plan_filtered, refine_geometry, refine_programs)
from .sampling_select import search_group as default_search_group
from .sampling_stats import HIST_BINS, _next_pow2, pass1_blocks, row_stats_pass, tile_size

_BIG = tl.constexpr(2147483647)
_PAD_KEY = tl.constexpr(-9187343241974906880)  # pack_key(-inf, 0): sorts after every candidate
_MAX_SEARCH = tl.constexpr(64)
NPROBE = tl.constexpr(8)   # thresholds counted per pass of the exact search (a power of 2)
PIVOT_FALLBACK_STREAM = tl.constexpr(PIVOT_ROUNDS * PIVOT_STREAM)   # a pivot row's exact search: fresh noise
BOUND_SLACK = 16           # `_tile_bound`: a second round only while more than k + BOUND_SLACK tiles reach lo


@triton.jit
def _sum2(x):
    return tl.sum(tl.sum(x, axis=1), axis=0)


@triton.jit
def _max2(x):
    return tl.max(tl.max(x, axis=1), axis=0)


@triton.jit
def _min2(x):
    return tl.min(tl.min(x, axis=1), axis=0)


@triton.jit
def _select_tiles(tm_row, list_row, NT, thr, NT_P2: tl.constexpr):
    """Write the ids of the tiles whose max is >= thr to list_row (in order); return how many."""
    tl.debug_barrier()
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    sel = ((tm >= thr) & (t < NT)).to(tl.int32)
    pos = tl.cumsum(sel, axis=0) - 1
    tl.store(list_row + pos, t, mask=sel > 0)
    tl.debug_barrier()
    return tl.sum(sel, axis=0)


@triton.jit
def _group_ids(list_row, g, n_sel, G: tl.constexpr):
    """Ids [G, 1] of the selected tiles g..g+G-1 (0 past the end) and their validity [G]."""
    gi = g + tl.arange(0, G)
    gm = gi < n_sel
    return tl.load(list_row + gi, mask=gm, other=0)[:, None], gm


@triton.jit
def _group_x(row, tid, gm, V, scale, TILE: tl.constexpr):
    """[G, TILE] scaled logits of the tiles `tid` (-inf where invalid) and their token offsets."""
    offs = tid * TILE + tl.arange(0, TILE)[None, :]
    x = tl.load(row + offs, mask=gm[:, None] & (offs < V), other=float("-inf")).to(tl.float32) * scale
    return x, offs


@triton.jit
def _load_group(row, list_row, g, n_sel, V, scale, TILE: tl.constexpr, G: tl.constexpr):
    """Tiles g..g+G-1 of the selected list as [G, TILE] (x, token offsets, tile ids [G, 1])."""
    tid, gm = _group_ids(list_row, g, n_sel, G)
    x, offs = _group_x(row, tid, gm, V, scale, TILE)
    return x, offs, tid


@triton.jit
def _count_mass_probes(row, tm_row, list_row, V, NT, scale, m, probes,
                       TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr, P: tl.constexpr):
    """Number and mass sum exp(x - m) of the finite tokens with x >= t for each of the P
    increasing thresholds `probes` ([P]), in one pass over the tiles whose max reaches the
    first one."""
    j = tl.arange(0, P)
    n_sel = _select_tiles(tm_row, list_row, NT, tl.min(probes, axis=0), NT_P2)
    cnt = tl.zeros([P], tl.int32)
    mass = tl.zeros([P], tl.float32)
    # software pipeline: the next group's data and the group after's ids are in flight
    # while this group is counted (these passes may cover the whole row)
    tid, gm = _group_ids(list_row, 0, n_sel, G)
    x, offs = _group_x(row, tid, gm, V, scale, TILE)
    tid_n, gm_n = _group_ids(list_row, G, n_sel, G)
    for g in range(0, n_sel, G):
        x_n, offs_n = _group_x(row, tid_n, gm_n, V, scale, TILE)
        tid_n, gm_n = _group_ids(list_row, g + 2 * G, n_sel, G)
        e = tl.where(x > float("-inf"), tl.exp(x - m), 0.0)
        for q in tl.static_range(P):
            t = tl.max(tl.where(j == q, probes, float("-inf")), axis=0)
            keep = (x >= t) & (x > float("-inf"))
            cnt += tl.where(j == q, _sum2(keep.to(tl.int32)), 0)
            mass += tl.where(j == q, _sum2(tl.where(keep, e, 0.0)), 0.0)
        x = x_n
    return cnt, mass


@triton.jit
def _collect_group(x, offs, lo, hi, m, n, mass, xmin, cand_row, CAP: tl.constexpr):
    """One [G, TILE] group of `_collect`: stores its candidates after the n stored so far;
    returns the running (n, mass, xmin)."""
    c = (x >= lo) & (x < hi) & (x > float("-inf"))
    mass += _sum2(tl.where(c, tl.exp(x - m), 0.0))
    xmin = tl.minimum(xmin, _min2(tl.where(c, x, float("inf"))))
    c2 = c.to(tl.int32)
    rc = tl.sum(c2, axis=1)                                   # per tile
    pos = n + (tl.cumsum(rc, axis=0) - rc)[:, None] + tl.cumsum(c2, axis=1) - 1
    tl.store(cand_row + pos, pack_key(x, offs), mask=(c2 > 0) & (pos < CAP))
    return n + tl.sum(rc, axis=0), mass, xmin


@triton.jit
def _collect(row, tm_row, list_row, cand_row, V, NT, scale, m, lo, hi,
             TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr, CAP: tl.constexpr,
             PIPE: tl.constexpr = False):
    """Store pack_key(x, token) of the finite tokens with lo <= x < hi (the first CAP of them);
    return (how many, their mass sum exp(x - m), the smallest of them).

    PIPE: software pipeline as in `_count_mass_probes` (the next group's data and the group
    after's ids in flight while a group is stored): the same stores, sums and order."""
    n_sel = _select_tiles(tm_row, list_row, NT, lo, NT_P2)
    n = n_sel * 0
    mass = tl.full([], 0.0, tl.float32)
    xmin = tl.full([], float("inf"), tl.float32)
    if PIPE:
        tid, gm = _group_ids(list_row, 0, n_sel, G)
        x, offs = _group_x(row, tid, gm, V, scale, TILE)
        tid_n, gm_n = _group_ids(list_row, G, n_sel, G)
        for g in range(0, n_sel, G):
            x_n, offs_n = _group_x(row, tid_n, gm_n, V, scale, TILE)
            tid_n, gm_n = _group_ids(list_row, g + 2 * G, n_sel, G)
            n, mass, xmin = _collect_group(x, offs, lo, hi, m, n, mass, xmin, cand_row, CAP)
            x = x_n
            offs = offs_n
    else:
        for g in range(0, n_sel, G):
            x, offs, tid = _load_group(row, list_row, g, n_sel, V, scale, TILE, G)
            n, mass, xmin = _collect_group(x, offs, lo, hi, m, n, mass, xmin, cand_row, CAP)
    tl.debug_barrier()
    return n, mass, xmin


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
def _sorted_candidates(cand_row, n, CAP: tl.constexpr):
    """The stored candidates sorted by value, descending: (x, token, valid, position)."""
    i = tl.arange(0, CAP)
    valid = i < n
    key = tl.load(cand_row + i, mask=valid, other=_PAD_KEY)
    sx, sidx = unpack_key(tl.sort(key, 0, True))
    sx = tl.where(valid, sx, float("-inf"))
    return sx, sidx, valid, i


@triton.jit
def _sorted_values(cand_row, n, CAP: tl.constexpr):
    """The stored candidates in their slots (x, token, valid, slot) and their values sorted
    descending, sx: the same value sequence as `_sorted_candidates`' (a sort of the (value,
    index) keys orders equal values by index, but they are equal), from a sort of 32-bit
    keys instead of 64. Returns (sx, x, token, valid, position)."""
    i = tl.arange(0, CAP)
    valid = i < n
    x, idx = unpack_key(tl.load(cand_row + i, mask=valid, other=_PAD_KEY))
    x = tl.where(valid, x, float("-inf"))
    sx = key_float(tl.sort(float_key(x), 0, True))
    return sx, x, idx, valid, i


@triton.jit
def _first_argmax(row, tm_row, NT, m, V, TILE: tl.constexpr, NT_P2: tl.constexpr):
    """First index of the row max m (unscaled row): scan the first tile whose max is m."""
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    first = tl.minimum(tl.min(tl.where(tm == m, t, _BIG), axis=0), NT - 1)
    offs = first * TILE + tl.arange(0, TILE)
    x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    return tl.min(tl.where(x == m, offs, _BIG), axis=0)


@triton.jit
def _draw_tiles(row, tm_row, list_row, V, NT, scale, m, tau, seed, pos, stream,
                TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr):
    """argmax over x >= tau of exp(x - m) / E (ties: smallest index), and the kept mass.

    Only tiles whose max reaches tau are read, and only they get noise.
    """
    n_sel = _select_tiles(tm_row, list_row, NT, tau, NT_P2)
    best = tl.full([], -1.0, tl.float32)
    tok = n_sel * 0 - 1
    mass = tl.full([], 0.0, tl.float32)
    tid, gm = _group_ids(list_row, 0, n_sel, G)          # software pipeline, as in the counts
    x, offs = _group_x(row, tid, gm, V, scale, TILE)
    tid_n, gm_n = _group_ids(list_row, G, n_sel, G)
    for g in range(0, n_sel, G):
        x_n, offs_n = _group_x(row, tid_n, gm_n, V, scale, TILE)
        offs = tid * TILE + tl.arange(0, TILE)[None, :]
        kept = (x >= tau) & (x > float("-inf"))
        e = tl.exp(x - m)
        # call index written so that the compiler sees the 4 tokens of a thread share it
        w0, w1, w2, w3 = random_words(seed, pos, stream, tid * (TILE // 4) + (tl.arange(0, TILE)[None, :] >> 2))
        sc = tl.where(kept, e / exponential(select_word(w0, w1, w2, w3, offs & 3)), -1.0)
        bs = _max2(sc)
        bi = _min2(tl.where(sc == bs, offs, _BIG))
        better = (bs > best) | ((bs == best) & (bi < tok))
        best = tl.where(better, bs, best)
        tok = tl.where(better, bi, tok)
        mass += _sum2(tl.where(kept, e, 0.0))
        x = x_n
        tid = tid_n
        tid_n, gm_n = _group_ids(list_row, g + 2 * G, n_sel, G)
    return tok, mass


@triton.jit
def _resolve_filtered(row, tm_row, list_row, cand_row, V, NT, scale, m, z, k, p, tau_min, has_k, has_p,
                      c_k, c_p, seed, pos, stream,
                      TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr, CAP: tl.constexpr):
    """Exact threshold of a row with top-k and/or top-p (and maybe min_p), and the draw.

    Stage 0 (top-k) finds v_k, the largest value with count(x >= v) >= k, and
    t1 = max(tau_min, v_k); stage 1 (top-p) finds the largest value v >= t1 with
    mass(x >= v) >= p * mass(x >= t1). Each stage starts from a guess `lo` of a value that
    satisfies its predicate (c_k / c_p from the tile maxima), collects the tokens in
    [lo, hi); while they are more than CAP it bisects [lo, hi) (value midpoints, then key
    midpoints, so it ends); a wrong guess is retried from the stage's floor. When the
    sorted candidates hold every token >= lo, stage 1 and the draw are done on them
    directly (the common case: one collect, one sort, no further pass).

    Returns (tau, token or -1 when the draw is still to be done, kept mass).
    """
    hi0 = key_float(float_key(m) + 1)          # next float above the max: nothing reaches it
    stage = tl.where(has_k, 0, 1)
    state = tl.where(has_k, 0, 2)              # 0 collect, 1 bisect, 2 start stage 1
    t1 = tau_min
    z_a = z
    floor = tl.maximum(tau_min, -3.4028234663852886e38)
    lo = tl.maximum(floor, c_k)
    hi = hi0
    cnt_hi = k * 0
    cnt_lo = cnt_hi
    mass_hi = tl.full([], 0.0, tl.float32)
    mass_lo = mass_hi
    it = cnt_hi
    tau = tl.full([], float("-inf"), tl.float32)
    tok = cnt_hi - 1
    kept_mass = tl.full([], 0.0, tl.float32)
    sx = tl.full([CAP], float("-inf"), tl.float32)
    sidx = tl.zeros([CAP], tl.int32)
    n_sorted = cnt_hi
    p_target = p * z
    while stage < 2:
        have_v = cnt_hi * 0
        have_sorted = cnt_hi * 0
        v = tl.full([], float("-inf"), tl.float32)
        if state == 0:
            n, mass_b, xmin = _collect(row, tm_row, list_row, cand_row, V, NT, scale, m, lo, hi,
                                       TILE, G, NT_P2, CAP)
            cnt_lo = cnt_hi + n
            mass_lo = mass_hi + mass_b
            pred_lo = tl.where(stage == 1, mass_lo >= p_target, cnt_lo >= k)
            if ~pred_lo:
                if lo <= floor:
                    have_v = have_v + 1            # the stage's answer lies below its floor
                else:
                    hi = lo
                    cnt_hi = cnt_lo
                    mass_hi = mass_lo
                    lo = floor
            elif n <= CAP:
                sx, sidx, valid, i = _sorted_candidates(cand_row, n, CAP)
                n_sorted = n
                e = tl.where(valid, tl.exp(sx - m), 0.0)
                jm = tl.sum((valid & (mass_hi + tl.cumsum(e, axis=0) < p_target)).to(tl.int32), axis=0)
                j = tl.minimum(tl.maximum(tl.where(stage == 1, jm, k - cnt_hi - 1), 0), n - 1)
                v = tl.max(tl.where(i == j, sx, float("-inf")), axis=0)
                have_v = have_v + 1
                have_sorted = have_sorted + 1
            else:
                lo = tl.maximum(lo, xmin)          # no token lies in [lo, xmin): same predicate
                state = cnt_hi * 0 + 1
        else:
            # NPROBE probes evenly spread over (lo, hi) in value, or in float-key order
            # (about log-spaced) while the bracket is wide, after 24 rounds or with an
            # infinite end (so the search ends whatever the values). A failed guess leaves
            # lo at -3.4e38: value midpoints would take ~40 passes to get near the data
            # (the millisecond pathology of flat top-p rows); key order takes two.
            jp = tl.arange(0, NPROBE)
            use_key = (it >= 24) | (hi == float("inf")) | (lo == float("-inf")) | (hi - lo > 64.0)
            klo = float_key(lo).to(tl.int64)
            khi = float_key(hi).to(tl.int64)
            frac = (jp + 1).to(tl.float32) / (NPROBE + 1)
            pk = key_float((klo + ((khi - klo) * (jp + 1).to(tl.int64)) // (NPROBE + 1)).to(tl.int32))
            probes = tl.where(use_key, pk, lo + frac * (hi - lo))
            probes = tl.minimum(tl.maximum(probes, lo), hi)
            if state == 2:
                probes = tl.zeros([NPROBE], tl.float32) + t1
            inside = (probes > lo) & (probes < hi)
            if (state == 1) & ((tl.sum(inside.to(tl.int32), axis=0) == 0) | (it >= _MAX_SEARCH)):
                v = lo                            # [lo, hi) holds only the value lo
                have_v = have_v + 1
            elif (state == 2) & (t1 == float("-inf")):
                p_target = p * z                  # stage 1 over every token
                floor = tl.full([], -3.4028234663852886e38, tl.float32)
                lo = tl.maximum(floor, c_p)
                hi = hi0
                cnt_hi = cnt_hi * 0
                mass_hi = mass_hi * 0.0
                it = cnt_hi * 0 - 1
                state = cnt_hi * 0
            else:
                pc, pm = _count_mass_probes(row, tm_row, list_row, V, NT, scale, m, probes,
                                            TILE, G, NT_P2, NPROBE)
                if state == 2:                    # stage 1 from t1: its mass is the top-p total
                    p_target = p * tl.max(pm, axis=0)
                    floor = t1
                    lo = t1
                    hi = hi0
                    cnt_hi = cnt_hi * 0
                    mass_hi = mass_hi * 0.0
                    it = cnt_hi * 0 - 1
                    state = cnt_hi * 0
                else:
                    pred = tl.where(stage == 1, pm >= p_target, pc >= k)
                    pred = (probes <= lo) | (pred & (probes < hi))   # pred(lo) true, pred(hi) false
                    nt = tl.sum(pred.to(tl.int32), axis=0)       # probes are increasing: a prefix
                    first_false = jp == nt
                    last_true = jp == nt - 1
                    has_f = nt < NPROBE
                    hi_n = tl.where(has_f, tl.max(tl.where(first_false, probes, float("-inf")), axis=0), hi)
                    cnt_hi = tl.where(has_f, tl.max(tl.where(first_false, pc, 0), axis=0), cnt_hi)
                    mass_hi = tl.where(has_f, tl.max(tl.where(first_false, pm, 0.0), axis=0), mass_hi)
                    lo_n = tl.where(nt > 0, tl.max(tl.where(last_true, probes, float("-inf")), axis=0), lo)
                    cnt_lo = tl.where(nt > 0, tl.max(tl.where(last_true, pc, 0), axis=0), cnt_lo)
                    mass_lo = tl.where(nt > 0, tl.max(tl.where(last_true, pm, 0.0), axis=0), mass_lo)
                    lo = lo_n
                    hi = hi_n
                    if cnt_lo - cnt_hi <= CAP:
                        state = cnt_hi * 0
            it += 1
        if have_v > 0:
            complete = (have_sorted > 0) & (cnt_hi == 0)  # the sorted candidates hold every x >= lo
            i = tl.arange(0, CAP)
            valid = i < n_sorted
            e = tl.where(valid, tl.exp(sx - m), 0.0)
            if stage == 0:
                t1 = tl.maximum(tau_min, v)
                if has_p & complete & (t1 >= lo):
                    in_a = valid & (sx >= t1)
                    z_in = tl.sum(tl.where(in_a, e, 0.0), axis=0)
                    excl = tl.cumsum(e, axis=0) - e
                    nk = tl.sum((in_a & (excl < p * z_in)).to(tl.int32), axis=0)
                    tau = tl.maximum(t1, tl.max(tl.where(i == nk - 1, sx, float("-inf")), axis=0))
                    stage = cnt_hi * 0 + 2
                elif has_p:
                    stage = cnt_hi * 0 + 1
                    state = cnt_hi * 0 + 2
                else:
                    tau = t1
                    stage = cnt_hi * 0 + 2
            else:
                tau = tl.maximum(t1, v)
                stage = cnt_hi * 0 + 2
            if (stage == 2) & complete & (tau >= lo):
                kept = valid & (sx >= tau)
                sc = tl.where(kept, e / token_noise(seed, pos, stream, sidx), -1.0)
                bs = tl.max(sc, axis=0)
                tok = tl.min(tl.where(kept & (sc == bs), sidx, _BIG), axis=0)
                kept_mass = tl.sum(tl.where(kept, e, 0.0), axis=0)
    return tau, tok, kept_mass


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
def _draw_unfiltered(row, tm_row, ts_row, NT, V, scale, m, seed, pos, stream,
                     TILE: tl.constexpr, NT_P2: tl.constexpr, SUB: tl.constexpr):
    """The draw of a row without top-k / top-p / min-p: a two-level exponential race.

    Sub-chunk c (tokens [c * SUB, (c + 1) * SUB)) has the mass M_c = sum of exp(x - m) over
    its tiles (pass 1's tile sums, exp(tile max - m) each); the race argmax_c M_c / E_c (E_c:
    word c % 4 of index c // 4 on stream + SUB_STREAM) picks c with probability M_c / Z, then
    argmax over c's tokens of exp(x - m) / E_t (the token noise of stream) picks t with
    probability exp(x_t - m) / M_c: t is drawn with probability exp(x_t - m) / Z, with the
    noise of SUB tokens only. Ties go to the lowest sub-chunk, then the lowest token.
    """
    TPS: tl.constexpr = SUB // TILE                 # tiles per sub-chunk
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    ts = tl.load(ts_row + t, mask=t < NT, other=0.0)
    w = tl.where(tm > float("-inf"), ts * tl.exp(tm - m), 0.0)
    if TPS <= NT_P2:
        NC: tl.constexpr = NT_P2 // TPS
        mass = tl.sum(tl.reshape(w, [NC, TPS]), axis=1)           # [NC]: tiles of a sub-chunk are consecutive
    else:
        NC: tl.constexpr = 1
        mass = tl.sum(tl.reshape(w, [1, NT_P2]), axis=1)          # one sub-chunk holds the row
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


@triton.jit(do_not_specialize=["NT", "NBLK", "stream", "KMAX"])
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
    V, NT, NBLK, stream, KMAX,
    TILE: tl.constexpr, NT_P2: tl.constexpr, S_P2: tl.constexpr, CAP: tl.constexpr,
    GB: tl.constexpr, SELECT: tl.constexpr, HB: tl.constexpr, G: tl.constexpr, SMALL: tl.constexpr, SUB: tl.constexpr,
    TOPT: tl.constexpr = 0, GD: tl.constexpr = 16, PIPE: tl.constexpr = False, DS: tl.constexpr = 0,
    DEFER: tl.constexpr = 0, SEARCH: tl.constexpr = True,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
    PIVOT: tl.constexpr = False,              # top-p alone: first candidate of the pivot rejection
):
    """Rows without a threshold get their token here, and so do rows with 1 <= top_k <= KMAX
    (`_direct_top_k`, mode DIRECT; FALLBACK when it cannot decide: pass 1 gave them no
    histogram); the others a plan (sampling_select.py). DEFER = 1: the direct rows are only
    marked DIRECT here and decided by the collect launch (`_collect_direct_kernel`), in
    parallel with the other rows' refine and collect instead of before them. DEFER = 2: the
    plan only lists their top tiles (mode SPREAD, lo = t_k, hi = +inf, top tiles in the
    state's 4th int); the collect launch reads them, many programs per row, and the finish
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
            if has_k & (k <= KMAX):
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


@triton.jit
def _decide_direct_row(logits_ptr, stride_row, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr, tile_max_ptr,
                       st_i_ptr, st_f_ptr, cand_ptr, list_ptr, tok_ptr, thr_ptr, lnorm_ptr, r, V, NT, stream, KMAX,
                       CAP: tl.constexpr, TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr,
                       SMALL: tl.constexpr, TOPT: tl.constexpr, GD: tl.constexpr, PIPE: tl.constexpr,
                       DS: tl.constexpr):
    """Decide row r, which the plan (launched with DEFER = 1) marked DIRECT, as the plan would
    have: the same `_direct_top_k` call on the same inputs (m, z and the min-p threshold as the
    plan stored them), the same results. A row it cannot decide goes to FALLBACK (the finish's
    search); the plan's stores stand for it: token -1, tau -inf, log Z."""
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
        tl.store(st_i_ptr + r * 4, r * 0 + FALLBACK)


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
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """Grid (R,): program r decides row r when the plan (DEFER = 1) marked it DIRECT
    (`_decide_direct_row`); the other programs return. direct_in="beside" launches it on a
    stream of its own beside the refine and collect launches: they read and write only rows in
    the modes REFINE_COUNT / REFINE_MASS / COLLECT / DRAW, this kernel only the DIRECT rows."""
    pdl_start(PDL)
    r = tl.program_id(0)
    if tl.load(st_i_ptr + r * 4) == DIRECT:
        _decide_direct_row(logits_ptr, stride_row, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr,
                           tile_max_ptr, st_i_ptr, st_f_ptr, cand_ptr, list_ptr, tok_ptr, thr_ptr, lnorm_ptr,
                           r, V, NT, stream, KMAX, CAP, TILE, G, NT_P2, SMALL, TOPT, GD, PIPE, DS)


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
    V, NT, S3, BPP, stream, KMAX,
    BLOCK: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr,
    SMALL: tl.constexpr, TOPT: tl.constexpr, GD: tl.constexpr, PIPE: tl.constexpr, DS: tl.constexpr,
    TPP: tl.constexpr = 8, DEFER: tl.constexpr = 1,
    ATOMIC_SLOTS: tl.constexpr = False,       # sampling_select.collect_program's
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """The collect launch (sampling_select.collect_program) in which program 0 of each row
    the plan marked DIRECT (plan launched with DEFER = 1) decides it as the plan would have:
    the same `_direct_top_k` call on the same inputs (m, z and the min-p threshold as the
    plan stored them), the same results; FALLBACK rows go on to the finish's search. Rows
    the plan marked SPREAD have their listed top tiles read by all their programs
    (`_spread_collect`, TPP tiles a load); the finish decides them."""
    pdl_start(PDL)
    r = tl.program_id(0)
    c = tl.program_id(1)
    mode = tl.load(st_i_ptr + r * 4)
    if DEFER == 2:          # (each mode compiles only its own branch)
        if mode == SPREAD:
            r64 = r.to(tl.int64)
            _spread_collect(logits_ptr + r64 * stride_row, list_ptr + r64 * NT_P2, cand_ptr + r64 * CAP,
                            st_i_ptr + r * 4 + 1, tl.load(st_i_ptr + r * 4 + 3), V, tl.load(inv_temp_ptr + r),
                            tl.load(st_f_ptr + r * 6 + 2), c, S3, TILE, TPP, CAP)
        else:
            collect_program(logits_ptr, stride_row, inv_temp_ptr, seed_ptr, pos_ptr, st_i_ptr, st_f_ptr, cand_ptr,
                            n_ptr, f_ptr, i_ptr, V, S3, BPP, stream, r, c, mode, BLOCK, CAP, ATOMIC_SLOTS)
    elif mode == DIRECT:
        if c == 0:
            _decide_direct_row(logits_ptr, stride_row, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, pos_ptr,
                               tile_max_ptr, st_i_ptr, st_f_ptr, cand_ptr, list_ptr, tok_ptr, thr_ptr, lnorm_ptr,
                               r, V, NT, stream, KMAX, CAP, TILE, G, NT_P2, SMALL, TOPT, GD, PIPE, DS)
    else:
        collect_program(logits_ptr, stride_row, inv_temp_ptr, seed_ptr, pos_ptr, st_i_ptr, st_f_ptr, cand_ptr,
                        n_ptr, f_ptr, i_ptr, V, S3, BPP, stream, r, c, mode, BLOCK, CAP, ATOMIC_SLOTS)


@triton.jit
def _finish_collected(cand_row, n_cand, n_above, m_above, m_min, best_a, tok_a, m, z, k, p, tau_min, lo, hi,
                      target, has_k, has_p, seed, pos, stream, CAP: tl.constexpr, VALUE_SORT: tl.constexpr = True):
    """Exact thresholds from the sorted candidates [lo, hi), the exact count / mass above hi
    and the exact mass m_min above the min-p threshold tau_min (m_min < 0: the candidates
    hold every token >= tau_min whenever it is the top-p base, their mass is used).

    The thresholds and every sum need the candidates' values in descending order only; the
    draw (argmax of exp(x - m) / E_t over the kept tokens, lowest token on ties) needs no
    order. VALUE_SORT sorts the values alone (`_sorted_values`: 32-bit keys) and draws over
    the candidates in their slots; otherwise the (value, index) keys are sorted and the draw
    reads the sorted tokens. The same results either way, bit for bit.

    Returns (ok, tau, token, kept mass); ok is False when an assumption of the plan fails
    (then the exact search decides).
    """
    ok = n_cand <= CAP
    n = tl.minimum(n_cand, CAP)
    if VALUE_SORT:
        sx, ux, uidx, valid, i = _sorted_values(cand_row, n, CAP)
    else:
        sx, uidx, valid, i = _sorted_candidates(cand_row, n, CAP)
        ux = sx
    e = tl.where(valid, tl.exp(sx - m), 0.0)
    t1 = tau_min
    if has_k:
        kk = k - n_above
        v_k = tl.max(tl.where(i == kk - 1, sx, float("-inf")), axis=0)
        ok = ok & (kk > 0) & ((kk <= n) | (tau_min >= lo))
        t1 = tl.maximum(tau_min, tl.where(kk <= n, v_k, float("-inf")))
    tau = t1
    if has_p:
        if target < 0.0:       # not known from the refine pass: p * mass(x >= t1)
            m_t1 = m_above + tl.sum(tl.where(sx >= t1, e, 0.0), axis=0)
            ok = ok & ((t1 == tau_min) | (t1 >= lo))
            m_t1 = tl.where(t1 == tau_min, tl.where(t1 == float("-inf"), z, tl.where(m_min >= 0.0, m_min, m_t1)),
                            m_t1)
            target = p * m_t1
        cum = m_above + tl.cumsum(e, axis=0)
        jp = tl.sum((valid & (cum < target)).to(tl.int32), axis=0)
        ok = ok & (m_above < target) & (jp < n)
        tau = tl.maximum(t1, tl.max(tl.where(i == jp, sx, float("-inf")), axis=0))
    ok = ok & (tau <= hi) & (tau >= lo)
    kept = valid & (sx >= tau)
    ukept = valid & (ux >= tau)                                     # the same tokens, in draw order
    if VALUE_SORT:
        ue = tl.exp(ux - m)
    else:
        ue = e
    sc = tl.where(ukept, ue / token_noise(seed, pos, stream, uidx), -1.0)
    bs = tl.max(sc, axis=0)
    bi = tl.min(tl.where(ukept & (sc == bs), uidx, _BIG), axis=0)
    better = (bs > best_a) | ((bs == best_a) & (bi < tok_a))
    tok = tl.where(better, bi, tok_a)
    return ok, tau, tok, m_above + tl.sum(tl.where(kept, e, 0.0), axis=0)


@triton.jit
def _finish_collected_sized(cand_row, n_cand, n_above, m_above, m_min, best_a, tok_a, m, z, k, p, tau_min, lo, hi,
                            target, has_k, has_p, seed, pos, stream, SMALL: tl.constexpr, CAP: tl.constexpr):
    """`_finish_collected` sorting the fewest keys of SMALL, 2 SMALL, 4 SMALL, ... (those below
    CAP) and CAP that hold the n_cand candidates (CAP when they are more; it then returns ok =
    False). The sort is most of the finish: with 8 warps on the H200 it takes 2.8 / 3.8 / 7.8
    µs at 256 / 512 / 1024 value keys (bench/results/logs/exp_finish_sort_2026-12-01.txt),
    where the (value, index) keys, one size of 1024 above 256, took 11.3."""
    if n_cand <= SMALL:
        ok, tau, tok, mass = _finish_collected(cand_row, n_cand, n_above, m_above, m_min, best_a, tok_a, m, z, k, p,
                                               tau_min, lo, hi, target, has_k, has_p, seed, pos, stream, SMALL)
    else:
        if 2 * SMALL < CAP:                     # static: the next size, recursively
            ok, tau, tok, mass = _finish_collected_sized(cand_row, n_cand, n_above, m_above, m_min, best_a, tok_a,
                                                         m, z, k, p, tau_min, lo, hi, target, has_k, has_p, seed,
                                                         pos, stream, 2 * SMALL, CAP)
        else:
            ok, tau, tok, mass = _finish_collected(cand_row, n_cand, n_above, m_above, m_min, best_a, tok_a, m, z, k,
                                                   p, tau_min, lo, hi, target, has_k, has_p, seed, pos, stream, CAP)
    return ok, tau, tok, mass


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
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    pdl_start(PDL)
    r = tl.program_id(0)
    mode = tl.load(st_i_ptr + r * 4)
    if (mode != DONE) & (mode != DIRECT) & (mode != PIVOTED):
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
        if (mode == COLLECT) | (mode == DRAW):
            # collect partials, in a fixed order
            n_above = r * 0
            m_t1 = tl.full([], 0.0, tl.float32)
            best = tl.full([], -1.0, tl.float32)
            tok_a = r * 0 + _BIG
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
                n_cand = tl.load(st_i_ptr + r * 4 + 1)
                t1_exact = tl.load(st_i_ptr + r * 4 + 2) != 0
                # sort what is there: most brackets hold a few hundred tokens
                ok, tau, tok, mass = _finish_collected_sized(cand_row, n_cand, n_above, mass, m_t1, best, tok_a, m, z,
                                                             k, p, tau_min, lo, hi, target, has_k & ~t1_exact, has_p,
                                                             seed, pos, stream, SMALL, CAP)
                if ~ok:
                    mode = r * 0 + FALLBACK
                    tau = tau_min
        if SPREAD_ROWS:   # the top tiles' candidates (collect launch): as `_direct_top_k` ends
            if mode == SPREAD:
                n_cand = tl.load(st_i_ptr + r * 4 + 1)
                ok, tau, tok, mass = _finish_direct_sized(cand_row, n_cand, m, z, k, p, tau_min, lo, has_p, seed, pos,
                                                          stream, SMALL, CAP)
                mode = tl.where(ok, DIRECT, FALLBACK)
                if ~ok:
                    tau = tau_min
        if mode == FALLBACK:
            # the exact single-program search: guesses of lower bounds of the cuts from the sorted tile maxima
            t = tl.arange(0, NT_P2)
            stm = tl.sort(tl.load(tm_row + t, mask=t < NT, other=float("-inf")), 0, True)
            c_k = tl.max(tl.where(t == k - 1, stm, float("-inf")), axis=0)
            cmass = tl.cumsum(tl.where(stm > float("-inf"), tl.exp(stm - m), 0.0), axis=0)
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
        tl.store(st_i_ptr + r * 4, mode)         # the path taken (sample_top_k_top_p_triton's `paths`)


DIRECT_TOP_K = 128
"""Default largest top_k decided in the plan (`kmax`): the common top_k values (20 .. 100)
and at most ~k * TILE tokens read from L2 by one program, whose ~k candidates fit the
small sort (256)."""


DEFAULT_CAP = 1024
"""Default candidate capacity `cap`: the most candidates one program sorts. A row whose
collected set exceeds it takes the exact single-program search (about 1 ms at V = 128256 on
the H200): top_k above about 1000 with top-p. The Sampler raises it for such launches
(`cap_for_top_k`)."""

MAX_AUTO_CAP = 4096
"""Largest cap `cap_for_top_k` picks."""


def cap_for_top_k(max_top_k: int) -> int:
    """The candidate capacity for a launch whose largest top_k among rows that also have top-p
    is `max_top_k` (host-known: SamplingMetadata.max_top_k_with_top_p): DEFAULT_CAP while k
    fits it, else the power of two that holds k, at most MAX_AUTO_CAP. A larger cap costs
    registers in the collect and finish kernels (scripts/triton_resources.py), so only
    launches with such a row get one. On the H200, batch 1 fp32 V = 128256
    (bench/exp_sampling_slow_rows.py --caps): with top_p 0.95, top_k 1000 took 37.7 us at cap
    1024 and 47.9 at cap 2048; top_k 2000 took 1032 us at cap 1024 (the search) and 53.7 at
    cap 2048; top_k 3000 / 4000 took 1159 / 1192 us at cap 2048 and 118 / 117 at cap 4096.
    Without top-p, top_k 1000 / 2000 / 4000 took 34-35 us at cap 1024 (no sort of the top_k
    set) and 46-114 us at larger caps: such rows keep the default. A row whose set still
    exceeds the cap (ties at the k-th value) takes the search. The tokens are the same at any
    cap (every path is exact with the same noise)."""
    return DEFAULT_CAP if max_top_k <= DEFAULT_CAP else min(MAX_AUTO_CAP, _next_pow2(max_top_k))


ATOMIC_SLOTS = True
"""Default `atomic_slots` (sampling_select.collect_program): each collected candidate takes its
slot from its own relaxed atomic add, not from one atomic add per block and a scan of the
block. The same results bit for bit. On the H200 (fp32 V = 128256, sample(...,
distribution=False), collect one c per program; bench/results/logs/exp_collect_slots_2026-12-03.txt)
bench_sampling's mixed rows took 44.5 / 60.0 / 104.7 / 222.8 µs against 44.5 / 63.5 / 110.8 /
241.7 with the scan at batch 8 / 32 / 128 / 512; rows all top_k 500 + top_p 0.95 (every block
holds a few candidates) 34.4 / 60.9 / 154.1 / 497.3 against 35.3 / 69.1 / 190.4 / 643.0, the
collect launch at batch 512 248.7 µs against 377.7 (both at group 4)."""


REFINE_COMPACT = True
"""Default `refine_compact` (sampling_select._refine_kernel): the refine launch keeps its
grid (R * ceil(S3 / search_group) programs; since session 37 at least REFINE_MIN_PROGRAMS,
`sampling_select.refine_programs`) but deals the parts (row, c) of the rows that refine to
its programs in turn. With the rows' own groups, a launch where few rows refine
was bound by the latency of their few programs, each reading search_group x BPP blocks one
after another; which rows refine depends on the logits drawn. On the H200
(bench_sampling's mixed rows, sample(..., distribution=False), the same results bit for bit;
bench/results/logs/exp_draw_variance_2026-12-03.txt and exp_refine_compact_2026-12-03.txt):
bf16 V = 151936 batch 128 on the table's logits took 107.1 µs against 139.3 by row (its
refine launches 8.5 against 39.9 µs; 102-104 µs on other draws, where no row refines) and
batch 32 on another draw 66.0 against 97.0. Where every row or no row refines it is level
within 1%: fp32 V = 128256 batch 8 / 32 / 128 42.1 / 57.2 / 96.9 against 42.0 / 57.0 / 98.5;
batch 512 (each of its 2048 programs scans the 512 rows' modes) about 1 µs slower, 217.3
against 216.3, and rows all top_k 500 + top_p 0.95 492.2 against 491.1."""


PIVOT_BESIDE = True
"""Default `pivot_beside`: the pivot rounds on a stream of their own, beside the refine and
collect launches (`side_stream(device, "pivot")`). On the H200, bench_sampling's mixed rows
(CUDA graphs, the same results; bench/exp_pivot_beside.py,
bench/results/logs/exp_pivot_beside_2026-12-03.txt), serial -> beside: fp32 V = 128256
batch 8 41.5 -> 37.4 µs, batch 32 57.3 -> 50.5, batch 128 99.2 -> 86.5, batch 512
217.9 -> 204.2; bf16 V = 151936 batch 8 41.9 -> 34.8, batch 128 107.3 -> 96.0."""

DIRECT_BESIDE = True
"""`direct_in="auto"` picks "beside" on CUDA for a launch with the search launches (and no
`paths`): the small top-k rows are decided by `_direct_rows_kernel` on a stream of its own,
beside the refine and collect launches, instead of in the collect launch (up to DEFER_ROWS
rows) or the plan. The same results either way. On the H200, bench_sampling's mixed rows
(CUDA graphs, interleaved, the same results; bench/exp_direct_beside.py,
bench/results/logs/exp_direct_beside_2026-12-03.txt), auto before -> beside: fp32
V = 128256 batch 8 38.8 -> 35.1 µs, 32 50.6 -> 42.5, 128 86.5 -> 80.5, 512 203.9 -> 199.2;
bf16 V = 151936 batch 8 35.1 -> 32.2, 128 97.2 -> 86.1, 512 213.4 -> 205.4. At batch 128
the plan takes 6.5 µs instead of 13.9. A launch without search (batch 1 there) keeps the
plan: "beside" in line would add a launch (15.5 against 14.1 µs)."""

_SIDE_STREAMS: dict = {}


def side_stream(device: torch.device, name: str) -> "torch.cuda.Stream":
    """The side stream `name` ("pivot": the pivot rounds; "direct": the direct rows of
    direct_in="beside") on `device`: one per (device, name), made once, so that a CUDA graph
    captures the work sent to it between the fork and the join. torch hands out its streams
    from a small round-robin pool, so a caller's stream made later may be this one: then the
    fork and the join wait on the stream itself and the work runs in line, the same results
    without the overlap."""
    idx = torch.device(device).index
    idx = torch.cuda.current_device() if idx is None else idx
    if (idx, name) not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx, name] = torch.cuda.Stream(device=idx)
    return _SIDE_STREAMS[idx, name]


DIRECT_SMALL = 64
"""Default `direct_small`: a direct row with at most 64 candidates (the common top_k values of
20 .. 50 on LLM logits) sorts them as 64 keys, not 256. On the H200 (V = 128256 fp32, batch 1,
bench_sampling's first mixed row; logs/exp_direct_stages_2026-12-01b.txt) the direct path took
9.3 against 10.2 µs and the whole sample() call 14.9 against 15.5."""

DEFER_ROWS = 16
"""Largest launch whose direct rows `direct_in="auto"` decides in the collect launch (when
the launch has one); above, the plan decides them. The same results either way, bit for bit.
On the H200 (bench_sampling's mixed rows, fp32 V = 128256; the whole sample() call in a CUDA
graph; logs/exp_plan_direct_2026-12-01e.txt, after session 19's fix of the collect-direct
kernel): at B = 4 / 8 / 16 / 32 / 48 / 64 the collect launch took 35.3 / 39.7 / 56.0 / 74.1 /
87.9 / 107.6 µs against 40.8 / 44.6 / 64.5 / 71.9 / 80.5 / 93.4 in the plan, and 178.0 / 308.8
against 137.8 / 224.8 at B = 128 / 256 (logs/exp_plan_direct_2026-12-01f.txt). (Session 19
measured 64 rows before that fix, and set 64.)"""

_CONSTANT_ROWS: dict = {}


def constant_rows(R: int, value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[R] tensor of `value` that kernels only read: a view of one cached buffer per (value,
    dtype, device), so that a call without a filter launches no fill kernel. The buffer is
    filled once, outside any CUDA-graph capture (a fill captured in a graph would run only at
    its replay: such a call gets a fresh tensor of its own)."""
    key = (value, dtype, torch.device(device))
    buf = _CONSTANT_ROWS.get(key)
    if buf is not None and buf.numel() >= R:
        return buf[:R]
    if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.full((R,), value, dtype=dtype, device=device)
    buf = torch.full((max(R, 2 * (buf.numel() if buf is not None else 0), 64),), value, dtype=dtype, device=device)
    _CONSTANT_ROWS[key] = buf
    return buf[:R]


MANY_ROWS = 256


def later_maxnreg(rows: int) -> dict[str, int | None]:
    """Registers per thread of the plan and the collect launch for a launch of `rows` rows
    ({"plan": cap or None, "collect": cap}). A cap compiles the same code into fewer registers
    (more programs per SM), so it changes speed only: every output is bit for bit the same (the
    tests compare them), and a row's token does not depend on its batch. On the H200 (the
    whole sample() call, bench_sampling's mixed rows, interleaved rounds;
    logs/exp_collect_caps_2026-12-01.txt): collect at 80 registers (119 uncapped) takes
    0.95-0.96x of the uncapped call at fp32 V = 128256 B = 32 and 128, and at 64 0.90x at
    B = 512, where the plan at 128 (165 uncapped, one program per SM) saves 2-3% more; below
    MANY_ROWS rows the plan's cap costs 4-12%."""
    many = rows >= MANY_ROWS
    return {"plan": 128 if many else None, "collect": 64 if many else 80}


def draw_sub_chunk(vocab: int) -> int:
    """Tokens per sub-chunk of the two-level draw of rows without a filter (`_draw_unfiltered`;
    specops.sampling.sampler_torch mirrors it): 2048, or an eighth of a small vocabulary, and
    never less than a tile. A function of the vocabulary only, so a seeded row draws the same
    token whatever its batch."""
    return max(tile_size(vocab), min(2048, _next_pow2(-(-vocab // 8))))


def sample_top_k_top_p_triton(
    logits: torch.Tensor,            # [R, V] fp32/bf16/fp16, unit column stride (row stride may be 0)
    inv_temperature: torch.Tensor,   # [R] fp32: 1/T, -1 on greedy rows
    top_k: torch.Tensor | None,      # [R] int32, 0 = off
    top_p: torch.Tensor | None,      # [R] fp32, 1 = off
    min_p: torch.Tensor | None,      # [R] fp32, 0 = off
    seeds: torch.Tensor,             # [R] int64
    positions: torch.Tensor,         # [R] int64
    stream: int = 0,
    *,
    cap: int = DEFAULT_CAP,
    tile: int | None = None,
    num_chunks: int | None = None,
    blocks_per_program: int | None = None,
    guess: bool = True,
    select: bool = True,
    kmax: int = DIRECT_TOP_K,
    paths: dict | None = None,
    plan_warps: int = 8,
    direct_top: bool = False,
    direct_group: int | None = None,
    direct_pipe: bool = False,
    direct_small: int = DIRECT_SMALL,
    direct_in: str = "auto",
    search: bool = True,
    pivot: bool = False,
    pivot_skip: bool = True,
    pivot_group: int | None = None,
    search_group: int | None = None,
    collect_group: int | None = None,
    atomic_slots: bool | None = None,
    refine_compact: bool | None = None,
    refine_min_programs: int | None = None,
    pivot_beside: bool | None = None,
    direct_beside: bool | None = None,
):
    """Pass 1 (row statistics, tile maxima, histograms), plan, refine, collect and finish.

    Returns (tokens [R] int64, threshold [R] fp32, row_max [R] fp32, log_norm [R] fp32).
    Inputs are assumed checked (see specops.sampling.topk_topp). `cap` (candidates sorted
    per row), `tile` and `num_chunks` (about how many blocks pass 1 cuts a row into) are
    tuning knobs; tests shrink them to reach every path at small vocabularies;
    `blocks_per_program` (pass 1's, see row_stats_pass) changes speed only; `guess=False` starts the exact
    search from the row max instead of the tile-maxima bounds (to test retries) and
    `select=False` sends every filtered row to that search (sampling_select.py skipped).
    Rows with 1 <= top_k <= `kmax` (and top_k < V) are decided in the plan from their top
    tiles (`_direct_top_k`); `kmax=0` turns that off, and so does `select=False`.
    `search=False` is a promise that no row needs the bracket search (every random row is
    unfiltered, or has 1 <= top_k <= `kmax` and top_k < V): the refine and collect launches
    are left out (5 of the 9 kernels). A row that breaks the promise still gets an exact
    draw, from the finish's single-program search (slow on a wide row, never wrong). It is
    False anyway when no filter tensor is given, and True with select=False or direct_in
    "collect" or "spread" (whose rows need the collect launch).
    `pivot=True` draws the rows with top-p and / or min-p and no top-k by pivot rejection
    (sampling_pivot.py): the same law, another token, and no threshold: their threshold and
    log_norm outputs are left unset (NaN) unless the row fell back to the exact search.
    Such rows need no search (`search=False` holds with them). `pivot_skip=False` makes the
    rounds read every sub-chunk (the same tokens; see `pivot_rounds`), and `pivot_group` sets
    the sub-chunks per program of their mass launches (the same tokens; default: by batch).
    `search_group` sets the programs c of a row that one program of the refine and collect
    launches handles (the same results; default: refine by batch, `sampling_select.search_group`,
    collect 1); `collect_group` sets it for the collect launch alone.
    `atomic_slots` gives each collected candidate its slot from its own atomic add instead of
    a block count and scan (the same results; default ATOMIC_SLOTS; see
    `sampling_select.collect_program`).
    `refine_compact` deals the parts of the rows that refine to the refine launch's programs in
    turn instead of giving each program its own row's group of parts (the same results;
    default REFINE_COMPACT; see `sampling_select._refine_kernel`). `refine_min_programs` is the
    fewest programs of that compact launch (the same results; default
    `sampling_select.REFINE_MIN_PROGRAMS`; see `sampling_select.refine_programs`).
    `pivot_beside=True` (CUDA, with `pivot` and the search launches; default PIVOT_BESIDE)
    launches the pivot rounds right after the plan on a stream of their own, beside the refine
    and collect launches, and joins them before the finish: they read and write only the rows
    in mode PIVOT_PENDING, which no refine or collect program touches, so the results are the
    same; off when `paths` is asked for (its "refined" snapshot would race with the rounds).
    `paths`, when a dict, receives "mode": [R] int32, the path each row took
    (sampling_select.DONE / DRAW / COLLECT / FALLBACK / DIRECT / PIVOTED).

    Latency knobs of the direct path (each gives the same tokens, thresholds, log_norm and
    paths["mode"] as the default, except where said; see bench/exp_plan_direct.py):
    `plan_warps`, the plan's warps (the sums of the direct rows' finish, and the plan's sum of
    pass 1's block partials, are then over another thread layout); `direct_top=True` takes
    t_k itself (not the counted bound) and the top tiles from one `tl.topk` of (max, id) keys
    (fewer candidates, the same leading ones) and reads them `direct_group` (default 64)
    tiles at a time with no tile list (`_top_tiles`); without it the listed tiles are read
    `direct_group` (default 2048 // tile) at a time, software-pipelined with
    `direct_pipe=True`; `direct_small` (default DIRECT_SMALL; 0 = off, else a power of two
    below 256) sorts at most that many candidates in a smaller sort (the sums then run over
    another layout: same results only where the experiment shows it); `direct_in="collect"`
    decides the direct rows in program 0 of their row in the collect launch instead of in
    the plan, so that they run beside the other rows' refine and collect rather than before
    them (`_collect_direct_kernel`); `direct_in="spread"`: the plan only lists the top tiles
    (those reaching the counted bound, or t_k with direct_top), every collect program of the
    row reads a few of them and the finish sorts the candidates; `direct_in="beside"`: a
    kernel of their own (`_direct_rows_kernel`, the plan's `_direct_top_k` call and layout)
    decides them, on CUDA with the search launches (and no `paths`) on a stream of its own
    (`side_stream(device, "direct")`) beside the refine and collect launches, else in line.
    With any of the three, paths["planned"] / ["refined"] show DIRECT / SPREAD also for rows
    that then fall back; paths["mode"] is the default's. The default, "auto", is "beside"
    when DIRECT_BESIDE is set and the launch runs the search launches on CUDA without
    `paths` (`direct_beside`, default DIRECT_BESIDE; the Sampler passes False when no row
    has a small top-k), else "collect" when the launch has the refine and collect kernels
    anyway (`search`) and at most DEFER_ROWS rows, else "plan": the direct rows' results are
    the same either way (the same `_direct_top_k` call, the same layout), so a row's results
    do not depend on its batch.
    """
    R, V = logits.shape
    dev = logits.device
    tile = tile or tile_size(V)
    if tile < 4 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 4, got {tile}")
    if cap < 16 or cap & (cap - 1):
        raise ValueError(f"cap must be a power of two >= 16, got {cap}")
    for name, v in (("plan_warps", plan_warps), ("direct_group", direct_group or 1),
                    ("direct_small", direct_small or 1)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if direct_in not in ("auto", "plan", "collect", "spread", "beside"):
        raise ValueError(f"direct_in must be 'auto', 'plan', 'collect', 'spread' or 'beside', got {direct_in!r}")
    NT = -(-V // tile)
    NT_P2 = max(16, _next_pow2(NT))
    sub = draw_sub_chunk(V)
    if tile > sub:
        raise ValueError(f"tile must be at most the draw's sub-chunk ({sub} tokens at V={V}), got {tile}")
    # a knob asks for at most 1024 blocks: the plan combines their partials in one vector
    tpb, nblk = pass1_blocks(NT, tile, None if num_chunks is None else max(1, min(int(num_chunks), NT, 1024)))
    G = max(1, 2048 // tile)
    kmax = max(0, int(kmax)) if select else 0
    # topk width: k <= TOPT for every direct row, or k > NT_P2 (fewer tiles than k: t_k = -inf)
    topt = min(_next_pow2(max(kmax, 1)), NT_P2) if direct_top else 0
    gd = min(direct_group or 64, topt) if direct_top else (direct_group or G)
    ds = direct_small if 0 < direct_small < min(256, cap) else 0
    # no filter tensor at all: no row can need the search; the direct rows of defer > 0 and
    # the DRAW rows of select=False need the collect launch
    search = (bool(search) and (top_k is not None or top_p is not None or min_p is not None)) or not select
    if direct_in == "auto":
        if (DIRECT_BESIDE if direct_beside is None else direct_beside) and search and top_k is not None \
                and dev.type == "cuda" and paths is None:
            direct_in = "beside"
        else:
            direct_in = "collect" if search and R <= DEFER_ROWS else "plan"
    defer = {"plan": 0, "collect": 1, "spread": 2, "beside": 1}[direct_in] if kmax > 0 else 0
    direct_rows = defer == 1 and direct_in == "beside"    # decided by _direct_rows_kernel
    # the collect launch decides the direct rows of "collect" and reads the tiles of "spread"
    search = search or (defer != 0 and not direct_rows)
    tokens = torch.empty(R, dtype=torch.int64, device=dev)
    thr = torch.empty(R, dtype=torch.float32, device=dev)
    rmax = torch.empty_like(thr)
    lnorm = torch.empty_like(thr)
    if R == 0:
        return tokens, thr, rmax, lnorm
    # a filter that is not given is off on every row: a view of a cached constant (no fill kernel)
    if top_k is None:
        top_k = constant_rows(R, 0, torch.int32, dev)
    if top_p is None:
        top_p = constant_rows(R, 1.0, torch.float32, dev)
    # log(min_p) once, in torch, so that the kernels and the reference share its rounding
    log_min_p = constant_rows(R, float("-inf"), torch.float32, dev) if min_p is None else torch.log(min_p)
    s3, bpp = refine_geometry(V)
    sg = default_search_group(R, s3) if search_group is None else int(search_group)
    if sg < 1 or sg & (sg - 1):
        raise ValueError(f"search_group must be a power of two, got {search_group!r}")
    cg = (1 if search_group is None else sg) if collect_group is None else int(collect_group)
    if cg < 1 or cg & (cg - 1):
        raise ValueError(f"collect_group must be a power of two, got {collect_group!r}")
    atomic_slots = ATOMIC_SLOTS if atomic_slots is None else bool(atomic_slots)
    refine_compact = REFINE_COMPACT if refine_compact is None else bool(refine_compact)
    s3g = -(-s3 // sg)   # programs per row of the refine launch (by row; compact: refine_programs)
    floor = REFINE_MIN_PROGRAMS if refine_min_programs is None else int(refine_min_programs)
    if floor < 1:
        raise ValueError(f"refine_min_programs must be >= 1, got {refine_min_programs!r}")
    refine_grid = (refine_programs(R, s3, sg, floor),) if refine_compact else (R, s3g)
    s3c = -(-s3 // cg)   # and of the collect launch
    f32, i32 = torch.float32, torch.int32
    tile_max = torch.empty(R, NT, dtype=f32, device=dev)
    part_f = torch.empty(R, nblk, 4, dtype=f32, device=dev)
    tile_sum = torch.empty(R, NT, dtype=f32, device=dev)
    hist = torch.empty(R, nblk, HIST_BINS, dtype=torch.int16, device=dev)
    hist_top = torch.empty(R, nblk, dtype=i32, device=dev)
    st_i = torch.empty(R, STATE_I, dtype=i32, device=dev)
    st_f = torch.empty(R, STATE_F, dtype=f32, device=dev)
    h2 = torch.empty(R, s3, SUB_BINS, dtype=i32, device=dev)
    pn = torch.empty(R, s3, dtype=i32, device=dev)
    pf = torch.empty(R, s3, 3, dtype=f32, device=dev)
    pi = torch.empty(R, s3, dtype=i32, device=dev)
    tile_list = torch.empty(R, NT_P2, dtype=i32, device=dev)
    cand = torch.empty(R, cap, dtype=torch.int64, device=dev)
    pdl = pdl_kwargs(logits)
    regs = later_maxnreg(R)
    # rows that need the search are the rows with a histogram: without them pass 1 runs lighter
    row_stats_pass(logits, inv_temperature, top_k, top_p, log_min_p, tile, tpb,
                   tile_max, tile_sum, part_f, hist, hist_top, blocks_per_program, kmax=kmax, histograms=search,
                   pivot=pivot)
    _plan_kernel[(R,)](
        logits, logits.stride(0), inv_temperature, top_k, top_p, log_min_p,
        tile_max, tile_sum, part_f, hist, hist_top, seeds, positions, tile_list, cand,
        tokens, thr, rmax, lnorm, st_i, st_f,
        V, NT, nblk, stream, kmax,
        TILE=tile, NT_P2=NT_P2, S_P2=max(16, _next_pow2(nblk)), CAP=cap, GB=32, SELECT=select, HB=HIST_BINS, G=G, SUB=sub,
        SMALL=min(256, cap), TOPT=topt, GD=gd, PIPE=direct_pipe, DS=ds, DEFER=defer, SEARCH=search,
        PIVOT=pivot, num_warps=plan_warps, maxnreg=regs["plan"], **pdl,
    )
    if paths is not None:
        paths["planned"] = st_i[:, 0].clone()
    pivot_mass = torch.empty(R, -(-V // sub), dtype=f32, device=dev) if pivot else None
    overlap = select and search and dev.type == "cuda" and paths is None   # a side stream has work beside
    beside = (PIVOT_BESIDE if pivot_beside is None else bool(pivot_beside)) and pivot and overlap
    direct_kw = dict(CAP=cap, TILE=tile, G=G, NT_P2=NT_P2, SMALL=min(256, cap), TOPT=topt, GD=gd, PIPE=direct_pipe,
                     DS=ds, num_warps=plan_warps)   # the plan's layout: the plan's results

    def launch_direct_rows(**launch_pdl):
        _direct_rows_kernel[(R,)](
            logits, logits.stride(0), inv_temperature, top_k, top_p, seeds, positions, tile_max, st_i, st_f,
            cand, tile_list, tokens, thr, lnorm, V, NT, stream, kmax, **direct_kw, **launch_pdl)

    main_stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
    forks = []   # side streams from here to the join before the finish
    if direct_rows and overlap:
        forks.append(side_stream(dev, "direct"))
        forks[-1].wait_stream(main_stream)
        with torch.cuda.stream(forks[-1]):
            launch_direct_rows()   # plain: it follows an event wait, not a kernel of the chain
    if beside:
        forks.append(side_stream(dev, "pivot"))
        forks[-1].wait_stream(main_stream)
        with torch.cuda.stream(forks[-1]):
            pivot_rounds(logits, inv_temperature, top_p, seeds, positions, tile_max, st_i, st_f, pivot_mass, tokens,
                         stream, sub, tile, pdl=pdl, skip=pivot_skip, group=pivot_group, first_pdl=False)
    if select and search:
        for last in (False, True):
            _refine_kernel[refine_grid](
                logits, logits.stride(0), inv_temperature, st_i, st_f, h2, pn, pf, V, s3, bpp, R, BLOCK=2048,
                GROUP=1 if refine_compact else sg, COMPACT=refine_compact, R_P2=max(2, _next_pow2(R)), num_warps=8,
                **pdl)
            _refine_combine_kernel[(R,)](top_k, top_p, st_i, st_f, h2, pn, pf, s3, CAP=cap, GS=32, LAST=last,
                                         num_warps=4, **pdl)
    if paths is not None:
        paths["refined"] = st_i[:, 0].clone()
        paths["state"] = st_f.clone()
    if defer and not direct_rows:
        _collect_direct_kernel[(R, s3)](
            logits, logits.stride(0), inv_temperature, top_k, top_p, seeds, positions, tile_max, st_i, st_f,
            cand, pn, pf, pi, tile_list, tokens, thr, lnorm, V, NT, s3, bpp, stream, kmax,
            BLOCK=2048, CAP=cap, TILE=tile, G=G, NT_P2=NT_P2, SMALL=min(256, cap), TOPT=topt, GD=gd,
            PIPE=direct_pipe, DS=ds, TPP=min(16, _next_pow2(-(-2 * kmax // s3))),   # [TPP, TILE] a load
            DEFER=defer, ATOMIC_SLOTS=atomic_slots, num_warps=8, **pdl)
    elif search:
        _collect_kernel[(R, s3c)](logits, logits.stride(0), inv_temperature, seeds, positions, st_i, st_f, cand,
                                  pn, pf, pi, V, s3, bpp, stream, BLOCK=2048, CAP=cap, GROUP=cg,
                                  ATOMIC_SLOTS=atomic_slots, num_warps=8, maxnreg=regs["collect"], **pdl)
    if direct_rows and not overlap:
        launch_direct_rows(**pdl)
    for fork in forks:
        main_stream.wait_stream(fork)
    if pivot and not beside:
        pivot_rounds(logits, inv_temperature, top_p, seeds, positions, tile_max, st_i, st_f, pivot_mass, tokens,
                     stream, sub, tile, pdl=pdl, skip=pivot_skip, group=pivot_group)
    _finish_kernel[(R,)](
        logits, logits.stride(0), inv_temperature, top_k, top_p, seeds, positions, tile_max,
        st_i, st_f, pn, pf, pi, tile_list, cand, tokens, thr, lnorm,
        V, NT, s3, stream,
        TILE=tile, G=G, NT_P2=NT_P2, CAP=cap, GS=64, GUESS=guess, SMALL=min(256, cap), SPREAD_ROWS=defer == 2,
        # 2 programs per SM (a few cold scalars spill); after a join, a plain launch: it follows
        # an event wait, not only the kernel before it
        num_warps=8, maxnreg=128, **({} if forks else pdl),
    )
    if paths is not None:
        paths["mode"] = st_i[:, 0]
    return tokens, thr, rmax, lnorm
