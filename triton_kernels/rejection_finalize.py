"""Rejection sampling, the finalize kernel (_rejection_finalize_kernel) after pass 1
(rejection_pass1.py), and its acceptance helpers: the request's rows, uniforms and scales,
acceptance from pass 1's partials, the level-2 race of the recovered token, the output row.
Launched by rejection_sample.rejection_sample_pass.

A second launch after pass 1, one program per request, combines the partials of all its
rows, decides acceptance and writes the request's whole output row [K + 1] (a separate
launch rather than "the last program to finish": no ordering between programs to rely on).
With programmatic dependent launch it reads everything that is an input (draft ids, keys,
uniforms, 1/T, threshold, the drafts' own logits l_x and q(x)) before waiting for pass 1, so
that after the wait it reads pass 1's partials in one round trip (and, to race, one sub-chunk
of a rejected row).

- greedy rows accept draft x while x == argmax of the row; the first mismatch writes the
  argmax and stops;
- random rows accept x when p(x) >= u * q(x) (q = draft prob, 1 without draft probs),
  u = uniform_open(word 0 of random_words(seed, pos, STREAM_ACCEPT, 0));
- a draft id outside [0, V) is rejected unconditionally;
- every draft accepted: the bonus token is appended.
"""

import triton
import triton.language as tl

from specops.triton_kernels.sampling_common import pdl_launch, pdl_wait
from specops.triton_kernels.rng import STREAM_ACCEPT, random_words, uniform_open
from specops.triton_kernels.rejection_common import (_INT_MAX, _merge_block_max, _race_chunks, _request_greedy,
                                                     _request_keys, _request_span, _row_key, _scaled_block,
                                                     _token_noise, _valid_draft)


