"""Rejection sampling with draft probs, pass 2: the recovered token of each request's first
rejected random row.

Pass 1 (rejection_pass1.py) and its finalize kernel (rejection_finalize.py), both launched by
rejection_sample.py, leave, per request, the target row j of its first rejection (-1 when
none), the row's softmax max and sum, and the chunk and sub-chunk partials of every row. The
token is drawn by the two-level race of rejection_sample.py's docstring (without draft probs
the finalize kernel of pass 1 draws it and this pass is not launched):

- with a valid draft, from the residual r_t = max(0, p_t - q_t): a first launch, grid
  (num_reqs, NUM_SUBS), sums r over each sub-chunk of the rejected row (target logits and
  draft probs read once, no noise; each sum over its own SUB tokens in an order fixed by V);
  then one program per request races the sub-chunks by those sums and the tokens of the
  chosen sub-chunk with keys r_t / E_t;
- if every r_t is 0 (only rounding can cause it: q >= p on every token), from p without
  the draft, as for n-gram drafts (p itself could give back the rejected draft): sub-chunks
  by pass 1's partials except the draft's, whose mass without it the first launch sums
  directly (no cancellation), tokens by l_t * (1/T) - log E_t with the draft left out;
- if the draft id is outside the vocabulary, from p: sub-chunks by pass 1's partials,
  tokens by l_t * (1/T) - log E_t.

A row without any mass emits token 0 (as torch.argmax of the all -inf keys of the reference).
A rejected row whose draft probs hold a value < 0, NaN or +inf (with a valid draft: the row's
residual is read) is invalid: its token is -1, which ends the request's output.
"""

import torch
import triton
import triton.language as tl

from specops.triton_kernels.sampling_common import pdl_kwargs, pdl_start
from specops.triton_kernels.rejection_common import (_merge_block_max, _race_chunks, _request_keys, _request_span,
                                                     _row_key, _row_scale, _scaled_block, _target_row, _token_noise,
                                                     _valid_draft)
from specops.triton_kernels.rejection_sample import NO_FP_FUSION, Pass1Result, race_geometry, temp_mode_of


