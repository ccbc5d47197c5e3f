"""Top-p and min-p without top-k, by pivot rejection: an exact draw that needs no threshold.

A row with top-p and/or min-p and no top-k, when the caller does not need the threshold
(`sample_top_k_top_p_triton(..., pivot=True)`), is drawn by rejection instead of by the
threshold search (sampling_select.py). Its kept set is {x >= tau}: min-p keeps
x >= t = m + log(min_p) (t = -inf without min-p), then top-p keeps the tokens of that set
whose mass strictly above them is below top_p * Z_t (Z_t: the mass of x >= t). So a token
x is kept iff x >= t and M(> x) < top_p * Z_t.

    top-p alone: candidate c = the plan's two-level draw from the whole row (as a row
                 without a filter), Z_t = Z;
    min-p alone: the plan draws c the same way and keeps it when x_c >= t (rejection from
                 the whole row); otherwise round 1 draws from x >= t, and keeps that;
    min-p and top-p: no candidate yet; round 1 sums Z_t and draws c from x >= t;
    then, each round: M = the mass exp(x - m) of the tokens with x > x_c (and x >= t);
                      if M < top_p * Z_t, c is kept: accept it;
                      else draw c again from those tokens (the old x_c is the pivot).

Every draw is from the target conditioned on a superset of the kept set (x >= t above the
pivot): the kept set is upward closed and a rejected c lies below tau, so an accepted token
follows the target exactly. Each round is one read of the row: the mass kernel sums, per
sub-chunk of `draw_sub_chunk(V)` tokens, the mass above the pivot (a sub-chunk whose tile
maxima, from pass 1, all lie at or below the pivot or below t is not read: its sum is 0),
which both decides the candidate and is the next draw's level-1 masses. The draw kernel
accepts, or redraws in two levels (a sub-chunk by the race of its restricted mass, then a
token of it by the race of exp(x - m) / E over the eligible tokens) with the noise of round
i on stream + i * PIVOT_STREAM (its sub-chunk noise + SUB_STREAM): fresh noise per round, so
each round's acceptance is independent of the earlier rounds' noise. A row still pending
after the last round takes the finish's exact search (FALLBACK; PIVOT_LATE with `late`: a
finish launch of its own after the rounds) with the noise of stream + PIVOT_ROUNDS *
PIVOT_STREAM, which is exact whatever happened before.

Round 1's masses can instead be summed by the collect launch's programs of the pivot rows
(`sample_top_k_top_p_triton(..., pivot_round1_in_collect=True)`, where its 2048-token blocks are
the sub-chunks): the same `sampling_common.pivot_sub_chunk_mass` on 8 warps, so the same bits,
and the rounds then start with round 1's draw (`pivot_rounds(..., first_mass=False)`).

Row state (sampling_select.STATE_I / STATE_F) of a pending row: the candidate token (-1:
none yet) in st_i[1], the pivot (the candidate's value, -inf: none) in st_f[2], Z_t in
st_f[3] (set by round 1 when the row has min-p and top-p), t in st_f[4].

The per-sub-chunk sums and their total are added in a fixed order over a geometry set by
the vocabulary only, so a seeded row's token does not depend on its batch.
specops.sampling.sampler_torch.pivot_draw mirrors this draw.
"""

import triton
import triton.language as tl

from .rng import PIVOT_STREAM, SUB_STREAM, exponential, random_words
from .sampling_common import pdl_start, pivot_sub_chunk_mass, select_word, token_noise
from .sampling_select import FALLBACK, PIVOT_LATE, PIVOT_PENDING, PIVOTED

PIVOT_ROUNDS = 3
"""Rounds of verification (each a mass and a draw launch) before the exact search. On the
benchmark's logits (bench/exp_topp_rejection_cpu.py, top_p 0.8-0.99) a draw took 1.02-1.20
rounds on average and at most 3."""

_BIG = tl.constexpr(2147483647)


