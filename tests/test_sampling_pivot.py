"""Top-p and / or min-p without top-k by pivot rejection (`sample(..., distribution=False)`,
sampling_pivot.py).

- The reference's pivot draw (specops.sampling.sampler_torch.pivot_draw) against the exact
  target: chi-square over many draws, masked tokens never drawn, on distributions where it
  takes one round, several rounds and the exact fallback, with top-p, min-p and both.
- The kernel against the reference: the same tokens row for row (interpreter at small
  shapes, CUDA at full ones), every path taken (accepted in the first round, in a later
  one, the fallback), other rows of a mixed batch unchanged, batch invariance.
- The Sampler asks for thresholds only when processed logprobs need them.
"""

import numpy as np
import pytest
import torch
from test_sampling_topk_topp import assert_same_tokens_only, chi2_ok, exact_target, fresh_gen

from specops.sampling import Sampler, SamplingMetadata, row_thresholds_torch, sample, sample_options, sample_torch
from specops.sampling.sampler_torch import pivot_draw, scale_logits
from specops.triton_kernels import sampling_select as sel
from specops.triton_kernels.sampling_pivot import PIVOT_ROUNDS
from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PIVOTED = int(sel.PIVOTED.value)
FALLBACK = int(sel.FALLBACK.value)


def rounds_taken(x: torch.Tensor, tokens: torch.Tensor, p: float) -> torch.Tensor:
    """[R] bool: whether each row's first candidate (the unfiltered two-level draw) was rejected."""
    xd = x.double()
    w = torch.exp(xd - xd.max(dim=-1, keepdim=True).values)
    return torch.where(x > x.gather(1, tokens.unsqueeze(1)), w, 0.0).sum(-1) >= p * w.sum(-1)


# ---- the reference, statistically ----------------------------------------------------------

