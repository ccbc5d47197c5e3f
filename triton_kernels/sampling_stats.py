"""Sampling pass 1: one read of every logits row -> per-chunk statistics and tile maxima.

Grid (rows, chunks): a row is split over several programs when the batch is small. Each
program reads its chunk once, tile by tile, and writes

- the max of every tile of TILE tokens (`tile_max`, temperature-scaled): pass 2 uses it
  to bound the top-k / top-p / min-p threshold and then reads only the tiles that can
  hold a kept token;
- its chunk's max, sum exp(x - max) (NaN when the chunk holds a NaN or +inf) and argmax
  (first index; the greedy token);
- for rows that need no threshold (random, no top-k / top-p / min-p) the draw itself:
  the chunk's best exp(x - max) / E and its index, E being the row's Exp(1) noise.

x = logits * (1 / temperature) on random rows and the logits themselves on greedy rows.
"""

import triton
import triton.language as tl

from .rng import exponential, random_words
from .sampling_common import select_word

_BIG = tl.constexpr(2147483647)


@triton.jit(do_not_specialize=["NT", "TILES_PER_PROG", "S", "stream"])
def _row_stats_kernel(
    logits_ptr, stride_row,       # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                 # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,         # [R] int32 / fp32
    log_min_p_ptr,                # [R] fp32: log(min_p), -inf = off
    seed_ptr, pos_ptr,            # [R] int64
    tile_max_ptr,                 # [R, NT] fp32 out
    part_f_ptr,                   # [R, S, 3] fp32 out: max, sumexp, best score
    part_i_ptr,                   # [R, S, 2] int32 out: argmax, best index
    V, NT, TILES_PER_PROG, S, stream,
    TILE: tl.constexpr, TPB: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    Q: tl.constexpr = TILE // 4
    row = logits_ptr + r.to(tl.int64) * stride_row
    inv_t = tl.load(inv_temp_ptr + r)
    scale = tl.where(inv_t > 0, inv_t, 1.0)
    k = tl.load(top_k_ptr + r)
    unfiltered = (inv_t > 0) & ((k <= 0) | (k >= V)) & (tl.load(top_p_ptr + r) >= 1.0)
    unfiltered = unfiltered & (tl.load(log_min_p_ptr + r) == float("-inf"))
    seed = tl.load(seed_ptr + r)
    pos = tl.load(pos_ptr + r)

    tt = tl.arange(0, TPB)
    t3 = tt[:, None, None]
    q3 = tl.arange(0, Q)[None, :, None]
    j3 = tl.arange(0, 4)[None, None, :]

    t_begin = s * TILES_PER_PROG
    t_end = tl.minimum(t_begin + TILES_PER_PROG, NT)
    m_run = tl.full([], float("-inf"), tl.float32)
    z_run = tl.full([], 0.0, tl.float32)
    best = tl.full([], 0.0, tl.float32)
    amax = r * 0
    bidx = r * 0 - 1
    for t0 in range(t_begin, t_end, TPB):
        tile = t0 + t3
        offs = tile * TILE + q3 * 4 + j3                      # [TPB, Q, 4]
        ok = (offs < V) & (tile < t_end)
        x = tl.load(row + offs, mask=ok, other=float("-inf")).to(tl.float32) * scale
        tmax = tl.max(tl.max(x, axis=2), axis=1)              # [TPB]
        tl.store(tile_max_ptr + r.to(tl.int64) * NT + t0 + tt, tmax, mask=(t0 + tt) < t_end)
        bmax = tl.max(tmax, axis=0)
        m_new = tl.maximum(m_run, bmax)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_run - m_ref)
        e = tl.exp(x - m_ref)
        z_run = z_run * alpha + tl.sum(tl.sum(tl.sum(e, axis=2), axis=1), axis=0)
        if bmax > m_run:
            amax = tl.min(tl.min(tl.min(tl.where(x == bmax, offs, _BIG), axis=2), axis=1), axis=0)
        if unfiltered:
            w0, w1, w2, w3 = random_words(seed, pos, stream, tile * Q + q3)
            score = e / exponential(select_word(w0, w1, w2, w3, j3))
            bs = tl.max(tl.max(tl.max(score, axis=2), axis=1), axis=0)
            prev = best * alpha
            if bs > prev:
                best = bs
                bidx = tl.min(tl.min(tl.min(tl.where(score == bs, offs, _BIG), axis=2), axis=1), axis=0)
            else:
                best = prev
        m_run = m_new
    base = (r * S + s).to(tl.int64)
    tl.store(part_f_ptr + base * 3 + 0, m_run)
    tl.store(part_f_ptr + base * 3 + 1, z_run)
    tl.store(part_f_ptr + base * 3 + 2, best)
    tl.store(part_i_ptr + base * 2 + 0, amax)
    tl.store(part_i_ptr + base * 2 + 1, bidx)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_size(vocab_size: int) -> int:
    """Tokens per tile: 128, or more so that a row has at most 1024 tiles."""
    return max(128, _next_pow2(-(-vocab_size // 1024)))


def row_stats_pass(
    logits,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temperature,   # [R] fp32
    top_k, top_p,      # [R] int32 / fp32
    log_min_p,         # [R] fp32, -inf = off
    seeds, positions,  # [R] int64
    stream: int,
    tile: int,
    num_chunks: int,
    tile_max,          # [R, NT] fp32 out
    part_f,            # [R, S, 3] fp32 out
    part_i,            # [R, S, 2] int32 out
    block: int = 2048,
    num_warps: int = 4,
):
    """Launch pass 1 over `num_chunks` programs per row (see module docstring)."""
    R, V = logits.shape
    NT = tile_max.shape[1]
    tiles_per_prog = -(-NT // num_chunks)
    tpb = min(max(1, block // tile), _next_pow2(tiles_per_prog))
    _row_stats_kernel[(R, num_chunks)](
        logits, logits.stride(0), inv_temperature, top_k, top_p, log_min_p,
        seeds, positions, tile_max, part_f, part_i,
        V, NT, tiles_per_prog, num_chunks, stream,
        TILE=tile, TPB=tpb, num_warps=num_warps,
    )
