"""Sampling pass 1: one read of every logits row -> per-chunk statistics and tile maxima.

Grid (rows, chunks): by default every program reads one block of 2048 tokens (TPB tiles
of TILE tokens), so that many small programs keep the memory system busy at any batch
size. Each program writes

- the max of every tile (`tile_max`, temperature-scaled): pass 2 uses it to bound the
  top-k / top-p / min-p threshold, to find the greedy argmax, and to read only the tiles
  that can hold a kept token;
- its chunk's max and sum exp(x - max) (NaN when the chunk holds a NaN or +inf);
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
    part_i_ptr,                   # [R, S] int32 out: best index
    V, NT, TILES_PER_PROG, S, stream,
    TILE: tl.constexpr, TPB: tl.constexpr,
):
    # The block is [TPB tiles, TILE]: a tile row lies inside one warp, so the per-tile
    # reductions need no barrier; running statistics are kept per tile slot and reduced
    # across slots (and warps) once, at the end. The Philox call of token t is t >> 2 and
    # its word t & 3: the 4 tokens a thread holds share one call (the compiler merges them).
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = logits_ptr + r.to(tl.int64) * stride_row
    inv_t = tl.load(inv_temp_ptr + r)
    scale = tl.where(inv_t > 0, inv_t, 1.0)
    k = tl.load(top_k_ptr + r)
    unfiltered = (inv_t > 0) & ((k <= 0) | (k >= V)) & (tl.load(top_p_ptr + r) >= 1.0)
    unfiltered = unfiltered & (tl.load(log_min_p_ptr + r) == float("-inf"))
    seed = tl.load(seed_ptr + r)
    pos = tl.load(pos_ptr + r)

    tt = tl.arange(0, TPB)
    cols = tl.arange(0, TILE)[None, :]

    t_begin = s * TILES_PER_PROG
    t_end = tl.minimum(t_begin + TILES_PER_PROG, NT)
    m_slot = tl.full([TPB], float("-inf"), tl.float32)
    z_slot = tl.zeros([TPB], tl.float32)
    b_slot = tl.zeros([TPB], tl.float32)       # best exp(x - m_slot) / E
    i_slot = tl.full([TPB], _BIG, tl.int32)
    for t0 in range(t_begin, t_end, TPB):
        tile = t0 + tt[:, None]
        offs = tile * TILE + cols                             # [TPB, TILE]
        ok = (offs < V) & (tile < t_end)
        x = tl.load(row + offs, mask=ok, other=float("-inf")).to(tl.float32) * scale
        tmax = tl.max(x, axis=1)                              # [TPB]
        tid = tl.max(tile, axis=1)                            # [TPB], in tmax's layout: no shuffle
        tl.store(tile_max_ptr + r.to(tl.int64) * NT + tid, tmax, mask=tid < t_end)
        m_new = tl.maximum(m_slot, tmax)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_slot - m_ref)
        e = tl.exp(x - m_ref[:, None])
        z_slot = z_slot * alpha + tl.sum(e, axis=1)
        if unfiltered:
            # call index written so that the compiler sees the 4 tokens of a thread share it
            w0, w1, w2, w3 = random_words(seed, pos, stream, tile * (TILE // 4) + (cols >> 2))
            score = e / exponential(select_word(w0, w1, w2, w3, offs & 3))
            tb = tl.max(score, axis=1)
            ti = tl.min(tl.where(score == tb[:, None], offs, _BIG), axis=1)
            prev = b_slot * alpha
            better = tb > prev
            b_slot = tl.where(better, tb, prev)
            i_slot = tl.where(better, ti, i_slot)
        m_slot = m_new
    m = tl.max(m_slot, axis=0)
    w = tl.exp(m_slot - tl.where(m == float("-inf"), 0.0, m))
    z = tl.sum(z_slot * w, axis=0)
    sb = b_slot * w
    best = tl.max(sb, axis=0)
    bidx = tl.min(tl.where(sb == best, i_slot, _BIG), axis=0)
    base = (r * S + s).to(tl.int64)
    tl.store(part_f_ptr + base * 3 + 0, m)
    tl.store(part_f_ptr + base * 3 + 1, z)
    tl.store(part_f_ptr + base * 3 + 2, best)
    tl.store(part_i_ptr + base, bidx)


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
    part_i,            # [R, S] int32 out
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
        TILE=tile, TPB=tpb, num_warps=num_warps, maxnreg=96,   # 5 programs per SM, no spill
    )