@pytest.mark.parametrize("dist,temp,p,mp", [
    ("flat", 1.0, 0.9, 0.0), ("peaked", 0.8, 0.6, 0.0), ("llm_like", 1.0, 0.95, 0.0), ("ties", 1.0, 0.5, 0.0),
    ("flat", 1.0, 0.05, 0.0),
    # min-p alone (the plan keeps a first candidate that reaches the threshold, else round 1
    # draws from the tokens above it), and min-p with top-p (no first candidate: two rounds of
    # verification, then the fallback)
    ("llm_like", 1.0, 1.0, 0.05), ("flat", 1.0, 1.0, 0.7), ("peaked", 0.8, 1.0, 0.02), ("ties", 1.0, 1.0, 0.3),
    ("peaked", 1.0, 0.7, 0.01), ("llm_like", 0.9, 0.9, 0.001), ("flat", 1.0, 0.1, 0.6),
])
def test_reference_pivot_draw_matches_exact_target(dist, temp, p, mp):
    # V = 600: five sub-chunks, so the restricted two-level redraws cross sub-chunks; top_p
    # 0.05 on the flat row rejects most candidates for PIVOT_ROUNDS rounds: the fallback's
    # race is in the counts too
    g = fresh_gen()
    V, N = 600, 24000
    assert -(-V // draw_sub_chunk(V)) == 5
    row = {"flat": lambda: torch.randn(V, generator=g) * 0.3,
           "peaked": lambda: torch.randn(V, generator=g) * 3.0,
           "llm_like": lambda: torch.randn(V, generator=g) * 1.5 + 8.0 * (torch.rand(V, generator=g) < 0.02),
           "ties": lambda: torch.randint(0, 4, (V,), generator=g).float()}[dist]()
    seed = int(torch.randint(0, 2**40, ()))
    md = SamplingMetadata.from_params([temp] * N, vocab_size=V, top_p=[p] * N, min_p=[mp] * N, seeds=[seed] * N,
                                      positions=list(range(N)))
    x = scale_logits(row.expand(N, V), md.inv_temperature)
    tokens = pivot_draw(x, md.top_p, md.seeds, md.positions, min_p=md.min_p)
    target = exact_target(row.numpy(), float(md.inv_temperature[0]), 0, p, mp)
    counts = np.bincount(tokens.numpy(), minlength=V)
    assert counts[target == 0].sum() == 0, "a token outside the kept set was drawn"
    assert (counts[target * N >= 30] > 0).all(), "a kept token was never drawn"
    ok, stat, q = chi2_ok(counts, target)
    assert ok, f"chi-square {stat:.1f} >= {q:.1f} ({dist}, top_p {p}, min_p {mp})"
    if dist == "flat" and p < 0.1:   # the case is there for the later rounds and the fallback
        assert float(rounds_taken(x[:2000], sub_chunk_first(x[:2000], md, 2000), p).float().mean()) > 0.5
    if mp > 0 and p == 1.0:          # min-p alone: both ways of drawing are in the counts
        # (over all N draws: the row max alone is kept, so a first draw is kept with probability
        # >= 1 / V, and a flat row's 0.7 threshold can keep as little as 1% of the mass: a bound
        # on 2000 draws failed about one run in 40)
        first = sub_chunk_first(x, md, N)
        kept_first = int((x.gather(1, first.unsqueeze(1)).squeeze(1) >= x.max() + torch.log(md.min_p[0])).sum())
        assert 0 < kept_first < N or dist == "ties", kept_first


def sub_chunk_first(x, md, n):
    from specops.sampling.sampler_torch import sub_chunk_draw
    return sub_chunk_draw(x, md.seeds[:n], md.positions[:n])


def test_reference_detects_a_pivot_draw_without_rejection():
    # the power check of the test above: accepting every first candidate (the unfiltered
    # draw) fails the chi-square at top_p 0.6 on a peaked row
    g = torch.Generator().manual_seed(7)
    V, N, p = 600, 24000, 0.6
    row = torch.randn(V, generator=g) * 3.0
    md = SamplingMetadata.from_params([1.0] * N, vocab_size=V, top_p=[p] * N, seeds=[5] * N, positions=list(range(N)))
    x = scale_logits(row.expand(N, V), md.inv_temperature)
    counts = np.bincount(sub_chunk_first(x, md, N).numpy(), minlength=V)
    assert not chi2_ok(counts, exact_target(row.numpy(), 1.0, 0, p, 0.0))[0]


# ---- the kernel against the reference ------------------------------------------------------

def mixed_pivot_batch(g: torch.Generator, R: int, V: int, dtype=torch.float32):
    """Pivot rows: top-p alone (several top_p, temperatures, a flat row with top_p 0.02 for the
    fallback), min-p alone, min-p with top-p; among greedy rows (one with min-p), rows without
    a filter, top-k, top-k + min-p and top-k + top-p rows. R = 14 holds every kind."""
    logits = torch.randn(R, V, generator=g) * 2.0
    logits[:, :7] += 6.0
    kinds = [(1.0, 0, 0.9, 0.0), (1.0, 0, 0.02, 0.0), (0.7, 0, 0.95, 0.0), (0.0, 0, 0.9, 0.1),
             (1.0, 0, 1.0, 0.0), (1.0, 20, 1.0, 0.0), (1.0, 0, 0.8, 0.05), (0.9, 10, 0.9, 0.0),
             (1.3, 0, 0.5, 0.0), (1.0, 0, 0.99, 0.0), (1.0, 0, 1.0, 0.05), (0.8, 0, 1.0, 0.9),
             (1.0, 30, 1.0, 0.02), (1.2, 0, 0.95, 0.001)]
    rows = [kinds[i % len(kinds)] for i in range(R)]
    flat = [i for i in range(R) if i % len(kinds) in (1, 11)]    # top_p 0.02 falls back; min_p 0.9 redraws
    logits[flat] = torch.randn(len(flat), V, generator=g) * 0.05
    md = SamplingMetadata.from_params([r[0] for r in rows], vocab_size=V, top_k=[r[1] for r in rows],
                                      top_p=[r[2] for r in rows], min_p=[r[3] for r in rows],
                                      seeds=[int(s) for s in torch.randint(0, 2**62, (R,), generator=g)],
                                      positions=[int(s) for s in torch.randint(0, 2**32, (R,), generator=g)],
                                      device=DEVICE)
    return logits.to(dtype).to(DEVICE), md


def _args(logits, md):
    return (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)


def _pivot_mask(md):
    """[R] bool: the random rows drawn by pivot rejection (top-p and / or min-p, no top-k)."""
    return ((md.top_p < 1) | (md.min_p > 0)) & (md.top_k == 0) & (md.inv_temperature > 0)


def _min_p_alone(md):
    return (md.min_p > 0) & (md.top_p == 1) & (md.top_k == 0) & (md.inv_temperature > 0)


@pytest.mark.skipif(CUDA, reason="small shapes run under the interpreter; CUDA runs the full shapes")
@pytest.mark.parametrize("V,R,dtype,kw", [
    (3000, 28, torch.float32, {}),
    (777, 28, torch.bfloat16, dict(tile=16, num_chunks=3)),
])
def test_triton_pivot_matches_reference_small(V, R, dtype, kw):
    # fixed inputs (no float near-tie among these rows: every token is compared exactly)
    g = torch.Generator().manual_seed(20261202 + V)
    logits, md = mixed_pivot_batch(g, R, V, dtype)
    paths = {}
    a = sample(*_args(logits, md), backend="triton", distribution=False, paths=paths, **kw)
    b = sample(*_args(logits, md), backend="torch", distribution=False)
    assert_same_tokens_only(a, b, logits, md.inv_temperature, md.seeds, md.positions, md.top_p, top_k=md.top_k,
                            min_p=md.min_p)
    assert torch.equal(a.tokens, b.tokens), (a.tokens, b.tokens)   # fixed inputs: no near-tie here
    full_read = sample(*_args(logits, md), backend="triton", distribution=False, pivot_skip=False, **kw)
    assert torch.equal(a.tokens, full_read.tokens)   # the skipped sub-chunks held no eligible token
    for group in (2, 4):   # several sub-chunks per mass program (the last group part-full): the same sums
        grouped = sample(*_args(logits, md), backend="triton", distribution=False, pivot_group=group, **kw)
        assert torch.equal(a.tokens, grouped.tokens), group
    # the other rows draw as with the thresholds
    c = sample(*_args(logits, md), backend="triton", **kw)
    pivot = _pivot_mask(md)
    assert torch.equal(a.tokens[~pivot], c.tokens[~pivot])
    mode = paths["mode"]
    assert bool((mode[pivot] == PIVOTED).any()) and bool((mode[pivot] == FALLBACK).any())
    # the rounds leaving their fallback rows to a finish launch after them (side_finish: on CUDA
    # both on the rounds' stream; in line here): the same tokens, those rows PIVOT_LATE
    late_paths = {}
    late = sample(*_args(logits, md), backend="triton", distribution=False, side_finish=True, paths=late_paths, **kw)
    assert torch.equal(a.tokens, late.tokens)
    assert torch.equal(late_paths["mode"][pivot & (mode == FALLBACK)],
                       torch.full_like(mode[pivot & (mode == FALLBACK)], int(sel.PIVOT_LATE.value)))
    assert torch.equal(late_paths["mode"][~(pivot & (mode == FALLBACK))], mode[~(pivot & (mode == FALLBACK))])
    assert bool((mode[~pivot] != PIVOTED).all())
    assert bool((mode[_min_p_alone(md)] == PIVOTED).all())     # min-p alone never needs the search
    # some top-p row was accepted after its first candidate was rejected, and some min-p row
    # was kept by the plan, another drawn again above the threshold
    x = scale_logits(logits.float(), md.inv_temperature)
    first = sample(logits, md.inv_temperature, None, None, None, md.seeds, md.positions, backend="torch").tokens
    later = pivot & (md.min_p == 0) & (mode == PIVOTED) & rounds_taken(x, first, md.top_p)
    assert bool(later.any())
    floor = x.max(dim=-1).values + torch.log(md.min_p)
    first_kept = x.gather(1, first.unsqueeze(1)).squeeze(1) >= floor
    assert bool((_min_p_alone(md) & first_kept).any()) and bool((_min_p_alone(md) & ~first_kept).any())


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_triton_pivot_follows_the_stream():
    # the rounds' noise is on the caller's stream (+ i * PIVOT_STREAM): another stream, other
    # tokens, the reference's again
    g = torch.Generator().manual_seed(11)
    logits, md = mixed_pivot_batch(g, 10, 1000)
    a = sample(*_args(logits, md), stream=7, backend="triton", distribution=False)
    b = sample(*_args(logits, md), stream=7, backend="torch", distribution=False)
    assert torch.equal(a.tokens, b.tokens)
    assert_same_tokens_only(a, b, logits, md.inv_temperature, md.seeds, md.positions, md.top_p, top_k=md.top_k,
                            min_p=md.min_p, stream=7)
    zero = sample(*_args(logits, md), backend="triton", distribution=False)
    assert bool((zero.tokens != a.tokens)[_pivot_mask(md)].any())


@pytest.mark.skipif(CUDA, reason="interpreter test")
def test_triton_pivot_rows_are_batch_invariant():
    g = torch.Generator().manual_seed(5)
    V, R = 1000, 10
    logits, md = mixed_pivot_batch(g, R, V)
    full = sample(*_args(logits, md), backend="triton", distribution=False).tokens
    for r in (0, 2, 8):   # alone, and at another row index among other neighbours
        one = sample(*(t[r:r + 1] for t in _args(logits, md)), backend="triton", distribution=False).tokens
        assert int(one[0]) == int(full[r])
        perm = torch.tensor([5, r, 3])
        three = sample(*(t[perm] for t in _args(logits, md)), backend="triton", distribution=False).tokens
        assert int(three[1]) == int(full[r])


def test_sampler_asks_for_the_distribution_only_with_processed_logprobs():
    V, R = 500, 4
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(R, V, generator=g).to(DEVICE)
    for mode, lp, has in (("raw_logprobs", None, False), ("raw_logprobs", 3, False),
                          ("processed_logprobs", 3, True), ("processed_logits", None, False)):
        md = SamplingMetadata.from_params([1.0] * R, vocab_size=V, top_p=[0.9] * R, seeds=[1, 2, 3, 4],
                                          positions=[0] * R, max_num_logprobs=lp, device=DEVICE)
        out = Sampler(logprobs_mode=mode)(logits, md)
        assert (out.result.threshold is not None) == has and (out.result.log_norm is not None) == has
        ref = sample_torch(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                           distribution=False)   # the tokens are the tokens-only draw's in every mode
        assert torch.equal(out.sampled_token_ids.cpu(), ref.tokens.cpu())
    proc, res = Sampler().target_distribution(logits, md)
    assert res.threshold is not None and res.log_norm is not None
    from specops.sampling import processed_probs
    with pytest.raises(ValueError, match="tokens only"):
        processed_probs(proc, out.result)      # the last Sampler call above drew tokens only


def test_search_hint_leaves_out_the_search_for_pivot_rows():
    V = 1000
    md = SamplingMetadata.from_params([1.0, 0.0, 1.0, 1.0], vocab_size=V, top_k=[0, 0, 40, 0],
                                      top_p=[0.9, 0.5, 1.0, 0.8], min_p=[0.0, 0.0, 0.0, 0.1])
    assert md.max_filtered_top_k == float("inf") and md.max_search_top_k == 40
    assert "search" not in sample_options(md, md.min_p)
    assert sample_options(md, md.min_p, distribution=False)["search"] is False
    # a min-p alone row needs no search either; a wide top-k (with or without min-p) still does
    md_mp = SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, min_p=[0.1, 0.0])
    assert md_mp.max_search_top_k == 0 and md_mp.any_pivot_row
    assert sample_options(md_mp, md_mp.min_p, distribution=False)["search"] is False
    for kw in (dict(min_p=[0.1, 0.0, 0.0, 0.0], top_k=[500, 0, 40, 0]), dict(top_k=[500, 0, 40, 0])):
        filters = {"top_p": [0.9, 0.5, 1.0, 1.0], **kw}
        md2 = SamplingMetadata.from_params([1.0, 0.0, 1.0, 1.0], vocab_size=V, **filters)
        assert "search" not in sample_options(md2, md2.min_p, distribution=False)
    # the hint follows an expand (spec-decode rows)
    rows = md.expand([0, 0, 2])
    assert rows.max_search_top_k == 40 and rows.filter_bound(rows.min_p, pivot=True) == 40
    # pivot rounds only when a random row has top-p or min-p and no top-k (greedy rows and
    # top-k + top-p / min-p do not count)
    assert md.any_pivot_row and "pivot" not in sample_options(md, md.min_p, distribution=False)
    md3 = SamplingMetadata.from_params([0.0, 1.0, 1.0, 0.0], vocab_size=V, top_k=[0, 20, 5, 0],
                                       top_p=[0.5, 0.9, 1.0, 1.0], min_p=[0.0, 0.0, 0.1, 0.2])
    assert md3.any_pivot_row is False and sample_options(md3, md3.min_p, distribution=False)["pivot"] is False
    assert "pivot" not in sample_options(md3, md3.min_p)          # with thresholds there are none anyway
    assert "pivot" not in sample_options(md3, None, distribution=False)   # another min_p: unknown
    # a caller that turns the pivot rounds off keeps the search for the pivot rows
    assert "search" not in sample_options(md, md.min_p, {"pivot": False}, distribution=False)


