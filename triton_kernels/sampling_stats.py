"""Sampling pass 1: one read of every logits row -> per-block statistics and tile maxima.

A row is cut into NBLK blocks of TPB tiles of TILE tokens (2048 tokens by default;
`pass1_blocks`, a function of the vocabulary). Grid (rows, programs): a program reads
BLOCKS_PER_PROGRAM blocks (loading the next while it reduces one) in a launch with many
blocks, else one, so that small batches still spread over the SMs. Every block is reduced
on its own, in the same layout whichever program reads it: what pass 1 writes does not
depend on how the launch groups the blocks. For each block it writes

- the max of every tile (`tile_max`, temperature-scaled): the greedy argmax, the direct
  top-k path and the exact search use it (bounds of the thresholds, tiles worth reading:
  sampling_tiles.py);
- the block's max and sum exp(x - max) (NaN when the block holds a NaN or +inf; the sum:
  each tile's sum exp(x - tile max), then the tiles weighted by exp(tile max - block max),
  compiled without fma contraction), and its number of finite tokens on rows that get a
  histogram (below; 0 on the others, whose plan never reads it);
- for rows that need no threshold (random, no top-k / top-p / min-p) the sum of
  exp(x - tile max) of every tile (`tile_sum`), from which the plan draws the row's
  sub-chunk (sampling_plan.py: a two-level race, the token noise of one sub-chunk only);
- for rows with top-k or top-p (but not rows with 1 <= top_k <= KMAX, which the plan
  decides from the tile maxima alone), a count histogram of the block over the
  absolute value grid a(x) = floor(x * BINS_PER_UNIT): bin j counts the tokens with
  a(x) = top - j, top = a(block max), for j < WINDOW; bin WINDOW counts the finite tokens
  below that window and bin WINDOW + 1 nothing (masked lanes, -inf). sampling_select.py
  adds the blocks of a row up (aligned on the grid) to bound the thresholds.

x = logits * (1 / temperature) on random rows and the logits themselves on greedy rows.
"""

import triton
import triton.language as tl

from .sampling_common import NO_FP_FUSION, pdl_kwargs, pdl_start

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


@triton.jit
def _load_block(row, b, t_end, V, tt, cols, TILE: tl.constexpr, TPB: tl.constexpr):
    """Block b of a row: its TPB tiles as [TPB, TILE] raw logits (-inf from tile t_end on:
    nothing is read there)."""
    tile = b * TPB + tt[:, None]
    offs = tile * TILE + cols
    return tl.load(row + offs, mask=(offs < V) & (tile < t_end), other=float("-inf"))


