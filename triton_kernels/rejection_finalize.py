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
from specops.triton_kernels.rejection_common import (_INT_MAX, _argmax_lowest, _merge_block_max, _request_greedy,
                                                     _request_keys, _request_span, _row_key, _scaled_block,
                                                     _sub_chunk_log_noise, _token_noise, _valid_draft)


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
def _load_partials(part_m_ptr, part_s_ptr, part_idx_ptr, jj, rmask, NUM_SPLITS: tl.constexpr,
                   TILE: tl.constexpr):
    """Pass 1's chunk partials of the draft rows jj [OUT_BLOCK] as [OUT_BLOCK, TILE] tiles (TILE >=
    NUM_SPLITS): (max, sum exp(x - max), index of the max) of each chunk; -inf / 0 / INT_MAX
    where masked."""
    ss = tl.arange(0, TILE)
    tmask = rmask[:, None] & (ss < NUM_SPLITS)[None, :]
    poff = jj[:, None] * NUM_SPLITS + ss[None, :]
    pm = tl.load(part_m_ptr + poff, mask=tmask, other=float("-inf"))
    ps = tl.load(part_s_ptr + poff, mask=tmask, other=0.0)
    pidx = tl.load(part_idx_ptr + poff, mask=tmask, other=_INT_MAX)
    return pm, ps, pidx


@triton.jit
def _accept_rows(pm, ps, pidx, rr, n, rmask, x, lx, q_x, u, greedy, FIX_SCALE: tl.constexpr,
                 OUT_BLOCK: tl.constexpr, GREEDY_MODE: tl.constexpr):
    """Acceptance of a request's draft rows from pass 1's chunk partials (_load_partials' tiles):
    greedy rows accept x
    == argmax, random ones p(x) >= u q(x) with p(x) = exp(l_x * (1/T) - row max) / row sum.
    An invalid row (a NaN or +inf scaled logit, or none above -inf; on a random row a valid
    draft's prob q(x) < 0, NaN or +inf) accepts nothing: it ends its request's output (the
    caller writes -1 there). Returns (num_accepted, rejected, first_rej, rej_ok: that row is
    valid (False without a rejection), argmax, row max (0 for an all -inf row), row sum); the
    last three [OUT_BLOCK].

    Every reduction over a row's chunks gives the same bits in any order, so none depends on the
    tiles' layout (which may change with OUT_BLOCK: the batch's K): max and min are exact, and
    the row sum adds the chunks' terms s_c * exp(m_c - row max) as integers, in units of
    1 / FIX_SCALE (fixed_sum_scale: each term rounded down by less than one unit, the total
    below 2^62), then converts the total to fp32 once."""
    row_max = tl.max(pm, 1)
    m_safe = tl.where(row_max == float("-inf"), 0.0, row_max)
    argmax = tl.min(tl.where(pm == row_max[:, None], pidx, _INT_MAX), 1)
    valid = x >= 0
    acc_greedy = valid & (x == argmax)
    if GREEDY_MODE == 1:
        # pass 1 stored NaN flags instead of sums; +inf and all -inf show in the max (a NaN max,
        # where a max propagates NaN, fails too)
        nan_flags = tl.sum((ps != ps).to(tl.int32), 1)
        row_ok = (nan_flags == 0) & (row_max > float("-inf")) & (row_max < float("inf"))
        accepted = acc_greedy & row_ok
        row_sum = tl.zeros_like(m_safe)
    else:
        term = ps * tl.exp(pm - m_safe[:, None])                  # in [0, 2 * CHUNK), or NaN / +inf
        bad = ~(term < float("inf"))
        units = tl.where(bad, 0, (term * FIX_SCALE).to(tl.int64))
        total, n_bad = tl.reduce((units, bad.to(tl.int32)), 1, _add2)
        row_sum = tl.where(n_bad > 0, float("nan"), total.to(tl.float32) * (1.0 / FIX_SCALE))
        row_sum = tl.where(rmask, row_sum, 1.0)
        # NaN (a NaN or +inf logit) and 0 (every logit -inf) fail, and on a random row a valid
        # draft's prob q(x) that is negative, NaN or +inf (draft probs: not checked on the host)
        row_ok = (row_sum > 0.0) & (greedy | (x < 0) | ((q_x >= 0.0) & (q_x < float("inf"))))
        p_x = tl.exp(lx - m_safe) / row_sum
        acc_random = valid & (p_x > 0.0) & (p_x >= u * q_x)
        accepted = tl.where(greedy, acc_greedy, acc_random) & row_ok
    # the first rejected row and whether it is valid, in one reduction of one key: an invalid row
    # accepts nothing, so the first rejected row is the first of both; key 2 * row + (invalid),
    # 2 * OUT_BLOCK + 1 without a rejection
    key = tl.min(tl.where(rmask & (accepted == 0), 2 * rr + (row_ok == 0).to(tl.int32), 2 * OUT_BLOCK + 1), 0)
    first_rej = key // 2
    rej_ok = (key % 2) == 0
    return tl.minimum(first_rej, n), first_rej < n, first_rej, rej_ok, argmax, m_safe, row_sum