def test_distribution_must_be_a_bool():
    x = torch.randn(2, 50)
    s = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError, match="distribution"):
        sample(x, torch.ones(2), None, torch.full((2,), 0.5), None, s, s, distribution=1)


# ---- CUDA, full shapes ---------------------------------------------------------------------

@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("V,R,dtype", [(128256, 40, torch.float32), (151936, 33, torch.bfloat16),
                                       (262144, 9, torch.float32)])
def test_cuda_pivot_matches_reference(V, R, dtype):
    g = torch.Generator().manual_seed(20261202 + V)
    logits, md = mixed_pivot_batch(g, R, V, dtype)
    paths = {}
    a = sample(*_args(logits, md), backend="triton", distribution=False, paths=paths)
    b = sample(*_args(logits, md), backend="torch", distribution=False)
    assert_same_tokens_only(a, b, logits, md.inv_temperature, md.seeds, md.positions, md.top_p, top_k=md.top_k,
                            min_p=md.min_p)
    assert bool((paths["mode"][_pivot_mask(md)] == PIVOTED).any())
    assert bool((paths["mode"][_min_p_alone(md)] == PIVOTED).all())
    # a sub-chunk with no tile max above the pivot is skipped: the same tokens when every one is read
    c = sample(*_args(logits, md), backend="triton", distribution=False, pivot_skip=False)
    assert torch.equal(a.tokens, c.tokens)
    # several sub-chunks per mass program, with and without the skip: the same tokens
    for group, skip in ((1, True), (8, True), (8, False)):
        d = sample(*_args(logits, md), backend="triton", distribution=False, pivot_group=group, pivot_skip=skip)
        assert torch.equal(a.tokens, d.tokens), (group, skip)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("p", [0.95, 0.5])
