"""Sampling: exact top-k / top-p / min-p thresholds without sorting the vocabulary, and the
exponential-noise draw. The launcher `sample_top_k_top_p_triton` runs, with no host sync:

1. pass 1 (sampling_stats.py, many programs per row): per-block max / sum-exp, the max
   of every tile, the sum exp(x - tile max) of every tile of rows without a filter, and a
   count histogram of every block of rows with a filter (except rows with top_k <= 512);
2. plan (`_plan_kernel`, sampling_plan.py, one program per row): combines the blocks: max m, normaliser Z;
   a NaN or +inf logit makes Z NaN and the row invalid (token -1), and so does a row with
   every logit -inf. Greedy rows take the argmax; rows without top-k / top-p / min-p draw
   a sub-chunk of `draw_sub_chunk(V)` tokens by its mass, then a token inside it
   (`_draw_unfiltered`: a two-level exponential race, noise from specops.rng, STREAM given
   by the caller; its sub-chunk noise on STREAM + SUB_STREAM). Rows with
   1 <= top_k <= kmax (128) are decided here (`_direct_top_k`, sampling_direct.py): the
   tiles whose max reaches a lower bound of the k-th largest tile max (found by counting
   the tile maxima against probes, not by sorting them) hold every token the filters keep;
   their tokens are collected and finished as in step 4 (ties or overflow: the exact
   search of step 4); launcher knobs (see `sample_top_k_top_p_triton`) trade how this
   is done (a tl.topk of the tile maxima, bigger groups of tiles) or where (in the collect
   launch, or listed here, read by collect and sorted by the finish: mode SPREAD), with the
   same results. Rows with 128 < top_k <= spread_kmax (512) are spread: the plan lists
   their top tiles (bounded the same way), the collect launch's programs of the row read
   them and the finish sorts the candidates (`SPREAD_TOP_K`). Other rows with a filter get
   a plan from their histogram (sampling_select.py);
3. refine (twice; left out when the host knows that no row needs it: `refine`) and collect
   (sampling_select.py, many programs per row; at large batches
   each program does several of a row's parts: `search_group`): narrow the bracket of the
   thresholds and store its tokens;
4. finish (`_finish_kernel`, sampling_finish.py, one program per row): sorts the collected
   candidates (sampling_candidates.py) and decides tau exactly (kept set = {x >= tau}, ties
   at tau all kept): top-k's k-th value t1 = max(k-th value, m + log(min_p)), then the
   largest value whose mass from the top reaches top_p of the mass above t1. Every
   assumption of the plan is checked; a row that fails a check, or that the plan could not
   bracket, takes the exact single-program search (`_resolve_filtered`, sampling_exact.py:
   lower bounds from the sorted tile maxima, then a bisection on the value counting tokens
   and mass over the row's tiles until at most CAP tokens are left, then a sort).
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

On CUDA the small top-k rows (`_direct_rows_kernel`) and the pivot rounds run on side streams
beside steps 3-4 (`direct_in="beside"`, `pivot_beside`); a row they cannot decide gets the
exact search from a finish launch on their own stream (`side_finish`), so the main finish
follows the collect launch and the streams join after it.

This file holds the launcher and its defaults; the single-program paths read rows tile by
tile (sampling_tiles.py).
"""

import inspect

import torch

from .sampling_common import pdl_kwargs
from .sampling_direct import _collect_direct_kernel, _direct_rows_kernel
from .sampling_finish import _finish_kernel
from .sampling_pivot import pivot_rounds
from .sampling_plan import _plan_kernel
from .sampling_select import (DIRECT_LATE, PIVOT_LATE, REFINE_MIN_PROGRAMS, STATE_F, STATE_I, SUB_BINS, _collect_kernel,
                              _refine_combine_kernel, _refine_kernel, refine_geometry, refine_programs)
from .sampling_select import search_group as default_search_group
from .sampling_stats import HIST_BINS, _next_pow2, pass1_blocks, row_stats_pass, tile_size


DIRECT_TOP_K = 128
"""Default largest top_k decided in the plan (`kmax`): the common top_k values (20 .. 100)
and at most ~k * TILE tokens read from L2 by one program, whose ~k candidates fit the
small sort (256)."""


