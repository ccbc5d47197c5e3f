"""Rejection sampling, pass 1: one read of every target row, then accept/reject per request.

Two launches: pass 1 (rejection_pass1.py) writes chunk partials of every target row, the
finalize kernel (rejection_finalize.py), one program per request, decides acceptance from them
and writes the request's output row; rejection_common.py holds the @triton.jit helpers they
share with rejection_recover.py. This module is the host side: the sizes (chunk_size,
sub_chunk_size, check_sub_chunk), the launcher rejection_sample_pass and what it leaves for the
recover pass (Pass1Result).

The recovered token of a random row is drawn from the residual w (without draft probs:
p with x removed; with them: max(0, p - q)) by a two-level exponential race over the row's
sub-chunks (SUB = sub_chunk_size(V) tokens, CHUNK / SUB of them in each chunk), exact
because P(t) = P(sub-chunk k) P(t | k) = (M_k / M) (w_t / M_k) with M_k the mass of k:

1. sub-chunk k = argmax_k log(M_k) - log(E_k), E_k Exp(1) from word k % 4 of
   random_words(seed, pos, STREAM_RECOVER_CHUNK, k // 4) (a stream no per-token draw uses);
2. within sub-chunk k only, the per-token race: argmax_{t in k, t != x} (x_t - log E_t), or
   argmax_{t in k} w_t / E_t with draft probs, E_t Exp(1) from word t % 4 of
   random_words(seed, pos, STREAM_RECOVER, t // 4).

Pass 1 writes, besides the chunk partials, the sum of exp(x - m_c) over each sub-chunk of
chunk c (m_c the chunk's max; each sum added directly over its own tokens, in an order
fixed by V) and the same sum without the draft token for the sub-chunk holding it. Without
draft probs these are the sub-chunk masses (M_k = e^{m_c} s_k up to the row's normaliser),
so nothing re-reads the row: the finalize kernel runs level 1 for the request's rejected
row, then level 2 over the chosen sub-chunk (one read of SUB tokens, in one step by
default) or, with FUSE_RACE, takes that sub-chunk's winner of the per-token race that
pass 1 ran everywhere. With draft probs, rejection_recover.py sums the residual of each
sub-chunk of the rejected row, then runs both levels. The same sub-chunks and noise, and
so the same tokens, as specops.spec_decode.rejection_torch. SUB = CHUNK is the one-level
chunk race of earlier versions (other tokens, the same law).

CHUNK and SUB depend on the vocabulary only (chunk_size, sub_chunk_size), so every row is
reduced and raced in the same order whatever the batch: seeded requests (their row keys:
rejection_common.py) are batch invariant.
"""

from typing import NamedTuple

import torch
import triton

from specops.triton_kernels.sampling_common import NO_FP_FUSION, pdl_kwargs
from specops.triton_kernels.rejection_finalize import _rejection_finalize_kernel
from specops.triton_kernels.rejection_pass1 import _rejection_sample_kernel

# Every rejection launch compiles without fma contraction (NO_FP_FUSION), and 1/T of a per-request temperature
# is the correctly rounded quotient (div_rn, as torch's 1 / T): so x = l * (1/T) is rounded
# once whichever way the kernel gets its scale (a temperature, or the processed rows' 1/T) and
# whether a threshold follows, and a seeded request's tokens do not depend on whether a
# neighbour in its batch needed its rows processed. (With contraction, x - max became
# fma(l, 1/T, -max) in some variants only, and an approximate 1/T differed in its last bit.)


def temp_mode_of(temperature, inv_temperature, dummy):
    """(TEMP_MODE, pointer argument) of the launchers."""
    if temperature is not None:
        return 1, temperature
    if inv_temperature is not None:
        return 2, inv_temperature
    return 0, dummy


class Pass1Result(NamedTuple):
    """What pass 1 and the finalize kernel leave for the recover pass (rejection_recover.py)."""
    rec_j: torch.Tensor    # [num_reqs] int32 target row of the request's recovered-token draw, or -1
    #                        (written only when the recover pass follows: draft probs, random rows)
    rec_ms: torch.Tensor   # [num_reqs, 2] fp32 max and sum of exp of that row (softmax statistics)
    part_m: torch.Tensor   # [T * num_chunks] fp32 chunk max of each target row's scaled logits
    part_s: torch.Tensor   # [T * num_chunks] fp32 chunk sum of exp(x - chunk max)
    part_sub: torch.Tensor  # [T * num_subs] fp32 sub-chunk sum of exp(x - max of its chunk)