@triton.jit(do_not_specialize=["NT", "NBLK", "BPP", "KMAX"])
def _row_stats_kernel(
    logits_ptr, stride_row,       # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                 # [R] fp32: 1/T, -1 on greedy rows
    top_k_ptr, top_p_ptr,         # [R] int32 / fp32
    log_min_p_ptr,                # [R] fp32: log(min_p), -inf = off
    tile_max_ptr,                 # [R, NT] fp32 out
    tile_sum_ptr,                 # [R, NT] fp32 out: sum exp(x - tile max) (unfiltered rows only)
    part_f_ptr,                   # [R, NBLK, 4] fp32 out: max, sumexp, (unused), finite tokens (0 without histogram)
    hist_ptr,                     # [R, NBLK, HIST_BINS] int16 out (filtered rows)
    hist_top_ptr,                 # [R, NBLK] int32 out: a(block max) (filtered rows)
    V, NT, NBLK,
    BPP,                          # blocks per program (the launch's choice: results do not depend on it)
    KMAX,                         # rows with 1 <= top_k <= KMAX (< V) need no histogram (0: none)
    TILE: tl.constexpr, TPB: tl.constexpr,
    PREFETCH: tl.constexpr = False,           # load block b + 1 before reducing block b
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
    PIVOT: tl.constexpr = False,              # rows of top-p / min-p without top-k: pivot rejection, tile sums
):
    pdl_start(PDL)
    # A block is [TPB tiles, TILE]: a tile row lies inside one warp, so the per-tile
    # reductions need no barrier. Every block is reduced on its own, in the same layout
    # whichever program reads it.
    r = tl.program_id(0)
    s = tl.program_id(1)
    row = logits_ptr + r.to(tl.int64) * stride_row
    inv_t = tl.load(inv_temp_ptr + r)
    scale = tl.where(inv_t > 0, inv_t, 1.0)
    k = tl.load(top_k_ptr + r)
    # the plan's tests, negated as written there (a NaN parameter counts as off in both)
    unfiltered = (inv_t > 0) & ((k <= 0) | (k >= V)) & ~(tl.load(top_p_ptr + r) < 1.0)
    no_min_p = ~(tl.load(log_min_p_ptr + r) > float("-inf"))
    unfiltered = unfiltered & no_min_p
    direct = (k >= 1) & (k <= KMAX) & (k < V)
    # top-p and / or min-p without top-k under PIVOT (sampling_pivot.py): the plan may draw a
    # first candidate as for a row without a filter, so the row gets tile sums and no histogram
    pivot = PIVOT & (inv_t > 0) & ((k <= 0) | (k >= V)) & ((tl.load(top_p_ptr + r) < 1.0) | ~no_min_p)
    filtered = (inv_t > 0) & ~unfiltered & ~direct & ~pivot
    sums = unfiltered | pivot

    tt = tl.arange(0, TPB)
    cols = tl.arange(0, TILE)[None, :]
    b_begin = s * BPP
    b_end = tl.minimum(b_begin + BPP, NBLK)
    t_end = tl.minimum(b_end * TPB, NT)                   # the program's tiles end there
    if PREFETCH:
        x_next = _load_block(row, b_begin, t_end, V, tt, cols, TILE, TPB)
    for b in range(b_begin, b_end):
        if PREFETCH:
            x_raw = x_next
            x_next = _load_block(row, b + 1, t_end, V, tt, cols, TILE, TPB)
        else:
            x_raw = _load_block(row, b, t_end, V, tt, cols, TILE, TPB)
        x = x_raw.to(tl.float32) * scale
        tile = b * TPB + tt[:, None]
        tid = tl.max(tile, axis=1)                            # [TPB], in tmax's layout: no shuffle
        tmax = tl.max(x, axis=1)                              # [TPB]
        t_ref = tl.where(tmax == float("-inf"), 0.0, tmax)
        t_sum = tl.sum(tl.exp(x - t_ref[:, None]), axis=1)    # [TPB] sum exp(x - tile max)
        row_t = r.to(tl.int64) * NT + tid
        tl.store(tile_max_ptr + row_t, tmax, mask=tid < NT)
        if sums:
            tl.store(tile_sum_ptr + row_t, t_sum, mask=tid < NT)
        m = tl.max(tmax, axis=0)
        z = tl.sum(t_sum * tl.exp(tmax - tl.where(m == float("-inf"), 0.0, m)), axis=0)
        n_fin = tl.zeros([], tl.int32)   # only the plan of a filtered row reads it
        if filtered:
            n_fin = tl.sum(tl.sum((x > float("-inf")).to(tl.int32), axis=1), axis=0)
        blk = r.to(tl.int64) * NBLK + b
        tl.store(part_f_ptr + blk * 4 + 0, m)
        tl.store(part_f_ptr + blk * 4 + 1, z)
        tl.store(part_f_ptr + blk * 4 + 3, n_fin.to(tl.float32))
        if filtered:
            top = tl.where(m > float("-inf"), grid_bin(m), _NO_TOP)
            j = top - grid_bin(x)
            j = tl.where(x > float("-inf"), tl.minimum(j, _HB - 2), _HB - 1)
            h = tl.histogram(tl.reshape(j, [TPB * TILE], can_reorder=True), _HB)   # order is irrelevant
            tl.store(hist_ptr + blk * _HB + tl.arange(0, _HB), h.to(tl.int16))
            tl.store(hist_top_ptr + blk, top)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_size(vocab_size: int) -> int:
    """Tokens per tile: 128, or more so that a row has at most 2048 tiles (128 up to V = 262144).

    A function of the vocabulary only (batch invariance). On the H200 (bench/exp_tile.py,
    2026-12-02) V = 151936 took 15.1 us at batch 1 in tiles of 128 against 17.1 in tiles of
    256 (the rule was at most 1024 tiles), 152 against 159 at batch 128, with the same tokens."""
    return max(128, _next_pow2(-(-vocab_size // 2048)))


def pass1_blocks(num_tiles: int, tile: int, num_chunks: int | None = None, block: int = 2048) -> tuple[int, int]:
    """(tiles per block TPB, blocks per row NBLK) of pass 1: blocks of `block` tokens (fewer
    tiles when the row has fewer), or fewer tiles so that the row has about `num_chunks`
    blocks (a tests' knob). A function of the vocabulary only: every partial pass 1 writes is
    a block's."""
    wanted = num_tiles if num_chunks is None else -(-num_tiles // num_chunks)
    tpb = min(max(1, block // tile), _next_pow2(wanted))
    return tpb, -(-num_tiles // tpb)


# Blocks per program once a launch has MANY_BLOCKS blocks. On the H200 (the whole sample call,
# bench_sampling's mixed rows, fp32 V = 128256; logs/exp_sampling_pass1_2026-11-30b.txt): B = 512
# 466 us against 491 with one block per program, B = 128 151 against 153; below, one block per
# program keeps a small batch spread over the SMs (B = 1: 19.0 us against 22.4 with 4 blocks).
BLOCKS_PER_PROGRAM = 4
MANY_BLOCKS = 4096


def pass1_maxnreg(histograms: bool) -> int:
    """Registers per thread of pass 1 (4 warps): 64 (8 programs per SM) when no row of the
    launch builds a histogram, else 80 (6 per SM: rows with a histogram run slower at 64).
    The same code at every cap, so the same outputs bit for bit. On the H200 (V = 128256,
    B = 128, logs/exp_sampling_pass1_2026-12-01.txt) pass 1 took, at 96 / 80 / 64 registers:
    plain fp32 rows 24.8 / 21.9 / 21.1 us, bf16 19.1 / 17.0 / 15.1; top-p fp32 rows
    59.2 / 58.0 / 60.8; the bench's mixed rows 40.1 / 39.7 / 42.5 (the whole sample() call:
    logs/exp_pass1_maxnreg_2026-12-01.txt)."""
    return 80 if histograms else 64


def row_stats_pass(
    logits,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temperature,   # [R] fp32
    top_k, top_p,      # [R] int32 / fp32
    log_min_p,         # [R] fp32, -inf = off
    tile: int,
    tpb: int,          # tiles per block (pass1_blocks)
    tile_max,          # [R, NT] fp32 out
    tile_sum,          # [R, NT] fp32 out (unfiltered rows)
    part_f,            # [R, NBLK, 4] fp32 out
    hist,              # [R, NBLK, HIST_BINS] int16 out
    hist_top,          # [R, NBLK] int32 out
    blocks_per_program: int | None = None,
    num_warps: int = 4,
    kmax: int = 0,
    maxnreg: int | None = None,
    histograms: bool = True,
    pivot: bool = False,
):
    """Launch pass 1 (see module docstring); rows with 1 <= top_k <= kmax get no histogram.
    `blocks_per_program` (default: 1, or BLOCKS_PER_PROGRAM from MANY_BLOCKS blocks in the
    launch; more than one prefetches the next block) changes speed only; `num_warps` changes
    speed and the rounding of the block sums (keep it a function of the vocabulary, for batch
    invariance). `maxnreg` (registers per thread; default: `pass1_maxnreg(histograms)`) caps
    the registers of the same code, so it changes speed only (the tests check every buffer bit
    for bit); `histograms=False` promises that no row needs a histogram (a row that does still
    gets it, only more slowly). `pivot=True`: rows with top-p and / or min-p and no top-k get
    tile sums instead of a histogram (their draw is sampling_pivot.py's)."""
    R, V = logits.shape
    NT = tile_max.shape[1]
    nblk = part_f.shape[1]
    if blocks_per_program is None:
        blocks_per_program = BLOCKS_PER_PROGRAM if R * nblk >= MANY_BLOCKS else 1
    bpp = max(1, min(int(blocks_per_program), nblk))
    _row_stats_kernel[(R, -(-nblk // bpp))](
        logits, logits.stride(0), inv_temperature, top_k, top_p, log_min_p,
        tile_max, tile_sum, part_f, hist, hist_top,
        V, NT, nblk, bpp, kmax,
        TILE=tile, TPB=tpb, PREFETCH=bpp > 1, PIVOT=pivot, num_warps=num_warps,
        maxnreg=maxnreg or pass1_maxnreg(histograms), **pdl_kwargs(logits), **NO_FP_FUSION,
    )
