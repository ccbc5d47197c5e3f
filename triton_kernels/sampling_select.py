"""Sampling, the threshold search spread over the whole GPU: plan, refine, collect.

Between pass 1 (sampling_stats.py) and the finish (sampling_finish.py) a row with
top-k / top-p / min-p (but not a small top-k: mode DIRECT, decided in the plan from the
tile maxima) goes through at most four small launches, each one read of the row at most,
many programs per row, no host sync:

1. plan (one program per row): adds up the row's level-1 count histogram (pass 1, bins of
   1/2 unit aligned on the row max) and bounds the thresholds with it. Counts are exact,
   so the bin of the k-th largest value is known; a bin's mass lies between its count
   times exp(bin floor - m) and times exp(bin ceiling - m), which brackets the top-p cut
   between two bins. The row gets a bracket [lo, hi) of values and a mode:
   - DRAW: the threshold is already exact (min_p alone, or min_p above the top-k bin);
   - COLLECT: the bracket holds at most CAP tokens;
   - REFINE_COUNT / REFINE_MASS: more than CAP tokens: a finer histogram is needed;
   - FALLBACK: anything the bounds cannot settle (the k-th value or the top-p cut below
     the 31-unit window, top-k above CAP with top-p and a bracket of more than CAP
     tokens): the exact single-program search of sampling_exact.py.
   With top-k (at most CAP) and top-p, a bracket of more than CAP tokens is refined like
   top-k alone (REFINE_COUNT); the collect then stores every token from the k-th value's
   sub-bin up (at most k plus that sub-bin's tokens), and the finish cuts top-p among them.
2. refine (programs per row), twice: 63 equal sub-bins of [lo, hi), the exact count and
   mass above hi and in [lo, hi) and the exact mass above the min-p threshold;
   refine_combine narrows the bracket to a few sub-bins (COLLECT when they hold at most
   CAP tokens, else another round, after the last FALLBACK).
3. collect (programs per row): stores every token of [lo, hi) as a sortable key, and the
   exact count, mass and best exponential-race score of the tokens >= hi (all kept).

The finish sorts the candidates and decides the exact thresholds, checking every
assumption the bounds made (a failed check falls back to the exact search), so the
histograms only steer the search: its result never depends on them.
Partial sums are added in a fixed order and the program geometry depends on the
vocabulary only, so a row's result does not depend on the batch.
"""

import triton
import triton.language as tl

from .rng import exponential, random_words
from .sampling_common import pack_key, pdl_start, pivot_sub_chunk_mass, select_word
from .sampling_stats import _HB, _NO_TOP, _W, grid_bin

DONE = tl.constexpr(0)
DRAW = tl.constexpr(1)
REFINE_COUNT = tl.constexpr(2)
REFINE_MASS = tl.constexpr(3)
COLLECT = tl.constexpr(4)
FALLBACK = tl.constexpr(5)
DIRECT = tl.constexpr(6)       # small top-k, decided in the plan from the top tiles (sampling_direct.py)
SPREAD = tl.constexpr(7)       # small top-k, top tiles listed by the plan, read by collect, decided by the finish
PIVOT_PENDING = tl.constexpr(8)  # top-p / min-p without top-k, by pivot rejection (sampling_pivot.py): pending
PIVOTED = tl.constexpr(9)        # the same rows, a candidate accepted by pivot rejection (token decided)
DIRECT_LATE = tl.constexpr(10)   # a DIRECT row its side stream could not decide: that stream's finish launch
PIVOT_LATE = tl.constexpr(11)    # a pivot row no round accepted, the same on the pivot stream (side_finish)

SUB_BINS = 64                  # refine: 63 sub-bins + nothing, two rounds
_SB = tl.constexpr(SUB_BINS)
STATE_I = 4                    # per row int32: mode, candidate count (PIVOT_PENDING: the candidate token), min-p above
                               # the k-th value, top tiles (SPREAD; -1 on a pivot row)
STATE_F = 6                    # per row fp32: m, z, lo (PIVOT_PENDING: the pivot), hi (PIVOT_PENDING: Z_t),
                               # t1 (min-p threshold or -inf), target
_BIG = tl.constexpr(1 << 20)
_IMAX = tl.constexpr(2147483647)
_LO_SAFE = tl.constexpr(0.99999)   # margins on the mass bounds (exp rounding): the finish checks anyway
_HI_SAFE = tl.constexpr(1.00001)