@triton.jit(do_not_specialize=["V", "NT"])
def _pivot_mass_kernel(
    logits_ptr, stride_row,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr,                      # [R] fp32: 1/T
    tile_max_ptr,                      # [R, NT] fp32 (pass 1): the max of every tile
    st_i_ptr, st_f_ptr,                # [R, 4] int32, [R, 6] fp32 row states (sampling_select.STATE_I / _F)
    mass_ptr,                          # [R, NC] fp32 out: per sub-chunk, the mass above the pivot
    V, NT,
    NC: tl.constexpr, SUB: tl.constexpr, TILE: tl.constexpr,
    GROUP: tl.constexpr = 1,           # sub-chunks per program (the same sums: each is its own reduction)
    SKIP: tl.constexpr = True,         # sub-chunks with no tile max above the pivot are not read
    PDL: tl.constexpr = False,         # programmatic dependent launch (sampling_common.pdl_start)
):
    """Program (r, g): for each sub-chunk c of group g (GROUP of them) of row r, the mass
    sum exp(x - m) over its tokens with x above the row's pivot and x >= its min-p threshold
    (rows in mode PIVOT_PENDING only). The row's state and the group's tile maxima are loaded
    together before the mode is tested: one round trip fewer on every program."""
    pdl_start(PDL)
    r = tl.program_id(0)
    g = tl.program_id(1)
    r64 = r.to(tl.int64)
    mode = tl.load(st_i_ptr + r * 4)
    pivot = tl.load(st_f_ptr + r * 6 + 2)
    floor = tl.load(st_f_ptr + r * 6 + 4)
    TPS: tl.constexpr = SUB // TILE
    gi = tl.arange(0, GROUP)
    cs = g * GROUP + gi                                            # [GROUP] the group's sub-chunks
    need = cs < NC
    if SKIP:
        t = cs[:, None] * TPS + tl.arange(0, TPS)[None, :]          # [GROUP, TPS] their tiles
        tm = tl.max(tl.load(tile_max_ptr + r64 * NT + t, mask=t < NT, other=float("-inf")), axis=1)
        need = need & (tm > pivot) & (tm >= floor)
    if mode == PIVOT_PENDING:
        inv_t = tl.load(inv_temp_ptr + r)
        m = tl.load(st_f_ptr + r * 6 + 0)
        for k in tl.static_range(GROUP):
            c = g * GROUP + k
            if c < NC:
                total = tl.zeros([], tl.float32)
                if tl.max(tl.where(gi == k, need, False).to(tl.int32), axis=0) != 0:
                    total = pivot_sub_chunk_mass(logits_ptr + r64 * stride_row, inv_t, m, pivot, floor, V, c, SUB)
                tl.store(mass_ptr + r64 * NC + c, total)