SPREAD_TOP_K = 512
"""Default largest top_k of the spread rows (`spread_kmax`): rows with kmax < top_k <= 512
(and top_k < V) get no histogram in pass 1 and no bracket search; the plan lists the tiles
whose max reaches a lower bound of the k-th largest tile max (`_spread_plan`), the collect
launch's programs of the row read them and the finish sorts the candidates (about 700 for
top_k 500 on LLM logits; direct_in="spread" does the same for the small top-k rows). The
same tokens and thresholds as the search (both exact, the same noise). Measured: see
bench/results/README.md, session 55: on the H100, fp32 V = 128256, tokens-only calls,
against the search (and with the refine launches left out as the Sampler does):
rows all top_k 500 + top_p 0.95 at batch 8 / 128 34.6 / 134.2 -> 28.5 / 89.2 us, top_k
200 + top_p 0.9 at batch 32 43.4 -> 27.1, bench_sampling's mixed rows at batch 8 / 32 /
128 / 512 35.4 / 42.1 / 82.2 / 201.7 -> 32.3 / 39.7 / 81.9 / 193.2
(logs/exp_sampling_ab_spread_2026-12-05_s55_h100.txt)."""


DEFAULT_CAP = 1024
"""Default candidate capacity `cap`: the most candidates one program sorts. A row whose
collected set exceeds it takes the exact single-program search (about 1 ms at V = 128256 on
the H200): top_k above about 1000 with top-p. The Sampler raises it for such launches
(`cap_for_top_k`)."""

FINISH_WARPS = 16
"""Default warps of the finish launch (`finish_warps`): its time is mostly the sort of a row's
candidates, and 1024 keys sort faster on 16 warps (4.5 against 5.7 µs on the H200,
logs/exp_finish_sort_2026-12-01.txt). On the H100 (session 59, fp32 V = 128256,
bench/exp_sampling_ab.py, the same tokens and log_norm as 8 warps at every shape;
logs/exp_finish_warps_2026-12-06_s59_h100.txt), against 8 warps: bench_sampling's mixed rows
batch 1 / 8 / 32 / 128 / 512 14.64 / 31.69 / 38.77 / 75.07 / 187.08 -> 14.68 / 30.26 / 37.28 /
72.36 / 182.98 µs, rows all top_k 500 + top_p 0.95 batch 8 / 128 28.29 / 85.20 -> 22.10 / 80.76;
slower where the rows sort at most 512 keys or fill several waves: top_k 200 + top_p 0.9 batch
32 26.77 -> 27.44, top_k 500 batch 512 265.72 -> 270.08."""

FINISH_MAXNREG = 128
"""Default register cap of the finish launch (`finish_maxnreg`, 0: none): the most a thread of 16
warps can have (one program per SM; a few cold scalars of the exact search spill)."""

SIDE_FINISH = True
"""Default `side_finish` where a side stream runs: the direct rows and the pivot rounds decide
their own fallback rows (a finish launch on their stream), so the main finish starts after the
collect launch instead of after the slower of the side streams, and the join follows it. On
the H100 (session 60, bench/exp_sampling_ab.py, the same tokens and row maxima as without;
logs/exp_side_finish_2026-12-06_s60_h100.txt), bench_sampling's mixed rows fp32 V = 128256
batch 1 / 8 / 32 / 128 / 512 took 13.90 / 29.26 / 36.60 / 72.54 / 183.19 µs without and 13.87 /
24.21 / 29.43 / 64.66 / 175.61 with it; bf16 batch 8 / 128 28.49 / 61.59 -> 22.13 / 54.60; launches
with no side stream (rows all top_k 500, or all top-p or min-p alone, batch 128) level."""

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

PIVOT_ROUND1_ROWS = 128
"""Fewest rows for which `pivot_round1_in_collect`'s default (None) has the collect launch sum
the pivot rows' round-1 masses (where the pivot rounds run beside it on CUDA). H200, session 66
(bench/exp_sampling_ab.py, fp32 V = 128256, the bench's mixed rows, tokens only, CUDA graphs,
the same tokens; bench/results/logs/exp_pivot_round1_2026-12-07_s66.txt), off -> on: batch 128
59.34 -> 55.88 µs, batch 256 93.46 -> 91.23, batch 512 157.00 -> 156.83. Below 128 rows not
measured: there the rounds' stream ends well before the main finish, and the collect launch's
pivot programs would only lengthen it."""

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