def test_cuda_pivot_statistics_full_vocab(p):
    # 16384 draws from one shared row (row stride 0) against the exact top-p target
    g = fresh_gen()
    V, N = 128256, 16384
    row = torch.randn(V, generator=g) * 1.5
    row[torch.randperm(V, generator=g)[:40]] += torch.linspace(6, 12, 40)
    md = SamplingMetadata.from_params([1.0] * N, vocab_size=V, top_p=[p] * N, seeds=[77] * N,
                                      positions=list(range(N)), device="cuda")
    res = sample(row.cuda().unsqueeze(0).expand(N, V), md.inv_temperature, None, md.top_p, None, md.seeds,
                 md.positions, backend="triton", distribution=False)
    x = row.double()
    tau = row_thresholds_torch(row.unsqueeze(0), None, torch.tensor([p]), None)[0]
    w = torch.where(row >= tau, torch.exp(x - x.max()), 0.0)
    probs = (w / w.sum()).numpy()
    counts = np.bincount(res.tokens.cpu().numpy(), minlength=V)
    assert counts[probs == 0].sum() == 0
    assert chi2_ok(counts, probs)[0]


@pytest.mark.parametrize("top_p_alone", [False, True])
def test_pivot_rounds_launch_only_for_a_pivot_row(top_p_alone, monkeypatch):
    # the Sampler's tokens-only call: a batch whose rows of top-p also have top-k (or are
    # greedy) launches no pivot round; one row of top-p alone brings the PIVOT_ROUNDS rounds
    from test_sampling_topk_topp import _CountingKernel
    from specops.triton_kernels import sampling_pivot as sp
    launched = []
    monkeypatch.setattr(sp, "_pivot_mass_kernel", _CountingKernel(sp._pivot_mass_kernel, "mass", launched))
    V = 128256 if CUDA else 700
    temps, ks, ps = [0.0, 1.0, 1.0], [0, 20, 0], [0.5, 0.9, 0.8 if top_p_alone else 1.0]
    md = SamplingMetadata.from_params(temps, vocab_size=V, top_k=ks, top_p=ps, seeds=[1, 2, 3], positions=[4, 5, 6],
                                      device=DEVICE)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    a = Sampler(backend="triton", kernel_options={} if CUDA else dict(tile=16))(logits, md)
    assert launched == (["mass"] * PIVOT_ROUNDS if top_p_alone else [])
    b = sample_torch(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                     distribution=False)
    assert torch.equal(a.sampled_token_ids.cpu(), b.tokens.cpu())