@triton.jit
def _add2(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _max5_combine(a1, b1, c1, d1, e1, a2, b2, c2, d2, e2):
    return tl.maximum(a1, a2), tl.maximum(b1, b2), tl.maximum(c1, c2), tl.maximum(d1, d2), tl.maximum(e1, e2)


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
    NUM_SUBS: tl.constexpr, OUT_BLOCK: tl.constexpr,
    SUB_BLOCK: tl.constexpr,                  # next_power_of_2(NUM_SUBS) >= NUM_SPLITS: the partials' tiles too
    FIX_SCALE: tl.constexpr,                  # fixed_sum_scale(NUM_SPLITS, CHUNK)
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

    Everything that is an input (draft ids, keys, uniforms, scales, q(x)) is read, and every
    row's level-1 noise computed, before pdl_wait, so that after it only pass 1's partials (one
    round trip) and, for a rejected random row, one sub-chunk of its logits are read. Every
    program waits, requests without drafts too: this launch then ends only after pass 1 has,
    which the recover pass (waiting on this launch only) relies on to read what pass 1 wrote."""
    req = tl.program_id(0)
    rr, start, n, rmask, jj, x, too_many = _request_rows(cu_ptr, draft_ids_ptr, req, num_target_rows, vocab_size,
                                                         MAX_K, OUT_BLOCK)
    greedy = _request_greedy(greedy_ptr, req, GREEDY_MODE)
    seeded, seed, position, step = _request_keys(seeds_ptr, has_seed_ptr, positions_ptr, step_ptr, req, HAS_SEEDS)
    engine_seed64 = engine_seed.to(tl.int64)
    u = _accept_uniforms(rr, jj, seeded, seed, position, engine_seed64, step)
    rows, inv_t, thr = _draft_rows(target_rows_ptr, temp_ptr, threshold_ptr, req, jj, rmask, greedy, TEMP_MODE,
                                   HAS_THRESHOLD, HAS_TARGET_ROWS)
    bonus = _valid_draft(tl.load(bonus_ptr + req), vocab_size)   # -1 outside [0, V), before narrowing
    q_x = tl.full(x.shape, 1.0, tl.float32)
    if HAS_DRAFT_PROBS:
        q_rows = draft_probs_ptr + jj.to(tl.int64) * draft_probs_stride
        q_x = tl.load(q_rows + tl.where(x >= 0, x, 0), mask=rmask, other=1.0).to(tl.float32)
    if RACE:
        # level 1's noise for every row, log E [OUT_BLOCK, SUB_BLOCK] (inputs only: computed while
        # pass 1 still runs), for whichever row is rejected
        kk = tl.arange(0, SUB_BLOCK)
        seed_rows, pos_rows = _row_key(seeded, seed, position, engine_seed64, step, rr.to(tl.int64), jj)
        log_noise = _sub_chunk_log_noise(kk[None, :], (seed_rows + 0 * pos_rows)[:, None], pos_rows[:, None])
    pdl_wait(PDL)
    pdl_launch(PDL)
    if n > 0:
        lx = tl.load(part_lx_ptr + jj, mask=rmask, other=float("-inf"))
        pm, ps, pidx = _load_partials(part_m_ptr, part_s_ptr, part_idx_ptr, jj, rmask, NUM_SPLITS, SUB_BLOCK)
        arrived = ps + pidx.to(tl.float32, bitcast=True) + lx[:, None]
        if RACE:
            # level 1's inputs for every row, in the same round trip as the acceptance partials:
            # log of each sub-chunk's mass m_c + log(s_k) (chunk c = k // SPC), with the sum without
            # the draft token for the sub-chunk holding it
            tmask = rmask[:, None] & (kk < NUM_SUBS)[None, :]
            if SUB == CHUNK:
                sub_m = pm
            else:
                sub_m = tl.load(part_m_ptr + jj[:, None] * NUM_SPLITS + kk[None, :] // (CHUNK // SUB), mask=tmask,
                                other=float("-inf"))
            sub_s = tl.load(part_sub_ptr + jj[:, None] * NUM_SUBS + kk[None, :], mask=tmask, other=0.0)
            sx = tl.load(part_sx_ptr + jj, mask=rmask & (x >= 0), other=0.0)
            arrived = arrived + sub_m + sub_s + sx[:, None]
        else:
            sx = tl.zeros(jj.shape, tl.float32)
        # ptxas sinks each load to its first use, so a load first used after the acceptance's first
        # reduction would be issued only once that reduction is done: one more round trip to L2
        # each. The first use (the row max of pm) takes every value loaded above, through a select
        # that never picks it (vocab_size > 0), so all are issued together.
        pm = tl.where(vocab_size < 0, arrived, pm)
        num_accepted, rejected, first_rej, rej_ok, argmax, m_safe, row_sum = _accept_rows(
            pm, ps, pidx, rr, n, rmask, x, lx, q_x, u, greedy, FIX_SCALE, OUT_BLOCK, GREEDY_MODE)
        # more drafts than MAX_K (inconsistent metadata, not checked on the host: no sync): the
        # output is empty (-1), as for an invalid first row
        num_accepted = tl.where(too_many, 0, num_accepted)
        rejected = rejected | too_many
        first_rej = tl.where(too_many, 0, first_rej)
        rej_ok = rej_ok & (too_many == 0)
        # the first rejected row's inputs (known before the wait: in the layout of the row ids, so
        # the reduction stays inside a warp), in one reduction: each value a max over the rows,
        # every other row's set to the lowest value. Its acceptance results (argmax, row max and
        # sum: one warp each row in the partials' tiles) are used row-wise instead.
        sel = rr == first_rej
        x_rej, sx_rej, row_rej, inv_t_rej, thr_rej = tl.reduce(
            (tl.where(sel, x, -1), tl.where(sel, sx, -1.0), tl.where(sel, rows, -1),
             tl.where(sel, inv_t, float("-inf")), tl.where(sel, thr, float("-inf"))), 0, _max5_combine)
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
                # level 1: the rejected row's race keys log M_k - log E_k computed on the whole tile
                # (-inf on the other rows), then one reduction over the rows (of one value: each is
                # an exchange across warps) and the argmax over the sub-chunks
                s_k = tl.where(sel[:, None], tl.where(kk[None, :] == x_sub, sx_rej, sub_s), -1.0)
                log_mass = tl.where(s_k > 0.0, sub_m + tl.log(tl.where(s_k > 0.0, s_k, 1.0)), float("-inf"))
                best, c = _argmax_lowest(tl.max(log_mass - log_noise, 0), kk, 0)
                seed_j, pos_j = _row_key(seeded, seed, position, engine_seed64, step, first_rej.to(tl.int64), j_rej)
                if best > float("-inf"):
                    if FUSE_RACE:
                        recovered = tl.load(part_kidx_ptr + j_rej * NUM_SUBS + c)
                    else:
                        recovered = _race_chunk_tokens(logits_ptr + row_rej * logits_stride, c, x_rej, inv_t_rej,
                                                       thr_rej, seed_j, pos_j, vocab_size, SUB, RACE_BLOCK,
                                                       HAS_THRESHOLD)
        token = tl.where(rej_ok, tl.where(greedy, argmax, recovered), -1)   # per row; an invalid row ends the output
        _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K)
        if HAS_DRAFT_PROBS:
            # the one row whose recovered token rejection_recover must draw, and its softmax
            # statistics, stored by that row (not written without a rejection: not read then)
            tl.store(rec_j_ptr + req, tl.where(rejected & (greedy == 0) & rej_ok, start + first_rej, -1))
            tl.store(rec_ms_ptr + req * 2 + rr * 0, m_safe, mask=sel)
            tl.store(rec_ms_ptr + req * 2 + 1 + rr * 0, row_sum, mask=sel)
