"""The plain torch reference of the sampling pipeline (sort-based), also the CPU path.

Every step is written the obvious way, with float64 where masses are summed, so that the
fused GPU path (specops.triton_kernels.sampling_*) can be checked against it token by
token: both draw with the same counter-based noise (specops.rng, STREAM_SAMPLE by
default), so with the same seeds and positions they pick the same tokens except in
float near-ties.

Output of a draw (`SampleResult`): the token of each row (-1 for an invalid row: a NaN or
+inf logit, or every logit -inf) and the processed distribution it was drawn from, in
three numbers per row: `threshold` (tokens with scaled logit x >= threshold are kept;
-inf when nothing is cut), `row_max` (max x) and `log_norm` (log of the kept mass
sum exp(x - row_max)), so that processed logprob(i) = x_i - row_max - log_norm on kept
tokens and -inf elsewhere. Greedy rows report their unscaled logits' softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specops import rng
from specops.ops.penalties import apply_penalties_torch  # noqa: F401  (the penalties' reference, one for both packages)
from specops.sampling.logits_processors.interface import to_device

_NOISE_CHUNK = 1 << 22  # elements of noise generated at once (bounds the reference's memory)


@dataclass
class SampleResult:
    """Tokens and the processed distribution they were drawn from (see module docstring).

    Attributes
    ----------
    tokens : torch.Tensor      [R] int64, -1 for invalid rows
    threshold : torch.Tensor   [R] fp32 (None when the draw was asked for tokens only:
                               `sample(..., distribution=False)`)
    row_max : torch.Tensor     [R] fp32
    log_norm : torch.Tensor    [R] fp32 (None as threshold)
    """

    tokens: torch.Tensor
    threshold: torch.Tensor | None
    row_max: torch.Tensor
    log_norm: torch.Tensor | None


# ---- processing steps (shared by the reference and the fast Sampler) ------------------------

def scale_logits(
    logits: torch.Tensor,           # [R, V] any float
    inv_temperature: torch.Tensor,  # [R] fp32, 1/T on random rows, -1 on greedy rows
) -> torch.Tensor:                  # [R, V] fp32
    """x = logits * (1/T) on random rows; greedy rows unchanged (fp32)."""
    x = logits.float()
    inv = inv_temperature.to(x.device, torch.float32).unsqueeze(1)
    return torch.where(inv > 0, x * inv, x)


def apply_allowed_token_mask_(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Set tokens outside the allowed set to -inf (allowed: [R, V] bool, True = allowed)."""
    if allowed is not None:
        logits.masked_fill_(~allowed, float("-inf"))
    return logits


def banned_bad_word_tokens(bad_words: dict[int, list[list[int]]],
                           history: Sequence[Sequence[int]] | None) -> tuple[list[int], list[int]]:
    """(rows, tokens) to ban: the last token of each bad word whose other tokens end the history."""
    rows: list[int] = []
    toks: list[int] = []
    for row, words in bad_words.items():
        hist = history[row] if history is not None else ()
        for word in words:
            prefix = word[:-1]
            if len(prefix) <= len(hist) and (not prefix or list(hist[len(hist) - len(prefix):]) == list(prefix)):
                rows.append(row)
                toks.append(word[-1])
    return rows, toks


def apply_bad_words_(logits: torch.Tensor, bad_words: dict[int, list[list[int]]],
                     history: Sequence[Sequence[int]] | None) -> torch.Tensor:
    """Ban bad-word completions in place (logits: [R, V])."""
    if bad_words:
        rows, toks = banned_bad_word_tokens(bad_words, history)
        if rows:
            idx = to_device([rows, toks], torch.int64, logits.device)    # [2, n]: no wait on the GPU
            logits[idx[0], idx[1]] = float("-inf")
    return logits


# ---- top-k / top-p / min-p thresholds (sort-based) ------------------------------------------

