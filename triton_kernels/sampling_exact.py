"""Sampling: the exact single-program search, the fallback of every path.

A row that the plan could not bracket, that failed a check of the finish, or that a launch
without the search launches could not decide, gets its thresholds here from one program:
lower bounds of the cuts from the sorted tile maxima, then a bisection on the value that
counts tokens and mass over the tiles reaching the probes, until at most CAP tokens are left
for a sort (sampling_candidates.py). Slow on a wide row, never wrong.
"""

import triton
import triton.language as tl

from .rng import exponential, random_words
from .sampling_candidates import _sorted_candidates
from .sampling_common import float_key, key_float, select_word, token_noise
from .sampling_tiles import _BIG, _collect, _group_ids, _group_x, _max2, _min2, _select_tiles, _sum2

_MAX_SEARCH = tl.constexpr(64)
NPROBE = tl.constexpr(8)   # thresholds counted per pass of the exact search (a power of 2)


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
