"""The Sampler pipeline, the logits-processor interface and logprobs.

- Pipeline order (allowed ids, bad words, min_tokens, logit_bias, penalties, temperature,
  min_p, top-k/top-p) against a hand-written reference on fresh random inputs.
- Sampler(triton) == Sampler(torch) (interpreter at small shapes, CUDA at full shapes).
- BatchUpdate semantics (removed -> added -> moved, swaps, live output lists), rows that
  are not 1:1 with requests, the loader (module:Class and the entry-point group).
- Logprobs in the four modes, ranks, invalid rows.
"""

import math
import sys
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specops.sampling import (BatchUpdate, LogitsProcessor, LogitsRows, MoveDirectionality, Sampler,
                              SamplingMetadata, apply_penalties_torch, build_logits_processors, sample_torch)
from specops.sampling.logits_processors import (LogitBiasLogitsProcessor, MinPLogitsProcessor,
                                                MinTokensLogitsProcessor, load_processor_class)
from specops.sampling.logits_processors import loader as loader_mod
from specops.sampling.logprobs import compute_logprobs
from specops.sampling.sampler import processed_probs
from specops.sampling.sampler_torch import scale_logits

CUDA = torch.cuda.is_available()
EOS = 2


def same_draw(a, b, sampler, logits, md):
    """Sampler outputs a (fused) and b (reference) agree (see test_sampling_topk_topp; without processed
    logprobs the Sampler draws tokens only: rows of top-p alone by pivot rejection)."""
    from test_sampling_topk_topp import assert_same_draw, assert_same_tokens_only
    proc = sampler.process(logits.clone(), md)
    top_p = md.top_p if md.top_p is not None else torch.ones(md.num_rows)
    same = assert_same_draw if a.result.threshold is not None else assert_same_tokens_only
    same(a.result, b.result, proc.logits, proc.inv_temperature, md.seeds, md.positions, top_p,
         top_k=md.top_k, min_p=proc.min_p)


def params(**kw):
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, min_tokens=0, logit_bias=None,
                stop_token_ids=None, ignore_eos=False, repetition_penalty=1.0, frequency_penalty=0.0,
                presence_penalty=0.0, allowed_token_ids=None, logprobs=None)
    return SimpleNamespace(**(base | kw))


def batch(V, plist, outputs, prompts, device="cpu", procs=None, **md_kw):
    """Processors fed with one BatchUpdate adding every request, and the step's metadata."""
    n = len(plist)
    procs = procs or build_logits_processors(n, V, device, eos_token_ids=[EOS], use_entry_points=False)
    procs.update_state(BatchUpdate(n, added=[(i, p, prompts[i], outputs[i]) for i, p in enumerate(plist)]))
    pm = torch.zeros(n, V, dtype=torch.bool)
    oc = torch.zeros(n, V, dtype=torch.int32)
    for i in range(n):
        pm[i, prompts[i]] = True
        for t in outputs[i]:
            oc[i, t] += 1
    md = SamplingMetadata.from_params(
        [p.temperature for p in plist], vocab_size=V, device=device, top_k=[p.top_k for p in plist],
        top_p=[p.top_p for p in plist], min_p=[p.min_p for p in plist], seeds=[p.seed for p in plist],
        positions=[len(prompts[i]) + len(outputs[i]) for i in range(n)],
        repetition_penalties=[p.repetition_penalty for p in plist],
        frequency_penalties=[p.frequency_penalty for p in plist],
        presence_penalties=[p.presence_penalty for p in plist], prompt_mask=pm.to(device), output_counts=oc.to(device),
        allowed_token_ids=[p.allowed_token_ids for p in plist], output_token_ids=[list(o) for o in outputs],
        logitsprocs=procs, rows=LogitsRows(list(range(n)), [len(o) for o in outputs]), **md_kw)
    return md, procs


def hand_pipeline(logits, plist, outputs, prompts, bad_words):
    """The pipeline written out row by row: the processed, scaled logits of random rows."""
    out = []
    for i, p in enumerate(plist):
        x = logits[i].float().clone()
        if p.allowed_token_ids is not None:
            keep = torch.zeros_like(x, dtype=torch.bool)
            keep[p.allowed_token_ids] = True
            x[~keep] = -torch.inf
        for w in bad_words.get(i, []):
            if len(w) == 1 or outputs[i][-(len(w) - 1):] == w[:-1]:
                x[w[-1]] = -torch.inf
        if len(outputs[i]) < p.min_tokens:
            x[EOS] = -torch.inf
        for t, b in (p.logit_bias or {}).items():
            x[t] += b
        seen = torch.zeros_like(x, dtype=torch.bool)
        seen[prompts[i]] = True
        cnt = torch.zeros_like(x)
        for t in outputs[i]:
            cnt[t] += 1
            seen[t] = True
        x = torch.where(seen, torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
        x = x - p.frequency_penalty * cnt - p.presence_penalty * (cnt > 0).float()
        out.append(x)
    return torch.stack(out)


def random_batch(V, n, gen):
    plist, outputs, prompts = [], [], []
    for i in range(n):
        r = torch.rand(8, generator=gen).tolist()
        plist.append(params(
            temperature=0.0 if r[0] < 0.2 else 0.5 + r[1],
            top_k=int(torch.randint(1, 20, (1,), generator=gen)) if r[2] < 0.4 else 0,
            top_p=0.5 + 0.4 * r[3] if r[3] < 0.5 else 1.0, min_p=0.1 * r[4] if r[4] < 0.3 else 0.0,
            seed=int(torch.randint(0, 2**40, (1,), generator=gen)) if r[5] < 0.5 else None,
            min_tokens=5 if r[6] < 0.3 else 0,
            logit_bias={int(torch.randint(0, V, (1,), generator=gen)): 3.0} if r[7] < 0.3 else None,
            repetition_penalty=1.3 if r[1] < 0.5 else 1.0, frequency_penalty=0.4 if r[2] < 0.5 else 0.0,
            presence_penalty=0.2 if r[4] < 0.5 else 0.0,
            allowed_token_ids=list(range(0, V, 3)) if r[6] > 0.85 else None))
        outputs.append(torch.randint(0, V, (int(torch.randint(0, 8, (1,), generator=gen)),), generator=gen).tolist())
        prompts.append(torch.randint(0, V, (6,), generator=gen).tolist())
    return plist, outputs, prompts


def fresh_gen():
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))