def row_thresholds_torch(
    x: torch.Tensor,                 # [R, V] fp32, temperature-scaled logits
    top_k: torch.Tensor | None,      # [R] int, 0 = off (values >= V are off too)
    top_p: torch.Tensor | None,      # [R] fp32, 1 = off
    min_p: torch.Tensor | None,      # [R] fp32, 0 = off
) -> torch.Tensor:                   # [R] fp32
    """The smallest kept value of every row (-inf where nothing is cut), by sorting.

    min_p first (x >= max + log(min_p)), then top-k (k-th largest value, ties kept), then
    top-p over what is left (keep x_i when the mass strictly above it is < top_p times the
    mass left; ties at the boundary kept). Masses in float64.
    """
    R, V = x.shape
    dev = x.device
    m = x.max(dim=-1).values
    tau = torch.full((R,), float("-inf"), dtype=torch.float32, device=dev)
    if min_p is not None:
        mp = min_p.to(dev, torch.float32)
        # log(min_p) rounded as the kernels get it; min_p > 1 acts as 1 (the max is always kept)
        tau = torch.where(mp > 0, m + torch.log(mp.clamp(max=1.0)), tau)
    if top_k is None and top_p is None:
        return tau
    sv = torch.sort(x, dim=-1, descending=True).values
    sv = torch.where(sv >= tau.unsqueeze(1), sv, torch.full_like(sv, float("-inf")))
    if top_k is not None:
        k = top_k.to(dev, torch.int64)
        on = (k > 0) & (k < V)
        kth = sv.gather(1, (k.clamp(1, V) - 1).unsqueeze(1)).squeeze(1)
        tau = torch.where(on, torch.maximum(tau, kth), tau)
    if top_p is not None:
        p = top_p.to(dev, torch.float64)
        sv64 = sv.double()
        in_a = (sv >= tau.unsqueeze(1)) & (sv > float("-inf"))
        e = torch.where(in_a, torch.exp(sv64 - m.double().unsqueeze(1)), torch.zeros_like(sv64))
        z_a = e.sum(dim=-1, keepdim=True)
        excl = torch.cumsum(e, dim=-1) - e
        keep = in_a & (excl < p.unsqueeze(1) * z_a)
        n_keep = keep.sum(dim=-1).clamp(min=1)
        tau_p = sv.gather(1, (n_keep - 1).unsqueeze(1)).squeeze(1)
        tau = torch.where(p < 1.0, torch.maximum(tau, tau_p), tau)
    return tau