@triton.jit
def _row_histogram(hist_row, top_row, NBLK, A, GB: tl.constexpr):
    """Level-1 counts of one row aligned on its top bin A ([_HB] int32; bin J holds the tokens
    with grid_bin(x) = A - J, J < _HB - 2)."""
    J = tl.arange(0, _HB)
    H = tl.zeros([_HB], tl.int32)
    for b0 in range(0, NBLK, GB):
        b = b0 + tl.arange(0, GB)
        bm = b < NBLK
        top = tl.load(top_row + b, mask=bm, other=_NO_TOP)
        d = tl.minimum(A - top, _HB)                       # >= 0: A is the row's top bin
        src = J[None, :] - d[:, None]
        ok = bm[:, None] & (src >= 0) & (src < _HB - 2)
        H += tl.sum(tl.load(hist_row + b.to(tl.int64)[:, None] * _HB + src, mask=ok, other=0).to(tl.int32), axis=0)
    return H


@triton.jit
def plan_filtered(hist_row, top_row, NBLK, n_fin, m, z, k, p, tau_min, has_k, has_p, has_mp,
                  CAP: tl.constexpr, GB: tl.constexpr):
    """(mode, lo, hi, t1_exact) of a row with top-k, top-p or min-p (see the module docstring).

    t1_exact: min_p is on and its threshold lies in a higher bin than the k-th value (or
    top-k is off), so the top-k cut is below it and drops nothing more. hi = +inf when
    every token >= lo fits in the candidates (the finish then needs nothing else).
    """
    W = _HB - 2
    A = grid_bin(m)
    H = _row_histogram(hist_row, top_row, NBLK, A, GB)
    J = tl.arange(0, _HB)
    inw = J < W
    cntc = tl.cumsum(H, axis=0)
    Jk = tl.where(has_k, tl.sum((inw & (cntc < k)).to(tl.int32), axis=0), _BIG)   # W: not in the window
    J_min = tl.where(has_mp, tl.minimum(tl.maximum(A - grid_bin(tau_min), 0), _BIG), _BIG)
    J_t1 = tl.minimum(Jk, J_min)
    t1_exact = has_mp & (J_min < Jk)                    # min_p lies above the k-th value's bin
    edge = (A - J).to(tl.float32) * _W                  # floor of bin J
    Hf = H.to(tl.float32)
    mlo = tl.where(inw, Hf * tl.exp(edge - m) * _LO_SAFE, 0.0)
    mhi = tl.where(inw, Hf * tl.exp(edge + _W - m) * _HI_SAFE, 0.0)
    mode = k * 0 + FALLBACK
    lo = tl.full([], 0.0, tl.float32)
    hi = lo
    J_low = J_t1
    J_top = J_t1
    if ~has_p:
        if t1_exact:
            mode = k * 0 + DRAW
            lo = tau_min
            hi = tau_min
        elif Jk < W:
            lo = (A - Jk).to(tl.float32) * _W
            hi = lo + _W
            c = tl.sum(tl.where(J == Jk, H, 0), axis=0)
            mode = tl.where(c <= CAP, COLLECT, REFINE_COUNT)
    else:
        pure = J_t1 >= _BIG                                 # top-p over the whole row: exact target
        exact_t1 = pure | t1_exact
        ml = tl.sum(tl.where(J < J_t1, mlo, 0.0), axis=0)
        mu = tl.sum(tl.where(J <= J_t1, mhi, 0.0), axis=0)
        t_lo = tl.where(pure, p * z, p * ml)                # bounds of the top-p target mass
        t_hi = tl.where(pure, p * z, p * mu)
        u_above = tl.cumsum(mhi, axis=0) - mhi              # >= mass above the ceiling of bin J
        l_incl = tl.cumsum(mlo, axis=0)                     # <= mass at or above the floor of bin J
        if pure:   # Z is exact: bound the mass above a bin by Z minus the mass below it too
            n_under = (n_fin - tl.sum(H, axis=0)).to(tl.float32)
            under_hi = n_under * tl.exp((A - W + 1).to(tl.float32) * _W - m) * _HI_SAFE
            u_above = tl.minimum(u_above, z - (tl.sum(mlo, axis=0) - tl.cumsum(mlo, axis=0) + mlo))
            l_incl = tl.maximum(l_incl, z - (tl.sum(mhi, axis=0) - tl.cumsum(mhi, axis=0) + under_hi))
        J_top = tl.maximum(tl.sum((inw & (u_above < t_lo)).to(tl.int32), axis=0) - 1, 0)
        J_bot = tl.sum((inw & (l_incl < t_hi)).to(tl.int32), axis=0)
        J_low = tl.where(exact_t1, tl.minimum(J_bot, J_t1), J_t1)
        J_top = tl.minimum(J_top, J_low)
        if J_low < W:
            lo = (A - J_low).to(tl.float32) * _W
            hi = (A - J_top + 1).to(tl.float32) * _W
            c = tl.sum(tl.where((J >= J_top) & (J <= J_low), H, 0), axis=0)
            mode = tl.where(c <= CAP, COLLECT, tl.where(exact_t1, REFINE_MASS, FALLBACK))
            if (mode == FALLBACK) & has_k & (k <= CAP):
                # the top-p base is the mass of the top-k set, which fits the candidates once the
                # k-th value is narrowed: refine it as for top-k alone, then collect every token
                # above it (refine_combine) and let the finish cut top-p among them
                mode = k * 0 + REFINE_COUNT
                lo = (A - Jk).to(tl.float32) * _W
                hi = lo + _W
    # every token >= lo fits in the candidates: collect them all, no race over the row
    n_from_lo = tl.sum(tl.where(J <= tl.minimum(J_low, W - 1), H, 0), axis=0)
    if ((mode == COLLECT) | (mode == DRAW)) & (J_low < W) & (n_from_lo <= CAP):
        mode = k * 0 + COLLECT
        hi = tl.full([], float("inf"), tl.float32)
    return mode, lo, hi, t1_exact


