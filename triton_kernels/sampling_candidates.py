"""Sampling: the exact thresholds of a row from its collected candidates, and the draw.

Every path that narrows a row to a value bracket (the collect launch of sampling_select.py,
the direct top-k path, the exact search) stores pack_key(x, token) of the bracket's tokens.
`_finish_collected` sorts their values, decides tau exactly (the k-th value, the min-p
threshold, the top-p cut: sampling_topk_topp.py, step 4), checks what the plan assumed,
and draws the exponential race over the kept tokens.
"""

import triton
import triton.language as tl

from .sampling_common import float_key, key_float, token_noise, unpack_key
from .sampling_tiles import _BIG

_PAD_KEY = tl.constexpr(-9187343241974906880)  # pack_key(-inf, 0): sorts after every candidate


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