DIRECT_PIPE = True
"""Default `direct_pipe`: the direct rows read their listed tiles software-pipelined (the next
group's load issued before the current group is reduced); the same candidates, sums and draw.
On the H100 (session 59, fp32 V = 128256, bench/exp_sampling_ab.py, the same tokens as without;
logs/exp_finish_warps_2026-12-06_s59_h100.txt) bench_sampling's mixed rows batch 1 / 8 / 32 /
128 / 512 took 14.61 / 30.22 / 37.21 / 72.47 / 183.07 µs without and 13.91 / 29.37 / 36.65 /
72.67 / 183.34 with it (bf16 batch 8 28.95 -> 28.63)."""

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


def check_kernel_options(V: int | None = None, *, cap: int = DEFAULT_CAP, tile: int | None = None,
                         plan_warps: int = 8, finish_warps: int = FINISH_WARPS, direct_group: int | None = None,
                         direct_small: int = DIRECT_SMALL, finish_maxnreg: int = FINISH_MAXNREG,
                         plan_maxnreg: int = -1, direct_in: str = "auto", **other) -> None:
    """Raise ValueError on a value of a `sample_top_k_top_p_triton` option that it cannot
    take (unknown names are the caller's check; `other` takes the options with no rule);
    with the vocabulary size V, also the rules that depend on it. Host arithmetic only: the
    Sampler runs it before it writes any logits."""
    if tile and (tile < 4 or tile & (tile - 1)):
        raise ValueError(f"tile must be a power of two >= 4, got {tile}")
    if cap < 16 or cap & (cap - 1):
        raise ValueError(f"cap must be a power of two >= 16, got {cap}")
    for name, v in (("plan_warps", plan_warps), ("finish_warps", finish_warps), ("direct_group", direct_group or 1),
                    ("direct_small", direct_small or 1)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if not 0 <= finish_maxnreg <= 255:
        raise ValueError(f"finish_maxnreg must be 0 (no cap) or a register count up to 255, got {finish_maxnreg}")
    if not -1 <= plan_maxnreg <= 255:
        raise ValueError(f"plan_maxnreg must be -1 (the default), 0 (no cap) or a register count up to 255, "
                         f"got {plan_maxnreg}")
    if direct_in not in ("auto", "plan", "collect", "spread", "beside"):
        raise ValueError(f"direct_in must be 'auto', 'plan', 'collect', 'spread' or 'beside', got {direct_in!r}")
    if V is not None and (tile or tile_size(V)) > draw_sub_chunk(V):
        raise ValueError(f"tile must be at most the draw's sub-chunk ({draw_sub_chunk(V)} tokens at V={V}), got {tile}")


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
    spread_kmax: int = SPREAD_TOP_K,
    paths: dict | None = None,
    plan_warps: int = 8,
    direct_top: bool = False,
    direct_group: int | None = None,
    direct_pipe: bool = DIRECT_PIPE,
    direct_small: int = DIRECT_SMALL,
    direct_in: str = "auto",
    search: bool = True,
    refine: bool = True,
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
    finish_warps: int = FINISH_WARPS,
    finish_maxnreg: int = FINISH_MAXNREG,
    plan_maxnreg: int = -1,
    side_finish: bool | None = None,
    pivot_round1_in_collect: bool | None = None,
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
    tiles (`_direct_top_k`); `kmax=0` turns that off, and so does `select=False`. Rows with
    `kmax` < top_k <= `spread_kmax` (< V) are spread (`SPREAD_TOP_K`) when the launch has the
    collect launch (`search`); `spread_kmax=0` (or select=False) turns that off.
    `search=False` is a promise that no row needs the bracket search (every random row is
    unfiltered, or has 1 <= top_k <= `kmax` and top_k < V): the refine and collect launches
    are left out (5 of the 9 kernels). A row that breaks the promise still gets an exact
    draw, from the finish's single-program search (slow on a wide row, never wrong). It is
    False anyway when no filter tensor is given, and True with select=False or direct_in
    "collect" or "spread" (whose rows need the collect launch).
    `refine=False` is the weaker promise that no row needs the bracket search other than the
    spread rows (every random row unfiltered, pivot, or with top_k <= `spread_kmax`): the
    four refine launches are left out, the collect launch stays; a row that breaks it is
    still exact (a bracket the refine would have narrowed falls back to the finish's search).
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
    and collect launches (after the collect launch with `pivot_round1_in_collect`), and joins
    them after the finish (before it with `side_finish=False`):
    they read and write only the rows
    in mode PIVOT_PENDING, which no refine or collect program touches, so the results are the
    same; off when `paths` is asked for (its "refined" snapshot would race with the rounds).
    `finish_warps` and `finish_maxnreg` (0: no cap) are the finish launch's warps and register
    cap (FINISH_WARPS, FINISH_MAXNREG); the warps change the layout of its sums (its sort, its
    cumulative and kept masses), so they are one value for every batch. `plan_maxnreg` is the
    plan's register cap (-1: `later_maxnreg`'s; 0: none): speed only, the same code.
    `side_finish` (default: SIDE_FINISH for each side stream that runs, i.e. `pivot_beside` or
    `direct_in="beside"` with the streams) lets the direct rows' kernel and the pivot rounds
    leave a row they cannot decide in a mode of its own (DIRECT_LATE / PIVOT_LATE) and decide it
    by a finish launch (ONLY = that mode: the same code, warps and cap, so the same results) on
    their own stream, so that the main finish skips their rows and the join comes after it
    instead of before. True without the streams runs the same launches in line (tests).
    `pivot_round1_in_collect=True` has the collect launch's programs of the pivot rows sum round
    1's sub-chunk masses (sampling_select.pivot_collect_program: the pivot mass kernel's
    `pivot_sub_chunk_mass` on the same sub-chunks, warps and layout, so the same bits), and the
    pivot rounds start with round 1's draw, after the collect launch (on their stream with
    `pivot_beside`: forked after it instead of after the plan). It takes effect only where the
    collect launch runs and its blocks are the rounds' sub-chunks (`draw_sub_chunk(V)` = 2048:
    V > 8192); elsewhere, and with False, the rounds run as before. The same tokens either way.
    Default (None): on where the rounds run beside the search on CUDA for PIVOT_ROUND1_ROWS rows
    or more.
    `paths`, when a dict, receives "mode": [R] int32, the path each row took
    (sampling_select.DONE / DRAW / COLLECT / FALLBACK / DIRECT / PIVOTED, and with
    `side_finish=True` DIRECT_LATE / PIVOT_LATE for the rows their finish launch decided).

    Latency knobs of the direct path (each gives the same tokens, thresholds, log_norm and
    paths["mode"] as the default, except where said; see bench/exp_plan_direct.py):
    `plan_warps`, the plan's warps (the sums of the direct rows' finish, and the plan's sum of
    pass 1's block partials, are then over another thread layout); `direct_top=True` takes
    t_k itself (not the counted bound) and the top tiles from one `tl.topk` of (max, id) keys
    (fewer candidates, the same leading ones) and reads them `direct_group` (default 64)
    tiles at a time with no tile list (`_top_tiles`); without it the listed tiles are read
    `direct_group` (default 2048 // tile) at a time, software-pipelined with
    `direct_pipe` (default DIRECT_PIPE); `direct_small` (default DIRECT_SMALL; 0 = off, else a power of two
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
    check_kernel_options(V, cap=cap, tile=tile, plan_warps=plan_warps, finish_warps=finish_warps,
                         direct_group=direct_group, direct_small=direct_small, finish_maxnreg=finish_maxnreg,
                         plan_maxnreg=plan_maxnreg, direct_in=direct_in)
    tile = tile or tile_size(V)
    NT = -(-V // tile)
    NT_P2 = max(16, _next_pow2(NT))
    sub = draw_sub_chunk(V)
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
    # spread rows (plan -> collect -> finish): kmax < top_k <= sk_hi, where the collect launch
    # runs anyway; direct_in="spread" (defer 2) spreads the direct rows too
    sk_hi = max(0, int(spread_kmax)) if select and search and top_k is not None else 0
    wide = sk_hi > kmax
    spread_rows = wide or defer == 2
    tokens = torch.empty(R, dtype=torch.int64, device=dev)
    thr = torch.empty(R, dtype=torch.float32, device=dev)
    rmax = torch.empty_like(thr)
    lnorm = torch.empty_like(thr)
    if R == 0:
        return tokens, thr, rmax, lnorm
    # no filter tensor: the plan decides every row (greedy, the unfiltered draw, or an invalid
    # row's -1), so the finish launch would only read their modes (DONE) and exit
    finish_needed = top_k is not None or top_p is not None or min_p is not None
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
    if plan_maxnreg >= 0:
        regs["plan"] = plan_maxnreg or None
    # rows that need the search are the rows with a histogram: without them pass 1 runs lighter
    row_stats_pass(logits, inv_temperature, top_k, top_p, log_min_p, tile, tpb,
                   tile_max, tile_sum, part_f, hist, hist_top, blocks_per_program,
                   kmax=max(kmax, sk_hi), histograms=search,
                   pivot=pivot)
    _plan_kernel[(R,)](
        logits, logits.stride(0), inv_temperature, top_k, top_p, log_min_p,
        tile_max, tile_sum, part_f, hist, hist_top, seeds, positions, tile_list, cand,
        tokens, thr, rmax, lnorm, st_i, st_f,
        V, NT, nblk, stream, kmax, sk_hi,
        TILE=tile, NT_P2=NT_P2, S_P2=max(16, _next_pow2(nblk)), CAP=cap, GB=32, SELECT=select, HB=HIST_BINS, G=G,
        SUB=sub, SMALL=min(256, cap), TOPT=topt, GD=gd, PIPE=direct_pipe, DS=ds, DEFER=defer, SEARCH=search,
        SPREAD_ROWS=wide,
        PIVOT=pivot, num_warps=plan_warps, maxnreg=regs["plan"], **pdl,
    )
    if paths is not None:
        paths["planned"] = st_i[:, 0].clone()
    pivot_mass = torch.empty(R, -(-V // sub), dtype=f32, device=dev) if pivot else None
    overlap = select and search and dev.type == "cuda" and paths is None   # a side stream has work beside
    beside = (PIVOT_BESIDE if pivot_beside is None else bool(pivot_beside)) and pivot and overlap
    direct_kw = dict(CAP=cap, TILE=tile, G=G, NT_P2=NT_P2, SMALL=min(256, cap), TOPT=topt, GD=gd, PIPE=direct_pipe,
                     DS=ds, num_warps=plan_warps)   # the plan's layout: the plan's results

    # side_finish: by default where the rows' side stream runs; a bool: both kinds, streams or not
    late_direct = (SIDE_FINISH and overlap) if side_finish is None else bool(side_finish)
    late_pivot = (SIDE_FINISH and beside) if side_finish is None else bool(side_finish)

    def launch_finish(only=0, **launch_pdl):
        _finish_kernel[(R,)](
            logits, logits.stride(0), inv_temperature, top_k, top_p, seeds, positions, tile_max,
            st_i, st_f, pn, pf, pi, tile_list, cand, tokens, thr, lnorm,
            V, NT, s3, stream,
            TILE=tile, G=G, NT_P2=NT_P2, CAP=cap, GS=64, GUESS=guess, SMALL=min(256, cap), SPREAD_ROWS=spread_rows,
            ONLY=only, STORE_MODE=paths is not None,   # (no side stream runs with `paths`)
            num_warps=finish_warps, maxnreg=finish_maxnreg or None, **launch_pdl,
        )

    def launch_direct_rows(**launch_pdl):
        _direct_rows_kernel[(R,)](
            logits, logits.stride(0), inv_temperature, top_k, top_p, seeds, positions, tile_max, st_i, st_f,
            cand, tile_list, tokens, thr, lnorm, V, NT, stream, kmax, LATE=late_direct, **direct_kw, **launch_pdl)
        if late_direct:   # the rows it could not decide, on its stream
            launch_finish(int(DIRECT_LATE.value), **pdl)

    # round 1's masses summed by the collect launch (its 2048-token blocks are the rounds' sub-chunks)
    round1 = pivot and search and sub == 2048 and (
        (beside and R >= PIVOT_ROUND1_ROWS) if pivot_round1_in_collect is None else bool(pivot_round1_in_collect))
    round1_mass, nc = (pivot_mass if round1 else tile_max), -(-V // sub)   # (not written without round1)

    def launch_pivot_rounds(first_pdl):
        pivot_rounds(logits, inv_temperature, top_p, seeds, positions, tile_max, st_i, st_f, pivot_mass, tokens,
                     stream, sub, tile, pdl=pdl, skip=pivot_skip, group=pivot_group, first_pdl=first_pdl,
                     late=late_pivot, first_mass=not round1)
        if late_pivot:   # the rows no round accepted, on their stream
            launch_finish(int(PIVOT_LATE.value), **pdl)

    main_stream = torch.cuda.current_stream(dev) if dev.type == "cuda" else None
    forks = []   # (side stream, whether it finishes its own rows: joined after the finish, else before)
    if direct_rows and overlap:
        forks.append((side_stream(dev, "direct"), late_direct))
        forks[-1][0].wait_stream(main_stream)
        with torch.cuda.stream(forks[-1][0]):
            launch_direct_rows()   # plain: it follows an event wait, not a kernel of the chain

    def fork_pivot_rounds():
        forks.append((side_stream(dev, "pivot"), late_pivot))
        forks[-1][0].wait_stream(main_stream)
        with torch.cuda.stream(forks[-1][0]):
            launch_pivot_rounds(first_pdl=False)
    if beside and not round1:
        fork_pivot_rounds()
    if select and search and refine:
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
    if spread_rows or (defer and not direct_rows):
        decide = defer == 1 and not direct_rows     # the collect launch decides the direct rows
        _collect_direct_kernel[(R, s3)](
            logits, logits.stride(0), inv_temperature, top_k, top_p, seeds, positions, tile_max, st_i, st_f,
            cand, pn, pf, pi, tile_list, tokens, thr, lnorm, round1_mass, V, NT, s3, bpp, stream, kmax, nc,
            BLOCK=2048, CAP=cap, TILE=tile, G=G, NT_P2=NT_P2, SMALL=min(256, cap), TOPT=topt, GD=gd,
            PIPE=direct_pipe, DS=ds, TPP=min(16, _next_pow2(-(-2 * max(kmax, sk_hi) // s3))),   # [TPP, TILE] a load
            DEFER=1 if decide else 0, SPREAD_ROWS=spread_rows, ATOMIC_SLOTS=atomic_slots, PIVOT_MASS=round1,
            num_warps=8, maxnreg=None if decide else regs["collect"], **pdl)
    elif search:
        _collect_kernel[(R, s3c)](logits, logits.stride(0), inv_temperature, seeds, positions, st_i, st_f, cand,
                                  pn, pf, pi, tile_max, round1_mass, V, s3, bpp, stream, NT, nc, BLOCK=2048, CAP=cap,
                                  GROUP=cg, ATOMIC_SLOTS=atomic_slots, PIVOT_MASS=round1, TILE=tile, num_warps=8,
                                  maxnreg=regs["collect"], **pdl)
    if beside and round1:   # round 1's masses are in: the rounds start with its draw
        fork_pivot_rounds()
    if direct_rows and not overlap:
        launch_direct_rows(**pdl)
    joined = False
    for fork, late in forks:
        if not late:   # the finish decides this stream's fallback rows: it waits for it
            main_stream.wait_stream(fork)
            joined = True
    if pivot and not beside:
        launch_pivot_rounds(first_pdl=True)
    # after a join, a plain launch: it follows an event wait, not only the kernel before it
    if finish_needed:
        launch_finish(**({} if joined else pdl))
    for fork, late in forks:
        if late:
            main_stream.wait_stream(fork)
    if paths is not None:
        paths["mode"] = st_i[:, 0]
    return tokens, thr, rmax, lnorm


# The keys sample(**kernel_options) and Sampler(kernel_options=...) take: the launcher's
# keyword-only options, read once here so that a wrapper patched over the launcher (a test's
# recorder) cannot change them.
KERNEL_OPTION_NAMES = frozenset(p.name for p in inspect.signature(sample_top_k_top_p_triton).parameters.values()
                                if p.kind is inspect.Parameter.KEYWORD_ONLY)
