"""Rejection sampling, pass 2: the recovered token of each request's first rejected random row.

Grid (num_reqs, NUM_SPLITS). Pass 1 (rejection_sample.py) leaves, per request, the target
row j of its first rejection (-1 when none or when it already wrote the token) with the
row's softmax max and sum. Program (r, c) races chunk c of that row:

- with draft probs and a valid draft: residual r_t = max(0, p_t - q_t), key r_t / E_t
  (if every r_t is 0, which only rounding can cause, the plain race below decides);
- otherwise (n-gram drafts, or a draft id outside the vocabulary): key l_t / T - log E_t
  over t != x, i.e. a draw from p with the draft removed (p itself for an invalid id).

E_t is Exp(1) from word t % 4 of random_words(seed, pos, STREAM_RECOVER, t // 4), with
(seed, pos) the row's key as in pass 1. A second launch, one program per request,
combines the chunk winners and writes the token into the output row.
"""

import torch
import triton
import triton.language as tl

from specops.triton_kernels.rejection_sample import (_INT_MAX, _merge_block_max, _pick_word, _request_keys, _row_key,
                                                    _row_scale, _scaled_block, _target_row, temp_mode_of)
from specops.triton_kernels.rng import STREAM_RECOVER, exponential, random_words


@triton.jit(do_not_specialize=["engine_seed"])
def _rejection_recover_kernel(
    out_ptr, out_stride,                      # [num_reqs, K + 1] int32
    logits_ptr, logits_stride,                # [num_logits, V]
    target_rows_ptr,                          # [T] int (HAS_TARGET_ROWS)
    draft_ids_ptr,                            # [T] int
    draft_probs_ptr, draft_probs_stride,      # [T, V] (HAS_DRAFT_PROBS)
    cu_ptr,                                   # [num_reqs] inclusive cumulative drafts
    temp_ptr,                                 # TEMP_MODE 1: [num_reqs] T; 2: [T] 1/T (fp32)
    threshold_ptr,                            # [T] fp32 (HAS_THRESHOLD)
    seeds_ptr, has_seed_ptr, positions_ptr,   # [num_reqs] (HAS_SEEDS)
    step_ptr, engine_seed,                    # [1] int64, int
    rec_j_ptr, rec_ms_ptr,                    # [num_reqs] int32, [num_reqs, 2] fp32 from pass 1
    part_res_ptr, part_res_idx_ptr,           # [num_reqs * NUM_SPLITS]
    part_log_ptr, part_log_idx_ptr,           # [num_reqs * NUM_SPLITS]
    vocab_size,
    NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    HAS_TARGET_ROWS: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, TEMP_MODE: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr, HAS_SEEDS: tl.constexpr,
):
    req = tl.program_id(0)
    split = tl.program_id(1)
    j = tl.load(rec_j_ptr + req)
    if j >= 0:
        start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int32)
        i = j - start
        row_ptr = _target_row(logits_ptr, logits_stride, target_rows_ptr, j, HAS_TARGET_ROWS)
        q_ptr = draft_probs_ptr + j.to(tl.int64) * draft_probs_stride
        inv_t, thr = _row_scale(temp_ptr, threshold_ptr, req, j, False, TEMP_MODE, HAS_THRESHOLD)
        row_max = tl.load(rec_ms_ptr + req * 2)
        row_sum = tl.load(rec_ms_ptr + req * 2 + 1)
        x = tl.load(draft_ids_ptr + j).to(tl.int32)
        valid = (x >= 0) & (x < vocab_size)
        if HAS_DRAFT_PROBS:
            excluded = tl.where(valid, -1, x)
        else:
            excluded = x
        seeded, seed, position, step = _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req,
                                                     HAS_SEEDS)
        seed_r, pos_r = _row_key(seeded, seed, position, engine_seed.to(tl.int64), step,
                                 i.to(tl.int64), j)

        kk = tl.arange(0, BLOCK // 4)
        ww = tl.arange(0, 4)[None, :]
        lb = tl.full([], float("-inf"), tl.float32)
        lbi = tl.full([], 0, tl.int32)
        rb = tl.full([], 0.0, tl.float32)
        rbi = tl.full([], 0, tl.int32)
        chunk0 = split * CHUNK
        for off in range(0, CHUNK, BLOCK):
            base = chunk0 + off
            t, mask, v = _scaled_block(row_ptr, base, kk, ww, vocab_size, inv_t, thr, HAS_THRESHOLD)
            w0, w1, w2, w3 = random_words(seed_r, pos_r, STREAM_RECOVER, base // 4 + kk)
            e = exponential(_pick_word(w0, w1, w2, w3, ww))
            key = tl.where(mask & (t != excluded), v - tl.log(e), float("-inf"))
            lb, lbi = _merge_block_max(key, t, lb, lbi)
            if HAS_DRAFT_PROBS:
                q = tl.load(q_ptr + t, mask=mask, other=0.0).to(tl.float32)
                p = tl.exp(v - row_max) / row_sum
                res = tl.where(mask, tl.maximum(p - q, 0.0) / e, 0.0)
                rb, rbi = _merge_block_max(res, t, rb, rbi)
        p_off = req * NUM_SPLITS + split
        tl.store(part_log_ptr + p_off, lb)
        tl.store(part_log_idx_ptr + p_off, lbi)
        if HAS_DRAFT_PROBS:
            tl.store(part_res_ptr + p_off, rb)
            tl.store(part_res_idx_ptr + p_off, rbi)


@triton.jit
def _recover_combine_kernel(
    out_ptr, out_stride,                      # [num_reqs, K + 1] int32
    draft_ids_ptr,                            # [T] int
    cu_ptr,                                   # [num_reqs] inclusive cumulative drafts
    rec_j_ptr,                                # [num_reqs] int32 from pass 1
    part_res_ptr, part_res_idx_ptr,           # [num_reqs * NUM_SPLITS]
    part_log_ptr, part_log_idx_ptr,           # [num_reqs * NUM_SPLITS]
    vocab_size,
    NUM_SPLITS: tl.constexpr, SPLIT_BLOCK: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr,
):
    """One program per request (a separate launch): the chunk winners -> the recovered token."""
    req = tl.program_id(0)
    j = tl.load(rec_j_ptr + req)
    if j >= 0:
        start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int32)
        x = tl.load(draft_ids_ptr + j).to(tl.int32)
        valid = (x >= 0) & (x < vocab_size)
        ss = tl.arange(0, SPLIT_BLOCK)
        smask = ss < NUM_SPLITS
        soff = req * NUM_SPLITS + ss
        pl = tl.load(part_log_ptr + soff, mask=smask, other=float("-inf"))
        best = tl.max(pl, 0)
        pli = tl.load(part_log_idx_ptr + soff, mask=smask, other=_INT_MAX)
        token = tl.min(tl.where(pl == best, pli, _INT_MAX), 0)
        token = tl.where(best == float("-inf"), 0, token)   # no candidate: as torch.argmax
        if HAS_DRAFT_PROBS:
            pr = tl.load(part_res_ptr + soff, mask=smask, other=0.0)
            rbest = tl.max(pr, 0)
            pri = tl.load(part_res_idx_ptr + soff, mask=smask, other=_INT_MAX)
            rtoken = tl.min(tl.where(pr == rbest, pri, _INT_MAX), 0)
            token = tl.where(valid & (rbest > 0.0), rtoken, token)
        tl.store(out_ptr + req.to(tl.int64) * out_stride + (j - start), token)


def rejection_recover_pass(
    out: torch.Tensor,                   # [num_reqs, K + 1] int32, written in place
    logits: torch.Tensor,                # [num_logits, V]
    target_rows: torch.Tensor | None,    # [T] int
    draft_token_ids: torch.Tensor,       # [T] int
    draft_probs: torch.Tensor | None,    # [T, V]
    cu_num_draft_tokens: torch.Tensor,   # [num_reqs]
    temperature: torch.Tensor | None,    # [num_reqs] fp32 T, or None
    inv_temperature: torch.Tensor | None,  # [T] fp32 1/T per target row, or None
    threshold: torch.Tensor | None,      # [T] fp32, or None
    seeds: torch.Tensor | None,          # [num_reqs] int64
    has_seed: torch.Tensor | None,       # [num_reqs] bool
    positions: torch.Tensor | None,      # [num_reqs] int64
    step: torch.Tensor,                  # [1] int64
    engine_seed: int,
    rec_j: torch.Tensor,                 # [num_reqs] int32 from pass 1
    rec_ms: torch.Tensor,                # [num_reqs, 2] fp32 from pass 1
    chunk: int,
) -> None:
    """Launch pass 2 (a program finds no work and exits when its request needs no draw)."""
    num_reqs = out.shape[0]
    vocab = logits.shape[1]
    num_splits = triton.cdiv(vocab, chunk)
    dev = logits.device
    ws_f = torch.empty(2 * num_reqs * num_splits, dtype=torch.float32, device=dev)
    ws_i = torch.empty(2 * num_reqs * num_splits, dtype=torch.int32, device=dev)
    f = num_reqs * num_splits
    temp_mode, temp_arg = temp_mode_of(temperature, inv_temperature, logits)
    _rejection_recover_kernel[(num_reqs, num_splits)](
        out, out.stride(0),
        logits, logits.stride(0),
        target_rows if target_rows is not None else draft_token_ids,
        draft_token_ids,
        draft_probs if draft_probs is not None else logits,
        draft_probs.stride(0) if draft_probs is not None else 0,
        cu_num_draft_tokens,
        temp_arg, threshold if threshold is not None else logits,
        seeds if seeds is not None else step, has_seed if has_seed is not None else step,
        positions if positions is not None else step,
        step, engine_seed,
        rec_j, rec_ms,
        ws_f[:f], ws_i[:f], ws_f[f:], ws_i[f:],
        vocab,
        NUM_SPLITS=num_splits, CHUNK=chunk, BLOCK=min(chunk, 1024),   # noise-heavy: small blocks
        SPLIT_BLOCK=triton.next_power_of_2(num_splits),
        HAS_TARGET_ROWS=target_rows is not None, HAS_DRAFT_PROBS=draft_probs is not None,
        TEMP_MODE=temp_mode, HAS_THRESHOLD=threshold is not None, HAS_SEEDS=seeds is not None,
        num_warps=4,
    )
    _recover_combine_kernel[(num_reqs,)](
        out, out.stride(0), draft_token_ids, cu_num_draft_tokens, rec_j,
        ws_f[:f], ws_i[:f], ws_f[f:], ws_i[f:], vocab,
        NUM_SPLITS=num_splits, SPLIT_BLOCK=triton.next_power_of_2(num_splits),
        HAS_DRAFT_PROBS=draft_probs is not None, num_warps=4,
    )