def test_sampler_tokens_do_not_depend_on_the_logprobs_asked_for():
    # a seeded row's token depends on its seed, logits and position only: not on whether its
    # batch asked for logprobs, nor on the mode (processed modes also compute the exact
    # distribution, whose support holds the token)
    from specops.sampling import compute_logprobs
    V, R = 300, 8
    g = torch.Generator().manual_seed(21)
    logits = (torch.randn(R, V, generator=g) * 2).to(DEVICE)
    kw = dict(vocab_size=V, top_k=[0, 0, 5, 0, 0, 0, 0, 0], top_p=[0.5, 0.9, 0.9, 1.0, 0.7, 0.95, 0.3, 0.8],
              seeds=list(range(100, 100 + R)), positions=[9] * R, device=DEVICE)
    temps = [1.0, 0.7, 1.0, 1.0, 0.0, 1.3, 1.0, 1.0]
    opts = {} if CUDA else {"tile": 16}
    backend = "auto" if CUDA else "torch"
    base = Sampler(backend=backend, kernel_options=opts)(logits, SamplingMetadata.from_params(temps, **kw))
    for mode in ("raw_logprobs", "processed_logprobs", "processed_logits"):
        md = SamplingMetadata.from_params(temps, max_num_logprobs=2, **kw)
        out = Sampler(logprobs_mode=mode, backend=backend, kernel_options=opts)(logits, md)
        assert torch.equal(out.sampled_token_ids, base.sampled_token_ids), mode
        if mode == "processed_logprobs":
            assert bool((out.logprobs.logprobs[:, 0] > -torch.inf).all())
    with pytest.raises(ValueError, match="tokens only"):
        compute_logprobs("processed_logprobs", 1, base.sampled_token_ids, processed_logits=logits,
                         inv_temperature=torch.ones(R, device=DEVICE), result=base.result)
