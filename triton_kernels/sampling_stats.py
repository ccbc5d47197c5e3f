"""Sampling pass 1: one read of every logits row -> per-chunk statistics and tile maxima.

Grid (rows, chunks): by default every program reads one block of 2048 tokens (TPB tiles
of TILE tokens), so that many small programs keep the memory system busy at any batch
size. Each program writes

- the max of every tile (`tile_max`, temperature-scaled): the greedy argmax and the exact
  search of sampling_topk_topp.py use it (bounds of the thresholds, tiles worth reading);
- its chunk's max and sum exp(x - max) (NaN when the chunk holds a NaN or +inf) and its
  number of finite tokens;
- for rows that need no threshold (random, no top-k / top-p / min-p) the sum of
  exp(x - tile max) of every tile (`tile_sum`), from which the plan draws the row's
  sub-chunk (sampling_topk_topp.py: a two-level race, the token noise of one sub-chunk only);
- for rows with top-k or top-p (but not rows with 1 <= top_k <= KMAX, which the plan
  decides from the tile maxima alone), a count histogram of every block (TPB tiles) over the
  absolute value grid a(x) = floor(x * BINS_PER_UNIT): bin j counts the tokens with
  a(x) = top - j, top = a(block max), for j < WINDOW; bin WINDOW counts the finite tokens
  below that window and bin WINDOW + 1 nothing (masked lanes, -inf). sampling_select.py
  adds the blocks of a row up (aligned on the grid) to bound the thresholds.

x = logits * (1 / temperature) on random rows and the logits themselves on greedy rows.
"""

import triton
import triton.language as tl

from .sampling_common import pdl_kwargs, pdl_start

BINS_PER_UNIT = 2          # level-1 histogram: 2 bins per unit of scaled logit (grid_bin)
HIST_BINS = 64             # WINDOW = 62 bins (31 units), + underflow, + nothing (Triton's histogram
                           # costs about 3 + bins / 8 instructions per token: keep it small)
_HB = tl.constexpr(HIST_BINS)
_W = tl.constexpr(1.0 / BINS_PER_UNIT)
_NO_TOP = tl.constexpr(-1073741824)   # `top` of a block without a finite token


@triton.jit
def grid_bin(x):
    """a(x) = floor(x * BINS_PER_UNIT) as int32 (clamped far outside any sane logit)."""
    return tl.floor(tl.minimum(tl.maximum(x * 2.0, -1.0e9), 1.0e9)).to(tl.int32)