# Pass 1 keeps one running state per lane (_chunk_stats_lanes) instead of reducing every block
# (fuse_race and prefetch keep the block reductions). On the H200 (V = 128256, B = 128, chunk
# 8192, exp_rejection_pass1.py --lanes-table, 2026-11-30): 19.1 against 20.0 us at K = 1,
# 123.4 against 135.1 at K = 8, 17.9 against 19.3 with draft probs.
LANE_STATS = True


def chunk_size(vocab: int) -> int:
    """Vocabulary entries per program of pass 1: 4096, or about a quarter of a small vocabulary.

    A function of the vocabulary only, so a row is reduced in the same order whatever
    the batch (batch invariance of seeded requests). On the H200 (V = 128256, B = 128,
    exp_rejection_pass1.py --lanes-table, 2026-11-30) pass 1 with per-lane statistics took
    17.5 / 120.1 us at K = 1 / 8 in chunks of 4096 against 19.1 / 123.4 in chunks of 8192.
    """
    return min(4096, max(64, triton.next_power_of_2(triton.cdiv(vocab, 4))))


def sub_chunk_size(vocab: int) -> int:
    """Tokens per sub-chunk of the recovered-token race (>= 32): 4096 from V = 16385 on (one
    sub-chunk per chunk), else half a chunk. A function of the vocabulary only, like
    chunk_size, so every row is raced in the same groups whatever the batch. On the H200, with
    chunks of 8192, sub-chunks of 2048 / 4096 / 8192 took 33.1 / 31.0 / 31.3 us at K = 1, B = 128 and
    200.7 / 181.2 / 177.6 at K = 8 (exp_rejection_pass1.py --breakdown --sub, 2026-11-30)."""
    return min(4096, max(32, triton.next_power_of_2(triton.cdiv(vocab, 4)) // 2))


def check_sub_chunk(sub_chunk: int, chunk: int) -> None:
    """A sub-chunk size the kernels take: a power of two in [16, chunk]."""
    if not (isinstance(sub_chunk, int) and 16 <= sub_chunk <= chunk and sub_chunk & (sub_chunk - 1) == 0):
        raise ValueError(f"sub_chunk must be a power of two in [16, {chunk}], got {sub_chunk!r}")


def fixed_sum_scale(num_splits: int, chunk: int) -> float:
    """Units per 1 of the finalize's fixed-point row sums (rejection_finalize._accept_rows):
    2^S with the total of num_splits chunk terms, each below 2 * chunk (a chunk's sum of at
    most `chunk` values <= 1, times a factor <= 1), under 2^62 units. For V = 128256 (32 chunks
    of 4096) S = 43: each term is rounded down by less than 2^-43 against a row sum >= 1."""
    return float(2 ** (61 - (num_splits * chunk).bit_length()))


def race_geometry(vocab: int, chunk: int, sub_chunk: int | None) -> tuple[int, int, int]:
    """(chunks, sub-chunk size, sub-chunks) of a row of `vocab` tokens read in chunks of `chunk`:
    the launchers' shared layout of pass 1's partials; `sub_chunk` None: min(chunk,
    sub_chunk_size(vocab)), else checked (check_sub_chunk)."""
    sub = min(chunk, sub_chunk_size(vocab)) if sub_chunk is None else sub_chunk
    check_sub_chunk(sub, chunk)
    return triton.cdiv(vocab, chunk), sub, triton.cdiv(vocab, sub)


def rejection_sample_pass(
    out: torch.Tensor,                   # [num_reqs, max_spec_len + 1] int32 (written whole)
    logits: torch.Tensor,                # [num_logits, V] fp32/bf16/fp16, unit stride over V
    target_rows: torch.Tensor | None,    # [T] int, or None: logits rows are the target rows
    draft_token_ids: torch.Tensor,       # [T] int
    draft_probs: torch.Tensor | None,    # [T, V] or None (n-gram drafts: q = one-hot)
    cu_num_draft_tokens: torch.Tensor,   # [num_reqs] int32/int64
    bonus_token_ids: torch.Tensor,       # [num_reqs] int
    temperature: torch.Tensor | None,    # [num_reqs] fp32 T, or None
    inv_temperature: torch.Tensor | None,  # [T] fp32 1/T per target row, or None (not both)
    threshold: torch.Tensor | None,      # [T] fp32 kept set {scaled logit >= threshold}, or None
    is_greedy: torch.Tensor | bool,      # [num_reqs] bool, or True / False for the whole batch
    seeds: torch.Tensor | None,          # [num_reqs] int64 (None: no seeded request)
    has_seed: torch.Tensor | None,       # [num_reqs] bool
    positions: torch.Tensor | None,      # [num_reqs] int64, sequence position of draft 0
    step: torch.Tensor,                  # [1] int64 engine step counter
    engine_seed: int,
    fuse_race: bool,
    chunk: int,
    sub_chunk: int | None = None,
    block: int | None = None,
    num_warps: int | None = None,
    prefetch: bool = False,
    race_block: int | None = None,
    race_warps: int = 8,
    lanes: bool | None = None,
) -> Pass1Result:
    """Launch pass 1 and the finalize kernel; returns what the recover pass reads.

    Inputs are checked by specops.spec_decode.rejection; this launcher only asserts layout.
    Without draft probs, the finalize kernel also draws the recovered tokens (the recover
    pass is then not needed). ``sub_chunk`` (default min(chunk, sub_chunk_size(V))) is the unit
    of the race's level 2: it changes which tokens are drawn (not their law), so keep it a
    function of V, as the torch reference's. ``block`` (entries per load, default min(chunk, 4096)),
    ``num_warps``, ``lanes`` (default LANE_STATS: per-lane running statistics; fuse_race and
    prefetch reduce in blocks) and ``prefetch`` change speed only: a row's reductions are in an
    order fixed by (V, chunk, block, num_warps, lanes), so callers keep them functions of V
    (batch invariance).
    ``race_block`` (tokens per step of the level-2 race, default sub_chunk) and
    ``race_warps`` (the finalize kernel's warps when it races) change speed only.
    """
    num_reqs, width = out.shape
    max_k = width - 1
    num_target_rows = draft_token_ids.shape[0]
    vocab = logits.shape[1]
    assert logits.stride(1) == 1 and out.is_contiguous()
    assert chunk >= 16 and chunk & (chunk - 1) == 0, "chunk must be a power of two >= 16"
    assert draft_probs is None or draft_probs.stride(1) == 1
    dev = logits.device
    num_splits, sub, num_subs = race_geometry(vocab, chunk, sub_chunk)
    # Blocks of up to 4096 entries (32 fp32 per thread) with 4 warps. On the H200 (V = 128256,
    # B = 128, 8192-entry chunks, exp_rejection_pass1.py, 2026-11-30) the block reductions took
    # 20.2 / 135.2 us at K = 1 / 8 against 24.8 / 174.8 for a whole chunk per load with 8 warps;
    # per-lane statistics were slower on 8 warps than on 4 (21.1 against 19.1 us at K = 1).
    block = min(chunk, 4096) if block is None else block
    assert block >= 16 and block & (block - 1) == 0 and chunk % block == 0
    if num_warps is None:
        num_warps = 4
    if lanes is None:
        lanes = LANE_STATS
    greedy_mode = 0 if isinstance(is_greedy, torch.Tensor) else (1 if is_greedy else 2)
    recover = draft_probs is not None and greedy_mode != 1   # rejection_recover_pass follows
    race = draft_probs is None and greedy_mode != 1
    nt = max(num_target_rows, 1)
    f, g = nt * num_splits, nt * num_subs
    ws_f = torch.empty(2 * f + g + 2 * nt + 2 * num_reqs, dtype=torch.float32, device=dev)
    ws_i = torch.empty(f + g + num_reqs, dtype=torch.int32, device=dev)
    part_m, part_s, part_sub = ws_f[:f], ws_f[f:2 * f], ws_f[2 * f:2 * f + g]
    part_lx, part_sx = ws_f[2 * f + g:2 * f + g + nt], ws_f[2 * f + g + nt:2 * f + g + 2 * nt]
    rec_ms = ws_f[2 * f + g + 2 * nt:].view(num_reqs, 2)
    part_idx, part_kidx, rec_j = ws_i[:f], ws_i[f:f + g], ws_i[f + g:]
    temp_mode, temp_arg = temp_mode_of(temperature, inv_temperature, logits)
    dummy = draft_token_ids
    grid = (num_reqs * max(max_k, 1), num_splits)
    pdl = pdl_kwargs(logits)
    _rejection_sample_kernel[grid](
        out, out.stride(0),
        logits, logits.stride(0),
        target_rows if target_rows is not None else dummy,
        draft_token_ids,
        cu_num_draft_tokens, bonus_token_ids,
        temp_arg, threshold if threshold is not None else logits,
        is_greedy if greedy_mode == 0 else dummy,
        seeds if seeds is not None else step, has_seed if has_seed is not None else step,
        positions if positions is not None else step,
        step, engine_seed,
        part_m, part_s, part_idx, part_sub, part_kidx, part_lx, part_sx,
        rec_j,
        num_target_rows, logits.shape[0], vocab,
        MAX_K=max_k, GRID_K=max(max_k, 1), NUM_SPLITS=num_splits, CHUNK=chunk, SUB=sub, NUM_SUBS=num_subs,
        BLOCK=block,
        OUT_BLOCK=triton.next_power_of_2(max_k + 1),
        HAS_TARGET_ROWS=target_rows is not None,
        TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None, GREEDY_MODE=greedy_mode,
        HAS_SEEDS=seeds is not None, FUSE_RACE=fuse_race,
        NEED_SX=race, PREFETCH=prefetch, WRITE_REC=recover,
        LANES=128 * num_warps if lanes and not fuse_race and not prefetch else 0,
        num_warps=num_warps, **pdl, **NO_FP_FUSION,
    )
    # the whole sub-chunk (4096 tokens) in one step with 8 warps: 5.4 / 11.9 us for the finalize at
    # K = 1 / 8, B = 128 on the H200 against 6.0 / 13.7 with 16 warps and 6.8 / 12.4 for 2 steps of
    # 2048 with 8 (exp_rejection_pass1.py --race, logs/exp_rejection_race_2026-11-30b.txt)
    race_block = min(sub, 8192) if race_block is None else race_block
    assert race_block >= 16 and race_block & (race_block - 1) == 0 and sub % race_block == 0
    _rejection_finalize_kernel[(num_reqs,)](
        out, out.stride(0), draft_token_ids, bonus_token_ids, cu_num_draft_tokens,
        is_greedy if greedy_mode == 0 else dummy,
        seeds if seeds is not None else step, has_seed if has_seed is not None else step,
        positions if positions is not None else step, step, engine_seed,
        part_m, part_s, part_idx, part_sub, part_kidx, part_lx, part_sx, rec_j, rec_ms,
        logits, logits.stride(0), target_rows if target_rows is not None else dummy,
        temp_arg, threshold if threshold is not None else logits,
        draft_probs if draft_probs is not None else logits, draft_probs.stride(0) if draft_probs is not None else 0,
        num_target_rows, vocab,
        MAX_K=max_k, NUM_SPLITS=num_splits, CHUNK=chunk, SUB=sub, NUM_SUBS=num_subs,
        OUT_BLOCK=triton.next_power_of_2(max_k + 1),
        SUB_BLOCK=triton.next_power_of_2(num_subs),
        FIX_SCALE=fixed_sum_scale(num_splits, chunk),
        GREEDY_MODE=greedy_mode, HAS_SEEDS=seeds is not None, FUSE_RACE=fuse_race,
        HAS_DRAFT_PROBS=draft_probs is not None, RACE=race, RACE_BLOCK=race_block,
        HAS_TARGET_ROWS=target_rows is not None, TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None,
        num_warps=race_warps if race and not fuse_race else 4, **pdl, **NO_FP_FUSION,
    )
    return Pass1Result(rec_j, rec_ms, part_m, part_s, part_sub)