@triton.jit
def _race_chunk_tokens(row_ptr, c, excluded, inv_t, thr, seed_r, pos_r, vocab_size, SUB: tl.constexpr,
                       BLOCK: tl.constexpr, HAS_THRESHOLD: tl.constexpr):
    """Level 2 of the recovered-token draw (no draft probs): the token of sub-chunk c (SUB
    tokens) winning the per-token race argmax over t != excluded of l_t * (1/T) - log E_t; lowest
    token on ties, 0 when every key is -inf. E_t: word t % 4 of
    random_words(seed_r, pos_r, STREAM_RECOVER, t // 4)."""
    kk = tl.arange(0, BLOCK // 4)
    ww = tl.arange(0, 4)[None, :]
    kb = tl.full([], float("-inf"), tl.float32)
    kbi = tl.full([], 0, tl.int32)
    sub0 = c * SUB
    limit = tl.minimum(vocab_size, sub0 + SUB)
    for off in range(0, SUB, BLOCK):
        base = sub0 + off
        t, mask, v = _scaled_block(row_ptr, base, kk, ww, limit, inv_t, thr, HAS_THRESHOLD)
        key = v - tl.log(_token_noise(seed_r, pos_r, base // 4 + kk[:, None], ww))
        key = tl.where(mask & (t != excluded), key, float("-inf"))
        kb, kbi = _merge_block_max(key, t, kb, kbi)
    return kbi


@triton.jit
def _request_rows(cu_ptr, draft_ids_ptr, req, num_target_rows, vocab_size, MAX_K: tl.constexpr,
                  OUT_BLOCK: tl.constexpr):
    """The draft rows of request req: (rr [OUT_BLOCK] draft index = output column, start, n,
    rmask = rr < n, jj = start + rr their target rows, x [OUT_BLOCK] their valid draft ids or -1,
    too_many: more than MAX_K drafts, so that the bonus token (drawn after all of them) cannot
    follow the first MAX_K). Inputs only: readable before pdl_wait."""
    rr = tl.arange(0, OUT_BLOCK)
    start, end = _request_span(cu_ptr, req, num_target_rows)
    n = tl.maximum(tl.minimum(end - start, MAX_K), 0)
    rmask = rr < n
    jj = start + rr
    x = _valid_draft(tl.load(draft_ids_ptr + jj, mask=rmask, other=-1), vocab_size)
    return rr, start, n, rmask, jj, x, end - start > MAX_K


@triton.jit
def _draft_rows(target_rows_ptr, temp_ptr, threshold_ptr, req, jj, rmask, greedy,
                TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr, HAS_TARGET_ROWS: tl.constexpr):
    """Per draft row jj [OUT_BLOCK] of request req: (logits row index, 1/T, threshold); greedy
    requests: 1/T = 1, no threshold. Inputs only: readable before pdl_wait. (The draft's scaled
    logit l_x * (1/T) is read from pass 1, not recomputed here.)"""
    if HAS_TARGET_ROWS:
        rows = tl.load(target_rows_ptr + jj, mask=rmask, other=0).to(tl.int64)
    else:
        rows = jj.to(tl.int64)
    inv_t = tl.full(jj.shape, 1.0, tl.float32)
    if TEMP_MODE == 1:
        inv_t = inv_t * tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.load(temp_ptr + req).to(tl.float32)))
    if TEMP_MODE == 2:
        inv_t = tl.where(greedy, 1.0, tl.load(temp_ptr + jj, mask=rmask, other=1.0).to(tl.float32))
    thr = tl.full(jj.shape, float("-inf"), tl.float32)
    if HAS_THRESHOLD:
        thr = tl.where(greedy, float("-inf"), tl.load(threshold_ptr + jj, mask=rmask, other=0.0).to(tl.float32))
    return rows, inv_t, thr


@triton.jit
def _accept_uniforms(rr, jj, seeded, seed, position, engine_seed, step):
    """u [OUT_BLOCK] of the draft rows: uniform_open of word 0 of
    random_words(seed_r, pos_r, STREAM_ACCEPT, 0). Inputs only: computable before pdl_wait."""
    seed_r, pos_r = _row_key(seeded, seed, position, engine_seed, step, rr.to(tl.int64), jj)
    w0, _, _, _ = random_words(seed_r, pos_r, STREAM_ACCEPT, tl.zeros_like(rr))
    return uniform_open(w0)


@triton.jit
def _accept_rows(part_m_ptr, part_s_ptr, part_idx_ptr, rr, n, rmask, jj, x, lx, q_x, u, greedy,
                 NUM_SPLITS: tl.constexpr, OUT_BLOCK: tl.constexpr, GREEDY_MODE: tl.constexpr):
    """Acceptance of a request's draft rows from pass 1's chunk partials: greedy rows accept x
    == argmax, random ones p(x) >= u q(x) with p(x) = exp(l_x * (1/T) - row max) / row sum.
    An invalid row (a NaN or +inf scaled logit, or none above -inf; on a random row a valid
    draft's prob q(x) < 0, NaN or +inf) accepts nothing: it ends its request's output (the
    caller writes -1 there). Returns (num_accepted, rejected, first_rej, rej_ok: that row is
    valid (False without a rejection), argmax, row max (0 for an all -inf row), row sum); the
    last three [OUT_BLOCK]."""
    # One column (chunk) at a time, row-wise operations only: no reduction across threads comes
    # before the last load of the partials, so that all of them are issued together after the
    # PDL wait (a tl.max over the [OUT_BLOCK, NUM_SPLITS] tile put a barrier, and so a second
    # round trip, between its load and the others). Max and min are exact in any order; the
    # sums are added in chunk order (a tl.sum over the tile would add them in an order set by
    # the compiler's layout of that tile, which may change with OUT_BLOCK: the batch's K).
    row_max = tl.full(jj.shape, float("-inf"), tl.float32)
    for k in tl.static_range(NUM_SPLITS):
        row_max = tl.maximum(row_max, tl.load(part_m_ptr + jj * NUM_SPLITS + k, mask=rmask, other=float("-inf")))
    m_safe = tl.where(row_max == float("-inf"), 0.0, row_max)
    argmax = tl.full(jj.shape, _INT_MAX, tl.int32)
    row_sum = tl.zeros_like(m_safe)
    nan_flags = tl.zeros(jj.shape, tl.int32)
    for k in tl.static_range(NUM_SPLITS):
        pm_k = tl.load(part_m_ptr + jj * NUM_SPLITS + k, mask=rmask, other=float("-inf"))
        pidx_k = tl.load(part_idx_ptr + jj * NUM_SPLITS + k, mask=rmask, other=_INT_MAX)
        argmax = tl.minimum(argmax, tl.where(pm_k == row_max, pidx_k, _INT_MAX))
        ps_k = tl.load(part_s_ptr + jj * NUM_SPLITS + k, mask=rmask, other=0.0)
        if GREEDY_MODE == 1:
            nan_flags += (ps_k != ps_k).to(tl.int32)     # pass 1 stored NaN flags instead of sums
        else:
            row_sum = row_sum + ps_k * tl.exp(pm_k - m_safe)
    valid = x >= 0
    acc_greedy = valid & (x == argmax)
    if GREEDY_MODE == 1:
        # +inf and all -inf show in the max (a NaN max, where a max propagates NaN, fails too)
        row_ok = (nan_flags == 0) & (row_max > float("-inf")) & (row_max < float("inf"))
        accepted = acc_greedy & row_ok
    else:
        row_sum = tl.where(rmask, row_sum, 1.0)
        # NaN (a NaN or +inf logit) and 0 (every logit -inf) fail, and on a random row a valid
        # draft's prob q(x) that is negative, NaN or +inf (draft probs: not checked on the host)
        row_ok = (row_sum > 0.0) & (greedy | (x < 0) | ((q_x >= 0.0) & (q_x < float("inf"))))
        p_x = tl.exp(lx - m_safe) / row_sum
        acc_random = valid & (p_x > 0.0) & (p_x >= u * q_x)
        accepted = tl.where(greedy, acc_greedy, acc_random) & row_ok
    # the first rejected row and the first invalid one in one reduction: rows before the first
    # rejection were accepted, so valid, and that row is valid iff the first invalid comes later
    first_rej, first_bad = tl.reduce((tl.where(rmask & (accepted == 0), rr, OUT_BLOCK),
                                      tl.where(rmask & (row_ok == 0), rr, OUT_BLOCK)), 0, _min2)
    rej_ok = first_bad != first_rej
    return tl.minimum(first_rej, n), first_rej < n, first_rej, rej_ok, argmax, m_safe, row_sum


@triton.jit
def _min2(a1, b1, a2, b2):
    return tl.minimum(a1, a2), tl.minimum(b1, b2)


@triton.jit
def _max2(a1, b1, a2, b2):
    return tl.maximum(a1, a2), tl.maximum(b1, b2)


@triton.jit
def _max8_combine(a1, b1, c1, d1, e1, f1, g1, h1, a2, b2, c2, d2, e2, f2, g2, h2):
    return (tl.maximum(a1, a2), tl.maximum(b1, b2), tl.maximum(c1, c2), tl.maximum(d1, d2), tl.maximum(e1, e2),
            tl.maximum(f1, f2), tl.maximum(g1, g2), tl.maximum(h1, h2))


@triton.jit
def _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K: tl.constexpr):
    """Request req's output row [MAX_K + 1]: its accepted drafts, then `token` after a rejection
    or the bonus token, then -1."""
    row = tl.where(rr < num_accepted, x, -1)
    row = tl.where(rr == num_accepted, tl.where(rejected, token, bonus), row)
    tl.store(out_ptr + req.to(tl.int64) * out_stride + rr, row, mask=rr < MAX_K + 1)