@triton.jit(do_not_specialize=["NT", "TILES_PER_PROG", "S", "ITERS", "KMAX"])
def _row_stats_kernel(
    logits_ptr, stride_row,       # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                 # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,         # [R] int32 / fp32
    log_min_p_ptr,                # [R] fp32: log(min_p), -inf = off
    tile_max_ptr,                 # [R, NT] fp32 out
    tile_sum_ptr,                 # [R, NT] fp32 out: sum exp(x - tile max) (unfiltered rows only)
    part_f_ptr,                   # [R, S, 4] fp32 out: max, sumexp, (unused), finite tokens
    hist_ptr,                     # [R, S * ITERS, HIST_BINS] int16 out (filtered rows)
    hist_top_ptr,                 # [R, S * ITERS] int32 out: a(block max) (filtered rows)
    V, NT, TILES_PER_PROG, S, ITERS,
    KMAX,                         # rows with 1 <= top_k <= KMAX (< V) need no histogram (0: none)
    TILE: tl.constexpr, TPB: tl.constexpr,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    pdl_start(PDL)
    # The block is [TPB tiles, TILE]: a tile row lies inside one warp, so the per-tile
    # reductions need no barrier; running statistics are kept per tile slot and reduced
    # across slots (and warps) once, at the end.
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = logits_ptr + r.to(tl.int64) * stride_row
    inv_t = tl.load(inv_temp_ptr + r)
    scale = tl.where(inv_t > 0, inv_t, 1.0)
    k = tl.load(top_k_ptr + r)
    # the plan's tests, negated as written there (a NaN parameter counts as off in both)
    unfiltered = (inv_t > 0) & ((k <= 0) | (k >= V)) & ~(tl.load(top_p_ptr + r) < 1.0)
    unfiltered = unfiltered & ~(tl.load(log_min_p_ptr + r) > float("-inf"))
    direct = (k >= 1) & (k <= KMAX) & (k < V)
    filtered = (inv_t > 0) & ~unfiltered & ~direct

    tt = tl.arange(0, TPB)
    cols = tl.arange(0, TILE)[None, :]

    t_begin = s * TILES_PER_PROG
    t_end = tl.minimum(t_begin + TILES_PER_PROG, NT)
    m_slot = tl.full([TPB], float("-inf"), tl.float32)
    z_slot = tl.zeros([TPB], tl.float32)
    n_fin = tl.zeros([TPB], tl.int32)
    for it in range(0, ITERS):
        t0 = t_begin + it * TPB
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
        n_fin += tl.sum((x > float("-inf")).to(tl.int32), axis=1)
        if filtered:
            blk = (r * S + s).to(tl.int64) * ITERS + it
            bmax = tl.max(tmax, axis=0)
            top = tl.where(bmax > float("-inf"), grid_bin(bmax), _NO_TOP)
            j = top - grid_bin(x)
            j = tl.where(x > float("-inf"), tl.minimum(j, _HB - 2), _HB - 1)
            h = tl.histogram(tl.reshape(j, [TPB * TILE], can_reorder=True), _HB)   # order is irrelevant
            tl.store(hist_ptr + blk * _HB + tl.arange(0, _HB), h.to(tl.int16))
            tl.store(hist_top_ptr + blk, top)
        if unfiltered:
            t_ref = tl.where(tmax == float("-inf"), 0.0, tmax)
            t_sum = tl.sum(tl.exp(x - t_ref[:, None]), axis=1)
            tl.store(tile_sum_ptr + r.to(tl.int64) * NT + tid, t_sum, mask=tid < t_end)
        m_slot = m_new
    m = tl.max(m_slot, axis=0)
    w = tl.exp(m_slot - tl.where(m == float("-inf"), 0.0, m))
    z = tl.sum(z_slot * w, axis=0)
    base = (r * S + s).to(tl.int64)
    tl.store(part_f_ptr + base * 4 + 0, m)
    tl.store(part_f_ptr + base * 4 + 1, z)
    tl.store(part_f_ptr + base * 4 + 3, tl.sum(n_fin, axis=0).to(tl.float32))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_size(vocab_size: int) -> int:
    """Tokens per tile: 128, or more so that a row has at most 1024 tiles."""
    return max(128, _next_pow2(-(-vocab_size // 1024)))


def pass1_geometry(num_tiles: int, tile: int, num_chunks: int, block: int = 2048) -> tuple[int, int, int]:
    """(tiles per program, tiles per block TPB, blocks per program) of pass 1."""
    tiles_per_prog = -(-num_tiles // num_chunks)
    tpb = min(max(1, block // tile), _next_pow2(tiles_per_prog))
    return tiles_per_prog, tpb, -(-tiles_per_prog // tpb)


def row_stats_pass(
    logits,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temperature,   # [R] fp32
    top_k, top_p,      # [R] int32 / fp32
    log_min_p,         # [R] fp32, -inf = off
    tile: int,
    num_chunks: int,
    tile_max,          # [R, NT] fp32 out
    tile_sum,          # [R, NT] fp32 out (unfiltered rows)
    part_f,            # [R, S, 4] fp32 out
    hist,              # [R, S * iters, HIST_BINS] int16 out (see blocks_per_row)
    hist_top,          # [R, S * iters] int32 out
    block: int = 2048,
    num_warps: int = 4,          # 4 warps within 96 registers: 5 programs per SM
    kmax: int = 0,
    maxnreg: int | None = 96,
):
    """Launch pass 1 over `num_chunks` programs per row (see module docstring); rows with
    1 <= top_k <= kmax get no histogram. `num_warps` and `maxnreg` change speed only (and the
    rounding of the chunk sums: keep them functions of the vocabulary, for batch invariance)."""
    R, V = logits.shape
    NT = tile_max.shape[1]
    tiles_per_prog, tpb, iters = pass1_geometry(NT, tile, num_chunks, block)
    _row_stats_kernel[(R, num_chunks)](
        logits, logits.stride(0), inv_temperature, top_k, top_p, log_min_p,
        tile_max, tile_sum, part_f, hist, hist_top,
        V, NT, tiles_per_prog, num_chunks, iters, kmax,
        TILE=tile, TPB=tpb, num_warps=num_warps, **({} if maxnreg is None else {"maxnreg": maxnreg}),
        **pdl_kwargs(logits),
    )
