"""Plain torch reference of rejection sampling (float64, a loop over requests).

It draws with the same counter-based noise as the Triton kernels (specops.rng) and the
same two-level race for recovered tokens (sub-chunks of sub_chunk_size(V) tokens by their
residual mass in float64, the kernels in fp32; then the tokens of one sub-chunk), so for
the same inputs it emits the same tokens except on float near-ties (of two sub-chunk keys,
or two token keys) far below test sizes.
It is also the CPU path of ``specops.spec_decode.rejection_sample``.
"""

from __future__ import annotations

import torch

from specops import rng
from specops.spec_decode.rejection_args import check_rejection_args, check_rejection_values
from specops.sampling.sampler_torch import two_level_race
from specops.triton_kernels.rejection_sample import check_sub_chunk, chunk_size, sub_chunk_size


def row_keys_for_drafts(
    cu_num_draft_tokens: torch.Tensor,  # [num_reqs] int, inclusive cumulative drafts
    seeds: torch.Tensor | None,         # [num_reqs] int64
    has_seed: torch.Tensor | None,      # [num_reqs] bool
    positions: torch.Tensor | None,     # [num_reqs] int64, sequence position of draft 0
    step: torch.Tensor | None,          # [] or [1] int64
    engine_seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-draft-row (seeds, positions) [T] int64, as the kernels derive them.

    Draft i of a seeded request is keyed (seed, positions[r] + i); rows of unseeded
    requests follow specops.rng.row_keys with the draft rows as rows.
    """
    device = cu_num_draft_tokens.device
    num_reqs = cu_num_draft_tokens.shape[0]
    counts = torch.diff(cu_num_draft_tokens.long(), prepend=torch.zeros(1, dtype=torch.long, device=device))
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), counts)
    first = torch.repeat_interleave(cu_num_draft_tokens.long() - counts, counts)
    within = torch.arange(req.shape[0], device=device) - first
    if seeds is None:
        seeds = torch.zeros(num_reqs, dtype=torch.int64, device=device)
        has_seed = torch.zeros(num_reqs, dtype=torch.bool, device=device)
        positions = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    step = torch.zeros((), dtype=torch.int64, device=device) if step is None else step.reshape(())
    return rng.row_keys(seeds.long()[req], has_seed.bool()[req], positions.long()[req] + within,
                        engine_seed, step)


def rejection_sample_torch(
    logits: torch.Tensor,               # [num_logits, V] target logits
    draft_token_ids: torch.Tensor,      # [T] int
    cu_num_draft_tokens: torch.Tensor,  # [num_reqs] int, inclusive cumulative drafts
    max_spec_len: int,
    bonus_token_ids: torch.Tensor,      # [num_reqs] int
    *,
    target_rows: torch.Tensor | None = None,   # [T] int rows of logits (None: logits is [T, V])
    draft_probs: torch.Tensor | None = None,   # [T, V]
    temperature: torch.Tensor | None = None,   # [num_reqs] float
    inv_temperature: torch.Tensor | None = None,  # [T] fp32
    threshold: torch.Tensor | None = None,     # [T] fp32
    is_greedy: torch.Tensor | bool = False,    # [num_reqs] bool or one flag for all
    seeds: torch.Tensor | None = None,         # [num_reqs] int64
    has_seed: torch.Tensor | None = None,      # [num_reqs] bool
    positions: torch.Tensor | None = None,     # [num_reqs] int64
    step: torch.Tensor | None = None,          # [] / [1] int64
    engine_seed: int = 0,
    sub_chunk: int | None = None,              # tokens per sub-chunk of the race (None: sub_chunk_size(V))
) -> torch.Tensor:                             # [num_reqs, max_spec_len + 1] int32
    """Reference of ``specops.spec_decode.rejection_sample``; same arguments and output.

    It checks what rejection_sample checks and, reading them back to the host, the values of
    cu_num_draft_tokens (non-decreasing from >= 0, ending at T, at most max_spec_len drafts a
    request) and target_rows (rows of logits): ValueError otherwise.

    Every draft row is decided independently (accept or the token it would emit on
    rejection; an invalid row, including every row of a random request whose temperature is
    not finite and > 0: -1); a request then emits its rows up to and including its first
    rejection, or all of them and the bonus token.
    """
    engine_seed = check_rejection_args(
        logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, bonus_token_ids, target_rows=target_rows,
        draft_probs=draft_probs, temperature=temperature, inv_temperature=inv_temperature, threshold=threshold,
        is_greedy=is_greedy, seeds=seeds, has_seed=has_seed, positions=positions, step=step, engine_seed=engine_seed)
    check_rejection_values(logits.shape[0], draft_token_ids.shape[0], cu_num_draft_tokens, max_spec_len, target_rows)
    device = logits.device
    num_reqs = cu_num_draft_tokens.shape[0]
    vocab = logits.shape[1]
    out = torch.full((num_reqs, max_spec_len + 1), -1, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return out
    cu = cu_num_draft_tokens.long()
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.long, device=device))
    # a bonus id outside [0, V) is -1 (no token), tested before narrowing as draft ids are
    bonus = torch.where((bonus_token_ids >= 0) & (bonus_token_ids < vocab), bonus_token_ids, -1).to(torch.int32)
    if int(cu[-1]) == 0:    # no drafts at all: every request emits its bonus token
        out[:, 0] = bonus
        return out
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), counts)       # [T]
    within = torch.arange(req.shape[0], device=device) - (cu - counts)[req]           # [T]
    if isinstance(is_greedy, torch.Tensor):
        greedy = is_greedy.bool()[req]
    else:
        greedy = torch.full_like(req, bool(is_greedy), dtype=torch.bool)
    rows = (logits[target_rows.long()] if target_rows is not None else logits).float()   # [T, V]
    inv = torch.ones_like(rows[:, 0])
    if temperature is not None:
        inv = 1.0 / temperature.float()[req]
    elif inv_temperature is not None:
        inv = inv_temperature.float()
    # a random row whose temperature is not finite and > 0 is invalid, as in the kernels: T = 0
    # gives 1/T = inf and T = NaN gives NaN (both invalid once scaled); T < 0 and T = +-inf give
    # 1/T <= 0, made NaN here (the kernels' padding past V turns such a scale into NaN / +inf)
    inv = torch.where(inv > 0, inv, float("nan"))
    inv = torch.where(greedy, torch.ones_like(inv), inv)
    scaled = rows * inv[:, None]                        # fp32, as the kernels and the Sampler scale
    if threshold is not None:
        thr = torch.where(greedy, float("-inf"), threshold.float())
        scaled = torch.where((scaled >= thr[:, None]) | scaled.isnan(), scaled, float("-inf"))
    # an invalid row (a NaN or +inf scaled logit, or none above -inf) ends its request's output
    row_ok = ~(scaled.isnan().any(dim=1) | scaled.isposinf().any(dim=1) | scaled.isneginf().all(dim=1))   # [T]
    scaled = torch.where(row_ok[:, None], scaled, 0.0).double()   # keep invalid rows from poisoning the ops
    rows = torch.where(row_ok[:, None], rows, 0.0)
    p = torch.softmax(scaled, dim=1)

    x = draft_token_ids.long()
    valid = (x >= 0) & (x < vocab)
    xc = torch.where(valid, x, torch.zeros_like(x))[:, None]
    row_seeds, row_pos = row_keys_for_drafts(cu_num_draft_tokens, seeds, has_seed, positions, step,
                                             engine_seed)
    u = rng.uniform_open(rng.random_words(row_seeds, row_pos, rng.STREAM_ACCEPT,
                                          torch.zeros_like(row_seeds))[0]).double()
    p_x = torch.where(valid, p.gather(1, xc)[:, 0], torch.zeros_like(u))
    q_x = draft_probs.double().gather(1, xc)[:, 0] if draft_probs is not None else torch.ones_like(u)
    target_argmax = torch.argmax(rows, dim=1)          # greedy rows: unscaled, unmasked
    # a random row whose valid draft has q(x) < 0, NaN or +inf is invalid too (draft probs are not
    # checked on the host: the kernels find it in their read of q(x))
    row_ok = row_ok & (greedy | ~valid | ((q_x >= 0) & (q_x < float("inf"))))
    accepted = torch.where(greedy, valid & (x == target_argmax), valid & (p_x > 0) & (p_x >= u * q_x)) & row_ok

    # the token each row emits if it is its request's first rejection: a two-level race
    noise = rng.vocab_noise(row_seeds, row_pos, rng.STREAM_RECOVER, vocab).double()   # [T, V] Exp(1)
    sub = sub_chunk_size(vocab) if sub_chunk is None else sub_chunk
    check_sub_chunk(sub, chunk_size(vocab))
    sub_noise = rng.vocab_noise(row_seeds, row_pos, rng.STREAM_RECOVER_CHUNK,
                                (vocab + sub - 1) // sub).double()                   # [T, num_subs]
    # p without a valid draft: the residual of one-hot q, and, with draft probs, the race when
    # max(0, p - q) has no mass (only rounding: q >= p everywhere), where p itself could give
    # back the rejected draft
    drop = torch.zeros_like(p, dtype=torch.bool).scatter(1, xc, valid[:, None])
    plain_key = (scaled - torch.log(noise)).masked_fill(drop, float("-inf"))
    plain_mass = p.masked_fill(drop, 0.0)
    recovered = two_level_race(plain_mass, plain_key, sub, sub_noise)
    if draft_probs is not None:
        residual = torch.clamp(p - draft_probs.double(), min=0.0)
        use_residual = valid & (residual.max(dim=1).values > 0)
        recovered = torch.where(use_residual, two_level_race(residual, residual / noise, sub, sub_noise),
                                recovered)
        # a draft prob < 0, NaN or +inf in the row of a valid draft: its residual is not a
        # distribution, so the row is invalid where it is the first rejection
        q_bad = (draft_probs < 0).any(dim=1) | draft_probs.isnan().any(dim=1) | draft_probs.isposinf().any(dim=1)
        recovered = torch.where(valid & q_bad, -1, recovered)
    emitted = torch.where(accepted, x, torch.where(greedy, target_argmax, recovered))
    emitted = torch.where(row_ok, emitted, -1)

    # a row is emitted when no earlier row of its request was rejected
    rejected = (~accepted).long()
    rejections_before = torch.cumsum(rejected, dim=0) - rejected                        # [T] in the batch
    at_start = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.cumsum(rejected, dim=0)])
    keep = rejections_before == at_start[cu - counts][req]                             # none earlier in req
    out[req[keep], within[keep]] = emitted[keep].to(torch.int32)
    num_rejected = torch.zeros_like(counts).index_add_(0, req, rejected)
    all_accepted = num_rejected == 0
    ids = torch.arange(num_reqs, device=device)
    out[ids[all_accepted], counts[all_accepted]] = bonus[all_accepted]
    return out
