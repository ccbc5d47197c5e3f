"""Plain torch reference of rejection sampling (float64, a loop over requests).

It draws with the same counter-based noise as the Triton kernels (specops.rng), so for
the same inputs it emits the same tokens except on float ties far below test sizes.
It is also the CPU path of ``specops.spec_decode.rejection_sample``.
"""

from __future__ import annotations

import torch

from specops import rng


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
    is_greedy: torch.Tensor | bool = False,    # [num_reqs] bool or one flag for all
    seeds: torch.Tensor | None = None,         # [num_reqs] int64
    has_seed: torch.Tensor | None = None,      # [num_reqs] bool
    positions: torch.Tensor | None = None,     # [num_reqs] int64
    step: torch.Tensor | None = None,          # [] / [1] int64
    engine_seed: int = 0,
) -> torch.Tensor:                             # [num_reqs, max_spec_len + 1] int32
    """Reference of ``specops.spec_decode.rejection_sample``; same arguments and output."""
    device = logits.device
    num_reqs = cu_num_draft_tokens.shape[0]
    vocab = logits.shape[1]
    rows = logits[target_rows.long()] if target_rows is not None else logits
    rows = rows.double()
    out = torch.full((num_reqs, max_spec_len + 1), -1, dtype=torch.int32, device=device)
    if num_reqs == 0:
        return out
    cu = [0] + cu_num_draft_tokens.long().tolist()
    if isinstance(is_greedy, torch.Tensor):
        greedy = is_greedy.bool().tolist()
    else:
        greedy = [bool(is_greedy)] * num_reqs
    row_seeds, row_pos = row_keys_for_drafts(cu_num_draft_tokens, seeds, has_seed, positions, step,
                                             engine_seed)
    u = rng.uniform_open(rng.random_words(row_seeds, row_pos, rng.STREAM_ACCEPT,
                                          torch.zeros_like(row_seeds))[0]).double()
    drafts = draft_token_ids.long().tolist()
    bonus = bonus_token_ids.long().tolist()
    for r in range(num_reqs):
        start, end = cu[r], cu[r + 1]
        if end - start > max_spec_len:
            raise ValueError(f"request {r} has {end - start} drafts, more than max_spec_len={max_spec_len}")
        temp = 1.0 if (temperature is None or greedy[r]) else float(temperature[r])
        emitted = []
        for j in range(start, end):
            x = drafts[j]
            valid = 0 <= x < vocab
            scaled = rows[j] / temp
            if greedy[r]:
                target = int(torch.argmax(rows[j]))
                if valid and x == target:
                    emitted.append(x)
                    continue
                emitted.append(target)
                break
            p = torch.softmax(scaled, dim=0)
            q_x = float(draft_probs[j, x]) if (draft_probs is not None and valid) else 1.0
            p_x = float(p[x]) if valid else 0.0
            if valid and p_x > 0.0 and p_x >= float(u[j]) * q_x:
                emitted.append(x)
                continue
            noise = rng.vocab_noise(row_seeds[j:j + 1], row_pos[j:j + 1], rng.STREAM_RECOVER, vocab)[0].double()
            token = None
            if draft_probs is not None and valid:
                residual = torch.clamp(p - draft_probs[j].double(), min=0.0)
                if float(residual.max()) > 0.0:
                    token = int(torch.argmax(residual / noise))
            if token is None:
                key = scaled - torch.log(noise)
                if valid and draft_probs is None:
                    key[x] = float("-inf")
                token = int(torch.argmax(key))
            emitted.append(token)
            break
        else:
            emitted.append(bonus[r])
        out[r, :len(emitted)] = torch.tensor(emitted, dtype=torch.int32, device=device)
    return out