# ---- the pipeline --------------------------------------------------------------------------

def test_pipeline_order_matches_hand_reference():
    g = fresh_gen()
    V, n = 64, 12
    plist, outputs, prompts = random_batch(V, n, g)
    bad = {0: [[outputs[0][-1] if outputs[0] else 1, 9]], 3: [[4]]}
    md, _ = batch(V, plist, outputs, prompts, bad_words_token_ids=bad)
    logits = torch.randn(n, V, generator=g) * 3
    want = hand_pipeline(logits, plist, outputs, prompts, bad)
    sampler = Sampler(backend="torch")
    proc = sampler.process(logits.clone(), md)
    torch.testing.assert_close(proc.logits, want)
    out = sampler(logits.clone(), md)   # no processed logprobs: tokens only (top-p alone by pivot rejection)
    ref = sample_torch(want, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                       distribution=False)
    assert torch.equal(out.sampled_token_ids, ref.tokens)
    greedy = md.temperature == 0
    assert torch.equal(out.sampled_token_ids[greedy], want[greedy].argmax(dim=-1))
    # tokens are always allowed by the processed logits
    assert bool((want.gather(1, out.sampled_token_ids.unsqueeze(1)) > -torch.inf).all())


def test_target_distribution_is_what_is_sampled():
    # the distribution the Sampler reports and its draws are both the exact target, computed
    # independently from the raw logits and the parameters (brute force): half the rows are cut
    # by min-p then top-p, half by top-k, so a Sampler that drops a filter or mixes rows fails
    from test_sampling_topk_topp import chi2_ok, exact_target
    from specops.sampling import processed_probs
    g = fresh_gen()
    V, N = 32, 12000
    row = torch.full((V,), -2.4) + 0.1 * torch.randn(V, generator=g)
    row[torch.randperm(V, generator=g)[:4]] += 2.4     # 4 head tokens near 0, a tail of 28 at -2.4
    groups = [(0.8, 0, 0.7, 0.1), (1.2, 2, 0.9, 0.0)]  # (temperature, top_k, top_p, min_p), N / 2 rows each
    per_row = [q for q in groups for _ in range(N // 2)]
    md = SamplingMetadata.from_params([q[0] for q in per_row], vocab_size=V, top_k=[q[1] for q in per_row],
                                      top_p=[q[2] for q in per_row], min_p=[q[3] for q in per_row],
                                      seeds=[5] * N, positions=list(range(N)))
    proc, res = Sampler(backend="torch").target_distribution(row.expand(N, V).clone(), md)
    probs = processed_probs(proc, res).double().numpy()
    for i, (temp, k, p, mp) in enumerate(groups):
        rows = slice(i * N // 2, (i + 1) * N // 2)
        target = exact_target(row.numpy(), 1 / temp, k, p, mp)
        # power guard: dropping a filter only adds tokens, here worth >= 40 expected draws, which
        # the masked-token check below catches (without min-p the tail's mass moves top-p's cut
        # past the 4th head token; without top-p that token is kept; without top-k the tail is)
        for dropped in [(k, 1.0, mp), (k, p, 0.0)] if i == 0 else [(0, p, mp)]:
            wrong = exact_target(row.numpy(), 1 / temp, *dropped)
            assert 0.5 * np.abs(wrong - target).sum() * (N // 2) >= 40, (groups[i], dropped)
        np.testing.assert_allclose(probs[rows], np.broadcast_to(target, probs[rows].shape), atol=1e-5)
        counts = np.bincount(res.tokens[rows].numpy(), minlength=V)
        assert counts[target == 0].sum() == 0, f"{groups[i]}: a masked token was drawn"
        ok, stat, q = chi2_ok(counts, target)
        assert ok, f"{groups[i]}: chi-square {stat:.1f} >= {q:.1f}"


def test_penalty_op_matches_the_reference():
    from specops.ops import apply_penalties_
    g = fresh_gen()
    R, V = 7, 300
    x = torch.randn(R, V, generator=g) * 4
    pm = torch.rand(R, V, generator=g) < 0.1
    oc = torch.randint(0, 3, (R, V), generator=g, dtype=torch.int32) * (torch.rand(R, V, generator=g) < 0.1)
    rep, freq, pres = torch.rand(R, generator=g) + 0.5, torch.rand(R, generator=g) - 0.5, torch.rand(R, generator=g)
    a, b = x.clone(), x.clone()
    apply_penalties_(a, pm, oc.int(), rep, freq, pres)
    apply_penalties_torch(b, pm, oc.int(), rep, freq, pres)
    torch.testing.assert_close(a, b)


def test_sampler_does_not_touch_untouched_logits_and_reads_half_precision():
    g = fresh_gen()
    V = 50
    md = SamplingMetadata.from_params([0.8, 0.0], vocab_size=V, top_p=[0.9, 1.0], seeds=[1, 2], max_num_logprobs=3)
    logits = (torch.randn(2, V, generator=g) * 2).bfloat16()
    out = Sampler(backend="torch")(logits, md)   # raw logprobs: a tokens-only draw
    ref = sample_torch(logits, md.inv_temperature, None, md.top_p, None, md.seeds, md.positions, distribution=False)
    assert torch.equal(out.sampled_token_ids, ref.tokens)
    lp = torch.log_softmax(logits.float(), dim=-1)
    torch.testing.assert_close(out.logprobs.logprobs[:, 0], lp.gather(1, ref.tokens.unsqueeze(1)).squeeze(1))


def test_logits_with_a_strided_last_dimension_and_penalties():
    # column-major fp32 logits (e.g. x.t().contiguous().t()) with penalties and an allowed-token
    # list: the triton backend's compiled penalty op needs a contiguous last dimension and raised,
    # after the allowed-token mask had already written -inf into the caller's tensor. The Sampler
    # now copies such logits first: both backends draw the same tokens
    R, V = 2, 8
    dev = "cuda" if CUDA else "cpu"

    def md():
        return SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, device=dev, seeds=[1, 2],
                                            repetition_penalties=[1.3, 1.3], allowed_token_ids=[[0, 1], None],
                                            prompt_mask=torch.zeros(R, V, dtype=torch.bool, device=dev),
                                            output_counts=torch.ones(R, V, dtype=torch.int32, device=dev))
    colmajor = torch.randn(R, V, generator=fresh_gen()).t().contiguous().t().to(dev)
    assert colmajor.stride(1) != 1
    expected = Sampler(backend="torch")(colmajor.contiguous(), md()).sampled_token_ids
    for backend in ("torch", "triton"):
        x = colmajor.clone()
        assert torch.equal(Sampler(backend=backend)(x, md()).sampled_token_ids, expected), backend


def test_rows_that_share_memory_are_copied_before_any_write():
    # an expanded [1, V] row (stride 0) as a batch: the allowed-token mask of row 0 once landed in
    # row 1 too (and in the caller's tensor), so row 1 drew from row 0's list
    V = 8
    for backend, device in (("torch", "cpu"), ("triton", "cuda" if CUDA else "cpu")):   # Triton on CPU: interpreter
        base = torch.arange(float(V), device=device)[None]
        md = SamplingMetadata.from_params([0.0, 0.0], vocab_size=V, allowed_token_ids=[[1, 2], None], device=device)
        out = Sampler(backend=backend)(base.expand(2, V), md).sampled_token_ids
        assert out.tolist() == [2, V - 1], backend
        assert torch.equal(base.cpu(), torch.arange(float(V))[None])      # the caller's row untouched


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_logits_dtype_is_checked_whatever_the_batch(dtype):
    # a batch that writes the logits (here an allowed-token list that allows everything) cast them
    # to fp32 first and so sampled int64 / float64 logits that a plain batch refuses
    logits = torch.zeros(1, 8, dtype=dtype)
    for kw in ({}, dict(allowed_token_ids=[list(range(8))])):
        md = SamplingMetadata.from_params([1.0], vocab_size=8, seeds=[1], **kw)
        with pytest.raises(TypeError, match="logits must be fp32, bf16 or fp16"):
            Sampler(backend="torch")(logits, md)


@pytest.mark.skipif(CUDA, reason="interpreter test; CUDA runs the full-shape version")
def test_triton_sampler_matches_torch_sampler_small():
    g = fresh_gen()
    V, n = 257, 8
    plist, outputs, prompts = random_batch(V, n, g)
    md, _ = batch(V, plist, outputs, prompts, max_num_logprobs=2)
    logits = torch.randn(n, V, generator=g) * 3
    a = Sampler(backend="torch")(logits.clone(), md)
    md2, _ = batch(V, plist, outputs, prompts, max_num_logprobs=2)
    b = Sampler(backend="triton", kernel_options=dict(tile=16, cap=64, num_chunks=2))(logits.clone(), md2)
    same_draw(b, a, Sampler(backend="torch"), logits, md)
    assert torch.equal(a.logprobs.token_ids[:, 1:], b.logprobs.token_ids[:, 1:])


def triton_against_reference(V, plist, g, kernel_options, min_p_from_processor=False):
    """The triton Sampler on a batch of `plist` (random outputs, prompts and logits from g)
    draws as the torch Sampler; with min_p_from_processor the triton side's metadata has no
    min_p (pyengine.sampling's way: the MinP processor supplies it). Returns that metadata."""
    n = len(plist)
    outputs = [torch.randint(0, V, (3,), generator=g).tolist() for _ in range(n)]
    prompts = [torch.randint(0, V, (6,), generator=g).tolist() for _ in range(n)]
    device = "cuda" if CUDA else "cpu"
    logits = (torch.randn(n, V, generator=g) * 2.5).to(device)
    md, _ = batch(V, plist, outputs, prompts, device=device)
    a = Sampler(backend="torch")(logits.clone(), md)
    md2, _ = batch(V, plist, outputs, prompts, device=device)
    if min_p_from_processor:
        md2 = replace(md2, min_p=None)
    b = Sampler(backend="triton", kernel_options=kernel_options)(logits.clone(), md2)
    same_draw(b, a, Sampler(backend="torch"), logits, md)
    return md2


@pytest.mark.parametrize("wide", [None, "top_p", "min_p", "min_p_proc", "top_k", "top_k_wide"])
def test_sampler_leaves_out_the_search_kernels_when_no_row_needs_them(wide, monkeypatch):
    # greedy, plain and top_k <= 128 rows are all decided in the plan: the Sampler tells the
    # kernels so (sample_options) and the refine / collect kernels are not launched. One row
    # with a wider filter (min-p, in the metadata or, as the engine passes it, through its
    # processor only; top_k > 512) brings them back; a spread row (128 < top_k <= 512) brings
    # the collect launch alone; top-p alone none (without processed logprobs the Sampler draws
    # it by pivot rejection, with no search). The draws are the reference's either way.
    from test_sampling_topk_topp import _CountingKernel
    from specops.triton_kernels import sampling_topk_topp as tk
    launched = []
    for name in ("_refine_kernel", "_collect_kernel", "_collect_direct_kernel"):   # either collect launch
        monkeypatch.setattr(tk, name, _CountingKernel(getattr(tk, name), name.replace("_direct", ""), launched))
    g = fresh_gen()
    V = 128256 if CUDA else 2000
    plist = [params(temperature=0.0), params(), params(top_k=20, seed=5), params(top_k=128, top_p=0.8),
             params(temperature=0.7, top_k=1, logit_bias={3: 2.0})]
    plist += {None: [], "top_p": [params(top_p=0.9)], "min_p": [params(min_p=0.05)],
              "min_p_proc": [params(min_p=0.05)], "top_k": [params(top_k=129)],
              "top_k_wide": [params(top_k=513)]}[wide]
    md2 = triton_against_reference(V, plist, g, {} if CUDA else dict(tile=16, cap=64), wide == "min_p_proc")
    if wide == "min_p_proc":
        assert md2.max_filtered_top_k == math.inf
    search = ["_refine_kernel", "_refine_kernel", "_collect_kernel"]
    want = {None: [], "top_p": [], "top_k": ["_collect_kernel"]}.get(wide, search)
    assert launched == want, launched


@pytest.mark.parametrize("wide", ["top_p", "top_p_min_p_proc", "top_k_alone"])
def test_sampler_raises_the_cap_for_a_wide_top_k_with_top_p(wide, monkeypatch):
    # A row with top-p and a top_k above DEFAULT_CAP sorts its top_k candidates: the Sampler
    # launches with the cap that holds them (sample_options, cap_for_top_k), else the row
    # would take the single-program search; also when min_p comes from its processor (the
    # engine's way). Without top-p (no sort) the default stands. The draws are the
    # reference's either way.
    from specops.triton_kernels import sampling_topk_topp as tk
    caps = []
    launch = tk.sample_top_k_top_p_triton

    def recording_launch(*args, **kwargs):
        caps.append(kwargs.get("cap", tk.DEFAULT_CAP))
        return launch(*args, **kwargs)

    monkeypatch.setattr(tk, "sample_top_k_top_p_triton", recording_launch)
    g = fresh_gen()
    V = 128256 if CUDA else 3000
    wide_k = tk.DEFAULT_CAP + 300
    plist = [params(top_k=wide_k, top_p=1.0 if wide == "top_k_alone" else 0.95), params(top_k=40),
             params(top_p=0.9, min_p=0.05)]
    triton_against_reference(V, plist, g, {} if CUDA else dict(tile=16), wide == "top_p_min_p_proc")
    assert caps == [tk.DEFAULT_CAP if wide == "top_k_alone" else 2 * tk.DEFAULT_CAP], caps


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_cuda_sampler_matches_torch_sampler_full_vocab(mode):
    g = fresh_gen()
    V, n = 128256, 48
    plist, outputs, prompts = random_batch(V, n, g)
    logits = torch.randn(n, V, generator=g).cuda() * 2.5
    md, _ = batch(V, plist, outputs, prompts, device="cuda", max_num_logprobs=5)
    a = Sampler(backend="torch", logprobs_mode=mode)(logits.clone(), md)
    md2, _ = batch(V, plist, outputs, prompts, device="cuda", max_num_logprobs=5)
    b = Sampler(logprobs_mode=mode)(logits.clone(), md2)
    same_draw(b, a, Sampler(backend="torch"), logits, md)
    if mode == "processed_logprobs":
        assert_same_processed_top_logprobs(b, a, Sampler(backend="torch").process(logits.clone(), md))
    else:
        torch.testing.assert_close(a.logprobs.logprobs[:, 1:], b.logprobs.logprobs[:, 1:], equal_nan=True)
        assert_same_top_ids(b, a, logits.cpu(), torch.zeros(n, dtype=torch.bool))
    assert torch.equal(a.logprobs.ranks, b.logprobs.ranks)


def assert_same_top_ids(a, b, x, skip):
    """The top-n token ids of Sampler outputs a and b name tokens of the same value of x [R, V] (the
    logits the logprobs are of: raw, or processed and scaled), rows in `skip` left out: ids may
    differ only between tokens of (near) equal value. Positions with a non-finite logprob on either
    side are left out (the -inf of a cut token: the order among those is arbitrary)."""
    ia, ib = a.logprobs.token_ids[:, 1:].cpu(), b.logprobs.token_ids[:, 1:].cpu()
    la, lb = a.logprobs.logprobs[:, 1:].cpu(), b.logprobs.logprobs[:, 1:].cpu()
    use = torch.isfinite(la) & torch.isfinite(lb) & (ia >= 0) & (ib >= 0) & ~skip[:, None]
    va, vb = x.gather(1, ia.clamp(min=0)), x.gather(1, ib.clamp(min=0))
    torch.testing.assert_close(va[use], vb[use])


def assert_same_processed_top_logprobs(a, b, proc):
    """The top-n processed logprobs of Sampler outputs a (kernels) and b (reference) agree.

    A row whose two thresholds differ (a top-p cut at a near-tie, decided in fp32 by the kernels
    and in fp64 by the reference: `same_draw` checks that it is one) keeps other tokens, so
    another normaliser: there the values agree up to it (value + log_norm), and a token between
    the two thresholds may be kept by one side only. Every other row agrees value for value."""
    ta, tb = a.result.threshold.cpu(), b.result.threshold.cpu()
    la, lb = a.logprobs.logprobs[:, 1:].cpu(), b.logprobs.logprobs[:, 1:].cpu()
    assert torch.equal(a.logprobs.token_ids[:, 1:].cpu() >= 0, b.logprobs.token_ids[:, 1:].cpu() >= 0)
    band = (ta != tb) & ~torch.isnan(ta)
    torch.testing.assert_close(la[~band], lb[~band], equal_nan=True)
    x = scale_logits(proc.logits, proc.inv_temperature).cpu()
    assert_same_top_ids(a, b, x, band)
    for r in band.nonzero().flatten().tolist():
        lo, hi = sorted((float(ta[r]), float(tb[r])))
        ids = b.logprobs.token_ids[r, 1:].cpu()
        v = x[r, ids.clamp(min=0)]
        firm = (v < lo) | (v >= hi)                  # kept or cut on both sides
        sa = la[r] + a.result.log_norm[r].cpu()
        sb = lb[r] + b.result.log_norm[r].cpu()
        torch.testing.assert_close(sa[firm], sb[firm], equal_nan=True)


def test_processed_logprobs_check_accepts_only_a_near_tie_shift():
    """assert_same_processed_top_logprobs (the check of the CUDA comparison above) on the CPU: a
    copy of the reference whose top-p row cuts one boundary token (as the kernels' fp32 sums may
    at a near-tie) passes with its logprobs shifted by that token's share; the same copy with
    one logprob off, or another row off, fails."""
    import copy
    g = fresh_gen()
    V, n = 64, 4
    plist, outputs, prompts = random_batch(V, n, g)
    plist[1] = params(temperature=0.9, top_p=0.6)
    logits = torch.randn(n, V, generator=g) * 2.0
    logits[1] = torch.linspace(3.0, -3.0, V)[torch.randperm(V, generator=g)]   # no token below 1e-4 of the cut's
    md, _ = batch(V, plist, outputs, prompts, max_num_logprobs=5)
    ref = Sampler(backend="torch", logprobs_mode="processed_logprobs")(logits.clone(), md)
    proc = Sampler(backend="torch").process(logits.clone(), md)
    x = scale_logits(proc.logits, proc.inv_temperature)[1].double()
    tau = float(ref.result.threshold[1])
    assert int((x >= tau).sum()) >= 2               # a cut with a token to drop
    cut = float(x[x > tau].min())                  # the next kept value: one token fewer
    log_norm = torch.log(torch.exp(x[x >= cut] - float(ref.result.row_max[1])).sum()).float()
    near = copy.deepcopy(ref)
    shift = float(ref.result.log_norm[1] - log_norm)
    assert shift > 1e-4                             # the old value-for-value check would fail
    near.result.threshold[1] = cut
    near.result.log_norm[1] = log_norm
    near.logprobs.logprobs[1] += shift
    assert_same_processed_top_logprobs(near, ref, proc)
    for row, col in ((1, 1), (0, 1)):              # the top token of each row: kept, never in the band
        bad = copy.deepcopy(near)
        bad.logprobs.logprobs[row, col] += 1e-3
        with pytest.raises(AssertionError):
            assert_same_processed_top_logprobs(bad, ref, proc)
    # the right values under another token's id: fails too (outside the band row)
    bad = copy.deepcopy(near)
    top = int(bad.logprobs.token_ids[0, 1])
    bad.logprobs.token_ids[0, 1] = int(x.argmin()) if int(x.argmin()) != top else (top + 1) % V
    with pytest.raises(AssertionError):
        assert_same_processed_top_logprobs(bad, ref, proc)


def test_custom_argmax_invariant_processor_runs_on_scaled_logits():
    class Halve(LogitsProcessor):  # argmax invariant: scales the random rows' logits by 1/2
        seen = []

        def is_argmax_invariant(self):
            return True

        def update_state(self, batch_update):
            pass

        def apply(self, logits, rows=None):
            Halve.seen.append(logits.clone())
            return logits * 0.5

    V = 30
    procs = build_logits_processors(2, V, custom=[Halve], use_entry_points=False)
    md = SamplingMetadata.from_params([0.5, 0.0], vocab_size=V, seeds=[3, 4], logitsprocs=procs)
    logits = torch.randn(2, V)
    out = Sampler(backend="torch")(logits.clone(), md)
    torch.testing.assert_close(Halve.seen[0][0], logits[0] * 2.0)   # temperature 0.5 applied first
    x = torch.stack([logits[0] * 2.0 * 0.5, logits[1] * 0.5])          # scaled, then halved
    ref = sample_torch(x, torch.tensor([1.0, -1.0]), None, None, None, md.seeds, md.positions)
    assert torch.equal(out.sampled_token_ids, ref.tokens)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_min_p_runs_before_custom_argmax_invariant_processors(backend):
    # vLLM v1 applies its built-in min_p before the custom argmax-invariant processors; the
    # Sampler applied min-p in the draw, after them: a processor that flattens the logits
    # (here halves them) widened the min-p cut
    class Halve(LogitsProcessor):
        def is_argmax_invariant(self):
            return True

        def update_state(self, batch_update):
            pass

        def apply(self, logits, rows=None):
            return logits * 0.5

    device = "cuda" if CUDA else "cpu"
    V = 16
    temps, min_ps = [0.5, 1.0, 0.0], [0.2, 0.1, 0.3]           # the last row is greedy
    # scaled logits -0.6 i and -0.3 i: min-p keeps i <= 2 and i <= 7 (halved first: i <= 5 and all);
    # no value within 0.05 of a cut, and the columns shuffled
    logits = -0.3 * torch.arange(V, dtype=torch.float32).repeat(3, 1)
    logits = logits[:, torch.randperm(V)].to(device)
    procs = build_logits_processors(3, V, device, custom=[Halve], use_entry_points=False)
    md = SamplingMetadata.from_params(temps, vocab_size=V, device=device, min_p=min_ps, seeds=[1, 2, 3],
                                      logitsprocs=procs)
    opts = {} if CUDA or backend == "torch" else dict(tile=16, cap=64, num_chunks=2)
    sampler = Sampler(backend=backend, kernel_options=opts)
    processed, res = sampler.target_distribution(logits.clone(), md)
    kept = (processed_probs(processed, res) > 0).cpu()
    # vLLM's order: temperature, then min_p (p >= min_p * max p), then the custom processor
    x = logits[:2].cpu().double() / torch.tensor(temps[:2], dtype=torch.float64)[:, None]
    p = torch.softmax(x, dim=-1)
    want = p >= torch.tensor(min_ps[:2], dtype=torch.float64)[:, None] * p.max(dim=-1, keepdim=True).values
    assert want.sum(dim=-1).tolist() == [3, 8]
    assert torch.equal(kept[:2], want)
    assert bool(kept[2].all()) and bool(torch.isfinite(processed.logits[2]).all())   # greedy: no min-p
    tokens = sampler(logits.clone(), md).sampled_token_ids.cpu()
    assert bool(want[[0, 1], tokens[:2]].all()) and tokens[2] == int(logits[2].argmax())


class HalveUsers(LogitsProcessor):
    """Argmax invariant; halves the rows of the requests whose extra_args ask for it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.users = set()

    def is_argmax_invariant(self):
        return True

    def update_state(self, batch_update):
        if batch_update:
            self.users -= set(batch_update.removed)
            self.users |= {i for i, p, _, _ in batch_update.added if (getattr(p, "extra_args", None) or {}).get("halve")}

    def is_active(self):
        return bool(self.users)

    def apply(self, logits, rows=None):
        rows = rows or LogitsRows.identity(logits.shape[0])
        for r, req in enumerate(rows.req_indices):
            if req in self.users:
                logits[r] *= 0.5                                          # in place, as processors may
        return logits


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_seeded_min_p_row_ignores_a_neighbours_custom_processor(backend):
    """A seeded min-p row's token is the same alone and beside a request that switches a
    custom argmax-invariant processor on (which min-p must precede, so the batch goes through
    the torch pre-mask): the rows the processor leaves alone keep the fused min-p draw. It
    differed at 8 of 20 positions. The processor's own row, min-p and all, draws the same
    token whatever its neighbour's min-p."""
    device = "cuda" if CUDA else "cpu"
    V = 500
    gen = torch.Generator().manual_seed(11)
    mine, other = (torch.randn(V, generator=gen) * 2).to(device), torch.randn(V, generator=gen).to(device)
    opts = {} if CUDA or backend == "torch" else dict(tile=64, cap=128, num_chunks=2)
    sampler = Sampler(backend=backend, kernel_options=opts)

    def tokens(rows, pos):   # rows: (logits, min_p, seed, halve) per request
        procs = build_logits_processors(4, V, device, custom=[HalveUsers], use_entry_points=False)
        added = [(i, SimpleNamespace(extra_args={"halve": r[3]}), None, []) for i, r in enumerate(rows)]
        procs.update_state(BatchUpdate(batch_size=len(rows), added=added))
        md = SamplingMetadata.from_params([0.9] * len(rows), vocab_size=V, device=device,
                                          min_p=[r[1] for r in rows], seeds=[r[2] for r in rows],
                                          positions=[pos] * len(rows), logitsprocs=procs,
                                          rows=LogitsRows.identity(len(rows)))
        return sampler(torch.stack([r[0] for r in rows]), md).sampled_token_ids.tolist()

    plain, halved = (mine, 0.1, 1234, False), (other, 0.2, 99, True)
    for pos in range(12):
        alone = tokens([plain], pos)[0]
        assert tokens([plain, halved], pos)[0] == alone
        assert tokens([halved, plain], pos)[1] == alone
        assert tokens([halved], pos)[0] == tokens([halved, (mine, 0.0, None, False)], pos)[0]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_logits_made_under_inference_mode_or_requiring_grad_are_sampled_unwritten(backend):
    """Logits from a model run under torch.inference_mode(), sampled outside it with penalties
    and allowed ids (which the Sampler writes in place): torch refuses to write an inference
    tensor there, so the Sampler writes a copy; same tokens as for ordinary logits."""
    device = "cuda" if CUDA else "cpu"
    V = 64
    md = SamplingMetadata.from_params([0.0, 0.8], vocab_size=V, device=device, seeds=[None, 5],
                                      repetition_penalties=[1.3, 1.0], frequency_penalties=[0.0, 0.5],
                                      prompt_mask=torch.rand(2, V, device=device) < 0.3,
                                      output_counts=torch.randint(0, 3, (2, V), dtype=torch.int32, device=device),
                                      allowed_token_ids=[None, list(range(0, V, 2))])
    opts = {} if CUDA or backend == "torch" else dict(tile=16, cap=64, num_chunks=2)
    sampler = Sampler(backend=backend, kernel_options=opts)
    base = torch.randn(2, V, device=device)
    with torch.inference_mode():
        logits = base.clone()
    out = sampler(logits, md).sampled_token_ids
    assert torch.equal(logits, base)                                   # not written
    assert torch.equal(out, sampler(base.clone(), md).sampled_token_ids)
    # logits that require grad (a model run outside no_grad), fp32 and bf16: the compiled penalty
    # op refuses to write them, once after the allowed mask had written the caller's tensor
    for dtype in (torch.float32, torch.bfloat16):
        weight = base.to(dtype).requires_grad_()
        logits = weight * 1
        out = sampler(logits, md).sampled_token_ids
        assert torch.equal(logits.detach(), base.to(dtype))           # not written
        assert torch.equal(out, sampler(base.to(dtype), md).sampled_token_ids)


# ---- processors and the persistent batch ----------------------------------------------------

def test_batch_update_removed_added_moved_in_order():
    V = 20
    minp = MinPLogitsProcessor(4, V)
    bias = LogitBiasLogitsProcessor(4, V)
    out0, out1 = [], [5]
    for proc in (minp, bias):
        proc.update_state(BatchUpdate(2, added=[(0, params(min_p=0.1, logit_bias={3: 1.0}), [1], out0),
                                                (1, params(min_p=0.2), [1], out1)]))
    # request 0 leaves, a new one lands on index 0, then 0 and 1 swap, then 1 moves to 3
    upd = BatchUpdate(2, removed=[0], added=[(0, params(min_p=0.3, logit_bias={4: -1.0}), [2], [])],
                      moved=[(0, 1, MoveDirectionality.SWAP), (1, 3, MoveDirectionality.UNIDIRECTIONAL)])
    for proc in (minp, bias):
        proc.update_state(upd)
    assert minp.min_p.tolist() == pytest.approx([0.2, 0.0, 0.0, 0.3])
    assert bias.state == {3: ([4], [-1.0])}
    rows = LogitsRows([3, 0, 3], [0, 1, 1])
    assert minp.row_min_p(rows, 3, "cpu").tolist() == pytest.approx([0.3, 0.2, 0.3])
    x = torch.zeros(3, V)
    bias.apply(x, rows)
    assert x[0, 4] == -1.0 and x[2, 4] == -1.0 and x[1].abs().sum() == 0


def test_min_tokens_follows_live_output_lists_and_spec_rows():
    V = 10
    proc = MinTokensLogitsProcessor(2, V, eos_token_ids=[EOS])
    out = [1, 1]
    proc.update_state(BatchUpdate(1, added=[(0, params(min_tokens=3, stop_token_ids=[7]), [0], out)]))
    x = torch.zeros(1, V)
    proc.apply(x)
    assert x[0, EOS] == -torch.inf and x[0, 7] == -torch.inf
    # speculative rows of the same request: 2 committed outputs, then 0, 1, 2 drafts before the row
    x = torch.zeros(3, V)
    proc.apply(x, LogitsRows([0, 0, 0], [2, 3, 4], [[], [4], [4, 5]]))
    assert x[:, EOS].tolist() == [-torch.inf, 0.0, 0.0]
    out.append(3)             # the live list grew: min_tokens reached, the state drops the request
    proc.update_state(None)
    assert not proc.is_active()


def test_loader_by_name_and_entry_point(tmp_path, monkeypatch):
    mod = tmp_path / "my_procs_mod.py"
    mod.write_text(textwrap.dedent("""
        import torch
        from specops.sampling import LogitsProcessor

        class BanZero(LogitsProcessor):
            def is_argmax_invariant(self):
                return False
            def update_state(self, batch_update):
                pass
            def apply(self, logits, rows=None):
                logits[:, 0] = -torch.inf
                return logits

        class NotAProcessor:
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = load_processor_class("my_procs_mod:BanZero")
    assert cls.__name__ == "BanZero"
    with pytest.raises(TypeError, match="subclass"):
        load_processor_class("my_procs_mod:NotAProcessor")
    with pytest.raises(ValueError, match="module.path:ClassName"):
        load_processor_class("my_procs_mod.BanZero")
    with pytest.raises(ValueError, match="has no class"):
        load_processor_class("my_procs_mod:Missing")
    # an empty half, a module that raises while importing, an abstract class: named errors (were importlib's
    # "Empty module name", the module's own RuntimeError, and a failure only when the processor was built)
    (tmp_path / "my_broken_mod.py").write_text("raise RuntimeError('boom')\n")
    for spec, exc, words in [(":BanZero", ValueError, "module.path:ClassName"),
                             ("my_procs_mod:", ValueError, "module.path:ClassName"),
                             ("my_broken_mod:X", ValueError, "my_broken_mod.*RuntimeError: boom"),
                             ("specops.sampling:LogitsProcessor", TypeError, "is abstract: it does not implement")]:
        with pytest.raises(exc, match=words):
            load_processor_class(spec)

    class BrokenEP:
        name, value = "mine", "nosuchmod_abc:X"

        def load(self):
            raise ModuleNotFoundError("No module named 'nosuchmod_abc'")

    monkeypatch.setattr(loader_mod, "entry_points", lambda group: [BrokenEP()])
    with pytest.raises(ValueError, match="entry point 'mine' = 'nosuchmod_abc:X' of group .*No module named"):
        build_logits_processors(2, 5)
    assert len(build_logits_processors(2, 5, use_entry_points=False)) == 3   # the built-ins, without the group

    class EP:
        def load(self):
            return cls

    monkeypatch.setattr(loader_mod, "entry_points", lambda group: [EP()] if group == "specops.logits_processors" else [])
    procs = build_logits_processors(2, 5)
    assert any(type(p).__name__ == "BanZero" for p in procs.non_argmax_invariant)
    md = SamplingMetadata.from_params([0.0, 0.0], vocab_size=5, logitsprocs=procs)
    logits = torch.tensor([[9.0, 1, 2, 3, 4], [9.0, 5, 1, 1, 1]])
    assert Sampler(backend="torch")(logits, md).sampled_token_ids.tolist() == [4, 1]
    del sys.modules["my_procs_mod"]


def test_one_custom_processor_name_is_not_read_as_its_characters():
    # custom="module:Class" (a str, not a list) was iterated character by character ("got 'g'")
    name = "specops.sampling.logits_processors:MinPLogitsProcessor"
    one = build_logits_processors(2, 10, "cpu", custom=name, use_entry_points=False, builtin=False)
    assert [type(p) for p in one.all] == [MinPLogitsProcessor]
    one = build_logits_processors(2, 10, "cpu", custom=MinPLogitsProcessor, use_entry_points=False, builtin=False)
    assert [type(p) for p in one.all] == [MinPLogitsProcessor]


def test_a_built_in_named_as_custom_is_built_once():
    # naming a built-in among the custom processors (or in the entry-point group) built it a
    # second time: a request's logit_bias was added twice (found by a review)
    name = "specops.sampling.logits_processors:LogitBiasLogitsProcessor"
    procs = build_logits_processors(1, 5, custom=[name, "specops.sampling.logits_processors:MinPLogitsProcessor"],
                                    use_entry_points=False)
    assert sorted(type(p).__name__ for p in procs.all) == ["LogitBiasLogitsProcessor", "MinPLogitsProcessor",
                                                           "MinTokensLogitsProcessor"]
    procs.update_state(BatchUpdate(1, added=[(0, params(logit_bias={4: 3.0}), [1], [])]))
    md = SamplingMetadata.from_params([0.0], vocab_size=5, logitsprocs=procs)
    logits = torch.tensor([[9.0, 1, 2, 3, 4]])
    out = Sampler(backend="torch").process(logits.clone(), md).logits
    assert out[0].tolist() == [9.0, 1, 2, 3, 7.0]      # + 3 once
    # without the built-ins a built-in named as custom is built, once however often it is named
    procs = build_logits_processors(1, 5, custom=[name, name], use_entry_points=False, builtin=False)
    assert [type(p).__name__ for p in procs.all] == ["LogitBiasLogitsProcessor"]


# ---- logprobs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, backend", [("raw_logprobs", "torch"), ("raw_logits", "torch"),
                                           ("processed_logprobs", "torch"), ("processed_logits", "torch"),
                                           ("raw_logprobs", "triton"), ("processed_logprobs", "triton"),
                                           ("processed_logits", "triton")])
def test_logprobs_modes(mode, backend):
    g = fresh_gen()
    V, n = 40, 5
    device = "cuda" if CUDA and backend == "triton" else "cpu"     # Triton on CPU: the interpreter
    md = SamplingMetadata.from_params([1.0, 0.5, 0.0, 1.0, 2.0], vocab_size=V, top_k=[5, 0, 0, 0, 3],
                                      top_p=[1.0, 0.7, 1.0, 1.0, 1.0], seeds=[1, 2, 3, 4, 5], max_num_logprobs=4,
                                      repetition_penalties=[1.5] * n,
                                      prompt_mask=(torch.rand(n, V, generator=g) < 0.3).to(device),
                                      output_counts=torch.zeros(n, V, dtype=torch.int32, device=device),
                                      device=device)
    logits = (torch.randn(n, V, generator=g) * 2).to(device)
    logits[3, 6] = float("nan")                          # invalid row
    out = Sampler(logprobs_mode=mode, backend=backend)(logits.clone(), md)
    lp = out.logprobs
    tok = out.sampled_token_ids
    assert tok[3] == -1 and lp.ranks[3] == -1 and lp.token_ids[3, 0] == -1
    ok = torch.tensor([0, 1, 2, 4], device=device)
    if mode.startswith("raw"):
        vals = logits.float()
        if mode == "raw_logprobs":
            vals = torch.log_softmax(vals, dim=-1)
    else:
        proc = logits.clone()
        apply_penalties_torch(proc, md.prompt_mask, md.output_counts, md.repetition_penalties,
                              md.frequency_penalties, md.presence_penalties)
        x = torch.where(md.inv_temperature.unsqueeze(1) > 0, proc * md.inv_temperature.unsqueeze(1), proc)
        res = out.result
        vals = torch.where(x >= res.threshold.unsqueeze(1), x, -torch.inf)
        if mode == "processed_logprobs":
            vals = torch.log_softmax(vals, dim=-1)
    vals = vals[ok]
    t = tok[ok]
    torch.testing.assert_close(lp.logprobs[ok, 0], vals.gather(1, t.unsqueeze(1)).squeeze(1))
    top = vals.topk(4, dim=-1)
    torch.testing.assert_close(lp.logprobs[ok, 1:], top.values)
    assert torch.equal(lp.ranks[ok], (vals > vals.gather(1, t.unsqueeze(1))).sum(-1) + 1)
    if mode.startswith("processed"):  # the sampled token is inside the processed support
        assert bool((lp.logprobs[ok, 0] > -torch.inf).all())


def test_keep_drawn_tokens_widens_only_rows_whose_token_is_cut():
    from specops.sampling.sampler_torch import keep_drawn_tokens
    g = fresh_gen()
    R, V = 4, 60
    logits = torch.randn(R, V, generator=g) * 2
    logits[2, 5] = float("nan")                                     # invalid row
    inv_t = torch.tensor([1.0, 0.8, 1.0, -1.0])                     # the last row greedy
    res = sample_torch(logits, inv_t, None, torch.full((R,), 0.6), None, torch.arange(R), torch.zeros(R, dtype=torch.int64))
    x = scale_logits(logits, inv_t)
    cut = torch.where(x[1] < res.threshold[1], x[1], -torch.inf)
    tokens = res.tokens.clone()
    tokens[1] = int(cut.argmax())                                   # the largest value the threshold cut
    wide = keep_drawn_tokens(x, res, tokens)
    assert torch.equal(wide.tokens, tokens)
    for name in ("threshold", "row_max", "log_norm"):               # other rows: bit for bit
        a, b = getattr(wide, name)[[0, 2, 3]], getattr(res, name)[[0, 2, 3]]
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), name
    assert wide.threshold[1] == x[1, tokens[1]] < res.threshold[1]
    kept = x[1][x[1] >= x[1, tokens[1]]].double()
    assert math.isclose(float(wide.log_norm[1]), float(torch.logsumexp(kept - float(res.row_max[1]), 0)),
                        rel_tol=1e-6)
    lp = compute_logprobs("processed_logprobs", 2, tokens, processed_logits=logits, inv_temperature=inv_t,
                          result=wide)
    want = torch.log_softmax(torch.where(x[1] >= wide.threshold[1], x[1], -torch.inf).double(), 0)[tokens[1]]
    assert math.isclose(float(lp.logprobs[1, 0]), float(want), rel_tol=1e-5)
    before = compute_logprobs("processed_logprobs", 2, tokens, processed_logits=logits, inv_temperature=inv_t,
                              result=res)
    assert float(before.logprobs[1, 0]) == -math.inf                # what the draw's token got before


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sampler_reports_a_drawn_token_the_threshold_cut(monkeypatch, backend):
    # the tokens-only draw and the threshold search may disagree at a float near-tie of the top-p
    # boundary: stand in for that by moving row 0's drawn token just below the threshold
    g = fresh_gen()
    R, V = 3, 50
    device = "cuda" if CUDA and backend == "triton" else "cpu"     # Triton on CPU: the interpreter
    md = SamplingMetadata.from_params([1.0, 0.7, 1.0], vocab_size=V, top_p=[0.6, 0.8, 1.0], seeds=[1, 2, 3],
                                      max_num_logprobs=1, device=device)
    logits = (torch.randn(R, V, generator=g) * 2).to(device)
    sampler = Sampler(logprobs_mode="processed_logprobs", backend=backend)
    real = Sampler.sample_processed
    cut = {}

    def draw(self, processed, metadata, stream=None, distribution=True):
        res = real(self, processed, metadata, stream, distribution)
        if distribution:
            cut["thr"] = res.threshold[0]
            return res
        x0 = processed.logits[0].float()
        below = torch.where(x0 < cut["thr"], x0, -torch.inf)
        tokens = res.tokens.clone()
        tokens[0] = int(below.argmax())
        cut["tok"] = tokens[0]
        return replace(res, tokens=tokens)

    monkeypatch.setattr(Sampler, "sample_processed", draw)
    out = sampler(logits.clone(), md)
    assert out.sampled_token_ids[0] == cut["tok"]
    assert out.result.threshold[0] == logits[0, cut["tok"]] < cut["thr"]
    x0 = logits[0].double()
    want = torch.log_softmax(torch.where(x0 >= x0[cut["tok"]], x0, -torch.inf), 0)[cut["tok"]]
    assert math.isclose(float(out.logprobs.logprobs[0, 0]), float(want), rel_tol=1e-5)
    assert bool((out.logprobs.logprobs[:, 0] > -torch.inf).all())


def test_logprobs_mode_is_checked():
    with pytest.raises(ValueError, match="logprobs_mode"):
        Sampler(logprobs_mode="probs")
    with pytest.raises(ValueError, match="raw_logits"):
        compute_logprobs("raw_logprobs", 2, torch.zeros(1, dtype=torch.int64))
    # the processed modes' per-row inputs: a shorter one broadcast silently (one row's
    # temperature for every row, a logprob of +0.25)
    R, V = 4, 10
    x = torch.randn(R, V, generator=fresh_gen())
    md = SamplingMetadata.from_params([1.0] * R, vocab_size=V, seeds=[1, 2, 3, 4], max_num_logprobs=2)
    out = Sampler(logprobs_mode="processed_logprobs", backend="torch")(x.clone(), md)
    res, tok = out.result, out.sampled_token_ids
    inv_t = torch.ones(R)
    for kw, words in ((dict(inv_temperature=torch.ones(1)), r"inv_temperature must have shape \[4\]"),
                      (dict(inv_temperature=torch.ones(R, 1)), r"inv_temperature must have shape \[4\]"),
                      (dict(result=replace(res, threshold=res.threshold[:1])), r"result.threshold must have shape"),
                      (dict(result=replace(res, log_norm=res.log_norm[:1])), r"result.log_norm must have shape")):
        args = {**dict(processed_logits=x, inv_temperature=inv_t, result=res), **kw}
        with pytest.raises(ValueError, match=words):
            compute_logprobs("processed_logprobs", 2, tok, **args)
    good = compute_logprobs("processed_logprobs", 2, tok, processed_logits=x, inv_temperature=inv_t, result=res)
    assert torch.equal(good.logprobs, out.logprobs.logprobs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_top_p_that_is_zero_in_fp32_keeps_the_max_beside_a_top_k(backend):
    # top_p = 1e-46 is in (0, 1] but 0 in fp32, where the Triton kernels' top_p <= 0 beside a
    # top-k keeps the whole top-k set (10 tokens over 32 seeds); the metadata stores FP32_TINY,
    # which keeps the max alone, as any top_p <= 1/V does and as the torch reference did
    device = "cuda" if CUDA else "cpu"
    V, n = 300, 12
    row = torch.randn(1, V, generator=fresh_gen()).to(device)
    md = SamplingMetadata.from_params([1.0] * n, vocab_size=V, top_p=[1e-46] * 6 + [1e-300] * 6, top_k=[10] * n,
                                      seeds=list(range(n)), device=device)
    tokens = Sampler(backend=backend)(row.expand(n, V).contiguous(), md).sampled_token_ids
    assert tokens.flatten().tolist() == [row.argmax().item()] * n