@triton.jit(do_not_specialize=["V", "stream"])
def _pivot_draw_kernel(
    logits_ptr, stride_row,            # [R, V] fp32/bf16/fp16, unit column stride
    inv_temp_ptr, top_p_ptr,           # [R] fp32: 1/T, top_p
    seed_ptr, pos_ptr,                 # [R] int64
    st_i_ptr, st_f_ptr,                # [R, 4] int32, [R, 6] fp32 row states (updated)
    mass_ptr,                          # [R, NC] fp32 (the mass launch of this round)
    tok_ptr,                           # [R] int64 out (accepted rows)
    V, stream,
    NC: tl.constexpr, NC_P2: tl.constexpr, SUB: tl.constexpr,
    ROUND: tl.constexpr,               # 1 .. PIVOT_ROUNDS: the redraw's noise is on stream + ROUND * PIVOT_STREAM
    LAST: tl.constexpr,                # no redraw: a row still pending goes to the finish's exact search
    LATE: tl.constexpr = False,        # LAST: to PIVOT_LATE (the finish launch after the rounds), not FALLBACK
    PDL: tl.constexpr = False,
):
    """Row r in mode PIVOT_PENDING: accept its candidate (mode PIVOTED, token stored) when the mass
    above it is below top_p * Z_t; else draw a new candidate above the pivot, which a row
    without top-p accepts at once (LAST: FALLBACK instead of a draw). A row without a
    candidate yet (min-p) first takes the round's total as Z_t. Everything the row needs
    before its redraw's sub-chunk is loaded together, before the mode is tested."""
    pdl_start(PDL)
    r = tl.program_id(0)
    r64 = r.to(tl.int64)
    c = tl.arange(0, NC_P2)
    mode = tl.load(st_i_ptr + r * 4)
    cand = tl.load(st_i_ptr + r * 4 + 1)
    m = tl.load(st_f_ptr + r * 6 + 0)
    pivot = tl.load(st_f_ptr + r * 6 + 2)
    z_t = tl.load(st_f_ptr + r * 6 + 3)
    floor = tl.load(st_f_ptr + r * 6 + 4)
    p = tl.load(top_p_ptr + r)
    inv_t = tl.load(inv_temp_ptr + r)
    seed = tl.load(seed_ptr + r)
    pos = tl.load(pos_ptr + r)
    mass = tl.load(mass_ptr + r64 * NC + c, mask=c < NC, other=0.0)
    if mode == PIVOT_PENDING:
        above = tl.sum(mass, axis=0)
        if cand < 0:                                  # no candidate yet: the mass of x >= t
            z_t = above
            tl.store(st_f_ptr + r * 6 + 3, above)
        if (cand >= 0) & (above < p * z_t):
            tl.store(tok_ptr + r, cand.to(tl.int64))
            tl.store(st_i_ptr + r * 4, PIVOTED)
        elif LAST:
            tl.store(st_i_ptr + r * 4, PIVOT_LATE if LATE else FALLBACK)
        else:
            s = stream + ROUND * PIVOT_STREAM
            w0, w1, w2, w3 = random_words(seed, pos, s + SUB_STREAM, c >> 2)
            score = tl.where(mass > 0.0, mass / exponential(select_word(w0, w1, w2, w3, c & 3)), -1.0)
            best = tl.max(score, axis=0)
            c_win = tl.min(tl.where(score == best, c, NC_P2), axis=0)
            offs = c_win * SUB + tl.arange(0, SUB)
            x = tl.load(logits_ptr + r64 * stride_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_t
            sc = tl.where((x > pivot) & (x >= floor), tl.exp(x - m) / token_noise(seed, pos, s, offs), -1.0)
            bs = tl.max(sc, axis=0)
            t = tl.min(tl.where(sc == bs, offs, _BIG), axis=0)
            if p < 1.0:
                tl.store(st_i_ptr + r * 4 + 1, t)
                tl.store(st_f_ptr + r * 6 + 2, tl.max(tl.where(offs == t, x, float("-inf")), axis=0))
            else:                                     # min-p alone: every token >= t is kept
                tl.store(tok_ptr + r, t.to(tl.int64))
                tl.store(st_i_ptr + r * 4, PIVOTED)


def pivot_group(rows: int, sub_chunks: int) -> int:
    """Sub-chunks per mass program: about one wave of programs on an H200 (132 SMs, 8 programs
    of 8 warps each) whatever the batch, since most programs of a round only test their row's
    mode and tile maxima (a power of two, 1 to 8). H200, fp32 V = 128256 (63 sub-chunks),
    bench/results/logs/exp_pivot_group_2026-12-03.txt: group 1 is best at B <= 8, 2 at B = 32,
    4-8 at B = 128 (a round's mass launch 11 -> 4-6 µs), 8 at B = 512 (40 -> 7-17 µs)."""
    want = -(-rows * sub_chunks // 1024)
    return min(8, triton.next_power_of_2(max(1, want)))


def pivot_rounds(logits, inv_temperature, top_p, seeds, positions, tile_max, st_i, st_f, mass, tokens, stream: int,
                 sub: int, tile: int, rounds: int = PIVOT_ROUNDS, pdl: dict | None = None, skip: bool = True,
                 group: int | None = None, first_pdl: bool = True, late: bool = False,
                 first_mass: bool = True) -> None:
    """Launch the verification rounds (module docstring) on the rows in mode PIVOT_PENDING.
    `tile_max` is pass 1's [R, NT] (tiles of `tile` tokens), `mass` [R, ceil(V / sub)] fp32
    scratch. `skip=False` reads every sub-chunk (the same sums: a skipped one holds no
    eligible token); `group` sub-chunks per mass program (a power of two; default
    `pivot_group`) changes the speed only. `first_pdl=False` launches the first kernel
    without PDL (`pdl` or not): on a stream of its own, after an event wait rather than a
    kernel of the chain. `late=True`: a row no round accepts goes to mode PIVOT_LATE instead of
    FALLBACK, for a finish launch with ONLY = PIVOT_LATE after the rounds (side_finish).
    `first_mass=False`: round 1's masses are in `mass` already (the collect launch summed them,
    sampling_select.pivot_collect_program, with the same sums): round 1 is its draw alone."""
    R, V = logits.shape
    nc = mass.shape[1]
    pdl = pdl or {}
    group = pivot_group(R, nc) if group is None else group
    if group < 1 or group & (group - 1):
        raise ValueError(f"pivot group must be a power of two >= 1, got {group}")
    for i in range(1, rounds + 1):
        if i > 1 or first_mass:
            _pivot_mass_kernel[(R, -(-nc // group))](logits, logits.stride(0), inv_temperature, tile_max, st_i, st_f,
                                                      mass, V, tile_max.shape[1], NC=nc, SUB=sub, TILE=tile,
                                                      GROUP=group, SKIP=skip, num_warps=8,
                                                      **(pdl if i > 1 or first_pdl else {}))
        _pivot_draw_kernel[(R,)](logits, logits.stride(0), inv_temperature, top_p, seeds, positions, st_i, st_f,
                                 mass, tokens, V, stream, NC=nc, NC_P2=max(16, triton.next_power_of_2(nc)), SUB=sub,
                                 ROUND=i, LAST=i == rounds, LATE=late, num_warps=8,
                                 **(pdl if i > 1 or first_mass or first_pdl else {}))