def search_group(rows: int, programs_per_row: int) -> int:
    """Programs c of a row that one program of the refine launch handles by default: the
    largest power of two up to `rows`, at most 8 (the collect launch keeps one: see below).
    Most programs of the refine launch only test their row's mode (rows of other paths) and
    exit, and at large batches those exits take much of the launch; each c's partials are
    computed and stored as without grouping, so the results are the same.

    H200, fp32 V = 128256 (32 programs per row), sample(..., distribution=False), every
    variant bit for bit the default's:
    - one group for both launches (bench/results/logs/exp_search_group_2026-12-03.txt),
      bench_sampling's mixed rows: batch 32 62.3 / 69.3 / 78.5 / 100.8 µs at group 1 / 2 / 4 /
      8, batch 128 115.2 / 111.5 / 126.5 / 151.4, batch 512 272.4 / 249.3 / 238.4 / 279.6:
      grouping shortened refine (49 -> 20 µs at 8) and lengthened collect (64 -> 103), whose
      kept rows' work it serialises;
    - so the collect launch keeps one c per program and only refine groups
      (bench/results/logs/exp_collect_slots_2026-12-03.txt, with per-candidate atomic slots):
      refine at 8 against session 34's default (one group, 1 / 1 / 2 / 4) took 44.4 / 57.9 /
      100.6 / 217.5 µs against 44.5 / 60.0 / 104.7 / 222.8 at batch 8 / 32 / 128 / 512.
    `programs_per_row` caps the group (a row has no more programs to give). Since session 36
    the refine launch deals its parts compactly by default (`_refine_kernel`, COMPACT): the
    group then sets only its size, R * ceil(programs_per_row / group) programs, and since
    session 37 at least REFINE_MIN_PROGRAMS of them (`refine_programs`)."""
    g = 1
    while g * 2 <= min(8, rows, programs_per_row):
        g *= 2
    return g


REFINE_MIN_PROGRAMS = 256
"""The fewest programs of the compact refine launch (`refine_programs`): two per SM of an
H200 (132 SMs), so that a batch of a few rows that all refine has one part per program."""


