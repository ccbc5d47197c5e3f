"""Top-k / top-p / min-p and the exponential-noise draw.

- The sort-based reference against an independent brute-force target: empirical token
  frequencies over many draws (one call over thousands of rows that share logits and
  differ in position) pass a chi-square test at false-failure probability ~1e-6 per
  case; masked tokens are never drawn; greedy rows equal the argmax.
- The fused Triton passes (interpreter on CPU at small shapes, compiled on CUDA at full
  shapes) against the reference: same thresholds, same tokens (up to float near-ties of
  the noise argmax, which are checked to be ties), every path reached (direct, candidate,
  bisection fallback, tiny candidate capacity, the small top-k path from the top tiles).
- Seeded rows repeat and do not depend on the batch; invalid rows give -1.
"""

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from specops import rng
from specops.sampling import SamplingMetadata, row_thresholds_torch, sample, sample_torch
from specops.sampling.sampler_torch import scale_logits
from specops.triton_kernels import sampling_select as sel
from specops.triton_kernels.sampling_common import pack_key
from specops.triton_kernels.sampling_candidates import _finish_collected, _finish_collected_sized
from specops.triton_kernels.sampling_direct import _tile_bound

CUDA = torch.cuda.is_available()
KERNEL_DEVICE = "cuda" if CUDA else "cpu"     # where tests of single jit helpers launch them (the interpreter on CPU)
Z_1E6 = 4.753  # one-sided standard normal quantile for probability 1e-6
POOLED_ALPHA = 1e-7  # chi2_ok's own test of the tokens expected fewer than 5 times in all


# ---- helpers -------------------------------------------------------------------------------

def fresh_gen() -> torch.Generator:
    """A generator seeded from torch's global RNG (which conftest seeds and prints)."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))


def mixed_params(R: int, V: int, gen: torch.Generator, greedy_frac=0.15, device="cpu"):
    """Per-row parameters: greedy and random rows, each filter on in about half the rows."""
    u = lambda: torch.rand(R, generator=gen)  # noqa: E731
    temp = torch.where(u() < 0.5, 0.5 + u(), torch.ones(R))
    inv = torch.where(u() < greedy_frac, torch.full((R,), -1.0), 1.0 / temp)
    k = torch.where(u() < 0.5, torch.randint(1, max(2, V), (R,), generator=gen), torch.zeros(R, dtype=torch.int64))
    k = torch.where(u() < 0.3, torch.randint(1, 6, (R,), generator=gen), k)
    p = torch.where(u() < 0.5, 0.3 + 0.69 * u(), torch.ones(R))
    mp = torch.where(u() < 0.3, 0.2 * u(), torch.zeros(R))
    seeds = torch.randint(-2**62, 2**62, (R,), generator=gen)
    pos = torch.randint(0, 2**32, (R,), generator=gen)
    return [t.to(device) for t in (inv.float(), k.to(torch.int32), p.float(), mp.float(), seeds, pos)]


def noise_scores(x: torch.Tensor, tau: torch.Tensor, seeds, positions) -> torch.Tensor:
    """exp(x - max) / E on kept tokens, 0 elsewhere ([R, V] fp64, reference noise)."""
    e = rng.vocab_noise(seeds.cpu(), positions.cpu(), rng.STREAM_SAMPLE, x.shape[1]).double()
    x = x.double().cpu()
    s = torch.exp(x - x.max(dim=-1, keepdim=True).values) / e
    return torch.where(x >= tau.double().cpu().unsqueeze(1), s, torch.zeros_like(s))


def sub_chunk_size(V: int) -> int:
    from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk
    return draw_sub_chunk(V)


def sub_chunk_scores(x: torch.Tensor, tau: torch.Tensor, seeds, positions) -> torch.Tensor:
    """M_c / E_c of every sub-chunk of the two-level draw (rows without a filter), M_c the
    kept mass exp(x - max) of sub-chunk c ([R, num_subs] fp64, reference noise)."""
    R, V = x.shape
    sub = sub_chunk_size(V)
    n = -(-V // sub)
    x = x.double().cpu()
    w = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    w = torch.where(x >= tau.double().cpu().unsqueeze(1), w, torch.zeros_like(w))
    mass = torch.nn.functional.pad(w, (0, n * sub - V)).view(R, n, sub).sum(dim=2)
    return mass / rng.vocab_noise(seeds.cpu(), positions.cpu(), rng.STREAM_SAMPLE + rng.SUB_STREAM, n).double()


def assert_same_draw(a, b, logits, inv, seeds, positions, top_p=None, mass_rtol=2e-5, *, top_k=None, min_p=None):
    """Kernel result `a` equals reference `b`.

    Thresholds are equal, or (top-p boundaries, which the kernel decides in fp32 and the
    reference in fp64) keep masses within `mass_rtol` of each other, or differ only by tokens
    whose mass above lies within `mass_rtol` of the top-p target (`top_p_near_tie`: either
    rounding may keep them, however heavy they are); tokens are equal up to
    float near-ties of the draw or tokens in the band between two such thresholds. A
    near-tie is checked by the row's own draw: rows with a filter (top_k / top_p / min_p
    as passed here; None = off) race every kept token, so the kernel's token must score
    within 1e-5 of the reference's; rows without one draw a sub-chunk first, so the two
    tokens are near-tied inside one sub-chunk, or the two sub-chunks are near-tied and the
    kernel's token is the best of its own sub-chunk. Rows without top-p (`top_p` >= 1)
    must have equal thresholds.
    """
    from specops.sampling.sampler_torch import filtered_rows
    bad = torch.isnan(b.threshold)
    assert torch.equal(torch.isnan(a.threshold), bad)
    assert torch.equal(a.tokens[bad], b.tokens[bad]) and bool((b.tokens[bad] == -1).all())
    ok = (~bad).cpu()
    ta, tb = a.threshold.cpu(), b.threshold.cpu()
    torch.testing.assert_close(a.row_max[ok].cpu(), b.row_max[ok].cpu())
    x_all = scale_logits(logits, inv).cpu()
    R, V = x_all.shape
    band = torch.zeros(len(ta), dtype=torch.bool)
    for r in (ok & (ta != tb)).nonzero().flatten().tolist():
        assert top_p is None or float(top_p[r]) < 1.0, f"row {r} without top-p: {ta[r]} vs {tb[r]}"
        x = x_all[r].double()
        w = torch.exp(x - x.max())
        z = w[x > -torch.inf].sum()
        ma, mb = w[x >= ta[r].double()].sum(), w[x >= tb[r].double()].sum()
        if abs(ma - mb) > mass_rtol * z:   # then the tokens between the two must be near-ties of the cut
            k_r = None if top_k is None else int(top_k[r])
            mp_r = None if min_p is None else float(min_p[r])
            lo, hi = sorted((float(ta[r]), float(tb[r])))
            assert top_p_near_tie(x, w, z, lo, hi, float(top_p[r]), k_r, mp_r, mass_rtol), (r, ta[r], tb[r], ma, mb)
        band[r] = True
    close = ok & ~band
    torch.testing.assert_close(a.log_norm.cpu()[close], b.log_norm.cpu()[close], rtol=1e-4, atol=1e-4)
    diff = (a.tokens.cpu() != b.tokens.cpu()).nonzero().flatten()
    near = []
    for r in diff.tolist():
        lo, hi = sorted((float(ta[r]), float(tb[r])))
        xa, xb = float(x_all[r, a.tokens[r]]), float(x_all[r, b.tokens[r]])
        if band[r] and (lo <= xa < hi or lo <= xb < hi):
            continue                     # one of the two tokens is in the disputed boundary band
        near.append(r)
    if near:
        near = torch.tensor(near)
        assert not bool((inv.cpu()[near] <= 0).any()), "greedy rows must agree exactly"
        two_level = ~filtered_rows(R, V, top_k, top_p, min_p, "cpu")[near]
        s = noise_scores(x_all[near], tb[near], seeds.cpu()[near], positions.cpu()[near])
        tok_a, tok_b = a.tokens.cpu()[near].clamp(min=0), b.tokens.cpu()[near].clamp(min=0)
        sa = s.gather(1, tok_a.unsqueeze(1)).squeeze(1)
        sb = s.gather(1, tok_b.unsqueeze(1)).squeeze(1)
        tie = sa >= sb * (1 - 1e-5)                     # one race over the kept tokens
        sub = sub_chunk_size(V)
        n = -(-V // sub)
        best_in_sub = torch.nn.functional.pad(s, (0, n * sub - V)).view(len(near), n, sub).max(dim=2).values
        c = sub_chunk_scores(x_all[near], tb[near], seeds.cpu()[near], positions.cpu()[near])
        sub_a, sub_b = tok_a // sub, tok_b // sub
        ca = c.gather(1, sub_a.unsqueeze(1)).squeeze(1)
        cb = c.gather(1, sub_b.unsqueeze(1)).squeeze(1)
        own_best = best_in_sub.gather(1, sub_a.unsqueeze(1)).squeeze(1)
        tie_two = torch.where(sub_a == sub_b, tie, (ca >= cb * (1 - 1e-5)) & (sa >= own_best * (1 - 1e-5)))
        tie = torch.where(two_level, tie_two, tie)
        assert bool(tie.all()), f"rows {near.tolist()}: kernel {sa} / {ca} vs reference {sb} / {cb}"
    assert len(diff) <= max(1, len(a.tokens) // 50)


def assert_same_tokens_only(a, b, logits, inv, seeds, positions, top_p=None, *, top_k=None, min_p=None, stream=0):
    """Results of `sample(..., distribution=False)` (no thresholds): kernel `a`, reference `b`.

    Rows of top-p and / or min-p without top-k (pivot rejection) have equal tokens, or the
    kernel's is the reference's pivot draw with top_p moved by 1e-5 relative (a float
    near-tie of an acceptance, which the kernel decides in fp32 and the reference in fp64).
    The other rows are the reference's draw with thresholds (b's tokens there, checked) and
    go through `assert_same_draw` against the reference's thresholds.
    """
    from specops.sampling.sampler_torch import SampleResult, pivot_draw, pivot_rows
    assert a.threshold is None and b.threshold is None and a.log_norm is None and b.log_norm is None
    cpu = [None if t is None else t.cpu() for t in (logits, inv, top_k, top_p, min_p, seeds, positions)]
    logits, inv, top_k, top_p, min_p, seeds, positions = cpu
    R, V = logits.shape
    ref = sample_torch(logits, inv, top_k, top_p, min_p, seeds, positions, stream)
    piv = pivot_rows(R, V, top_k, top_p, min_p, "cpu") & (inv > 0) & ~torch.isnan(ref.threshold)
    ta, tb = a.tokens.cpu().clone(), b.tokens.cpu().clone()
    assert torch.equal(tb[~piv], ref.tokens[~piv])
    x = scale_logits(logits, inv)
    for r in (piv & (ta != tb)).nonzero().flatten().tolist():
        one = lambda t: None if t is None else t[r:r + 1]  # noqa: E731
        alts = [int(pivot_draw(x[r:r + 1], top_p[r:r + 1] * f, seeds[r:r + 1], positions[r:r + 1], stream,
                               one(min_p))[0])
                for f in (1 - 1e-5, 1 + 1e-5) if top_p is not None and float(top_p[r]) < 1.0]
        assert int(ta[r]) in alts, f"pivot row {r}: kernel {int(ta[r])}, reference {int(tb[r])} (near-tie draws {alts})"
    tb[piv] = ta[piv]
    full = lambda res, tok: SampleResult(tok, ref.threshold, res.row_max.cpu(), ref.log_norm)  # noqa: E731
    assert_same_draw(full(a, ta), full(b, tb), logits, inv, seeds, positions, top_p, top_k=top_k, min_p=min_p)


def top_p_near_tie(x, w, z, lo, hi, p, k, mp, rtol) -> bool:
    """Do the two thresholds lo < hi of a row (x [V] fp64 scaled logits, w = exp(x - max), z
    their sum) differ only by near-ties of the top-p rule? True when every token in [lo, hi) has
    a mass above it (within the top-k / min-p base) within rtol * z of the target p * base mass:
    fp32 sums (the kernel) and fp64 sums (the reference) may then decide it either way, whatever
    the token's own mass. A cut elsewhere (a real disagreement) leaves a token far from it."""
    V = len(x)
    t1 = float("-inf")
    if k is not None and 0 < k < V:
        t1 = max(t1, float(x.sort(descending=True).values[k - 1]))
    if mp is not None and mp > 0.0:
        t1 = max(t1, float(x.max()) + math.log(mp))
    base = x >= t1
    target = p * w[base].sum()
    disputed = (x >= lo) & (x < hi)
    for v in x[disputed].unique():
        if abs(w[base & (x > v)].sum() - target) > rtol * z:
            return False
    return bool(disputed.any())


def exact_target(logits_row: np.ndarray, inv_t: float, k: int, p: float, mp: float) -> np.ndarray:
    """The truncated distribution by definition (brute force, float64, independent code)."""
    x = (logits_row.astype(np.float32) * np.float32(inv_t)).astype(np.float64)
    V = len(x)
    m = x.max()
    keep = x > -np.inf
    if mp > 0:
        keep &= x >= float(np.float32(m) + np.log(np.float32(mp)))
    if 0 < k < V:
        kth = np.sort(x[keep])[::-1][k - 1] if keep.sum() >= k else -np.inf
        keep &= x >= kth
    if p < 1:
        w = np.where(keep, np.exp(x - m), 0.0)
        za = w.sum()
        above = np.array([w[(x > x[i]) & keep].sum() for i in range(V)])
        keep &= above < p * za
    w = np.where(keep, np.exp(x - m), 0.0)
    return w / w.sum()