@triton.jit(do_not_specialize=["num_target_rows", "engine_seed"])
def _rejection_finalize_kernel(
    out_ptr, out_stride,                      # [num_reqs, MAX_K + 1] int32
    draft_ids_ptr, bonus_ptr, cu_ptr, greedy_ptr,
    seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, engine_seed,
    part_m_ptr, part_s_ptr, part_idx_ptr,     # [T * NUM_SPLITS] from pass 1
    part_sub_ptr, part_kidx_ptr,              # [T * NUM_SUBS] from pass 1 (RACE; part_kidx: FUSE_RACE)
    part_lx_ptr,                              # [T] from pass 1
    part_sx_ptr,                              # [T] from pass 1 (RACE)
    rec_j_ptr, rec_ms_ptr,                    # [num_reqs] int32, [num_reqs, 2] fp32 out (HAS_DRAFT_PROBS)
    logits_ptr, logits_stride, target_rows_ptr, temp_ptr, threshold_ptr,   # as in pass 1
    draft_probs_ptr, draft_probs_stride,      # [T, V] (HAS_DRAFT_PROBS)
    num_target_rows, vocab_size,
    MAX_K: tl.constexpr, NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
    NUM_SUBS: tl.constexpr, OUT_BLOCK: tl.constexpr, SUB_BLOCK: tl.constexpr,
    GREEDY_MODE: tl.constexpr, HAS_SEEDS: tl.constexpr, FUSE_RACE: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,            # q(x) from the draft probs; rejection_recover draws the tokens
    RACE: tl.constexpr,                       # draw recovered tokens here (no draft probs, random rows)
    RACE_BLOCK: tl.constexpr, HAS_TARGET_ROWS: tl.constexpr, TEMP_MODE: tl.constexpr, HAS_THRESHOLD: tl.constexpr,
    PDL: tl.constexpr = False,                # programmatic dependent launch (sampling_common.pdl_wait)
):
    """One program per request, after every chunk partial is written (a separate launch: no
    inter-program ordering to rely on): acceptance, the output row and, with RACE, the
    recovered token; with draft probs, the rejected row and its softmax statistics for
    rejection_recover, which writes the recovered token.

    Everything that is an input (draft ids, keys, uniforms, scales, q(x)) is read before
    pdl_wait, so that after it only pass 1's partials (one round trip) and, for a rejected
    random row, one sub-chunk of its logits are read. Every program waits, requests without
    drafts too: this launch then ends only after pass 1 has, which the recover pass (waiting
    on this launch only) relies on to read what pass 1 wrote."""
    req = tl.program_id(0)
    rr, start, n, rmask, jj, x, too_many = _request_rows(cu_ptr, draft_ids_ptr, req, num_target_rows, vocab_size,
                                                         MAX_K, OUT_BLOCK)
    greedy = _request_greedy(greedy_ptr, req, GREEDY_MODE)
    seeded, seed, position, step = _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req, HAS_SEEDS)
    engine_seed64 = engine_seed.to(tl.int64)
    u = _accept_uniforms(rr, jj, seeded, seed, position, engine_seed64, step)
    rows, inv_t, thr = _draft_rows(target_rows_ptr, temp_ptr, threshold_ptr, req, jj, rmask, greedy, TEMP_MODE,
                                   HAS_THRESHOLD, HAS_TARGET_ROWS)
    bonus = tl.load(bonus_ptr + req).to(tl.int32)
    q_x = tl.full(x.shape, 1.0, tl.float32)
    if HAS_DRAFT_PROBS:
        q_rows = draft_probs_ptr + jj.to(tl.int64) * draft_probs_stride
        q_x = tl.load(q_rows + tl.where(x >= 0, x, 0), mask=rmask, other=1.0).to(tl.float32)
    pdl_wait(PDL)
    pdl_launch(PDL)
    if n > 0:
        lx = tl.load(part_lx_ptr + jj, mask=rmask, other=float("-inf"))
        if RACE:
            # level 1's inputs for every row, in the same round trip as the acceptance partials:
            # log of each sub-chunk's mass m_c + log(s_k) (chunk c = k // SPC), with the sum without
            # the draft token for the sub-chunk holding it
            kk = tl.arange(0, SUB_BLOCK)
            tmask = rmask[:, None] & (kk < NUM_SUBS)[None, :]
            sub_m = tl.load(part_m_ptr + jj[:, None] * NUM_SPLITS + kk[None, :] // (CHUNK // SUB), mask=tmask,
                            other=float("-inf"))
            sub_s = tl.load(part_sub_ptr + jj[:, None] * NUM_SUBS + kk[None, :], mask=tmask, other=0.0)
            sx = tl.load(part_sx_ptr + jj, mask=rmask & (x >= 0), other=0.0)
        else:
            sx = tl.zeros(jj.shape, tl.float32)
        num_accepted, rejected, first_rej, rej_ok, argmax, m_safe, row_sum = _accept_rows(
            part_m_ptr, part_s_ptr, part_idx_ptr, rr, n, rmask, jj, x, lx, q_x, u, greedy,
            NUM_SPLITS, OUT_BLOCK, GREEDY_MODE)
        # more drafts than MAX_K (inconsistent metadata, not checked on the host: no sync): the
        # output is empty (-1), as for an invalid first row
        num_accepted = tl.where(too_many, 0, num_accepted)
        rejected = rejected | too_many
        first_rej = tl.where(too_many, 0, first_rej)
        rej_ok = rej_ok & (too_many == 0)
        # everything the rest needs of the first rejected row, in one reduction: each value a
        # max over the rows, every other row's set to the lowest value
        sel = rr == first_rej
        x_rej, sx_rej, row_rej, inv_t_rej, thr_rej, argmax_rej, m_rej, sum_rej = tl.reduce(
            (tl.where(sel, x, -1), tl.where(sel, sx, -1.0), tl.where(sel, rows, -1),
             tl.where(sel, inv_t, float("-inf")), tl.where(sel, thr, float("-inf")), tl.where(sel, argmax, -1),
             tl.where(sel, m_safe, float("-inf")), tl.where(sel, row_sum, float("-inf"))), 0, _max8_combine)
        recovered = tl.full([], 0, tl.int32)                       # no mass: as torch.argmax
        if HAS_DRAFT_PROBS:
            recovered = tl.full([], -1, tl.int32)                  # -1: rejection_recover writes it
        if RACE:
            # no draft probs: the two-level race of the rejected random row right here (its
            # sub-chunk masses are pass 1's partials), level 2 over the chosen sub-chunk's tokens,
            # or that sub-chunk's winner which pass 1 already found (FUSE_RACE)
            if rejected & (greedy == 0) & rej_ok:
                j_rej = start + first_rej
                x_sub = tl.where(x_rej >= 0, x_rej // SUB, -1)
                s_k, m_k = tl.reduce((tl.where(sel[:, None], sub_s, -1.0),
                                      tl.where(sel[:, None], sub_m, float("-inf"))), 0, _max2)
                s_k = tl.where(kk == x_sub, sx_rej, s_k)
                log_mass = tl.where(s_k > 0.0, m_k + tl.log(tl.where(s_k > 0.0, s_k, 1.0)), float("-inf"))
                seed_j, pos_j = _row_key(seeded, seed, position, engine_seed64, step, first_rej.to(tl.int64), j_rej)
                c, best = _race_chunks(log_mass, kk, seed_j, pos_j)
                if best > float("-inf"):
                    if FUSE_RACE:
                        recovered = tl.load(part_kidx_ptr + j_rej * NUM_SUBS + c)
                    else:
                        recovered = _race_chunk_tokens(logits_ptr + row_rej * logits_stride, c, x_rej, inv_t_rej,
                                                       thr_rej, seed_j, pos_j, vocab_size, SUB, RACE_BLOCK,
                                                       HAS_THRESHOLD)
        token = tl.where(rej_ok, tl.where(greedy, argmax_rej, recovered), -1)   # an invalid row ends the output
        _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K)
        if HAS_DRAFT_PROBS:
            # the one row whose recovered token rejection_recover must draw, and its softmax
            # statistics (-inf without a rejection: not read then); picked by a max, not a sum, so
            # that no float sum's order depends on the launch (num_warps)
            tl.store(rec_j_ptr + req, tl.where(rejected & (greedy == 0) & rej_ok, start + first_rej, -1))
            tl.store(rec_ms_ptr + req * 2, m_rej)
            tl.store(rec_ms_ptr + req * 2 + 1, sum_rej)