def refine_programs(rows: int, programs_per_row: int, group: int, floor: int = REFINE_MIN_PROGRAMS) -> int:
    """Programs of the compact refine launch (`_refine_kernel`, COMPACT): R * ceil(S3 / group),
    raised to `floor` but to no more than R * S3 (one part (row, c) each). Every part is
    computed and stored the same whatever the count, so this changes the speed only.

    The group alone sized the launch until session 37: at batch 8 it gave 32 programs for up
    to 256 parts, so when every row refined (top-p alone with its threshold, `distribution=True`)
    each program read 8 x BPP blocks one after another. H200, sample(..., distribution=True)
    on rows all top_p 0.9 / 0.95 (bench_sampling's top-p rows), the same results bit for bit
    (bench/results/logs/exp_refine_programs_2026-12-03.txt), floor 256 against none:
    fp32 V = 128256 batch 2 / 8 / 32 33.6 / 40.0 / 92.5 µs against 37.3 / 60.5 / 105.6, bf16
    V = 151936 batch 8 50.4 against 74.3 (session 32's table, before the grouping: 42.6 /
    100.2 at fp32 batch 8 / 32, 61.7 at bf16 batch 8). One part per program (no cap on the
    floor) took 89.3 at fp32 batch 32 but 59.2 against 57.0 on bench_sampling's mixed rows
    (tokens only, where few rows refine), which took 42.2 / 57.0 at batch 8 / 32 with the
    floor against 41.9 / 56.9 without."""
    return min(rows * programs_per_row, max(rows * -(-programs_per_row // group), floor))


def refine_geometry(vocab: int, block: int = 2048, max_programs: int = 32) -> tuple[int, int]:
    """(programs per row, blocks of `block` tokens per program) of refine and collect.

    A function of the vocabulary only (batch invariance). 32 programs per row: at batch 512
    fewer, longer programs win (H200, V=128256: 16 / 32 / 128 programs -> 624 / 659 / 739 µs
    for the whole sample), at batch 1 more programs win (128: 25 µs).
    """
    blocks = -(-vocab // block)
    per_prog = -(-blocks // max_programs)
    return -(-blocks // per_prog), per_prog


@triton.jit
def _row_inputs(logits_ptr, stride_row, inv_temp_ptr, st_f_ptr, r):
    """(row pointer, 1/T, m, lo, hi, t1) of row r, as refine and collect read them."""
    row = logits_ptr + r.to(tl.int64) * stride_row
    inv_t = tl.load(inv_temp_ptr + r)
    m = tl.load(st_f_ptr + r * 6 + 0)
    lo = tl.load(st_f_ptr + r * 6 + 2)
    hi = tl.load(st_f_ptr + r * 6 + 3)
    t1 = tl.load(st_f_ptr + r * 6 + 4)
    return row, inv_t, m, lo, hi, t1


@triton.jit
def merge_best(sc, idx, best, tok, NO_TOKEN: tl.constexpr):
    """(best, tok) updated with the best of the race scores sc [N] (tokens idx [N]).

    Ties go to the lowest token, within the block and against the running best; an index
    without a candidate is NO_TOKEN (larger than any token).
    """
    bs = tl.max(sc, axis=0)
    bi = tl.min(tl.where(sc == bs, idx, NO_TOKEN), axis=0)
    better = (bs > best) | ((bs == best) & (bi < tok))
    return tl.where(better, bs, best), tl.where(better, bi, tok)


@triton.jit(do_not_specialize=["V", "S3", "BPP", "R"])
def _refine_kernel(
    logits_ptr, stride_row,          # [R, V]
    inv_temp_ptr,                    # [R] fp32
    st_i_ptr, st_f_ptr,              # [R, 4] int32, [R, 6] fp32 row states
    h2_ptr,                          # [R, S3, _SB] int32 out
    n_ptr,                           # [R, S3] int32 out: tokens >= hi
    mass_ptr,                        # [R, S3, 3] fp32 out: mass >= hi, mass >= t1, mass in [lo, hi)
    V, S3, BPP, R,
    BLOCK: tl.constexpr,
    GROUP: tl.constexpr = 1,                  # programs c of the row handled by this one (search_group)
    COMPACT: tl.constexpr = False,            # the launch's programs share the refining rows' parts (below)
    R_P2: tl.constexpr = 1,                   # COMPACT: a power of two >= R
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """Grid (R, ceil(S3 / GROUP)): program (r, g) computes parts c = g * GROUP .. + GROUP - 1 of
    row r when that row refines. COMPACT (grid (`refine_programs`,)): the parts (row, c) of
    the rows that refine, in row order, are dealt to the programs in turn, so that one row
    that refines is spread over S3 programs however large GROUP is, instead of GROUP * BPP
    blocks read one after another by each of its few programs. Either way each part's
    partials are computed and stored as `_refine_program` does: the same results."""
    pdl_start(PDL)
    if COMPACT:
        rows = tl.arange(0, R_P2)
        modes = tl.load(st_i_ptr + rows * 4, mask=rows < R, other=DONE)
        refines = ((modes == REFINE_COUNT) | (modes == REFINE_MASS)).to(tl.int32)
        parts = tl.sum(refines, axis=0) * S3
        if tl.program_id(0) < parts:                       # (most launches: no row refines)
            rank = tl.cumsum(refines, axis=0)              # refining rows up to and including each row
            for w in range(tl.program_id(0), parts, tl.num_programs(0)):
                q = w // S3                                # the q-th refining row (from 0), part c
                r = tl.sum((rank <= q).to(tl.int32), axis=0)
                c = w - q * S3
                row, inv_t, m, lo, hi, t1 = _row_inputs(logits_ptr, stride_row, inv_temp_ptr, st_f_ptr, r)
                _refine_program(row, inv_t, m, lo, hi, t1, h2_ptr, n_ptr, mass_ptr, V, S3, BPP, r, c, BLOCK)
    else:
        r = tl.program_id(0)
        mode = tl.load(st_i_ptr + r * 4)
        if (mode == REFINE_COUNT) | (mode == REFINE_MASS):
            row, inv_t, m, lo, hi, t1 = _row_inputs(logits_ptr, stride_row, inv_temp_ptr, st_f_ptr, r)
            for g in range(GROUP):
                c = tl.program_id(1) * GROUP + g
                if c < S3:
                    _refine_program(row, inv_t, m, lo, hi, t1, h2_ptr, n_ptr, mass_ptr, V, S3, BPP, r, c, BLOCK)


@triton.jit
def _refine_program(row, inv_t, m, lo, hi, t1, h2_ptr, n_ptr, mass_ptr, V, S3, BPP, r, c, BLOCK: tl.constexpr):
    """Program c of row r of the refine launch: its partials (arguments as `_refine_kernel`'s)."""
    inv_sw = (_SB - 1) / (hi - lo)
    h = tl.zeros([_SB], tl.int32)
    n_above = tl.zeros([BLOCK], tl.int32)
    m_above = tl.zeros([BLOCK], tl.float32)
    m_t1 = tl.zeros([BLOCK], tl.float32)
    m_in = tl.zeros([BLOCK], tl.float32)
    for it in range(0, BPP):
        offs = (c * BPP + it) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_t
        fin = x > float("-inf")
        e = tl.exp(x - m)
        above = fin & (x >= hi)
        n_above += above.to(tl.int32)
        m_above += tl.where(above, e, 0.0)
        m_t1 += tl.where(fin & (x >= t1), e, 0.0)
        s = tl.minimum(tl.maximum((x - lo) * inv_sw, 0.0), _SB - 2.0).to(tl.int32)
        inb = fin & (x >= lo) & (x < hi)
        m_in += tl.where(inb, e, 0.0)
        h += tl.histogram(tl.where(inb, s, _SB - 1), _SB)
    base = (r * S3 + c).to(tl.int64)
    tl.store(h2_ptr + base * _SB + tl.arange(0, _SB), h)
    tl.store(n_ptr + base, tl.sum(n_above, axis=0))
    tl.store(mass_ptr + base * 3, tl.sum(m_above, axis=0))
    tl.store(mass_ptr + base * 3 + 1, tl.sum(m_t1, axis=0))
    tl.store(mass_ptr + base * 3 + 2, tl.sum(m_in, axis=0))


@triton.jit(do_not_specialize=["S3"])
def _refine_combine_kernel(
    top_k_ptr, top_p_ptr,            # [R] int32 / fp32
    st_i_ptr, st_f_ptr,              # [R, 2] int32, [R, 6] fp32 row states (updated)
    h2_ptr, n_ptr, mass_ptr,         # refine partials
    S3,
    CAP: tl.constexpr, GS: tl.constexpr, LAST: tl.constexpr,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    pdl_start(PDL)
    r = tl.program_id(0)
    mode = tl.load(st_i_ptr + r * 4)
    if (mode == REFINE_COUNT) | (mode == REFINE_MASS):
        m = tl.load(st_f_ptr + r * 6 + 0)
        z = tl.load(st_f_ptr + r * 6 + 1)
        lo = tl.load(st_f_ptr + r * 6 + 2)
        hi = tl.load(st_f_ptr + r * 6 + 3)
        t1 = tl.load(st_f_ptr + r * 6 + 4)
        sb = tl.arange(0, _SB)
        H = tl.zeros([_SB], tl.int32)
        n_above = mode * 0
        m_above = tl.full([], 0.0, tl.float32)
        m_t1 = m_above
        m_in = m_above
        for c0 in range(0, S3, GS):                        # fixed order: batch invariant sums
            cc = c0 + tl.arange(0, GS)
            cm = cc < S3
            base = (r * S3 + cc).to(tl.int64)
            H += tl.sum(tl.load(h2_ptr + base[:, None] * _SB + sb[None, :], mask=cm[:, None], other=0), axis=0)
            n_above += tl.sum(tl.load(n_ptr + base, mask=cm, other=0), axis=0)
            m_above += tl.sum(tl.load(mass_ptr + base * 3, mask=cm, other=0.0), axis=0)
            m_t1 += tl.sum(tl.load(mass_ptr + base * 3 + 1, mask=cm, other=0.0), axis=0)
            m_in += tl.sum(tl.load(mass_ptr + base * 3 + 2, mask=cm, other=0.0), axis=0)
        real = sb < _SB - 1
        H = tl.where(real, H, 0)
        sw = (hi - lo) / (_SB - 1)
        e_lo = lo + sb.to(tl.float32) * sw                 # floor of sub-bin s
        e_hi = tl.where(sb == _SB - 2, hi, e_lo + sw)
        new_mode = mode * 0 + FALLBACK
        s_lo = mode * 0
        s_hi = s_lo
        target = tl.full([], -1.0, tl.float32)
        # top-k with top-p: collect every token from the k-th value's sub-bin up (hi = +inf)
        whole = (mode == REFINE_COUNT) & (tl.load(top_p_ptr + r) < 1.0)
        if mode == REFINE_COUNT:
            k = tl.load(top_k_ptr + r)
            above_c = n_above + (tl.sum(H, axis=0) - tl.cumsum(H, axis=0))   # tokens above sub-bin s
            # the k-th largest value lies in the highest s with above_c(s) < k <= above_c(s) + H[s]
            s_k = tl.sum((real & (above_c >= k)).to(tl.int32), axis=0)
            if (s_k < _SB - 1) & (n_above < k):
                s_lo = s_k
                s_hi = s_k
                new_mode = mode * 0 + COLLECT
        else:
            target = tl.load(top_p_ptr + r) * tl.where(t1 == float("-inf"), z, m_t1)
            Hf = H.to(tl.float32)
            mlo = Hf * tl.exp(e_lo - m) * _LO_SAFE
            mhi = Hf * tl.exp(e_hi - m) * _HI_SAFE
            # bounds of the mass above ceiling(s) and at or above floor(s), from both ends of the
            # bracket (its exact total m_in is known)
            u_above = m_above + tl.minimum(tl.sum(mhi, axis=0) - tl.cumsum(mhi, axis=0),
                                           m_in - tl.cumsum(mlo, axis=0))
            l_incl = m_above + tl.maximum(tl.sum(mlo, axis=0) - tl.cumsum(mlo, axis=0) + mlo,
                                          m_in - (tl.cumsum(mhi, axis=0) - mhi))
            s_hi = (_SB - 1) - tl.sum((real & (u_above < target)).to(tl.int32), axis=0)
            s_lo = tl.sum((real & (l_incl >= target)).to(tl.int32), axis=0) - 1
            if (m_above < target) & (s_lo >= 0) & (s_hi < _SB - 1) & (s_lo <= s_hi):
                new_mode = mode * 0 + COLLECT
        if new_mode == COLLECT:
            c = tl.sum(tl.where((sb >= s_lo) & (sb <= s_hi), H, 0), axis=0)
            if whole:
                c = n_above + tl.sum(tl.where(real & (sb >= s_lo), H, 0), axis=0)
            if c > CAP:
                if LAST:
                    new_mode = mode * 0 + FALLBACK
                else:
                    new_mode = mode            # another round over the narrower bracket
            lo2 = tl.sum(tl.where(sb == s_lo, e_lo, 0.0), axis=0)
            hi2 = tl.sum(tl.where(sb == s_hi, e_hi, 0.0), axis=0)
            tl.store(st_f_ptr + r * 6 + 2, tl.where(s_lo == 0, lo, lo2))
            tl.store(st_f_ptr + r * 6 + 3, tl.where(whole & (new_mode == COLLECT), float("inf"), hi2))
            tl.store(st_f_ptr + r * 6 + 5, target)
        tl.store(st_i_ptr + r * 4, new_mode)


@triton.jit(do_not_specialize=["V", "S3", "BPP", "stream", "NT"])
def _collect_kernel(
    logits_ptr, stride_row,          # [R, V]
    inv_temp_ptr,                    # [R] fp32
    seed_ptr, pos_ptr,               # [R] int64
    st_i_ptr, st_f_ptr,              # [R, 2] int32 (candidate count: atomic), [R, 6] fp32
    cand_ptr,                        # [R, CAP] int64 out: pack_key(x, token) of lo <= x < hi
    n_ptr,                           # [R, S3] int32 out: tokens >= hi
    f_ptr,                           # [R, S3, 3] fp32 out: their mass, best race score, mass >= t1
    i_ptr,                           # [R, S3] int32 out: token of the best score
    tile_max_ptr,                    # [R, NT] fp32 (pass 1; read with PIVOT_MASS only)
    mass_ptr,                        # [R, NC] fp32 out (PIVOT_MASS): round 1's masses of the pivot rows
    V, S3, BPP, stream, NT, NC,
    BLOCK: tl.constexpr, CAP: tl.constexpr,
    GROUP: tl.constexpr = 1,                  # programs c of the row handled by this one (search_group)
    ATOMIC_SLOTS: tl.constexpr = False,       # a candidate's slot from its own atomic (collect_program)
    PIVOT_MASS: tl.constexpr = False,         # pivot rows: round 1's masses (pivot_collect_program)
    TILE: tl.constexpr = 16,                  # PIVOT_MASS: tokens per tile of tile_max
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    pdl_start(PDL)
    r = tl.program_id(0)
    mode = tl.load(st_i_ptr + r * 4)
    if (mode == COLLECT) | (mode == DRAW):
        for g in range(GROUP):
            c = tl.program_id(1) * GROUP + g
            if c < S3:
                collect_program(logits_ptr, stride_row, inv_temp_ptr, seed_ptr, pos_ptr, st_i_ptr, st_f_ptr,
                                cand_ptr, n_ptr, f_ptr, i_ptr, V, S3, BPP, stream, r, c, mode, BLOCK, CAP,
                                ATOMIC_SLOTS)
    elif PIVOT_MASS:
        if mode == PIVOT_PENDING:
            for g in range(GROUP):
                c = tl.program_id(1) * GROUP + g
                if c < S3:
                    pivot_collect_program(logits_ptr, stride_row, inv_temp_ptr, tile_max_ptr, st_f_ptr, mass_ptr,
                                          V, NT, NC, BPP, r, c, BLOCK, TILE)


@triton.jit
def pivot_collect_program(logits_ptr, stride_row, inv_temp_ptr, tile_max_ptr, st_f_ptr, mass_ptr, V, NT, NC, BPP,
                          r, c, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """Program c of a pivot row (mode PIVOT_PENDING) in a collect launch with PIVOT_MASS: the
    masses of round 1 of sampling_pivot.py's rounds for its blocks b = c * BPP + it (b < NC), which
    are the rounds' sub-chunks (the launcher asks for it only where BLOCK = draw_sub_chunk(V) =
    2048 and the launch has 8 warps, as `_pivot_mass_kernel`'s): each one stored as that kernel
    (SKIP) stores it, the same `pivot_sub_chunk_mass` sum, or 0.0 when no tile max of the
    sub-chunk lies above the pivot and at or above the min-p floor (the same test: a max is exact
    in any order). It reads what the plan left and no launch before the pivot rounds changes: m,
    the pivot (the first candidate's value; -inf without one), the floor t (-inf without min-p)."""
    r64 = r.to(tl.int64)
    row = logits_ptr + r64 * stride_row
    inv_t = tl.load(inv_temp_ptr + r)
    m = tl.load(st_f_ptr + r * 6 + 0)
    pivot = tl.load(st_f_ptr + r * 6 + 2)
    floor = tl.load(st_f_ptr + r * 6 + 4)
    TPS: tl.constexpr = BLOCK // TILE
    for it in range(0, BPP):
        b = c * BPP + it
        if b < NC:
            t = b * TPS + tl.arange(0, TPS)
            tm = tl.max(tl.load(tile_max_ptr + r64 * NT + t, mask=t < NT, other=float("-inf")), axis=0)
            total = tl.zeros([], tl.float32)
            if (tm > pivot) & (tm >= floor):
                total = pivot_sub_chunk_mass(row, inv_t, m, pivot, floor, V, b, BLOCK)
            tl.store(mass_ptr + r64 * NC + b, total)


@triton.jit
def _collect_open_top(row, inv_t, lo, count_ptr, cand_row, V, BPP, c, BLOCK: tl.constexpr, CAP: tl.constexpr):
    """Program c's blocks of a row whose bracket is open at the top (hi = +inf) and that sums
    no mass: every finite token >= lo stored, each at the slot of its own relaxed atomic add.

    The loads take the one-token-a-thread layout of the atomics and the stores, so no layout
    conversion (shared memory and barriers) sits between them: Triton's coalescing gives every
    load of one shape the widest layout any of them gets (the general loop's 2048-token loads
    take four tokens a thread), so this loop reads a block as two halves, both loaded before
    their atomics, and its offsets are multiplied by a 1 the compiler cannot see (contiguity
    1)."""
    HALF: tl.constexpr = BLOCK // 2
    one = (BPP > 0).to(tl.int32)
    lane = tl.arange(0, HALF) * one
    for it in range(0, BPP):
        offs0 = (c * BPP + it) * BLOCK + lane
        offs1 = offs0 + HALF
        x0 = tl.load(row + offs0, mask=offs0 < V, other=float("-inf")).to(tl.float32) * inv_t
        x1 = tl.load(row + offs1, mask=offs1 < V, other=float("-inf")).to(tl.float32) * inv_t
        cand0 = (x0 > float("-inf")) & (x0 >= lo)
        cand1 = (x1 > float("-inf")) & (x1 >= lo)
        # both halves' slots asked for before either is stored: one round trip
        slot0 = tl.atomic_add(count_ptr + lane * 0, lane * 0 + 1, mask=cand0, sem="relaxed")
        slot1 = tl.atomic_add(count_ptr + lane * 0, lane * 0 + 1, mask=cand1, sem="relaxed")
        tl.store(cand_row + slot0, pack_key(x0, offs0), mask=cand0 & (slot0 < CAP))
        tl.store(cand_row + slot1, pack_key(x1, offs1), mask=cand1 & (slot1 < CAP))


@triton.jit
def collect_program(logits_ptr, stride_row, inv_temp_ptr, seed_ptr, pos_ptr, st_i_ptr, st_f_ptr, cand_ptr,
                    n_ptr, f_ptr, i_ptr, V, S3, BPP, stream, r, c, mode,
                    BLOCK: tl.constexpr, CAP: tl.constexpr, ATOMIC_SLOTS: tl.constexpr = False):
    """Program c of row r of the collect launch (arguments as `_collect_kernel`'s); also
    called by sampling_direct's collect launch that decides deferred direct rows.

    A block's candidates get their slots in the row's list from the row's atomic count: one
    atomic add of the block's count and a scan of the block (ATOMIC_SLOTS=False), or one
    relaxed atomic add per candidate (True: no block-wide count or scan). The stored set and
    the count are the same either way, only the slots differ (the finish sorts the set)."""
    if (mode == COLLECT) | (mode == DRAW):
        row, inv_t, m, lo, hi, t1 = _row_inputs(logits_ptr, stride_row, inv_temp_ptr, st_f_ptr, r)
        seed = tl.load(seed_ptr + r)
        pos = tl.load(pos_ptr + r)
        if mode == DRAW:
            lo = t1
            hi = t1
        # a bracket open at the top (hi = +inf: every token from lo up is a candidate) has no
        # token above it, so its blocks skip the count, the reduction and the race (the same
        # outputs: nothing is >= +inf on a valid row)
        has_above = hi < float("inf")
        n_above = mode * 0
        m_above = tl.zeros([BLOCK], tl.float32)
        m_t1 = tl.zeros([BLOCK], tl.float32)
        best = tl.full([], -1.0, tl.float32)
        tok = mode * 0 + _IMAX
        lane = tl.arange(0, BLOCK)
        # an open-top bracket with nothing to sum (no min-p mass): only its candidates to store
        if (~has_above) & ~((mode == COLLECT) & (t1 > float("-inf"))) & ATOMIC_SLOTS:
            _collect_open_top(row, inv_t, lo, st_i_ptr + r * 4 + 1, cand_ptr + r.to(tl.int64) * CAP, V, BPP, c,
                              BLOCK, CAP)
        else:
            for it in range(0, BPP):
                offs = (c * BPP + it) * BLOCK + lane
                x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_t
                fin = x > float("-inf")
                if has_above:
                    above = fin & (x >= hi)
                    na = tl.sum(above.to(tl.int32), axis=0)
                    if na > 0:
                        e = tl.exp(x - m)
                        m_above += tl.where(above, e, 0.0)
                        # call index written so that the compiler sees the 4 tokens of a thread share it
                        w0, w1, w2, w3 = random_words(seed, pos, stream, offs >> 2)
                        sc = tl.where(above, e / exponential(select_word(w0, w1, w2, w3, offs & 3)), -1.0)
                        best, tok = merge_best(sc, offs, best, tok, _IMAX)
                        n_above += na
                if (mode == COLLECT) & (t1 > float("-inf")):
                    m_t1 += tl.where(fin & (x >= t1), tl.exp(x - m), 0.0)
                cand = fin & (x >= lo) & (x < hi)
                if ATOMIC_SLOTS:
                    slot = tl.atomic_add(st_i_ptr + r * 4 + 1 + lane * 0, lane * 0 + 1, mask=cand, sem="relaxed")
                    tl.store(cand_ptr + r.to(tl.int64) * CAP + slot, pack_key(x, offs), mask=cand & (slot < CAP))
                else:
                    nc = tl.sum(cand.to(tl.int32), axis=0)
                    if nc > 0:
                        first = tl.atomic_add(st_i_ptr + r * 4 + 1, nc)
                        slot = first + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                        tl.store(cand_ptr + r.to(tl.int64) * CAP + slot, pack_key(x, offs), mask=cand & (slot < CAP))
        base = (r * S3 + c).to(tl.int64)
        tl.store(n_ptr + base, n_above)
        tl.store(f_ptr + base * 3, tl.sum(m_above, axis=0))
        tl.store(f_ptr + base * 3 + 1, best)
        tl.store(f_ptr + base * 3 + 2, tl.sum(m_t1, axis=0))
        tl.store(i_ptr + base, tok)