def poisson_sf(k: float, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu) (summed from k up; the binomial count it stands for has a
    lighter tail, so a p-value from it is conservative)."""
    k = int(k)
    if k <= 0:
        return 1.0
    term = math.exp(k * math.log(mu) - mu - math.lgamma(k + 1))
    total, j = 0.0, k
    while term > 0 and (j <= mu or term > 1e-18 * total):
        total += term
        j += 1
        term *= mu / j
    return min(1.0, total)


def chi2_ok(counts: np.ndarray, probs: np.ndarray) -> tuple[bool, float, float]:
    """Chi-square goodness of fit, bins with expected < 5 merged; threshold at p ~ 1e-6. Fails
    outright when a token of probability 0 was drawn (the merged bins would hide it).

    When the merged bin expects fewer than 5 draws in all it is not a chi-square cell: a cell
    expecting 0.01 draws scores ~100 for a single draw, which a correct sampler makes in one run
    of a hundred (the llm_like top-k 5 rows often keep such tokens: that case failed a correct
    sampler in ~2.6e-4 of runs, some rows in 3%). It is checked on its own instead, against the
    exact Poisson tail at POOLED_ALPHA (stat inf when that fails), and the chi-square is over
    the other cells (df one less)."""
    n = counts.sum()
    if counts[probs == 0].sum() > 0:     # a token of probability 0 was drawn
        return False, math.inf, 0.0
    exp = probs * n
    big = exp >= 5
    small = ~big & (probs > 0)
    obs_b, exp_b = list(counts[big]), list(exp[big])
    pooled_obs, pooled_exp = float(counts[small].sum()), float(exp[small].sum())
    if pooled_exp >= 5:
        obs_b.append(pooled_obs)
        exp_b.append(pooled_exp)
    pairs = [(o, e) for o, e in zip(obs_b, exp_b) if e > 0]
    stat = sum((o - e) ** 2 / e for o, e in pairs)
    df = max(1, len(pairs) - 1)
    q = df * (1 - 2 / (9 * df) + Z_1E6 * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty
    if 0 < pooled_exp < 5 and poisson_sf(pooled_obs, pooled_exp) < POOLED_ALPHA:
        return False, math.inf, q        # the rare tokens together were drawn far too often
    return stat < q, stat, q


# ---- the reference, statistically ----------------------------------------------------------

DISTRIBUTIONS = {
    "flat": lambda g, V: torch.randn(V, generator=g) * 0.3,
    "peaked": lambda g, V: torch.randn(V, generator=g) * 3.0,
    "llm_like": lambda g, V: torch.randn(V, generator=g) * 1.5 + 8.0 * (torch.rand(V, generator=g) < 0.1),
    "ties": lambda g, V: torch.randint(0, 4, (V,), generator=g).float(),
}
PARAMS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.6, 0.0), (1.0, 0, 1.0, 0.15),
    (0.9, 12, 0.8, 0.02), (1.0, 3, 0.5, 0.3),
]


# top-k alone cuts where the k-th and (k+1)-th tokens both carry mass: distinct values, and on
# the peaked rows a temperature that keeps the gaps at the top small enough (the power guard
# of the test below held on all of 4M simulated rows)
TOP_K_CASES = [("flat", (1.0, 7, 1.0, 0.0)), ("peaked", (2.5, 5, 1.0, 0.0))]
CASES = [(d, PARAMS[(i + j) % len(PARAMS)]) for i, d in enumerate(sorted(DISTRIBUTIONS)) for j in range(0, 6, 2)]
CASES += TOP_K_CASES


@pytest.mark.parametrize("dist,params", CASES)
def test_reference_matches_exact_target(dist, params):
    g = fresh_gen()
    V, N = 32, 16000
    row = DISTRIBUTIONS[dist](g, V)
    temp, k, p, mp = params
    md = SamplingMetadata.from_params([temp] * N, vocab_size=V, top_k=[k] * N, top_p=[p] * N, min_p=[mp] * N,
                                      seeds=[4242] * N, positions=list(range(N)))
    res = sample_torch(row.expand(N, V), md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    target = exact_target(row.numpy(), float(md.inv_temperature[0]), k, p, mp)
    if (dist, params) in TOP_K_CASES:
        # power guard: top-k off by one either way moves >= 40 expected draws onto a masked
        # token (k + 1) or off a kept one (k - 1), which the two checks below catch
        for k_wrong in (k - 1, k + 1):
            wrong = exact_target(row.numpy(), float(md.inv_temperature[0]), k_wrong, p, mp)
            assert 0.5 * np.abs(wrong - target).sum() * N >= 40, f"top-k {k} vs {k_wrong}: too close to tell"
    counts = np.bincount(res.tokens.numpy(), minlength=V)
    assert counts[target == 0].sum() == 0, "a masked token was drawn"
    # a kept token is drawn (a correct sampler misses one it expects >= 30 times w.p. < e^-30)
    assert (counts[target * N >= 30] > 0).all(), "a kept token was never drawn"
    ok, stat, q = chi2_ok(counts, target)
    assert ok, f"chi-square {stat:.1f} >= {q:.1f} ({dist}, {params})"
    # the processed distribution reported with the draw is the target
    x = scale_logits(row.unsqueeze(0), md.inv_temperature[:1])[0].double()
    lp = torch.where(x >= res.threshold[0].double(), x - res.row_max[0] - res.log_norm[0], -torch.inf)
    np.testing.assert_allclose(torch.exp(lp).numpy(), target, atol=1e-5)


def test_reference_two_level_draw_matches_target():
    # rows without a filter draw a sub-chunk by its mass, then a token inside it: over several
    # sub-chunks (V = 600: 128-token sub-chunks, the last one short) the draw is the softmax
    from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk
    g = fresh_gen()
    V, N = 600, 30000
    assert -(-V // draw_sub_chunk(V)) == 5
    row = torch.randn(V, generator=g) * 1.5
    row[550:] += 2.0                                    # the short last sub-chunk holds much of the mass
    md = SamplingMetadata.from_params([0.9] * N, vocab_size=V, seeds=[77] * N, positions=list(range(N)))
    res = sample_torch(row.expand(N, V), md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    target = exact_target(row.numpy(), float(md.inv_temperature[0]), 0, 1.0, 0.0)
    ok, stat, q = chi2_ok(np.bincount(res.tokens.numpy(), minlength=V), target)
    assert ok, f"chi-square {stat:.1f} >= {q:.1f}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_without_a_filter_draw_the_reference_tokens(dtype):
    # many temperature-only rows over several sub-chunks: the kernel's two-level draw gives
    # the reference's very tokens (fixed logits: no near-tie among these rows), in every row
    g = torch.Generator().manual_seed(20261130)
    V, R = (1000, 32) if not CUDA else (151936, 64)
    device = "cuda" if CUDA else "cpu"
    logits = (torch.randn(R, V, generator=g) * 3).to(dtype).to(device)
    inv = (0.5 + torch.rand(R, generator=g)).to(device)
    seeds = torch.randint(0, 2**62, (R,), generator=g).to(device)
    pos = torch.randint(0, 2**32, (R,), generator=g).to(device)
    kw = {} if CUDA else dict(tile=16, num_chunks=2)
    assert -(-V // sub_chunk_size(V)) >= 8
    a = sample(logits, inv, None, None, None, seeds, pos, backend="triton", **kw)
    b = sample(logits, inv, None, None, None, seeds, pos, backend="torch")
    assert torch.equal(a.tokens.cpu(), b.tokens.cpu())
    # and they spread over the sub-chunks (the test would not see a wrong sub-chunk race if
    # every row's mass sat in one)
    assert len(set((b.tokens.cpu() // sub_chunk_size(V)).tolist())) >= 6


def test_top_p_near_tie_accepts_only_cuts_at_the_target():
    # one token whose mass above equals the top-p target up to rounding may be kept by one side
    # and not the other; a threshold one token off elsewhere, or several tokens off, is refused
    x = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64)
    w = torch.exp(x - x.max())
    z = w.sum()
    p = float(w[:3].sum() / z) * (1 + 1e-9)       # the cut lands right at token 3's mass above
    assert top_p_near_tie(x, w, z, 0.5, 1.0, p, None, None, 2e-5)       # token 3 (x = 0.5) disputed
    assert not top_p_near_tie(x, w, z, 0.0, 1.0, p, None, None, 2e-5)   # tokens 3 and 4
    assert not top_p_near_tie(x, w, z, 1.0, 2.0, p, None, None, 2e-5)   # token 2: far from the target
    # the base of top-k 4: the same cut is a near-tie of p * mass(top 4) only
    p4 = float(w[:3].sum() / w[:4].sum())
    assert top_p_near_tie(x, w, z, 0.5, 1.0, p4, 4, None, 2e-5)
    assert not top_p_near_tie(x, w, z, 0.5, 1.0, p4, None, None, 2e-5)


def test_reference_detects_a_wrong_sampler():
    # Guard of the statistical test itself: dropping the top-p boundary token must fail.
    g = fresh_gen()
    V, N = 40, 20000
    target = np.zeros(V)
    while (target > 0).sum() < 2:
        # a row whose max alone holds >= 0.6 of the mass (1.6e-4 of randn rows) keeps one token:
        # nothing to drop (the "wrong" law would be all zeros); draw another row
        row = torch.randn(V, generator=g)
        target = exact_target(row.numpy(), 1.0, 0, 0.6, 0.0)
    wrong = target.copy()
    wrong[np.argmin(np.where(target > 0, target, np.inf))] = 0
    wrong /= wrong.sum()
    draws = np.random.default_rng(0).choice(V, size=N, p=wrong)
    assert not chi2_ok(np.bincount(draws, minlength=V), target)[0]


def test_unseeded_rows_draw_the_target_too():
    g = fresh_gen()
    V, N = 30, 20000
    row = torch.randn(V, generator=g) * 2
    md = SamplingMetadata.from_params([0.8] * N, vocab_size=V, top_p=[0.9] * N, engine_seed=99, step=5)
    res = sample_torch(row.expand(N, V), md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    target = exact_target(row.numpy(), float(md.inv_temperature[0]), 0, 0.9, 0.0)
    assert chi2_ok(np.bincount(res.tokens.numpy(), minlength=V), target)[0]


def test_reference_greedy_rows_take_argmax_and_ignore_filters():
    g = fresh_gen()
    logits = torch.randn(64, 100, generator=g)
    inv = torch.full((64,), -1.0)
    k = torch.full((64,), 3, dtype=torch.int32)
    res = sample_torch(logits, inv, k, torch.full((64,), 0.5), None, torch.arange(64), torch.zeros(64, dtype=torch.int64))
    assert torch.equal(res.tokens, logits.argmax(dim=-1))
    assert bool((res.threshold == -torch.inf).all())


def test_thresholds_keep_ties():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0, 2.0, 0.0]])
    k1 = torch.tensor([1], dtype=torch.int32)
    assert row_thresholds_torch(x, k1, None, None).item() == 3.0  # both 3.0 kept
    k3 = torch.tensor([3], dtype=torch.int32)
    assert row_thresholds_torch(x, k3, None, None).item() == 2.0  # all three 2.0 kept with k=3
    # k on the last of a tie (k - 1 or k + 1 would give another value)
    assert row_thresholds_torch(x, torch.tensor([2], dtype=torch.int32), None, None).item() == 3.0
    assert row_thresholds_torch(x, torch.tensor([6], dtype=torch.int32), None, None).item() == 1.0
    # top-p: the two 3.0 carry 2e^3/(2e^3+3e^2+e+1) ~ 0.62 of the mass; p = 0.5 keeps both
    assert row_thresholds_torch(x, None, torch.tensor([0.5]), None).item() == 3.0
    assert row_thresholds_torch(x, None, torch.tensor([0.7]), None).item() == 2.0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_top_k_keeps_exactly_the_k_largest(backend):
    # distinct values in random order, one row per k = 1 .. V: the kept set is the k largest
    # tokens exactly, not k - 1 or k + 1 (ties, as above, can hide an off-by-one); the Triton
    # passes through the direct top-k path and, with kmax=0, the candidate collect; the token
    # drawn is one of the kept
    V = 16
    device = "cuda" if CUDA else "cpu"
    x = (torch.randperm(V) - 7.5).float().to(device)
    logits = x.expand(V, V)
    k = torch.arange(1, V + 1, dtype=torch.int32, device=device)
    rank = (x.unsqueeze(0) > x.unsqueeze(1)).sum(dim=1)          # tokens above each token
    want = rank.unsqueeze(0) < k.unsqueeze(1)                    # [k, token]
    seeds, pos = torch.randint(0, 2**40, (V,), device=device), torch.arange(V, device=device)
    inv = torch.ones(V, device=device)
    small = {} if CUDA else dict(tile=4, cap=16)
    # (kmax=0: rows up to SPREAD_TOP_K spread; with spread_kmax=0 too: the search)
    for kw in ([{}] if backend == "torch" else [small, small | dict(kmax=0), small | dict(kmax=0, spread_kmax=0)]):
        res = sample(logits, inv, k, None, None, seeds, pos, backend=backend, **kw)
        kept = logits >= res.threshold.unsqueeze(1)
        assert torch.equal(kept, want), (kw, res.threshold.tolist())
        assert bool(want.gather(1, res.tokens.unsqueeze(1)).all()), kw


# ---- the Triton passes against the reference ----------------------------------------------

SMALL_CASES = [  # (V, tile, cap, chunks, guess): every path of pass 2 at a small vocabulary
    (17, 4, 16, 1, True),
    (257, 16, 64, 3, True),
    (257, 32, 16, 2, True),      # cap 16: most filtered rows overflow and take the bisection
    (1000, 32, 128, 4, True),
    (300, 16, 32, 2, False),     # searches start from the max: wrong guesses are retried
    (5000, 64, 64, 3, True),     # several tile groups per pass (the pipelined loops)
]


@pytest.mark.skipif(CUDA, reason="small shapes run under the interpreter; CUDA runs the full shapes")
@pytest.mark.parametrize("V,tile,cap,chunks,guess", SMALL_CASES)
def test_triton_matches_reference_small(V, tile, cap, chunks, guess):
    g = fresh_gen()
    R = 10
    dist = list(DISTRIBUTIONS.values())
    logits = torch.stack([dist[i % len(dist)](g, V) for i in range(R)]) * 2
    inv, k, p, mp, seeds, pos = mixed_params(R, V, g)
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", tile=tile, cap=cap, num_chunks=chunks,
               guess=guess)
    b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_triton_half_precision_strides_and_broadcast_rows():
    g = fresh_gen()
    V, R = 300, 6
    inv, k, p, mp, seeds, pos = mixed_params(R, V, g, greedy_frac=0.2)
    wide = torch.randn(R, V + 13, generator=g) * 2
    cases = [wide[:, :V],                                     # row stride != V
             torch.randn(1, V, generator=g).expand(R, V),     # row stride 0
             (torch.randn(R, V, generator=g) * 3).bfloat16(),
             (torch.randn(R, V, generator=g) * 3).half()]
    for logits in cases:
        a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", tile=16, cap=64, num_chunks=2)
        b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
        assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_triton_ties_and_masked_tokens():
    g = fresh_gen()
    V, R = 200, 6
    logits = torch.randint(0, 5, (R, V), generator=g).float()
    logits[:, ::3] = float("-inf")                      # masked tokens
    logits[5] = float("-inf")
    logits[5, 1] = 2.0                                  # one finite token
    inv = torch.tensor([1.0, 1.0, 0.5, 2.0, 1.0, 1.0])
    k = torch.tensor([1, 7, 0, 30, 0, 4], dtype=torch.int32)
    p = torch.tensor([1.0, 0.9, 0.4, 1.0, 0.999, 0.5])
    mp = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.0])
    seeds, pos = torch.arange(R), torch.arange(R) + 100
    for cap in (16, 256):
        a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", tile=16, cap=cap, num_chunks=3)
        b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
        assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)
        assert bool((logits.gather(1, a.tokens.unsqueeze(1)) > float("-inf")).all())
        assert a.tokens[5].item() == 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_invalid_rows_give_minus_one(backend):
    # on CUDA at a full vocabulary (the compiled kernels' shapes), on CPU at a small one
    device, V = ("cuda", 128256) if CUDA else ("cpu", 50)
    logits = torch.randn(6, V, device=device)
    logits[0, 3] = float("nan")
    logits[1, 7] = float("inf")
    logits[2] = float("-inf")
    logits[3, 9] = float("nan")              # greedy row with a NaN
    inv = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0], device=device)
    k = torch.tensor([0, 5, 0, 0, 5, 0], dtype=torch.int32, device=device)
    kw = dict(tile=16, cap=32) if backend == "triton" and not CUDA else {}
    seeds, pos = torch.arange(6, device=device), torch.zeros(6, dtype=torch.int64, device=device)
    res = sample(logits, inv, k, None, None, seeds, pos, backend=backend, **kw)
    assert res.tokens.tolist()[:4] == [-1, -1, -1, -1]
    assert res.tokens[4] >= 0 and res.tokens[5] == logits[5].argmax()
    assert bool(torch.isnan(res.threshold[:4]).all()) and not bool(torch.isnan(res.threshold[4:]).any())


def _seed_invariance(backend: str, V: int, kw: dict, device: str = "cpu", unfiltered_row: bool = False):
    g = fresh_gen()
    R = 5
    logits = (torch.randn(R, V, generator=g) * 2).to(device)
    inv, k, p, mp, seeds, pos = mixed_params(R, V, g, greedy_frac=0.0, device=device)
    if unfiltered_row:                       # row 2 without a filter: the two-level draw
        k[2], p[2], mp[2] = 0, 1.0, 0.0
    full = sample(logits, inv, k, p, mp, seeds, pos, backend=backend, **kw).tokens
    again = sample(logits, inv, k, p, mp, seeds, pos, backend=backend, **kw).tokens
    assert torch.equal(full, again)
    # row 2 alone, and row 2 moved to the front of different neighbours with other parameters
    alone = sample(logits[2:3], inv[2:3], k[2:3], p[2:3], mp[2:3], seeds[2:3], pos[2:3], backend=backend, **kw).tokens
    order = torch.tensor([2, 0, 4], device=device)
    k2, p2 = k.clone(), p.clone()
    k2[0], p2[4] = 3, 0.5
    moved = sample(logits[order], inv[order], k2[order], p2[order], mp[order], seeds[order], pos[order],
                   backend=backend, **kw).tokens
    assert full[2] == alone[0] == moved[0]


@pytest.mark.timeout(300)      # on CUDA it compiles the kernels' variants: 117 s under 4 workers on the H200
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_seeded_rows_are_batch_invariant(backend):
    for unfiltered_row in (False, True):
        if backend == "triton" and CUDA:
            _seed_invariance(backend, 128256, {}, "cuda", unfiltered_row)
        else:
            _seed_invariance(backend, 300, dict(tile=16, cap=64) if backend == "triton" else {},
                             unfiltered_row=unfiltered_row)


@pytest.mark.timeout(300)
def test_direct_rows_are_the_same_whichever_launch_decides_them(monkeypatch):
    # direct_in="auto": small top-k rows are decided in the plan when the launch has no search
    # (the rows alone), in the collect launch when it has one and at most DEFER_ROWS rows (beside a
    # top-p row), in the plan again above that; direct_in="beside" decides them in a kernel of their
    # own (in line here: `paths` is asked for): every output of those rows is the same bit for bit
    from specops.triton_kernels import sampling_topk_topp as stk

    g = fresh_gen()
    dev = "cuda" if CUDA else "cpu"
    V, kw = (128256, dict(spread_kmax=0)) if CUDA else (1500, dict(tile=16, cap=256, spread_kmax=0))
    monkeypatch.setattr(stk, "DEFER_ROWS", 4)       # the rule, at a small batch
    R = stk.DEFER_ROWS + 4
    logits = torch.randn(R, V, generator=g) * 2
    logits.scatter_add_(1, torch.randint(0, V, (R, 32), generator=g), 6 + 6 * torch.rand(R, 32, generator=g))
    logits = logits.to(dev)
    inv = torch.full((R,), 1 / 0.8, device=dev)
    k = torch.tensor([40, 50] + [0] * (R - 2), dtype=torch.int32, device=dev)
    p = torch.tensor([0.95, 1.0] + [0.9] * (R - 2), device=dev)
    seeds, pos = torch.arange(R, device=dev) + 7, torch.arange(R, device=dev) * 5
    launched = []
    monkeypatch.setattr(stk, "_collect_direct_kernel", _CountingKernel(stk._collect_direct_kernel, "direct", launched))
    monkeypatch.setattr(stk, "_direct_rows_kernel", _CountingKernel(stk._direct_rows_kernel, "rows", launched))

    def run(rows, **opts):
        paths = {}
        res = sample(logits[:rows], inv[:rows], k[:rows], p[:rows], None, seeds[:rows], pos[:rows],
                     backend="triton", paths=paths, **kw, **opts)
        return res, paths["mode"][:2].tolist()

    D = _modes()["DIRECT"]
    alone, mode_alone = run(2, search=False)                 # in the plan, no search launched
    assert launched == []
    beside, mode_beside = run(3)                              # in the collect launch
    assert launched == ["direct"]
    many, mode_many = run(R)                                  # R > DEFER_ROWS: in the plan
    assert launched == ["direct"]
    own, mode_own = run(R, direct_in="beside")                # in _direct_rows_kernel
    assert launched == ["direct", "rows"]
    own_alone, mode_own_alone = run(2, direct_in="beside", search=False)   # the same, without search
    assert launched == ["direct", "rows", "rows"]
    assert mode_alone == mode_beside == mode_many == mode_own == mode_own_alone == [D, D]
    for got in (beside, many, own, own_alone):
        for x, y in zip((alone.tokens, alone.threshold, alone.row_max, alone.log_norm),
                        (got.tokens, got.threshold, got.row_max, got.log_norm)):
            assert torch.equal(x[:2], y[:2])


def test_missing_filters_read_cached_constants():
    from specops.triton_kernels.sampling_topk_topp import _CONSTANT_ROWS, constant_rows

    _CONSTANT_ROWS.clear()
    a = constant_rows(5, 0, torch.int32, torch.device("cpu"))
    b = constant_rows(3, 0, torch.int32, "cpu")
    assert a.dtype == torch.int32 and a.tolist() == [0] * 5 and b.tolist() == [0] * 3
    assert b.data_ptr() == a.data_ptr()                       # one buffer, no new fill
    c = constant_rows(300, float("-inf"), torch.float32, "cpu")
    assert c.shape == (300,) and bool((c == float("-inf")).all())
    assert constant_rows(2, 1.0, torch.float32, "cpu").tolist() == [1.0, 1.0]


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_missing_filters_inside_a_first_graph_capture():
    # a launch without filter tensors whose constants are not cached yet fills its own inside the
    # capture (a cached buffer filled there would hold garbage until the first replay)
    from specops.triton_kernels.sampling_topk_topp import _CONSTANT_ROWS

    g = fresh_gen()
    R, V = 3, 4096
    logits = (torch.randn(R, V, generator=g) * 2).cuda()
    inv = torch.tensor([1.0, 0.5, -1.0], device="cuda")
    seeds, pos = torch.arange(R, device="cuda") + 1, torch.zeros(R, dtype=torch.int64, device="cuda")
    want = sample(logits, inv, None, None, None, seeds, pos, backend="triton")     # compiles
    _CONSTANT_ROWS.clear()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        got = sample(logits, inv, None, None, None, seeds, pos, backend="triton")
    torch.cuda.current_stream().wait_stream(side)
    assert not _CONSTANT_ROWS                                  # nothing cached from inside the capture
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.log_norm, want.log_norm)
    again = sample(logits, inv, None, None, None, seeds, pos, backend="triton")
    assert torch.equal(again.tokens, want.tokens) and _CONSTANT_ROWS


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("R", [10, 130])
def test_cuda_pivot_rounds_beside_the_search_give_the_same_results(R):
    # top-p / min-p rows without top-k (pivot rounds, on their own stream with pivot_beside)
    # and small top-k rows (direct_in="beside": on a stream of their own) beside rows that refine
    # and collect (top_k 500 + top_p), greedy and unfiltered rows: the same results as every
    # launch on one stream, eagerly and from a CUDA graph
    g = fresh_gen()
    V = 128256
    base = torch.randn(R, V, generator=g) * 2
    hot = torch.randint(0, V, (R, 32), generator=g)
    logits = base.scatter_add_(1, hot, 6 + 6 * torch.rand(R, 32, generator=g)).cuda()
    kinds = [(1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.05), (1.0, 500, 0.95, 0.0), (0.0, 0, 1.0, 0.0),
             (0.7, 0, 0.95, 0.02), (1.0, 0, 1.0, 0.0), (0.8, 40, 0.95, 0.0), (1.0, 2000, 0.9, 0.0),
             (1.0, 0, 1e-6, 0.0), (1.0, 10, 0.9, 0.0)]
    rows = [kinds[i % len(kinds)] for i in range(R)]
    # flat rows: top_p 1e-6 rejects the pivot rounds' candidates (the exact fallback), and the
    # top_k 10 rows tie at their max over 32 tiles: more candidates than the direct path sorts
    kind = torch.tensor([i % len(kinds) for i in range(R)])
    flat = (kind == 8) | (kind == 9)
    logits[flat.cuda()] = (torch.randn(int(flat.sum()), V, generator=g) * 0.05).cuda()
    logits[(kind == 9).cuda(), 1000:1000 + 4096] = 5.0
    inv = torch.tensor([1 / t if t > 0 else -1.0 for t, *_ in rows], device="cuda")
    k = torch.tensor([r[1] for r in rows], dtype=torch.int32, device="cuda")
    p = torch.tensor([r[2] for r in rows], device="cuda")
    mp = torch.tensor([r[3] for r in rows], device="cuda")
    seeds, pos = torch.arange(R, device="cuda") + 11, torch.arange(R, device="cuda") * 3

    def call(**opts):
        return sample(logits, inv, k, p, mp, seeds, pos, backend="triton", distribution=False, **opts)
    want = call(pivot_beside=False, direct_in="plan")
    paths = {}   # with paths the side kernels run in line and their fallbacks show as FALLBACK
    call(direct_in="beside", paths=paths)
    fell = paths["mode"].cpu() == int(sel.FALLBACK.value)
    assert bool(fell[kind == 9].all()) and bool(fell[kind == 8].any()), paths["mode"]
    assert bool((paths["planned"].cpu()[kind == 9] == int(sel.DIRECT.value)).all()), paths["planned"]
    # the side streams' fallback rows decided on their own streams (side_finish, the default
    # beside) or by the finish after the join: the same results
    for opts in (dict(pivot_beside=True), dict(direct_in="beside"), dict(direct_in="beside", pivot_beside=False),
                 dict(side_finish=False)):
        assert_same_result(want, call(**opts))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            got = call(**opts)
        torch.cuda.current_stream().wait_stream(side)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert_same_result(want, got)
    ref = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")   # the same law, tokens may differ
    assert bool(((want.tokens >= 0) == (ref.tokens >= 0)).all())
    # with the thresholds (no pivot rounds; the direct rows' stream still runs): the late
    # direct rows' thresholds and log_norm as the finish after the join gives them
    full = [sample(logits, inv, k, p, mp, seeds, pos, backend="triton", **opts)
            for opts in ({}, dict(side_finish=False), dict(direct_in="plan"))]
    assert_same_result(full[0], full[1])
    assert_same_result(full[0], full[2])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_nan_parameters_count_as_off(backend):
    # sample() takes parameter tensors unchecked (SamplingMetadata validates them): a NaN
    # top_p / min_p is off and a NaN 1/T is greedy, alike in pass 1, the plan and the
    # reference, so that no row reads what pass 1 did not write
    g = fresh_gen()
    V = 300
    device = "cuda" if CUDA else "cpu"
    logits = (torch.randn(4, V, generator=g) * 2).to(device)
    nan = float("nan")
    inv = torch.tensor([1.0, 1.0, nan, 0.7], device=device)
    p = torch.tensor([nan, 1.0, 1.0, nan], device=device)
    mp = torch.tensor([0.0, nan, 0.0, nan], device=device)
    k = torch.zeros(4, dtype=torch.int32, device=device)
    seeds, pos = torch.arange(4, device=device) + 5, torch.arange(4, device=device)
    kw = dict(tile=16, cap=64) if backend == "triton" and not CUDA else {}
    a = sample(logits, inv, k, p, mp, seeds, pos, backend=backend, **kw)
    b = sample(logits, torch.tensor([1.0, 1.0, -1.0, 0.7], device=device), None, None, None, seeds, pos,
               backend="torch")
    assert torch.equal(a.tokens.cpu(), b.tokens.cpu()), (a.tokens, b.tokens)


@pytest.mark.parametrize("distribution", [True, False])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_out_of_range_parameters_act_as_documented(backend, distribution):
    # sample() documents how it reads values SamplingMetadata would refuse: min_p > 1 acts as 1
    # (the max's ties: the argmax here) with or without top-k / top-p beside it, and so does
    # top_p <= 0 alone; beside a top-k, top_p <= 0 keeps the top-k set on Triton (the max's ties
    # on torch); top_k <= 0 or >= V, top_p > 1 and min_p < 0 are off. Before min_p was clamped,
    # min_p > 1 gave token 2**31 - 1 on Triton and 0 on torch.
    g = fresh_gen()
    V = 300
    device = "cuda" if CUDA else "cpu"
    logits = (torch.randn(7, V, generator=g) * 2).to(device)
    f = lambda *v: torch.tensor(v, dtype=torch.float32, device=device)   # noqa: E731
    inv = f(1.0, 1.0, 1.0, 1.0, 0.8, 1.0, 1.0)
    k = torch.tensor([0, 5, 0, 7, 0, -5, V + 10], dtype=torch.int32, device=device)
    p = f(1.0, 1.0, 0.5, 0.0, -1.0, 2.0, 1.0)
    mp = f(1.5, 1.5, 1.5, 0.0, 0.0, 0.0, -0.5)
    seeds, pos = torch.arange(7, device=device) + 11, torch.arange(7, device=device) * 3
    kw = dict(tile=16, cap=64) if backend == "triton" and not CUDA else {}
    got = sample(logits, inv, k, p, mp, seeds, pos, backend=backend, distribution=distribution, **kw).tokens.cpu()
    argmax = logits.argmax(1).cpu()
    assert got[[0, 1, 2, 4]].tolist() == argmax[[0, 1, 2, 4]].tolist(), (got, argmax)
    assert int(got[3]) in logits[3].topk(7).indices.tolist(), got
    if backend == "torch":
        assert got[3] == argmax[3], (got, argmax)
    unfiltered = sample(logits[5:], inv[5:], None, None, None, seeds[5:], pos[5:], backend="torch").tokens.cpu()
    assert got[5:].tolist() == unfiltered.tolist(), (got, unfiltered)


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_triton_defaults_and_knob_checks():
    x = torch.randn(2, 17)
    inv = torch.tensor([1.0, -1.0])
    s = torch.tensor([3, 4])
    a = sample(x, inv, None, None, None, s, s, backend="triton", cap=16)      # default tile, no filter
    b = sample(x, inv, None, None, None, s, s, backend="torch")
    assert torch.equal(a.tokens, b.tokens) and bool((a.threshold == -torch.inf).all())
    with pytest.raises(ValueError, match="tile"):
        sample(x, inv, None, None, None, s, s, backend="triton", tile=48)
    with pytest.raises(ValueError, match="cap"):
        sample(x, inv, None, None, None, s, s, backend="triton", cap=8)
    with pytest.raises(ValueError, match="search_group"):
        sample(x, inv, None, None, None, s, s, backend="triton", search_group=3)
    with pytest.raises(ValueError, match="collect_group"):
        sample(x, inv, None, None, None, s, s, backend="triton", collect_group=0)
    with pytest.raises(ValueError, match="refine_min_programs"):
        sample(x, inv, None, None, None, s, s, backend="triton", refine_min_programs=0)
    with pytest.raises(ValueError, match="finish_warps"):
        sample(x, inv, None, None, None, s, s, backend="triton", finish_warps=12)
    with pytest.raises(ValueError, match="finish_maxnreg"):
        sample(x, inv, None, None, None, s, s, backend="triton", finish_maxnreg=-1)
    with pytest.raises(ValueError, match="plan_maxnreg"):
        sample(x, inv, None, None, None, s, s, backend="triton", plan_maxnreg=256)
    # a valid register cap is taken (the interpreter ignores it: that a cap changes no output is
    # test_pass1_block_grouping_changes_nothing's, on CUDA)
    c = sample(x, inv, None, None, None, s, s, backend="triton", cap=16, plan_maxnreg=64)
    assert torch.equal(a.tokens, c.tokens)


def test_argument_checks():
    x = torch.randn(3, 10)
    inv = torch.ones(3)
    s = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(TypeError, match="top_k"):
        sample(x, inv, torch.zeros(3), None, None, s, s)
    with pytest.raises(ValueError, match="inv_temperature"):
        sample(x, torch.ones(4), None, None, None, s, s)
    with pytest.raises(TypeError, match="logits"):
        sample(x.long(), inv, None, None, None, s, s)
    with pytest.raises(TypeError, match=r"seeds must be a tensor of shape \[3\], got None \(required"):
        sample(x, inv)
    with pytest.raises(TypeError, match=r"positions must be a tensor of shape \[3\], got None \(required"):
        sample(x, inv, seeds=s)
    with pytest.raises(TypeError, match="inv_temperature must have dtype"):   # checked before the missing keys
        sample(x, inv.double())
    with pytest.raises(ValueError, match="backend"):
        sample(x, inv, None, None, None, s, s, backend="cuda")
    for backend in ("torch", "triton"):  # an empty batch
        res = sample(x[:0], inv[:0], None, None, None, s[:0], s[:0], backend=backend)
        assert res.tokens.shape == (0,) and res.threshold.shape == (0,)


# ---- CUDA: full shapes ----------------------------------------------------------------------

@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("V,R,dtype", [
    (128256, 1, torch.float32), (128256, 7, torch.float32), (128256, 512, torch.float32),
    (128256, 64, torch.bfloat16), (151936, 33, torch.float32), (262144, 9, torch.float32),
])
def test_cuda_full_shapes_match_reference(V, R, dtype):
    g = fresh_gen()
    base = torch.randn(R, V, generator=g) * 2.5
    hot = torch.rand(R, V, generator=g) < 3e-4
    logits = (base + 10.0 * hot).to(dtype).cuda()                   # an LLM-like distribution
    inv, k, p, mp, seeds, pos = mixed_params(R, V, g, device="cuda")
    k = torch.where(k > 0, (k % 300) + 1, k).to(torch.int32)         # also a few k > ~1000 below
    if R >= 64:
        k[:4] = torch.tensor([2000, 5000, 1, 0], dtype=torch.int32)
        p[4:8] = torch.tensor([0.99, 0.999, 0.5, 0.95])
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton")
    b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)
    for group, compact, floor in ((1, True, None), (2, True, None), (8, True, 1), (8, True, 100), (8, False, None)):
        # refine / collect programs per program, refine parts dealt in turn (to at least `floor`
        # programs, default REFINE_MIN_PROGRAMS; 1: the group alone sizes the launch, at R = 7 28
        # programs; 100: some programs take 3 parts, some 2) or by row: the same partials
        assert_same_result(a, sample(logits, inv, k, p, mp, seeds, pos, backend="triton", search_group=group,
                                     refine_compact=compact, refine_min_programs=floor))
    for slots in (False, True):   # a candidate's slot from a block scan or its own atomic: the same set
        assert_same_result(a, sample(logits, inv, k, p, mp, seeds, pos, backend="triton", atomic_slots=slots,
                                     search_group=8, collect_group=1))


def assert_same_result(a, b):
    """Two SampleResults bit for bit (NaN where NaN)."""
    for name in ("tokens", "threshold", "row_max", "log_norm"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:   # not asked for (distribution=False): absent in both
            assert x is None and y is None, name
            continue
        assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num()), name


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_flat_distribution_fallback_matches_reference():
    g = fresh_gen()
    R, V = 16, 128256
    logits = (torch.randn(R, V, generator=g) * 0.5).cuda()           # top-p keeps most of the vocabulary
    inv, k, p, mp, seeds, pos = mixed_params(R, V, g, greedy_frac=0.0, device="cuda")
    p = torch.full((R,), 0.9, device="cuda")
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton")
    b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("V,dtype", [(128256, torch.float32), (151936, torch.bfloat16)])
def test_cuda_top_k_with_top_p_takes_no_single_program_search(V, dtype):
    # top_k 129 .. 1000 with top-p over dense rows: the k-th value is refined and top-p cut
    # among the collected top-k set; none of these rows needs the single-program search
    from specops.triton_kernels import sampling_select as sel
    rows = [(1.0, kk, pp, 0.0) for kk in (129, 200, 500, 700, 1000) for pp in (0.5, 0.9, 0.95, 0.99)]
    rows += [(0.7, 500, 0.95, 0.01), (1.3, 300, 0.9, 0.0)]
    x, inv, k, p, mp, seeds, pos = _top_k_top_p_rows(V, dtype, rows, device="cuda", scale=2.0)
    paths = {}
    a = sample(x, inv, k, p, mp, seeds, pos, backend="triton", paths=paths)
    b = sample(x, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, x, inv, seeds, pos, p, top_k=k, min_p=mp)
    # a row fits the candidates (cap 1024) when its tokens >= the k-th value do, with room
    # for the rest of that value's sub-bin; bf16 ties at k = 1000 may not (those are exact too)
    xs = scale_logits(x, inv)
    mode = paths["mode"].tolist()
    fits = [int((xs[i] >= xs[i].topk(int(k[i])).values[-1]).sum()) <= 1024 - 32 for i in range(len(rows))]
    assert sum(fits) >= len(rows) - 4, fits
    assert all(mo != int(sel.FALLBACK.value) for mo, f in zip(mode, fits) if f), (mode, fits)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("params", [(0.8, 50, 0.9, 0.0), (1.0, 0, 0.95, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.05)])
def test_cuda_kernel_statistics_full_vocab(params):
    # 16384 draws from one shared row (row stride 0) against the exact target on its support
    g = fresh_gen()
    V, N = 128256, 16384
    row = torch.randn(V, generator=g) * 1.5
    row[torch.randperm(V, generator=g)[:40]] += torch.linspace(6, 12, 40)
    temp, k, p, mp = params
    md = SamplingMetadata.from_params([temp] * N, vocab_size=V, top_k=[k] * N, top_p=[p] * N, min_p=[mp] * N,
                                      seeds=[77] * N, positions=list(range(N)), device="cuda")
    logits = row.cuda().unsqueeze(0).expand(N, V)
    res = sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                 backend="triton")
    x = scale_logits(row.unsqueeze(0).cuda(), md.inv_temperature[:1])[0]
    tau = row_thresholds_torch(x.unsqueeze(0), md.top_k[:1] if md.top_k is not None else None,
                               md.top_p[:1] if md.top_p is not None else None,
                               md.min_p[:1] if md.min_p is not None else None)[0]
    tk = res.threshold[0]
    assert bool((res.threshold == tk).all())
    w_all = torch.exp(x.double() - x.max())
    # the kernel decides the top-p boundary in fp32: its kept mass is the fp64 reference's to 2e-5
    assert abs(w_all[x >= tk].sum() - w_all[x >= tau].sum()) <= 2e-5 * w_all.sum()
    w = torch.where(x >= tk, w_all, torch.zeros_like(w_all))
    probs = (w / w.sum()).cpu().numpy()
    counts = np.bincount(res.tokens.cpu().numpy(), minlength=V)
    assert counts[probs == 0].sum() == 0
    assert chi2_ok(counts, probs)[0]


@pytest.mark.skipif(CUDA, reason="interpreter test")
@pytest.mark.parametrize("V,tile,cap,chunks,guess", [(257, 32, 16, 2, True), (300, 16, 32, 2, False)])
def test_exact_search_alone_matches_reference(V, tile, cap, chunks, guess):
    # select=False: every filtered row takes the single-program exact search (the fallback)
    g = fresh_gen()
    dist = list(DISTRIBUTIONS.values())
    logits = torch.stack([dist[i % len(dist)](g, V) for i in range(10)]) * 2
    inv, k, p, mp, seeds, pos = mixed_params(10, V, g)
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", tile=tile, cap=cap, num_chunks=chunks,
               guess=guess, select=False)
    b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_every_search_path_is_taken_and_exact():
    # LLM-like rows (a few raised tokens over a wide body) and flat rows, with the parameter
    # mixes that reach each path of sampling_select: a direct collect, one or two refine
    # rounds, the draw above a known min-p threshold, and the fallback exact search.
    from specops.triton_kernels import sampling_select as sel
    COLLECT, DONE, FALLBACK, REFINE_COUNT, REFINE_MASS = (
        int(c.value) for c in (sel.COLLECT, sel.DONE, sel.FALLBACK, sel.REFINE_COUNT, sel.REFINE_MASS))
    V = 20000
    mix = [(0.8, 40, 0.95, 0.0), (1.0, 0, 0.9, 0.0), (0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.05),
           (0.6, 20, 0.8, 0.02), (1.0, 3000, 1.0, 0.0), (1.0, 2000, 0.9, 0.0), (2.0, 0, 0.99, 0.0)]
    g = fresh_gen()
    R = 2 * len(mix)
    x = torch.randn(R, V, generator=g)
    x[: len(mix)] *= 2
    hot = torch.randint(0, V, (len(mix), 32), generator=g)
    x[: len(mix)].scatter_add_(1, hot, 6 + 6 * torch.rand(len(mix), 32, generator=g))
    rows = mix + mix
    inv = torch.tensor([1 / t if t > 0 else -1.0 for t, *_ in rows])
    k = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    p = torch.tensor([r[2] for r in rows])
    mp = torch.tensor([r[3] for r in rows])
    seeds, pos = torch.arange(R) + 3, torch.arange(R) * 7
    paths = {}
    a = sample(x, inv, k, p, mp, seeds, pos, backend="triton", paths=paths, kmax=0, spread_kmax=0)   # the search
    b = sample(x, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, x, inv, seeds, pos, p, top_k=k, min_p=mp)
    # several refine / collect programs per program (10 per row: the last group part-full), the
    # refine parts dealt to the launch's programs in turn (compact, the default; here its floor
    # of REFINE_MIN_PROGRAMS gives 160 programs, one part each; with a floor of 1 the group
    # sizes the launch: at group 8 its 32 programs take the 40 or so parts of the refining rows,
    # some two; a floor of 36 raises that to 36) or each row's own
    for group, compact, floor in ((2, True, 1), (8, True, 1), (8, True, 36), (4, False, None), (8, False, None)):
        assert_same_result(a, sample(x, inv, k, p, mp, seeds, pos, backend="triton", kmax=0, spread_kmax=0,
                                     search_group=group, refine_compact=compact, refine_min_programs=floor))
    for slots in (False, True):   # collect slots from a block scan or per-candidate atomics; its own group
        assert_same_result(a, sample(x, inv, k, p, mp, seeds, pos, backend="triton", kmax=0, spread_kmax=0,
                                     search_group=4, collect_group=2, atomic_slots=slots))
    planned = set(paths["planned"].tolist())
    final = paths["mode"].tolist()
    assert {COLLECT, REFINE_COUNT, REFINE_MASS, FALLBACK, DONE} <= planned, planned
    assert final.count(COLLECT) >= 10 and FALLBACK in final, final
    # collected brackets of both kinds: open at the top (hi = +inf: every token from lo up is a
    # candidate, none above hi) and closed (the collect races the tokens above hi)
    his = paths["state"][:, 3][paths["mode"] == COLLECT]
    assert bool(torch.isinf(his).any()) and bool(torch.isfinite(his).any()), his


def test_search_false_skips_the_search_launches_and_stays_exact(monkeypatch):
    # search=False promises that every random row is unfiltered or a direct top-k: the refine
    # and collect kernels are not launched. Rows that keep the promise are decided in the plan
    # (the same draws as search=True); rows that break it (top-p, min-p, top-k > kmax) take the
    # finish's exact single-program search: the reference's draws all the same.
    from specops.triton_kernels import sampling_select as sel
    from specops.triton_kernels import sampling_topk_topp as tk
    DIRECT, DONE, FALLBACK = (int(c.value) for c in (sel.DIRECT, sel.DONE, sel.FALLBACK))
    launched = []
    for name in ("_refine_kernel", "_refine_combine_kernel", "_collect_kernel", "_collect_direct_kernel"):
        kernel = getattr(tk, name)
        monkeypatch.setattr(tk, name, _CountingKernel(kernel, name, launched))
    V = 8000
    device = "cuda" if CUDA else "cpu"
    kw = {} if CUDA else dict(tile=16, cap=256)   # cap >= 2 * 128: a top-k of 129 could be decided directly
    kept = [(0.8, 40, 0.95, 0.0), (0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.6, 20, 0.8, 0.02), (1.0, 128, 1.0, 0.0)]
    broken = [(1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.05), (1.0, 3000, 1.0, 0.0), (1.0, 129, 0.9, 0.0)]
    g = fresh_gen()
    for rows in (kept, kept + broken):
        R = len(rows)
        x = torch.randn(R, V, generator=g) * 2
        x.scatter_add_(1, torch.randint(0, V, (R, 32), generator=g), 6 + 6 * torch.rand(R, 32, generator=g))
        x = x.to(device)
        inv = torch.tensor([1 / t if t > 0 else -1.0 for t, *_ in rows], device=device)
        k = torch.tensor([r[1] for r in rows], dtype=torch.int32, device=device)
        p = torch.tensor([r[2] for r in rows], device=device)
        mp = torch.tensor([r[3] for r in rows], device=device)
        seeds, pos = torch.arange(R, device=device) + 3, torch.arange(R, device=device) * 7
        paths = {}
        a = sample(x, inv, k, p, mp, seeds, pos, backend="triton", paths=paths, search=False, **kw)
        b = sample(x, inv, k, p, mp, seeds, pos, backend="torch")
        assert launched == [], launched
        assert_same_draw(a, b, x, inv, seeds, pos, p, top_k=k, min_p=mp)
        mode = paths["mode"].tolist()
        # the kept rows: greedy / unfiltered DONE, top-k <= 128 DIRECT (FALLBACK only if the
        # direct path cannot decide); every broken row: the finish's exact search
        assert mode[1] == DONE and mode[2] == DONE and {mode[0], mode[3], mode[4]} <= {DIRECT, FALLBACK}, mode
        assert all(m == FALLBACK for m in mode[len(kept):]), mode
        # the kept rows are what the full pipeline gives, bit for bit (batch invariance)
        c = sample(x, inv, k, p, mp, seeds, pos, backend="triton", **kw)
        assert len(launched) == 5, launched
        launched.clear()
        n = len(kept)
        for f in ("tokens", "threshold", "row_max", "log_norm"):
            assert torch.equal(getattr(a, f)[:n], getattr(c, f)[:n]), f


class _CountingKernel:
    """A Triton kernel whose launches are recorded by name."""

    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


def _top_k_top_p_rows(V: int, dtype: torch.dtype, rows: list, device: str = "cpu", scale: float = 1.0,
                      seed: int | None = None):
    """Dense rows (randn * scale: the k-th value's level-1 bin holds many tokens) with the
    given (temperature, top_k, top_p, min_p) per row, and the seeds / positions; `seed`
    fixes the logits (else fresh ones)."""
    g = fresh_gen() if seed is None else torch.Generator().manual_seed(seed)
    x = (torch.randn(len(rows), V, generator=g) * scale).to(dtype).to(device)
    inv = torch.tensor([1 / t for t, *_ in rows], device=device)
    k = torch.tensor([r[1] for r in rows], dtype=torch.int32, device=device)
    p = torch.tensor([r[2] for r in rows], device=device)
    mp = torch.tensor([r[3] for r in rows], device=device)
    seeds = torch.arange(len(rows), device=device) * 11 + 3
    pos = torch.arange(len(rows), device=device) * 7
    return x, inv, k, p, mp, seeds, pos


@pytest.mark.skipif(CUDA, reason="interpreter test")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_with_top_p_refines_the_k_th_value(dtype):
    # top-k (above kmax, at most cap) with top-p whose bracket holds more than cap tokens:
    # the plan refines the k-th value (REFINE_COUNT) instead of taking the single-program
    # search, the collect stores every token from its sub-bin up and the finish cuts top-p.
    # Before this path these rows all took FALLBACK. k = cap + 1 still does.
    from specops.triton_kernels import sampling_select as sel
    M = {n: int(getattr(sel, n).value) for n in ("COLLECT", "REFINE_COUNT", "FALLBACK")}
    cap = 64
    rows = [(1.0, 56, 0.9, 0.0), (0.8, 50, 0.95, 0.0), (1.0, 64, 0.99, 0.0), (1.0, 55, 0.9, 0.001),
            (1.0, 64, 0.5, 0.0), (1.2, 30, 0.97, 0.0), (0.5, 40, 0.8, 0.0), (1.0, 65, 0.9, 0.0)]
    # fixed logits: how many rows need the refine depends on them (half of them with these)
    x, inv, k, p, mp, seeds, pos = _top_k_top_p_rows(20000, dtype, rows, seed=20261130)
    paths = {}
    a = sample(x, inv, k, p, mp, seeds, pos, backend="triton", paths=paths, kmax=0, spread_kmax=0, cap=cap)
    b = sample(x, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, x, inv, seeds, pos, p, top_k=k, min_p=mp)
    planned, final = paths["planned"].tolist(), paths["mode"].tolist()
    assert planned.count(M["REFINE_COUNT"]) >= 3, planned
    # k = cap itself fits unless ties at the k-th value overflow (bf16): either path is exact
    assert all(f == M["COLLECT"] for f, (_, kk, *_) in zip(final, rows) if kk <= cap - 8), final
    assert final[-1] == M["FALLBACK"], final


class _PoisonedTorch:
    """torch, except that `empty` / `empty_like` fill what they return with garbage (NaN,
    huge integers): a kernel that reads a workspace slot or output no kernel wrote then
    gives a different answer (on CUDA the caching allocator hands out stale memory)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def _poison(t):
        if t.dtype.is_floating_point:
            return t.fill_(float("nan"))
        return t.fill_({torch.int16: -12345, torch.int32: 987654321}.get(t.dtype, -(2**62) + 12345))

    def empty(self, *a, **kw):
        return self._poison(torch.empty(*a, **kw))

    def empty_like(self, *a, **kw):
        return self._poison(torch.empty_like(*a, **kw))


def assert_same_with_poisoned_workspaces(monkeypatch, a, *args, **kw):
    """`sample(*args, backend="triton", **kw)` with poisoned workspaces equals `a`, bit for bit."""
    from specops.triton_kernels import sampling_topk_topp
    with monkeypatch.context() as mp:
        mp.setattr(sampling_topk_topp, "torch", _PoisonedTorch())
        b = sample(*args, backend="triton", **kw)
    for x, y in zip((a.tokens, a.threshold, a.row_max, a.log_norm), (b.tokens, b.threshold, b.row_max, b.log_norm)):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


# ---- the small top-k path (rows with 1 <= top_k <= kmax decided from their top tiles) -------

def _modes():
    from specops.triton_kernels import sampling_select as sel
    return {n: int(getattr(sel, n).value) for n in ("DONE", "DRAW", "COLLECT", "REFINE_COUNT", "FALLBACK", "DIRECT")}


def _direct_rows(g: torch.Generator, V: int, kmax: int):
    """Rows and parameters for every case of the direct path.

    Returns (logits [R, V] fp32, (inv_temperature, top_k, top_p, min_p, seeds, positions),
    the planned mode of each row: a mode, a set of allowed modes, or None for any).
    """
    M = _modes()
    D, F = M["DIRECT"], M["FALLBACK"]
    rows, params, want = [], [], []

    def add(x, t, k, p, mp, mode):
        rows.append(x)
        params.append((t, k, p, mp))
        want.append(mode)

    llm = lambda: torch.randn(V, generator=g) * 2 + 8.0 * (torch.rand(V, generator=g) < 0.02)  # noqa: E731
    add(llm(), 0.8, 1, 1.0, 0.0, D)                       # k = 1
    add(llm(), 1.0, kmax, 1.0, 0.0, D)                    # k = kmax
    add(llm(), 1.0, kmax + 1, 1.0, 0.0, {M["COLLECT"], M["REFINE_COUNT"]})   # k just above kmax: the plan
    add(llm(), 0.8, 12, 0.9, 0.02, D)                     # the engine benchmark's mix
    add(llm(), 1.0, kmax, 0.3, 0.0, D)                    # top-p cuts inside the top-k
    add(llm(), 1.0, kmax, 1.0, 0.3, D)                    # min-p cuts inside the top-k
    add(llm(), 1.0, kmax, 0.5, 0.05, D)                   # both
    x = torch.randn(V, generator=g) * 0.5                 # ties at the k-th value: 3 x 5.0, 4 x 4.0 (k = 5)
    hot = torch.randperm(V, generator=g)[:7]
    x[hot[:3]], x[hot[3:]] = 5.0, 4.0
    x[hot[3] ^ 1] = 4.0                                   # one more tie in the same tile as another
    add(x, 1.0, 5, 1.0, 0.0, D)
    add(x.clone(), 1.0, 3, 0.95, 0.0, D)                  # k-th value = the tied max
    add(llm(), -1.0, 3, 0.5, 0.0, M["DONE"])              # greedy rows ignore the filters
    add(llm(), 1.0, 0, 1.0, 0.0, M["DONE"])               # unfiltered
    add(llm(), 1.0, 0, 0.9, 0.0, None)                    # top-p alone: the plan, as before
    x = torch.full((V,), float("-inf"))                   # fewer finite tokens than k: t_k = -inf
    x[torch.randperm(V, generator=g)[:9]] = torch.randn(9, generator=g)
    add(x, 1.0, kmax, 0.8, 0.0, D)
    add(torch.randint(0, 3, (V,), generator=g).float(), 1.0, 2, 1.0, 0.0, F)   # ties over every tile
    x = torch.randn(V, generator=g) * 0.5                 # t_k = 5.0 reached by 2 * kmax - 4 tiles (each
    x[torch.randperm(V // 16, generator=g)[:2 * kmax - 4] * 16 + 3] = 5.0   # one token): more than the topk
    add(x, 1.0, kmax, 0.9, 0.0, D)                        # width of direct_top=True (tiles of 16 tokens)
    logits = torch.stack(rows)
    R = len(rows)
    t = torch.tensor([q[0] for q in params])
    inv = torch.where(t > 0, 1.0 / t, torch.full_like(t, -1.0))
    k = torch.tensor([q[1] for q in params], dtype=torch.int32)
    p = torch.tensor([q[2] for q in params])
    mp = torch.tensor([q[3] for q in params])
    seeds, pos = torch.randint(0, 2**40, (R,), generator=g), torch.randint(0, 2**20, (R,), generator=g)
    return logits, (inv, k, p, mp, seeds, pos), want


@triton.jit
def _tile_bound_kernel(tm_ptr, k_ptr, lo_ptr, n_ptr, NT, NT_P2: tl.constexpr, SLACK: tl.constexpr):
    r = tl.program_id(0)
    t = tl.arange(0, NT_P2)
    tm_r = tl.load(tm_ptr + r * NT + t, mask=t < NT, other=float("-inf"))
    lo, n_sel = _tile_bound(tm_ptr + r * NT, NT, tl.max(tm_r, axis=0), tl.load(k_ptr + r), NT_P2, SLACK=SLACK)
    tl.store(lo_ptr + r, lo)
    tl.store(n_ptr + r, n_sel)


def _tile_bounds(tm: torch.Tensor, k: torch.Tensor, slack: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_tile_bound` of each row of tile maxima tm [R, NT] with its k [R] (int32), one program a
    row, at SLACK `slack`: (lo [R] fp32, n_sel [R] int32)."""
    R, NT = tm.shape
    lo = torch.empty(R, dtype=torch.float32, device=tm.device)
    n_sel = torch.empty(R, dtype=torch.int32, device=tm.device)
    _tile_bound_kernel[(R,)](tm, k, lo, n_sel, NT, NT_P2=1 << (NT - 1).bit_length(), SLACK=slack)
    return lo, n_sel


@triton.jit
def _finish_collected_kernel(cand_ptr, n_ptr, k_ptr, p_ptr, m_ptr, lo_ptr, seed_ptr, out_f, out_i,
                             S: tl.constexpr, SMALL: tl.constexpr, SIZED: tl.constexpr, VALUE_SORT: tl.constexpr):
    # row r: `_finish_collected` of the complete set in cand_ptr[r, :S] (SIZED: the sized one,
    # SMALL .. S keys); out_f[r] = (tau, mass), out_i[r] = (token, ok)
    r = tl.program_id(0)
    zero = tl.full([], 0.0, tl.float32)
    n = tl.load(n_ptr + r)
    k = tl.load(k_ptr + r)
    p = tl.load(p_ptr + r)
    args = (cand_ptr + r * S, n, n * 0, zero, zero - 1.0, zero - 1.0, n * 0 + 2147483647, tl.load(m_ptr + r),
            zero + 1.0, k, p, zero + float("-inf"), tl.load(lo_ptr + r), zero + float("inf"), zero - 1.0, k > 0,
            p < 1.0, tl.load(seed_ptr + r), tl.load(seed_ptr + r) + 7, 0)
    if SIZED:
        ok, tau, tok, mass = _finish_collected_sized(*args, SMALL, S)
    else:
        ok, tau, tok, mass = _finish_collected(*args, S, VALUE_SORT=VALUE_SORT)
    tl.store(out_f + r * 2, tau)
    tl.store(out_f + r * 2 + 1, mass)
    tl.store(out_i + r * 2, tok)
    tl.store(out_i + r * 2 + 1, ok.to(tl.int32))


@triton.jit
def _pack_keys_kernel(x_ptr, idx_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, pack_key(tl.load(x_ptr + i), tl.load(idx_ptr + i)))


def _candidate_sets(ns: list[int], g: torch.Generator, device: str):
    """Candidate sets of ns[r] tokens (randn * 2 values, every other row rounded to quarters:
    ties; distinct shuffled token ids), with top-k / top-p / both / neither cycling over the
    rows. Returns (xs, idxs, packed keys [R, 256] padded with _PAD_KEY, the kernel's row
    arguments n, k, p, m, lo, seed)."""
    R, W = len(ns), 256
    keys = torch.full((R, W), -9187343241974906880, dtype=torch.int64, device=device)     # _PAD_KEY
    xs, idxs, ks, ps, ms, los = [], [], [], [], [], []
    for r, n in enumerate(ns):
        x = torch.randn(n, generator=g) * 2.0
        if r % 2:
            x = (x * 4).round() / 4
        idx = torch.randperm(50000, generator=g)[:n].to(torch.int32)
        _pack_keys_kernel[(1,)](torch.cat([x, torch.zeros(W - n)]).to(device),
                                torch.cat([idx, torch.zeros(W - n, dtype=torch.int32)]).to(device), keys[r], N=W)
        keys[r, n:] = -9187343241974906880
        xs.append(x)
        idxs.append(idx)
        ks.append([0, max(1, n // 3), n][r % 3])
        ps.append([1.0, 0.7, 0.95, 0.3][r % 4])
        ms.append(float(x.max()) + float(torch.rand(1, generator=g)))
        los.append(float(x.min()))
    row_args = [torch.tensor(ns, dtype=torch.int32), torch.tensor(ks, dtype=torch.int32), torch.tensor(ps),
                torch.tensor(ms), torch.tensor(los), torch.randint(0, 2**40, (R,), generator=g)]
    return xs, idxs, keys, [a.to(device) for a in row_args], ks, ps


def _run_finish(keys, row_args, S: int, SMALL: int = 0, SIZED: bool = False, VALUE_SORT: bool = True):
    """The wrapper kernel on keys[:, :S] (padded with _PAD_KEY to S): ((tau, mass) [R, 2],
    (token, ok) [R, 2]) on the CPU."""
    R, device = keys.shape[0], keys.device
    cand = torch.full((R, S), -9187343241974906880, dtype=torch.int64, device=device)
    w = min(S, keys.shape[1])
    cand[:, :w] = keys[:, :w]
    out_f = torch.zeros(R, 2, device=device)
    out_i = torch.zeros(R, 2, dtype=torch.int32, device=device)
    _finish_collected_kernel[(R,)](cand, *row_args, out_f, out_i, S=S, SMALL=SMALL or S, SIZED=SIZED,
                                   VALUE_SORT=VALUE_SORT)
    return out_f.cpu(), out_i.cpu()


def test_finish_sorting_values_alone_changes_nothing():
    # the finish's thresholds and sums need the candidates' values in order, the draw no order:
    # sorting the values alone (32-bit keys) and drawing over the slots gives the same tau,
    # token, kept mass and ok bit for bit as sorting the (value, index) keys, on candidate sets
    # in shuffled slots with ties (rounded values), top-k / top-p / both, at two sort sizes
    g = fresh_gen()
    S, R = 256, 12
    ns = [int(torch.randint(1, S + 1, (1,), generator=g)) for _ in range(R)]
    xs, idxs, keys, row_args, _, _ = _candidate_sets(ns, g, KERNEL_DEVICE)
    out = {(size, vs): _run_finish(keys, row_args, size, VALUE_SORT=vs) for size in (S, 2 * S) for vs in (False, True)}
    for size in (S, 2 * S):
        assert torch.equal(out[size, True][0], out[size, False][0]), size
        assert torch.equal(out[size, True][1], out[size, False][1]), size
    ok = out[S, True][1][:, 1]
    assert ok.sum() >= R // 2, ok
    # the token is a kept candidate of its row
    for r in range(R):
        if ok[r]:
            tok, tau = int(out[S, True][1][r, 0]), float(out[S, True][0][r, 0])
            hit = idxs[r] == tok
            assert hit.any() and float(xs[r][hit][0]) >= tau


def test_finish_sort_size_follows_the_candidate_count():
    # `_finish_collected_sized` sorts SMALL, 2 SMALL, 4 SMALL, ... or CAP keys, the fewest that
    # hold the set: the same tau, token and ok as one sort of CAP keys (the sums may differ in
    # the last bit: another layout), for sets at and around each size, and above CAP
    g = fresh_gen()
    SMALL, CAP = 16, 128
    ns = [5, 16, 17, 30, 32, 33, 50, 64, 65, 100, 128, 129, 200]
    R = len(ns)
    xs, _, keys, row_args, ks, ps = _candidate_sets(ns, g, KERNEL_DEVICE)
    out = {sized: _run_finish(keys, row_args, CAP, SMALL=SMALL, SIZED=sized) for sized in (False, True)}
    assert torch.equal(out[True][1], out[False][1])                      # token, ok
    assert torch.equal(out[True][0][:, 0], out[False][0][:, 0])          # tau
    torch.testing.assert_close(out[True][0][:, 1], out[False][0][:, 1], rtol=1e-6, atol=0)
    # ok on every filtered row whose set fits CAP, except a top-p-alone row whose candidates
    # hold less than p of the row's mass (z = 1 here; m is above their max): the top-p
    # threshold lies outside the set. No filter (tau -inf < lo) or too many, not ok
    ms = row_args[3].cpu().double()
    mass = [float(torch.exp(xs[r].double() - ms[r]).sum()) for r in range(R)]
    expect = [(ks[r] > 0 or ps[r] < 1.0) and ns[r] <= CAP and (ks[r] > 0 or mass[r] >= ps[r]) for r in range(R)]
    near = [ks[r] == 0 and abs(mass[r] - ps[r]) < 1e-4 for r in range(R)]      # fp32 sums may go either way
    ok = out[True][1][:, 1].tolist()
    assert [o for o, n in zip(ok, near) if not n] == [int(e) for e, n in zip(expect, near) if not n]


def test_tile_bound_is_a_lower_bound_and_skips_only_rounds_it_needs_not():
    device = KERNEL_DEVICE      # a jit helper alone: CUDA when present, else the interpreter
    # the counted lower bound of t_k (the k-th largest tile max) of the small top-k path, with
    # its second round only while more than k + 16 tiles reach the first round's bound, against
    # both rounds always (SLACK -1), the first round alone (SLACK 2**30) and the sorted tile
    # maxima: lo <= t_k, n_sel = tiles >= lo >= k, never above the two-round bound, equal to it
    # whenever it leaves more than k + 16 tiles or the first round did, else the first round's;
    # fewer than k finite tiles: lo = -inf, every finite tile
    g = fresh_gen()
    NT = 300
    peaked = torch.randn(NT, generator=g) * 0.5
    peaked[torch.randperm(NT, generator=g)[:40]] += 4.0 + 4.0 * torch.rand(40, generator=g)
    ties = torch.randint(0, 4, (NT,), generator=g).float()
    sparse = torch.full((NT,), float("-inf"))
    sparse[torch.randperm(NT, generator=g)[:30]] = torch.randn(30, generator=g)
    outlier = torch.randn(NT, generator=g)          # one far tile: the first round's probes are coarse
    outlier[int(torch.randint(0, NT, (1,), generator=g))] = 60.0
    rows, ks = [], []
    for base in (torch.randn(NT, generator=g), peaked, ties, sparse, torch.randn(NT, generator=g) * 1e-3, outlier):
        for k in (1, 5, 20, 40, 64, 128):
            rows.append(base)
            ks.append(k)
    tm = torch.stack(rows).to(device)
    k = torch.tensor(ks, dtype=torch.int32, device=device)
    lo, n_sel = (v.cpu() for v in _tile_bounds(tm, k, 16))
    lo2, n_sel2 = (v.cpu() for v in _tile_bounds(tm, k, -1))
    tm, k = tm.cpu(), k.cpu().long()
    n_fin = (tm > float("-inf")).sum(1)
    t_k = tm.sort(1, descending=True).values.gather(1, (k - 1).clamp(max=NT - 1)[:, None])[:, 0]
    enough = n_fin >= k
    assert not enough.all() and enough.any()
    reach = (tm >= torch.maximum(lo, torch.tensor(-3.4028234663852886e38))[:, None]).sum(1)
    assert torch.equal(n_sel.long(), reach)
    assert torch.equal(lo[~enough], torch.full_like(lo[~enough], float("-inf")))
    assert torch.equal(n_sel[~enough].long(), n_fin[~enough])
    assert (lo[enough] <= t_k[enough]).all() and (n_sel[enough].long() >= k[enough]).all()
    assert (lo <= lo2).all() and (n_sel >= n_sel2).all()
    wide = enough & (n_sel.long() > k + 16)
    assert torch.equal(lo[wide], lo2[wide]) and torch.equal(n_sel[wide], n_sel2[wide])
    assert (enough & (lo < lo2)).any(), "no row stopped after one round: the test lost its point"
    # the rows whose first round alone leaves more than k + 16 tiles took the second round
    lo1, n_sel1 = (v.cpu() for v in _tile_bounds(tm.to(device), k.int().to(device), 1 << 30))
    needs = enough & (n_sel1.long() > k + 16)
    assert needs.any(), "no row needed its second round: the test lost its point"
    assert torch.equal(lo[needs], lo2[needs]) and torch.equal(n_sel[needs], n_sel2[needs])
    assert torch.equal(lo[enough & ~needs], lo1[enough & ~needs])


@pytest.mark.skipif(CUDA, reason="interpreter test")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_top_k_path_is_taken_and_exact(dtype, monkeypatch):
    g = fresh_gen()
    V, kmax = 1500, 12
    # "planned": the plan's own decisions (k = kmax + 1: the search, not the spread)
    kw = dict(tile=16, cap=64, num_chunks=3, kmax=kmax, direct_in="plan", spread_kmax=0)
    logits, args, want = _direct_rows(g, V, kmax)
    logits = logits.to(dtype)
    inv, k, p, mp, seeds, pos = args
    paths = {}
    a = sample(logits, *args, backend="triton", paths=paths, **kw)
    b = sample(logits, *args, backend="torch")
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)
    assert_same_with_poisoned_workspaces(monkeypatch, a, logits, *args, **kw)   # no unwritten slot is read
    planned, mode = paths["planned"].tolist(), paths["mode"].tolist()
    M = _modes()
    D = M["DIRECT"]
    for r, w in enumerate(want):
        if w in (D, M["DONE"]):
            assert planned[r] == mode[r] == w, (r, planned[r], mode[r], w)
        elif w is not None:
            assert planned[r] in (w if isinstance(w, set) else {w}), (r, planned[r], w)
        if w != D:
            assert mode[r] != D, r
    # the same rows through the plan, refine, collect and finish (no direct path)
    c = sample(logits, *args, backend="triton", kmax=0, spread_kmax=0,
               **{n: v for n, v in kw.items() if n not in ("kmax", "spread_kmax")})
    d = torch.tensor([w == D for w in want])
    assert torch.equal(a.tokens[d], c.tokens[d])
    assert torch.equal(a.threshold[d], c.threshold[d])
    assert torch.equal(a.row_max, c.row_max)
    torch.testing.assert_close(a.log_norm[d], c.log_norm[d], rtol=1e-6, atol=1e-6)
    # greedy and unfiltered rows, and rows the direct path left, are unchanged
    assert torch.equal(a.tokens[~d], c.tokens[~d]) and torch.equal(a.threshold[~d], c.threshold[~d])


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_direct_top_k_candidate_overflow_falls_back():
    # cap 16 < the tokens of the top tiles: the direct path gives the row to the exact search
    g = fresh_gen()
    V = 600
    logits = torch.randn(4, V, generator=g) * 0.3
    inv = torch.ones(4)
    k = torch.tensor([20, 20, 1, 40], dtype=torch.int32)
    p = torch.tensor([1.0, 0.7, 1.0, 0.9])
    mp = torch.tensor([0.0, 0.0, 0.0, 0.01])
    seeds, pos = torch.arange(4) + 11, torch.arange(4)
    paths = {}
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", tile=16, cap=16, num_chunks=2, kmax=64,
               paths=paths)
    b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)
    M = _modes()
    assert paths["mode"].tolist() == [M["FALLBACK"], M["FALLBACK"], M["DIRECT"], M["FALLBACK"]]
    # the direct rows' own kernel, leaving them to a finish launch after it (side_finish: on
    # CUDA both on the direct rows' stream; in line here): the same results, the rows DIRECT_LATE
    late_paths = {}
    late = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", tile=16, cap=16, num_chunks=2, kmax=64,
                  direct_in="beside", side_finish=True, paths=late_paths)
    assert_same_result(a, late)
    DL = int(sel.DIRECT_LATE.value)
    assert late_paths["mode"].tolist() == [DL, DL, M["DIRECT"], DL]


# the latency knobs of the direct path (bench/exp_plan_direct.py times them): the same candidate
# set, sums and draw by construction ...
DIRECT_VARIANTS = [
    dict(direct_top=True),
    dict(direct_top=True, direct_group=4),
    dict(direct_group=4, direct_pipe=True),
    dict(direct_pipe=False),                  # the default reads the listed tiles pipelined
    dict(direct_in="collect"),
    dict(direct_in="collect", direct_top=True, direct_group=8),
    dict(direct_in="collect", atomic_slots=True),
    dict(direct_in="spread"),
    dict(direct_in="spread", direct_top=True),
    dict(direct_in="beside"),
    dict(direct_in="beside", direct_top=True, direct_group=8),
]
# ... and over another thread layout on a GPU (the interpreter's sums do not see it)
LAYOUT_VARIANTS = [dict(plan_warps=4), dict(direct_small=16), dict(direct_top=True, direct_small=16)]


def _assert_same_results(a, b, pa, pb):
    for x, y in zip((a.tokens, a.threshold, a.row_max, a.log_norm), (b.tokens, b.threshold, b.row_max, b.log_norm)):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(pa["mode"], pb["mode"])


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_direct_top_k_variants_match_default():
    # every latency knob of the direct path gives the default's tokens, thresholds, log_norm and paths,
    # bit for bit: ties at t_k (within and beyond the topk width), fallbacks, k at the tile count
    g = fresh_gen()
    V, kmax = 1500, 12
    kw = dict(tile=16, cap=64, num_chunks=3, kmax=kmax)
    logits, args, want = _direct_rows(g, V, kmax)
    # V = 200: 13 tiles (NT_P2 16); k around the tile count (k > 13: t_k = -inf, every finite token)
    x = torch.randn(5, 200, generator=g) * 2
    k2 = torch.tensor([1, 12, 13, 14, 16], dtype=torch.int32)
    args2 = (torch.ones(5), k2, torch.tensor([1.0, 0.9, 0.8, 1.0, 0.5]), torch.tensor([0.0, 0.0, 0.05, 0.0, 0.0]),
             torch.arange(5) + 3, torch.arange(5))
    kw2 = dict(tile=16, cap=256, num_chunks=2, kmax=16)
    for lg, ar, k in ((logits, args, kw), (x, args2, kw2)):
        pa = {}
        a = sample(lg, *ar, backend="triton", paths=pa, **k)
        if lg is x:
            assert pa["mode"].tolist() == [_modes()["DIRECT"]] * 5, pa["mode"].tolist()
        for var in DIRECT_VARIANTS + LAYOUT_VARIANTS:
            pb = {}
            b = sample(lg, *ar, backend="triton", paths=pb, **k, **var)
            _assert_same_results(a, b, pa, pb)


def _spread_case(device: str, dtype: torch.dtype):
    """Rows for the spread path: (logits, args, kw, which rows spread, the tie row's index, the
    search rows). Interpreter: V 4000, tiles of 16, kmax 12, spread_kmax 100; CUDA: the defaults."""
    g = fresh_gen()
    V, kmax, skmax = (128256, 128, 512) if device == "cuda" else (4000, 12, 100)
    kw = {} if device == "cuda" else dict(tile=16, cap=256, num_chunks=3, kmax=kmax, spread_kmax=skmax)
    rows = [(1.0, kmax + 1, 0.9, 0.0), (0.8, (kmax + skmax) // 2, 1.0, 0.0), (1.0, skmax, 0.95, 0.02),
            (1.0, skmax + 1, 0.9, 0.0), (1.2, kmax + 7, 0.5, 0.0), (0.0, skmax, 0.9, 0.0), (1.0, 0, 0.9, 0.0),
            (1.0, 0, 1.0, 0.0), (1.0, kmax + 2, 0.8, 0.0)]
    x = torch.randn(len(rows), V, generator=g) * 2
    x.scatter_add_(1, torch.randint(0, V, (len(rows), 64), generator=g), 5 + 5 * torch.rand(len(rows), 64, generator=g))
    x[[3, 6]] = torch.randn(2, V, generator=g) * 0.3   # flat search rows: brackets the refine narrows
    # the top value in more than 2 * spread_kmax tiles (interpreter: the plan's FALLBACK) or
    # more than the 1024 candidates the finish sorts (CUDA: 1002 tiles): the fallback
    tie = len(rows) - 1
    x[tie] = torch.randn(V, generator=g) * 0.5
    x[tie, torch.randperm(V // 16, generator=g)[:2 * skmax + 8] * 16 + 5] = 5.0
    inv = torch.tensor([1 / t if t > 0 else -1.0 for t, *_ in rows])
    k = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    p = torch.tensor([r[2] for r in rows])
    mp = torch.tensor([r[3] for r in rows])
    seeds, pos = torch.arange(len(rows)) * 13 + 1, torch.arange(len(rows)) * 3
    args = tuple(t.to(device) for t in (inv, k, p, mp, seeds, pos))
    spread = torch.tensor([t > 0 and kmax < kk <= skmax for t, kk, *_ in rows])
    spread[tie] = False
    search = torch.tensor([t > 0 and (kk > skmax or (kk == 0 and pp < 1.0)) for t, kk, pp, _ in rows])
    return x.to(dtype).to(device), args, kw, spread, tie, search


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if CUDA else [torch.float32])
@pytest.mark.timeout(600)
def test_spread_rows_match_the_search_and_the_reference(dtype, monkeypatch):
    # rows with kmax < top_k <= spread_kmax: the plan lists their top tiles, the collect launch
    # reads them, the finish sorts the candidates; the same tokens and thresholds as the search
    # (spread_kmax=0), the reference's draw; a tie over too many tiles falls back; refine=False
    # (no refine launch) keeps rows that needed the refine exact through the fallback
    from specops.triton_kernels import sampling_select as sel
    dev = "cuda" if CUDA else "cpu"
    x, args, kw, spread, tie, search = _spread_case(dev, dtype)
    SPREAD, FALLBACK, DIRECT = int(sel.SPREAD.value), int(sel.FALLBACK.value), int(sel.DIRECT.value)
    inv, k, p, mp, seeds, pos = args
    paths = {}
    a = sample(x, *args, backend="triton", paths=paths, **kw)
    assert_same_draw(a, sample(x, *args, backend="torch"), x, inv, seeds, pos, p, top_k=k, min_p=mp)
    planned, mode = paths["planned"].cpu(), paths["mode"].cpu()
    assert bool((planned[spread] == SPREAD).all()) and bool((mode[spread] == DIRECT).all()), (planned, mode)
    assert int(planned[tie]) in (SPREAD, FALLBACK) and int(mode[tie]) == FALLBACK, (planned, mode)
    assert not bool((planned[search] == SPREAD).any()), planned
    b = sample(x, *args, backend="triton", **(kw | dict(spread_kmax=0)))    # the search
    for name in ("tokens", "threshold", "row_max"):     # bit for bit, NaN where NaN (not NaN against 0.0)
        u, v = getattr(a, name), getattr(b, name)
        assert torch.equal(u.isnan(), v.isnan()) and torch.equal(u.nan_to_num(), v.nan_to_num()), name
    torch.testing.assert_close(a.log_norm, b.log_norm, rtol=1e-6, atol=1e-6, equal_nan=True)
    pr = {}
    c = sample(x, *args, backend="triton", paths=pr, refine=False, **kw)
    assert torch.equal(a.tokens, c.tokens) and torch.equal(a.threshold.isnan(), c.threshold.isnan())
    assert torch.equal(a.threshold.nan_to_num(), c.threshold.nan_to_num())
    torch.testing.assert_close(a.log_norm, c.log_norm, rtol=1e-6, atol=1e-6, equal_nan=True)
    refines = (planned == int(sel.REFINE_COUNT.value)) | (planned == int(sel.REFINE_MASS.value))
    assert bool((pr["mode"].cpu()[refines] == FALLBACK).all()), (planned, pr["mode"])   # no refine: the fallback
    if not CUDA:
        assert bool(refines.any()), planned
        assert_same_with_poisoned_workspaces(monkeypatch, a, x, *args, **kw)    # no unwritten slot is read


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.timeout(400)      # one compilation per variant: 205 s for nine on the H200 with 6 workers
def test_cuda_direct_top_k_variants_match_default():
    g = fresh_gen()
    R, V = 48, 128256
    logits = (torch.randn(R, V, generator=g) * 2.5 + 10.0 * (torch.rand(R, V, generator=g) < 3e-4)).cuda()
    logits[-1] = torch.randint(0, 3, (V,), generator=g).float().cuda()       # ties over every tile: fallback
    inv = torch.full((R,), 1 / 0.8, device="cuda")
    k = (torch.arange(R, device="cuda", dtype=torch.int32) * 7) % 140 + 1    # 1 .. 134: direct and plan rows
    p = torch.full((R,), 0.9, device="cuda")
    mp = torch.full((R,), 0.02, device="cuda")
    seeds, pos = torch.arange(R, device="cuda") + 5, torch.arange(R, device="cuda") * 3
    pa = {}
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", paths=pa)
    # one variant of each knob (the interpreter test runs them all): tile top, spread, pipelined
    # wide groups, unpipelined reads, another plan layout
    for var in [dict(direct_top=True, direct_group=128), dict(direct_in="spread"),
                dict(direct_group=64, direct_pipe=True), dict(direct_pipe=False), dict(plan_warps=4),
                dict(direct_in="beside")]:
        pb = {}
        b = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", paths=pb, **var)
        # tokens and paths bitwise; a variant's sums may run in another order on a GPU, so its
        # float outputs may differ by an ulp (seen on the H200: 7 of 48 rows, 1.2e-7 at most)
        assert torch.equal(a.tokens, b.tokens), var
        assert torch.equal(pa["mode"], pb["mode"]), var
        for x, y in zip((a.threshold, a.row_max, a.log_norm), (b.threshold, b.row_max, b.log_norm)):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6, equal_nan=True, msg=lambda m: f"{var}: {m}")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_direct_top_k_matches_plan_and_reference(dtype, monkeypatch):
    # the engine benchmark's rows (T 0.8, top-k 50, top-p 0.9, min-p 0.02) and k = 1 / 128 / 129
    g = fresh_gen()
    R, V = 64, 128256
    base = torch.randn(R, V, generator=g) * 2.5
    hot = torch.rand(R, V, generator=g) < 3e-4
    logits = (base + 10.0 * hot).to(dtype).cuda()
    inv = torch.full((R,), 1 / 0.8, device="cuda")
    k = torch.full((R,), 50, dtype=torch.int32, device="cuda")
    k[:3] = torch.tensor([1, 128, 129], dtype=torch.int32)
    p = torch.full((R,), 0.9, device="cuda")
    mp = torch.full((R,), 0.02, device="cuda")
    seeds, pos = torch.arange(R, device="cuda") + 5, torch.arange(R, device="cuda") * 3
    paths = {}
    a = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", paths=paths)
    b = sample(logits, inv, k, p, mp, seeds, pos, backend="torch")
    c = sample(logits, inv, k, p, mp, seeds, pos, backend="triton", kmax=0, spread_kmax=0)
    assert_same_draw(a, b, logits, inv, seeds, pos, p, top_k=k, min_p=mp)
    assert_same_with_poisoned_workspaces(monkeypatch, a, logits, inv, k, p, mp, seeds, pos)
    d = (paths["mode"] == _modes()["DIRECT"]).cpu()
    # k = 129 (above kmax): a spread row, which the finish decides as DIRECT
    assert bool(d[:3].all()) and int(d.sum()) >= R - 4, paths["mode"].tolist()
    assert torch.equal(a.tokens.cpu()[d], c.tokens.cpu()[d])
    assert torch.equal(a.threshold.cpu()[d], c.threshold.cpu()[d])
    torch.testing.assert_close(a.log_norm.cpu()[d], c.log_norm.cpu()[d], rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not CUDA, reason="GPU code generation (fma contraction per kernel variant): the interpreter rounds "
                    "as torch")
@pytest.mark.timeout(300)      # one compilation per kernel variant
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_a_rows_distribution_does_not_depend_on_its_batch(dtype):
    # a row's token and processed distribution (threshold, row max, log normaliser), bit for bit,
    # whether its batch leaves the search launches out (SEARCH False: no filter tensor, or
    # search=False) or has neighbours that need them (rows 2 and 3): the plan and finish kernels
    # compile in another variant, and a float expression contracted into an fma in one variant
    # only would change the last bits of a seeded row's numbers. (The plan, select and finish
    # kernels compile with contraction: this checks today's code generation, not a guarantee.)
    V = 128256
    g = torch.Generator(device="cuda").manual_seed(7)
    logits = (torch.randn(4, V, device="cuda", generator=g) * 3).to(dtype)
    inv = 1.0 / torch.tensor([0.7, 1.3, 1.0, 0.9], device="cuda")
    seeds, pos = torch.arange(4, device="cuda") + 11, torch.full((4,), 5, dtype=torch.int64, device="cuda")
    k = torch.tensor([0, 20, 1000, 0], dtype=torch.int32, device="cuda")    # row 0 unfiltered, row 1 direct top-k
    p = torch.tensor([1.0, 1.0, 0.9, 0.8], device="cuda")
    mp = torch.tensor([0.0, 0.0, 0.0, 0.05], device="cuda")
    full = sample(logits, inv, k, p, mp, seeds, pos, backend="triton")
    cases = [(0, {}), (1, {"top_k": k[1:2]}), (1, {"top_k": k[1:2], "top_p": p[1:2], "search": False})]
    for row, kw in cases:
        one = slice(row, row + 1)
        alone = sample(logits[one], inv[one], seeds=seeds[one], positions=pos[one], backend="triton", **kw)
        for name in ("tokens", "threshold", "row_max", "log_norm"):
            assert torch.equal(getattr(full, name)[one], getattr(alone, name)), (row, sorted(kw), name)


@pytest.mark.timeout(300)      # one compilation per pass-1 variant and register cap
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pass1_block_grouping_changes_nothing(dtype, monkeypatch):
    # pass 1 groups its blocks into programs by the launch's size (one block each, or several
    # with the next one prefetched): each block is reduced alone, in one layout and without fma
    # contraction, so every output is bit for bit the same however they are grouped; likewise
    # for the register caps of the plan and the collect launch (set by the batch's size); rows
    # of every path, a NaN row and an all -inf row included
    from specops.triton_kernels import sampling_select, sampling_topk_topp
    device, V, kw = ("cuda", 128256, {}) if CUDA else ("cpu", 3001, dict(tile=16, num_chunks=7))
    R = 12
    g = torch.Generator(device=device).manual_seed(11)
    logits = torch.randn(R, V, device=device, generator=g) * 2
    logits[:, :V:97] += 6.0
    logits[4, 5] = float("nan")
    logits[5] = float("-inf")
    logits = logits.to(dtype)
    inv = 1.0 / torch.tensor([0.8, 0.7, 1.0, 1.0, 1.0, 1.0, 0.6, 1.0, 1.3, 1.0, 0.9, 1.0], device=device)
    inv[3] = -1.0                                       # greedy
    k = torch.tensor([40, 50, 0, 0, 0, 0, 20, 500, 0, 0, 3, 0], dtype=torch.int32, device=device)
    p = torch.tensor([0.95, 1.0, 0.9, 1.0, 0.9, 1.0, 0.8, 0.95, 1.0, 0.5, 1.0, 1.0], device=device)
    mp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.02, 0.0, 0.05, 0.0, 0.0, 0.0], device=device)
    seeds, pos = torch.arange(R, device=device) + 100, torch.arange(R, device=device) * 3
    paths = {}
    runs = [sample(logits, inv, k, p, mp, seeds, pos, backend="triton", blocks_per_program=bpp, paths=paths, **kw)
            for bpp in (1, 2, 3, 4)]
    assert runs[0].tokens[4] == -1 and runs[0].tokens[5] == -1 and (runs[0].tokens[:4] >= 0).all()
    assert (paths["mode"] == int(sampling_select.COLLECT.value)).any()   # the collect launch ran
    for regs in ({"plan": None, "collect": None}, {"plan": 128, "collect": 64}, {"plan": 96, "collect": 96}):
        monkeypatch.setattr(sampling_topk_topp, "later_maxnreg", lambda rows, regs=regs: regs)
        runs.append(sample(logits, inv, k, p, mp, seeds, pos, backend="triton", **kw))
    for run in runs[1:]:
        for name in ("tokens", "threshold", "row_max", "log_norm"):     # NaN where the row is invalid
            torch.testing.assert_close(getattr(run, name), getattr(runs[0], name), rtol=0, atol=0, equal_nan=True,
                                       msg=name)


@pytest.mark.timeout(300)      # one compilation per pass-1 variant
@pytest.mark.parametrize("V", [128256, 151936] if CUDA else [3001])
def test_pass1_buffers_do_not_depend_on_block_grouping(V):
    # what pass 1 writes (tile maxima and sums, block partials, histograms), bit for bit, for
    # every grouping of blocks into programs, the launcher's own choice and one program per row
    # included, and for every register cap (the same code; a launch promised no histogram rows
    # still builds the histograms of the rows that need one); unwritten entries keep their
    # sentinel in every run
    from specops.triton_kernels.sampling_stats import HIST_BINS, pass1_blocks, row_stats_pass, tile_size
    device = "cuda" if CUDA else "cpu"
    tile = tile_size(V) if CUDA else 16
    NT = -(-V // tile)
    tpb, nblk = pass1_blocks(NT, tile, None if CUDA else 7)
    assert nblk >= 5
    R = 8
    g = torch.Generator(device=device).manual_seed(5)
    logits = torch.randn(R, V, device=device, generator=g) * 2
    logits[2, 7] = float("nan")
    inv = torch.tensor([1.25, -1.0, 1.0, 1.0, 0.8, 1.0, 1.0, 2.0], device=device)   # row 1 greedy
    k = torch.tensor([0, 0, 0, 40, 500, 0, 0, 0], dtype=torch.int32, device=device)  # row 3 direct
    p = torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 0.7, 1.0], device=device)
    log_min_p = torch.log(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0], device=device))
    runs = []
    launches = [dict(blocks_per_program=bpp) for bpp in (1, 2, 3, 4, None, nblk)]
    launches += [dict(maxnreg=64, blocks_per_program=4), dict(maxnreg=80), dict(maxnreg=96, blocks_per_program=2),
                 dict(histograms=False, blocks_per_program=4)]
    for launch in launches:
        out = [torch.full((R, NT), 7.0, device=device), torch.full((R, NT), 7.0, device=device),
               torch.full((R, nblk, 4), 7.0, device=device),
               torch.full((R, nblk, HIST_BINS), 7, dtype=torch.int16, device=device),
               torch.full((R, nblk), 7, dtype=torch.int32, device=device)]
        row_stats_pass(logits, inv, k, p, log_min_p, tile, tpb, *out, kmax=128, **launch)
        runs.append([t.view(torch.int32) if t.is_floating_point() else t for t in out])
    assert (runs[0][3] != 7).any() and (runs[0][1] != torch.tensor(7.0).view(torch.int32)).any()
    for run in runs[1:]:
        for name, a, b in zip(("tile_max", "tile_sum", "part_f", "hist", "hist_top"), run, runs[0]):
            assert torch.equal(a, b), name


def test_a_maximum_of_negative_zero_keeps_its_ties_in_the_exact_search():
    """The exact search's first bound is one key above the row's maximum: for -0.0 that key was
    +0.0's, which the tied -0.0 tokens (equal to +0.0) reach, so they were never counted and a
    token below them was drawn (top_k=1 drew a -1.0 logit). Same tokens as the reference."""
    dev = KERNEL_DEVICE
    logits = torch.full((1, 40), -0.0, device=dev)
    logits[0, ::5] = -1.0                                   # 32 tokens at -0.0 (the max), 8 at -1.0
    args = (torch.tensor([1.0], device=dev), torch.tensor([1], dtype=torch.int32, device=dev), None, None,
            torch.tensor([3], device=dev), torch.tensor([0], device=dev))
    paths = {}
    got = sample(logits, *args, backend="triton", cap=16, paths=paths)
    want = sample(logits, *args, backend="torch")
    assert paths["mode"].tolist() == [5]                    # the exact search decided the row
    assert got.tokens.tolist() == want.tokens.tolist() and logits[0, got.tokens.item()] == 0.0
    assert got.threshold.item() == want.threshold.item() == 0.0


def test_search_group_defaults_follow_the_measured_batches():
    # bench/results/logs/exp_collect_slots_2026-12-03.txt (H200, fp32 V = 128256, 32 programs per row):
    # refine at group 8 was fastest at batch 8 .. 512 with the collect launch at 1 and atomic slots
    from specops.triton_kernels import sampling_topk_topp
    from specops.triton_kernels.sampling_select import refine_geometry, search_group
    s3 = refine_geometry(128256)[0]
    assert [search_group(b, s3) for b in (1, 2, 3, 4, 8, 32, 128, 512)] == [1, 2, 2, 4, 8, 8, 8, 8]
    assert sampling_topk_topp.ATOMIC_SLOTS is True
    for rows in range(1, 2000, 37):
        for per_row in (1, 10, 25, 32):
            g = search_group(rows, per_row)
            assert g in (1, 2, 4, 8) and g <= max(1, min(rows, per_row))