@triton.jit
def _sub_log_mass(part_m_ptr, part_sub_ptr, j, kk, NUM_SUBS: tl.constexpr, SPC: tl.constexpr,
                  NUM_SPLITS: tl.constexpr):
    """log of the mass of p in each sub-chunk kk [SUB_BLOCK] of target row j, up to a constant
    of the row: m_c + log(s_k) from the partials of pass 1 (chunk c = k // SPC); -inf for an
    empty sub-chunk or past the last one."""
    kmask = kk < NUM_SUBS
    pm = tl.load(part_m_ptr + j * NUM_SPLITS + kk // SPC, mask=kmask, other=float("-inf"))
    ps = tl.load(part_sub_ptr + j * NUM_SUBS + kk, mask=kmask, other=0.0)
    return tl.where(ps > 0.0, pm + tl.log(tl.where(ps > 0.0, ps, 1.0)), float("-inf"))


@triton.jit
def _race_sub_chunk(row_ptr, q_ptr, c, use_res, x, row_max, row_sum, inv_t, thr, seed_r, pos_r, vocab_size,
                    SUB: tl.constexpr, BLOCK: tl.constexpr, HAS_THRESHOLD: tl.constexpr):
    """Level 2 of the draw: the token of sub-chunk c (SUB tokens) winning the per-token race,
    argmax of max(0, p_t - q_t) / E_t with use_res (p_t = exp(l_t * (1/T) - row_max) / row_sum),
    else of l_t * (1/T) - log E_t over the tokens other than x (-1: none left out); lowest
    token on ties, 0 when every key is -inf. E_t: word t % 4 of random_words(seed_r, pos_r,
    STREAM_RECOVER, t // 4)."""
    kk = tl.arange(0, BLOCK // 4)
    ww = tl.arange(0, 4)[None, :]
    kb = tl.full([], float("-inf"), tl.float32)
    kbi = tl.full([], 0, tl.int32)
    sub0 = c * SUB
    limit = tl.minimum(vocab_size, sub0 + SUB)
    for off in range(0, SUB, BLOCK):
        base = sub0 + off
        t, mask, v = _scaled_block(row_ptr, base, kk, ww, limit, inv_t, thr, HAS_THRESHOLD)
        e = _token_noise(seed_r, pos_r, base // 4 + kk[:, None], ww)
        q = tl.load(q_ptr + t, mask=t < tl.where(use_res, limit, 0), other=0.0).to(tl.float32)
        p = tl.exp(v - row_max) / row_sum
        key = tl.where(use_res, tl.maximum(p - q, 0.0) / e, v - tl.log(e))
        key = tl.where(mask & (t != tl.where(use_res, -1, x)), key, float("-inf"))   # x left out of p's race
        kb, kbi = _merge_block_max(key, t, kb, kbi)
    return kbi


@triton.jit
def _residual_mass_kernel(
    logits_ptr, logits_stride,                # [num_logits, V]
    target_rows_ptr,                          # [T] int (HAS_TARGET_ROWS)
    draft_ids_ptr,                            # [T] int
    draft_probs_ptr, draft_probs_stride,      # [T, V]
    temp_ptr,                                 # TEMP_MODE 1: [num_reqs] T; 2: [T] 1/T (fp32)
    threshold_ptr,                            # [T] fp32 (HAS_THRESHOLD)
    rec_j_ptr, rec_ms_ptr,                    # [num_reqs] int32, [num_reqs, 2] fp32 from the finalize
    part_res_ptr,                             # [num_reqs * NUM_SUBS] fp32 out
    part_px_ptr,                              # [num_reqs] fp32 out: mass of p in x's sub-chunk without x
    vocab_size,
    NUM_SUBS: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr,
    HAS_TARGET_ROWS: tl.constexpr, TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """Program (r, k): sum over sub-chunk k of the residual max(0, p_t - q_t) of request r's
    rejected row, and, in the sub-chunk holding the draft x, the sum of p_t over t != x (when
    the draft is valid; the race reads nothing otherwise)."""
    pdl_start(PDL)
    req = tl.program_id(0)
    k = tl.program_id(1)
    j = tl.load(rec_j_ptr + req)   # >= 0 only for a rejected row the finalize found valid (in the logits)
    if j >= 0:
        x = _valid_draft(tl.load(draft_ids_ptr + j), vocab_size)
        if x >= 0:
            row_ptr = _target_row(logits_ptr, logits_stride, target_rows_ptr, j, HAS_TARGET_ROWS)
            q_ptr = draft_probs_ptr + j.to(tl.int64) * draft_probs_stride
            inv_t, thr = _row_scale(temp_ptr, threshold_ptr, req, j, False, TEMP_MODE, HAS_THRESHOLD)
            row_max = tl.load(rec_ms_ptr + req * 2)
            row_sum = tl.load(rec_ms_ptr + req * 2 + 1)
            kk = tl.arange(0, BLOCK // 4)
            ww = tl.arange(0, 4)[None, :]
            acc = tl.full([], 0.0, tl.float32)
            acc_px = tl.full([], 0.0, tl.float32)
            min_q = tl.full([], 0.0, tl.float32)     # with sum_q: a q < 0, NaN or +inf in the row
            sum_q = tl.full([], 0.0, tl.float32)
            sub0 = k * SUB
            limit = tl.minimum(vocab_size, sub0 + SUB)
            for off in range(0, SUB, BLOCK):
                t, mask, v = _scaled_block(row_ptr, sub0 + off, kk, ww, limit, inv_t, thr, HAS_THRESHOLD)
                q = tl.load(q_ptr + t, mask=mask, other=0.0).to(tl.float32)
                p = tl.exp(v - row_max) / row_sum
                acc += tl.sum(tl.sum(tl.where(mask, tl.maximum(p - q, 0.0), 0.0), 1), 0)
                acc_px += tl.sum(tl.sum(tl.where(mask & (t != x), p, 0.0), 1), 0)
                min_q = tl.minimum(min_q, tl.min(tl.min(q, 1), 0))
                sum_q += tl.sum(tl.sum(q, 1), 0)
            # a draft prob < 0 (the min), NaN or +inf (the sum) in the rejected row: the residual
            # is no distribution, so its sum is stored as NaN, which makes the row invalid
            bad_q = (min_q < 0.0) | ~(sum_q < float("inf"))
            tl.store(part_res_ptr + req * NUM_SUBS + k, tl.where(bad_q, float("nan"), acc))
            if k == x // SUB:
                tl.store(part_px_ptr + req, acc_px)


@triton.jit(do_not_specialize=["num_target_rows", "engine_seed"])
def _recover_race_kernel(
    out_ptr, out_stride,                      # [num_reqs, K + 1] int32
    logits_ptr, logits_stride,                # [num_logits, V]
    target_rows_ptr,                          # [T] int (HAS_TARGET_ROWS)
    draft_ids_ptr,                            # [T] int
    draft_probs_ptr, draft_probs_stride,      # [T, V]
    cu_ptr,                                   # [num_reqs] inclusive cumulative drafts
    temp_ptr,                                 # TEMP_MODE 1: [num_reqs] T; 2: [T] 1/T (fp32)
    threshold_ptr,                            # [T] fp32 (HAS_THRESHOLD)
    seeds_ptr, has_seed_ptr, positions_ptr,   # [num_reqs] (HAS_SEEDS)
    step_ptr, engine_seed,                    # [1] int64, int
    rec_j_ptr, rec_ms_ptr,                    # [num_reqs] int32, [num_reqs, 2] fp32 from the finalize
    part_m_ptr, part_sub_ptr,                 # [T * NUM_SPLITS], [T * NUM_SUBS] fp32 from pass 1
    part_res_ptr,                             # [num_reqs * NUM_SUBS] fp32 from _residual_mass_kernel
    part_px_ptr,                              # [num_reqs] fp32 from _residual_mass_kernel
    num_target_rows, vocab_size,
    NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr, NUM_SUBS: tl.constexpr,
    BLOCK: tl.constexpr, SUB_BLOCK: tl.constexpr,
    HAS_TARGET_ROWS: tl.constexpr, TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
    HAS_SEEDS: tl.constexpr,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_start)
):
    """One program per request: level 1 over the sub-chunks of its rejected row, level 2 over
    the tokens of the chosen sub-chunk; writes the token into the output row."""
    pdl_start(PDL)
    req = tl.program_id(0)
    j = tl.load(rec_j_ptr + req)
    if j >= 0:
        start, _ = _request_span(cu_ptr, req, num_target_rows)   # as the finalize clamped it
        i = j - start
        x = _valid_draft(tl.load(draft_ids_ptr + j), vocab_size)
        valid = x >= 0
        seeded, seed, position, step = _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req,
                                                     HAS_SEEDS)
        seed_r, pos_r = _row_key(seeded, seed, position, engine_seed.to(tl.int64), step, i.to(tl.int64), j)

        # level 1: the sub-chunk masses of the residual, or of p when the residual has none
        # (without a valid draft x in x's sub-chunk: its mass as the first launch summed it,
        # p normalised by the row's max and sum, put back on pass 1's scale)
        kk = tl.arange(0, SUB_BLOCK)
        res = tl.load(part_res_ptr + req * NUM_SUBS + kk, mask=kk < tl.where(valid, NUM_SUBS, 0), other=0.0)
        bad_q = tl.sum((res != res).to(tl.int32), 0) > 0      # a draft prob < 0, NaN or +inf in the row
        res = tl.where(res == res, res, 0.0)
        use_res = tl.max(res, 0) > 0.0
        log_res = tl.where(res > 0.0, tl.log(tl.where(res > 0.0, res, 1.0)), float("-inf"))
        log_p = _sub_log_mass(part_m_ptr, part_sub_ptr, j, kk, NUM_SUBS, CHUNK // SUB, NUM_SPLITS)
        row_max = tl.load(rec_ms_ptr + req * 2)
        row_sum = tl.load(rec_ms_ptr + req * 2 + 1)
        if valid:
            px = tl.load(part_px_ptr + req)
            log_px = tl.where(px > 0.0, tl.log(tl.where(px > 0.0, px, 1.0)) + row_max + tl.log(row_sum),
                              float("-inf"))
            log_p = tl.where(kk == x // SUB, log_px, log_p)
        c, best = _race_chunks(tl.where(use_res, log_res, log_p), kk, seed_r, pos_r)

        # level 2: the per-token race within sub-chunk c
        token = tl.full([], 0, tl.int32)                            # no mass: as torch.argmax
        if best > float("-inf"):
            row_ptr = _target_row(logits_ptr, logits_stride, target_rows_ptr, j, HAS_TARGET_ROWS)
            q_ptr = draft_probs_ptr + j.to(tl.int64) * draft_probs_stride
            inv_t, thr = _row_scale(temp_ptr, threshold_ptr, req, j, False, TEMP_MODE, HAS_THRESHOLD)
            token = _race_sub_chunk(row_ptr, q_ptr, c, use_res, x, row_max, row_sum, inv_t, thr, seed_r, pos_r,
                                    vocab_size, SUB, BLOCK, HAS_THRESHOLD)
        tl.store(out_ptr + req.to(tl.int64) * out_stride + i, tl.where(bad_q, -1, token))   # -1 ends the output


def rejection_recover_pass(
    out: torch.Tensor,                   # [num_reqs, K + 1] int32, written in place
    logits: torch.Tensor,                # [num_logits, V]
    target_rows: torch.Tensor | None,    # [T] int
    draft_token_ids: torch.Tensor,       # [T] int
    draft_probs: torch.Tensor,           # [T, V]
    cu_num_draft_tokens: torch.Tensor,   # [num_reqs]
    temperature: torch.Tensor | None,    # [num_reqs] fp32 T, or None
    inv_temperature: torch.Tensor | None,  # [T] fp32 1/T per target row, or None
    threshold: torch.Tensor | None,      # [T] fp32, or None
    seeds: torch.Tensor | None,          # [num_reqs] int64
    has_seed: torch.Tensor | None,       # [num_reqs] bool
    positions: torch.Tensor | None,      # [num_reqs] int64
    step: torch.Tensor,                  # [1] int64
    engine_seed: int,
    pass1: Pass1Result,
    chunk: int,
    sub_chunk: int | None = None,
    race_block: int | None = None,
    race_warps: int = 8,
) -> None:
    """Launch pass 2 (a program finds no work and exits when its request needs no draw).

    Only with draft probs: without them the finalize kernel of pass 1 draws the tokens.

    ``sub_chunk`` must be pass 1's (default: the same default). ``race_block`` (tokens per
    step of the level-2 race, default sub_chunk) and ``race_warps`` change speed only. On the
    H200 (fp32 V = 128256, CUDA graphs, the same tokens) the race on 8 warps took the whole
    call 0.2-0.8 us less than on 16 at each of the 5 shapes with draft probs, in both rounds
    of an interleaved sweep (K = 1 batch 128: 33.0-33.1 against 33.2-33.3 us; K = 4 batch 32:
    33.3-33.6 against 33.8-34.2; bench/results/logs/exp_race_warps_2026-12-04.txt).
    """
    num_reqs = out.shape[0]
    vocab = logits.shape[1]
    num_splits, sub, num_subs = race_geometry(vocab, chunk, sub_chunk)
    race_block = min(sub, 8192) if race_block is None else race_block
    assert race_block >= 16 and race_block & (race_block - 1) == 0 and sub % race_block == 0
    temp_mode, temp_arg = temp_mode_of(temperature, inv_temperature, logits)
    rows = dict(target_rows_ptr=target_rows if target_rows is not None else draft_token_ids,
                draft_ids_ptr=draft_token_ids, draft_probs_ptr=draft_probs,
                draft_probs_stride=draft_probs.stride(0))
    part_res = torch.empty(num_reqs * (num_subs + 1), dtype=torch.float32, device=logits.device)
    part_px = part_res[num_reqs * num_subs:]
    block = min(sub, 4096)   # memory bound: wide loads, no noise
    pdl = pdl_kwargs(logits)
    _residual_mass_kernel[(num_reqs, num_subs)](
        logits, logits.stride(0), **rows,
        temp_ptr=temp_arg, threshold_ptr=threshold if threshold is not None else logits,
        rec_j_ptr=pass1.rec_j, rec_ms_ptr=pass1.rec_ms, part_res_ptr=part_res, part_px_ptr=part_px,
        vocab_size=vocab,
        NUM_SUBS=num_subs, SUB=sub, BLOCK=block,
        HAS_TARGET_ROWS=target_rows is not None, TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None,
        num_warps=8 if block >= 4096 else 4, **pdl, **NO_FP_FUSION,
    )
    _recover_race_kernel[(num_reqs,)](
        out, out.stride(0), logits, logits.stride(0), **rows,
        cu_ptr=cu_num_draft_tokens,
        temp_ptr=temp_arg, threshold_ptr=threshold if threshold is not None else logits,
        seeds_ptr=seeds if seeds is not None else step, has_seed_ptr=has_seed if has_seed is not None else step,
        positions_ptr=positions if positions is not None else step,
        step_ptr=step, engine_seed=engine_seed,
        rec_j_ptr=pass1.rec_j, rec_ms_ptr=pass1.rec_ms,
        part_m_ptr=pass1.part_m, part_sub_ptr=pass1.part_sub, part_res_ptr=part_res, part_px_ptr=part_px,
        num_target_rows=draft_token_ids.shape[0], vocab_size=vocab,
        NUM_SPLITS=num_splits, CHUNK=chunk, SUB=sub, NUM_SUBS=num_subs, BLOCK=race_block,
        SUB_BLOCK=triton.next_power_of_2(num_subs),
        HAS_TARGET_ROWS=target_rows is not None, TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None,
        HAS_SEEDS=seeds is not None, num_warps=race_warps, **pdl, **NO_FP_FUSION,
    )
