"""Sampling: a row read tile by tile, for the paths where one program handles a row.

A tile is TILE consecutive tokens; pass 1 (sampling_stats.py) wrote the max of each. The
direct top-k path (sampling_direct.py), the exact search (sampling_exact.py) and the plan's
greedy argmax (sampling_plan.py) read only the tiles whose max reaches a value: they list
them (`_select_tiles`), load them G at a time (`_load_group`) and store the tokens of a
value bracket as sortable candidates (`_collect`, for sampling_candidates.py).
"""

import triton
import triton.language as tl

from .sampling_common import pack_key

_BIG = tl.constexpr(2147483647)


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
def _first_argmax(row, tm_row, NT, m, V, TILE: tl.constexpr, NT_P2: tl.constexpr):
    """First index of the row max m (unscaled row): scan the first tile whose max is m."""
    t = tl.arange(0, NT_P2)
    tm = tl.load(tm_row + t, mask=t < NT, other=float("-inf"))
    first = tl.minimum(tl.min(tl.where(tm == m, t, _BIG), axis=0), NT - 1)
    offs = first * TILE + tl.arange(0, TILE)
    x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    return tl.min(tl.where(x == m, offs, _BIG), axis=0)