def top_k_top_p_min_p_mask_torch(x: torch.Tensor, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """[R, V] fp32 scaled logits with every token outside the kept set set to -inf."""
    tau = row_thresholds_torch(x, top_k, top_p, min_p)
    return torch.where(x >= tau.unsqueeze(1), x, torch.full_like(x, float("-inf")))


# ---- the draw --------------------------------------------------------------------------------

def invalid_rows(x: torch.Tensor) -> torch.Tensor:
    """[R] bool: rows with a NaN or +inf logit, or with every logit -inf."""
    return torch.isnan(x).any(dim=-1) | torch.isposinf(x).any(dim=-1) | torch.isneginf(x).all(dim=-1)


def two_level_race(
    mass: torch.Tensor,         # [T, V] float64 >= 0, the distribution to draw from (unnormalised)
    key: torch.Tensor,          # [T, V] float64 per-token race keys: argmax over a set draws from mass
    sub_chunk: int,
    sub_noise: torch.Tensor,    # [T, num_subs] float64 Exp(1), num_subs = ceil(V / sub_chunk)
) -> torch.Tensor:              # [T] int64
    """Token argmax of ``key`` within the sub-chunk argmax_k log(M_k) - log(E_k), M_k = the
    mass of sub-chunk k (tokens [k * sub_chunk, (k + 1) * sub_chunk)).

    The sub-chunk race picks k with probability M_k / sum(M); the token race within k picks
    t with probability mass_t / M_k (``key`` is an exponential race of ``mass``), so t is
    drawn with probability mass_t / sum(M): exactly the one-level race over the row, with
    noise for one sub-chunk only. A row without mass picks sub-chunk 0 (where its keys, all
    -inf, give token 0, as torch.argmax of the one-level race does).
    """
    rows, vocab = mass.shape
    num_subs = sub_noise.shape[1]
    padded = torch.nn.functional.pad(mass, (0, num_subs * sub_chunk - vocab))
    sub_mass = padded.view(rows, num_subs, sub_chunk).sum(dim=2)                      # [T, num_subs]
    best = torch.argmax(torch.log(sub_mass) - torch.log(sub_noise), dim=1)            # [T]
    in_best = torch.arange(vocab, device=mass.device)[None, :] // sub_chunk == best[:, None]
    return torch.argmax(torch.where(in_best, key, float("-inf")), dim=1)


def noise_argmax(
    x: torch.Tensor,          # [R, V] fp32, masked logits (-inf = not kept)
    seeds: torch.Tensor,      # [R] int64
    positions: torch.Tensor,  # [R] int64
    stream: int = rng.STREAM_SAMPLE,
) -> torch.Tensor:            # [R] int64
    """argmax_i exp(x_i - max) / E_i with E the rows' Exp(1) noise (specops.rng)."""
    R, V = x.shape
    out = torch.empty(R, dtype=torch.int64, device=x.device)
    step = max(1, _NOISE_CHUNK // max(V, 1))
    for r0 in range(0, R, step):
        xs = x[r0:r0 + step]
        noise = rng.vocab_noise(seeds[r0:r0 + step], positions[r0:r0 + step], stream, V).to(x.device)
        m = xs.max(dim=-1, keepdim=True).values
        score = torch.exp(xs - m) / noise
        out[r0:r0 + step] = torch.nan_to_num(score, nan=-1.0).argmax(dim=-1)
    return out


def filtered_rows(rows: int, vocab: int, top_k, top_p, min_p, device) -> torch.Tensor:
    """[rows] bool: rows with top-k (0 < k < vocab), top-p (< 1) or min-p (> 0) on."""
    out = torch.zeros(rows, dtype=torch.bool, device=device)
    for t, on in ((top_k, lambda v: (v > 0) & (v < vocab)), (top_p, lambda v: v < 1.0), (min_p, lambda v: v > 0.0)):
        if t is not None:
            out |= on(t.to(device))
    return out


def sub_chunk_draw(
    x: torch.Tensor,          # [R, V] fp32 scaled logits, every token kept
    seeds: torch.Tensor,      # [R] int64
    positions: torch.Tensor,  # [R] int64
    stream: int = rng.STREAM_SAMPLE,
) -> torch.Tensor:            # [R] int64
    """The draw of rows without a filter, as the kernels make it: the sub-chunk of
    draw_sub_chunk(V) tokens by an exponential race of its mass (noise on stream +
    rng.SUB_STREAM), then the token of that sub-chunk by the race of exp(x - max) / E."""
    from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk
    R, V = x.shape
    sub = draw_sub_chunk(V)
    num_subs = -(-V // sub)
    out = torch.empty(R, dtype=torch.int64, device=x.device)
    step = max(1, _NOISE_CHUNK // max(V, 1))
    for r0 in range(0, R, step):
        xs = x[r0:r0 + step].double()
        s, p = seeds[r0:r0 + step], positions[r0:r0 + step]
        mass = torch.exp(xs - xs.max(dim=-1, keepdim=True).values)
        noise = rng.vocab_noise(s, p, stream, V).to(x.device).double()
        sub_noise = rng.vocab_noise(s, p, stream + rng.SUB_STREAM, num_subs).to(x.device).double()
        out[r0:r0 + step] = two_level_race(mass, torch.nan_to_num(mass / noise, nan=-1.0), sub, sub_noise)
    return out


def pivot_draw(
    x: torch.Tensor,                  # [R, V] fp32 scaled logits of valid random rows (pivot_rows)
    top_p: torch.Tensor | None,       # [R] fp32, 1 = off
    seeds: torch.Tensor,              # [R] int64
    positions: torch.Tensor,          # [R] int64
    stream: int = rng.STREAM_SAMPLE,
    min_p: torch.Tensor | None = None,  # [R] fp32, 0 = off
) -> torch.Tensor:                    # [R] int64
    """Top-p and / or min-p (no top-k) by pivot rejection, as
    specops.triton_kernels.sampling_pivot draws it. The kept set: x >= t = max + log(min_p)
    (t = -inf without min-p), then the tokens whose mass strictly above them is below
    top_p * Z_t (Z_t: the mass of x >= t). A row with one of the two filters takes the
    two-level draw of a row without a filter as its first candidate (min-p alone keeps it
    when x >= t, else has none); a row with both starts without one. Round i: a row without
    a candidate takes Z_t, and a candidate whose mass above reaches top_p * Z_t is replaced
    by a draw from the tokens >= t above it (noise on stream + i * PIVOT_STREAM; a row
    without top-p keeps that draw); after PIVOT_ROUNDS rounds, one race over the kept set
    on stream + PIVOT_ROUNDS * PIVOT_STREAM."""
    from specops.triton_kernels.sampling_pivot import PIVOT_ROUNDS
    from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk
    R, V = x.shape
    dev = x.device
    sub = draw_sub_chunk(V)
    num_subs = -(-V // sub)
    p = torch.ones(R, device=dev) if top_p is None else top_p.to(dev, torch.float32)
    mp = torch.zeros(R, device=dev) if min_p is None else min_p.to(dev, torch.float32)
    has_p, has_mp = p < 1.0, mp > 0.0
    m = x.max(dim=-1).values
    # as the kernels round it; min_p > 1 acts as 1
    floor = torch.where(has_mp, m + torch.log(torch.where(has_mp, mp.clamp(max=1.0), 1.0)), float("-inf"))
    xd = x.double()
    w = torch.exp(xd - xd.max(dim=-1, keepdim=True).values)
    eligible_floor = x >= floor.unsqueeze(1)
    tokens = sub_chunk_draw(x, seeds, positions, stream)
    first_x = x.gather(1, tokens.unsqueeze(1)).squeeze(1)
    has_cand = has_p & ~has_mp                      # top-p alone: the first draw is the candidate
    live = ~(has_mp & ~has_p & (first_x >= floor))  # min-p alone: kept when it reaches t, else none
    tokens = torch.where(has_cand | ~live, tokens, torch.full_like(tokens, -1))
    z_t = w.sum(dim=-1)
    for i in range(1, PIVOT_ROUNDS + 1):
        pivot = torch.where(has_cand, x.gather(1, tokens.clamp(min=0).unsqueeze(1)).squeeze(1), float("-inf"))
        mass = torch.where((x > pivot.unsqueeze(1)) & eligible_floor, w, 0.0)
        above = mass.sum(dim=-1)
        z_t = torch.where(live & ~has_cand, above, z_t)
        live &= ~(has_cand & (above < p.double() * z_t))
        if not bool(live.any()):
            return tokens
        keys = live.to(seeds.device)
        s, q = seeds[keys], positions[keys]
        if i < PIVOT_ROUNDS:
            st = stream + i * rng.PIVOT_STREAM
            noise = rng.vocab_noise(s, q, st, V).to(dev).double()
            sub_noise = rng.vocab_noise(s, q, st + rng.SUB_STREAM, num_subs).to(dev).double()
            tokens[live] = two_level_race(mass[live], mass[live] / noise, sub, sub_noise)
            has_cand |= live
            live &= has_p                           # without top-p the draw is kept
        else:
            xl = x[live]
            tau = row_thresholds_torch(xl, None, p[live], mp[live])
            xm = torch.where(xl >= tau.unsqueeze(1), xl, torch.full_like(xl, float("-inf")))
            tokens[live] = noise_argmax(xm, s, q, stream + PIVOT_ROUNDS * rng.PIVOT_STREAM).to(tokens.device)
    return tokens


def pivot_rows(rows: int, vocab: int, top_k, top_p, min_p, device) -> torch.Tensor:
    """[rows] bool: rows with top-p (< 1) or min-p (> 0), and no top-k (0 < k < vocab)."""
    if top_p is None and min_p is None:
        return torch.zeros(rows, dtype=torch.bool, device=device)
    return filtered_rows(rows, vocab, None, top_p, min_p, device) & ~filtered_rows(rows, vocab, top_k, None, None,
                                                                                   device)


def sample_torch(
    logits: torch.Tensor,             # [R, V] fp32/bf16/fp16 processed logits (before temperature)
    inv_temperature: torch.Tensor,    # [R] fp32, 1/T on random rows, -1 on greedy rows
    top_k: torch.Tensor | None,       # [R] int, 0 = off
    top_p: torch.Tensor | None,       # [R] fp32, 1 = off
    min_p: torch.Tensor | None,       # [R] fp32, 0 = off
    seeds: torch.Tensor,              # [R] int64
    positions: torch.Tensor,          # [R] int64
    stream: int = rng.STREAM_SAMPLE,
    distribution: bool = True,
) -> SampleResult:
    """Temperature, min-p, top-k, top-p and the exponential-noise draw; greedy rows take
    the argmax of the unscaled logits. The reference of `specops.sampling.sample`
    (`distribution=False`: rows with top-p and / or min-p and no top-k by `pivot_draw`; threshold and
    log_norm None)."""
    R, V = logits.shape
    x = scale_logits(logits, inv_temperature)
    random = inv_temperature.to(x.device) > 0
    bad = invalid_rows(x)
    xs = torch.where(bad.unsqueeze(1), torch.zeros_like(x), x)  # keep invalid rows from poisoning ops
    tau = row_thresholds_torch(xs, top_k, top_p, min_p)
    tau = torch.where(random, tau, torch.full_like(tau, float("-inf")))
    xm = torch.where(xs >= tau.unsqueeze(1), xs, torch.full_like(xs, float("-inf")))
    tokens = xs.argmax(dim=-1)                                      # greedy rows
    filtered = filtered_rows(R, V, top_k, top_p, min_p, x.device)
    pivoted = random & ~bad & pivot_rows(R, V, top_k, top_p, min_p, x.device) if not distribution else None
    raced = random & filtered        # one race over the kept tokens
    if pivoted is not None:
        raced &= ~pivoted
        if bool(pivoted.any()):
            keys = pivoted.to(seeds.device)
            sel = lambda t: None if t is None else t.to(x.device)[pivoted]  # noqa: E731
            tokens[pivoted] = pivot_draw(xs[pivoted], sel(top_p), seeds[keys], positions[keys], stream,
                                         sel(min_p)).to(tokens.device)
    if bool(raced.any()):
        keys = raced.to(seeds.device)
        tokens[raced] = noise_argmax(xm[raced], seeds[keys], positions[keys], stream).to(tokens.device)
    two_level = random & ~filtered   # the kernels' two-level draw (sub-chunk, then token)
    if bool(two_level.any()):
        keys = two_level.to(seeds.device)
        tokens[two_level] = sub_chunk_draw(xs[two_level], seeds[keys], positions[keys], stream).to(tokens.device)
    m = xs.max(dim=-1).values
    nan = torch.full_like(tau, float("nan"))
    if not distribution:
        return SampleResult(tokens=torch.where(bad, torch.full_like(tokens, -1), tokens), threshold=None,
                            row_max=torch.where(bad, nan, m), log_norm=None)
    log_norm = torch.log(torch.exp(xm.double() - m.double().unsqueeze(1)).sum(dim=-1)).float()
    return SampleResult(
        tokens=torch.where(bad, torch.full_like(tokens, -1), tokens),
        threshold=torch.where(bad, nan, tau), row_max=torch.where(bad, nan, m),
        log_norm=torch.where(bad, nan, log_norm))


def need_distribution(res: SampleResult) -> None:
    """Raise ValueError when `res` holds tokens only (threshold / log_norm None)."""
    if res.threshold is None or res.log_norm is None:
        raise ValueError("this SampleResult holds tokens only (drawn with distribution=False): get the "
                         "distribution from Sampler.target_distribution or sample(..., distribution=True)")


def keep_drawn_tokens(x: torch.Tensor, res: SampleResult, tokens: torch.Tensor) -> SampleResult:
    """`res` (a distribution) with `tokens` ([R] int64, -1 on invalid rows) drawn from it: a row
    whose token lies below its threshold gets the threshold lowered to the token's value and
    log_norm summed again over that wider kept set; other rows are returned bit for bit.

    The tokens-only draw (pivot rejection) and the threshold search decide the top-p boundary
    with sums in different orders, so at a float near-tie the draw may keep a token that the
    threshold leaves out; the distribution reported with it (processed logprobs) then keeps
    that token too instead of giving the drawn token logprob -inf. x: [R, V] fp32 scaled
    logits (scale_logits). No host sync, so every row pays for the check: two [R, V] passes
    (the mask and the logsumexp) besides x. A token outside [0, V) is an invalid row's: its
    row is returned as it is."""
    need_distribution(res)
    V = x.shape[1]
    tok = tokens.clamp(0, V - 1).unsqueeze(1)
    x_tok = x.gather(1, tok).squeeze(1)
    below = (tokens >= 0) & (tokens < V) & (x_tok < res.threshold)   # NaN thresholds (invalid rows) never are
    threshold = torch.where(below, x_tok, res.threshold)
    kept = torch.where(x >= threshold.unsqueeze(1), x - res.row_max.unsqueeze(1), float("-inf"))
    log_norm = torch.where(below, torch.logsumexp(kept, dim=-1), res.log_norm)
    return SampleResult(tokens=tokens, threshold=threshold, row_max=res.row_max, log_norm=log_norm)


def processed_logits_from_result(x: torch.Tensor, res: SampleResult) -> torch.Tensor:
    """[R, V] fp32: scaled logits with tokens below the row threshold set to -inf."""
    need_distribution(res)
    return torch.where(x >= res.threshold.unsqueeze(1), x, torch.full_like(x, float("-inf")))


def target_probs_torch(x: torch.Tensor, res: SampleResult) -> torch.Tensor:
    """[R, V] fp32 probabilities of the processed distribution (zeros on invalid rows)."""
    need_distribution(res)
    p = torch.exp(x - res.row_max.unsqueeze(1) - res.log_norm.unsqueeze(1))
    p = torch.where(x >= res.threshold.unsqueeze(1), p, torch.zeros_like(p))
    return torch.nan_to_num(p, nan=0.0)
