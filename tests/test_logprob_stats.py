"""The fused logprobs kernel (specops.triton_kernels.logprob_stats) against the torch path.

compute_logprobs(backend="triton") must give what backend="torch" gives for the raw modes:
ids and ranks exactly (the top-1 of tied maxima is the first index; ties among the top n,
n >= 2, may come in another order, checked to be ties), values to fp32 rounding. Cases:
awkward shapes, fp32/bf16/fp16, ties across chunks, the chosen token being the max, -inf
entries, NaN/+inf/all -inf rows, invalid tokens, strided rows, several blocks per program,
batch invariance. CPU runs the Triton interpreter at small shapes; CUDA adds full vocabularies
and CUDA-graph capture.
"""

import pytest
import torch

import specops.triton_kernels.logprob_stats as logprob_stats_module
from specops.sampling.logprobs import LogprobsTensors, compute_logprobs
from specops.sampling.topk_topp import resolve_backend
from specops.triton_kernels.logprob_stats import chunk_geometry, logprob_stats

CUDA = torch.cuda.is_available()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def device() -> str:
    """The kernel's device: CUDA (compiled) when present, else CPU (interpreter): never both."""
    return "cuda" if CUDA else "cpu"


def first_max_index(x: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R]: the first NaN if the row has one, else the first index of the max."""
    x = x.float()
    nan = torch.isnan(x)
    arg = torch.where(nan, float("-inf"), x).argmax(dim=-1)          # torch.argmax: first of ties
    return torch.where(nan.any(dim=-1), nan.int().argmax(dim=-1), arg)


def check(scores, tokens, n, mode, out=None):
    """Triton result (or `out`) against the torch path on the same inputs."""
    a = out or compute_logprobs(mode, n, tokens, raw_logits=scores, backend="triton")
    b = compute_logprobs(mode, n, tokens, raw_logits=scores, backend="torch")
    assert a.token_ids.shape == b.token_ids.shape and a.logprobs.dtype == torch.float32
    assert torch.equal(a.ranks, b.ranks)
    assert torch.equal(a.token_ids[:, 0], b.token_ids[:, 0])
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5, equal_nan=True)
    if n == 0 or scores.shape[0] == 0:
        return
    x = scores.float()
    valid = (tokens >= 0) & (tokens < scores.shape[1])
    ia, ib = a.token_ids[:, 1:], b.token_ids[:, 1:]
    assert bool((ia[~valid] == -1).all())
    diff = valid.unsqueeze(1) & (ia != ib)
    if diff.any():                                  # only ties may come in another order
        va, vb = x.gather(1, ia.clamp(min=0)), x.gather(1, ib.clamp(min=0))
        same = (va == vb) | (torch.isnan(va) & torch.isnan(vb))
        assert bool(same[diff].all()), (ia[diff], ib[diff])
    if n == 1:
        assert torch.equal(ia[valid, 0], first_max_index(x)[valid])


def random_scores(R, V, dtype, device, scale=3.0):
    return (torch.randn(R, V, device=device) * scale).to(dtype)


def random_tokens(R, V, device, invalid=0.2):
    t = torch.randint(0, V, (R,), device=device)
    return torch.where(torch.rand(R, device=device) < invalid, torch.full_like(t, -1), t)


def empty_outputs(R, n, device):
    """(ids [R, n + 1] int64, vals [R, n + 1] fp32, ranks [R] int64, lse [R] fp32) for logprob_stats."""
    return (torch.empty(R, n + 1, dtype=torch.int64, device=device), torch.empty(R, n + 1, device=device),
            torch.empty(R, dtype=torch.int64, device=device), torch.empty(R, device=device))


def vocabs(device):
    return [17, 1000, 4099] + ([128256, 151936] if device == "cuda" else [])


# R = 33 in fp32 only on CPU: the interpreter runs every program in turn
SHAPES = [(R, dt) for R in (0, 1, 3) for dt in DTYPES] + [(33, torch.float32)]


@pytest.mark.parametrize("R, dtype", SHAPES + ([(33, torch.bfloat16), (33, torch.float16)] if CUDA else []),
                         ids=str)
def test_random_rows(device, R, dtype):
    for V in vocabs(device):
        x = random_scores(R, V, dtype, device)
        tok = random_tokens(R, V, device)
        for n, mode in ((0, "raw_logprobs"), (1, "raw_logprobs"), (5, "raw_logprobs"), (1, "raw_logits")):
            check(x, tok, n, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_rows(device, dtype):
    """Ties at the max across chunks, chosen = max, -inf entries, NaN / +inf / all -inf rows."""
    inf, nan = float("inf"), float("nan")
    for V in vocabs(device)[1:]:
        R = 10
        x = random_scores(R, V, torch.float32, device)
        top = float(x.max()) + 1.0
        last = V - 1
        x[0, [last, 3, V // 2]] = top                  # ties in several chunks: first index wins
        x[1, V // 2] = top                             # the chosen token is the max (rank 1)
        x[2, torch.rand(V, device=device) < 0.5] = -inf
        x[3] = -inf                                    # all -inf: logsumexp -inf, NaN logprobs
        x[4, [7, last]] = nan                          # NaN: its first index is the top-1
        x[5, [last, 11]] = inf
        x[6, 5], x[6, last] = inf, nan
        x[7] = nan
        x[8, :] = 1.25                                 # every token tied
        x[9, 0] = top                                  # the max at index 0
        x = x.to(dtype)
        tok = torch.tensor([3, V // 2, 0, 1, 7, 0, 5, 2, last, 0], device=device)
        tok[2] = int(torch.nonzero(x[2].float() > -inf)[0])
        for n, mode in ((0, "raw_logprobs"), (1, "raw_logprobs"), (3, "raw_logprobs"), (1, "raw_logits")):
            check(x, tok, n, mode)
        out = compute_logprobs("raw_logprobs", 1, tok, raw_logits=x, backend="triton")
        assert out.ranks[1] == 1 and out.token_ids[1, 1] == V // 2
        assert out.token_ids[0, 1] == 3 and out.token_ids[3, 1] == 0 and out.token_ids[4, 1] == 7
        assert out.token_ids[8, 1] == 0 and out.ranks[8] == 1
        assert bool(torch.isnan(out.logprobs[[3, 4, 6, 7]]).all())
        assert out.logprobs[5, 0] == -inf and out.token_ids[5, 1] == 11 and torch.isnan(out.logprobs[5, 1])


def test_invalid_tokens(device):
    x = random_scores(4, 1000, torch.float32, device)
    tok = torch.tensor([-1, 5, -1, 1000], device=device)    # 1000 = V: out of range, like -1
    for n in (0, 1, 4):
        out = compute_logprobs("raw_logprobs", n, tok, raw_logits=x, backend="triton")
        bad = torch.tensor([True, False, True, True], device=device)
        assert bool((out.token_ids[bad] == -1).all()) and bool((out.ranks[bad] == -1).all())
        assert bool(torch.isnan(out.logprobs[bad]).all())
        assert not bool(torch.isnan(out.logprobs[1]).any())
        check(x[:3], tok[:3], n, "raw_logprobs")


def test_tokens_outside_the_vocabulary_are_invalid_rows_on_both_backends(device):
    """A token id >= V (or < -1) is an invalid row on the torch path too (it raised a bare
    "index out of bounds" there, where the Triton path gave ids -1, NaN values and rank -1),
    in the raw and the processed modes, with and without `widen`."""
    V = 17
    x = random_scores(5, V, torch.float32, device)
    tok = torch.tensor([3, V, -1, 40, -7], device=device)
    bad = torch.tensor([False, True, True, True, True], device=device)
    for mode in ("raw_logprobs", "raw_logits"):
        for n in (0, 1, 3):
            out = compute_logprobs(mode, n, tok, raw_logits=x, backend="torch")
            assert bool((out.token_ids[bad] == -1).all()) and bool((out.ranks[bad] == -1).all())
            assert bool(torch.isnan(out.logprobs[bad]).all()) and not bool(torch.isnan(out.logprobs[0]).any())
            check(x, tok, n, mode)
    logits, inv_t, res, tokens = processed_case(6, V, torch.float32, device, seed=5)
    tokens = tokens.clone()
    tokens[4], tokens[5] = V, V + 100
    for mode in ("processed_logprobs", "processed_logits"):
        for widen in (False, True):
            out, wide = check_processed(logits, inv_t, res, tokens, 2, mode, widen)
            assert bool((out.token_ids[4:] == -1).all()) and bool((out.ranks[4:] == -1).all())
            assert torch.equal(wide.threshold[4:], res.threshold[4:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_strided_rows(device, dtype):
    """Rows of a wider tensor (any row stride, odd offset), and a column-strided view."""
    R, V = 5, 4099
    wide = random_scores(R, V + 37, dtype, device)
    x = wide[:, 3:3 + V]
    tok = random_tokens(R, V, device)
    for n in (1, 5):
        check(x, tok, n, "raw_logprobs")
    t = random_scores(V, R, dtype, device).t()                  # column stride R
    check(t, tok, 1, "raw_logprobs")


def test_several_blocks_per_program(device):
    """Small blocks and few chunks: the running max / sum across blocks of one program."""
    R, V = 6, 500
    assert chunk_geometry(V, 16, 4) == (16, 8, 4)
    x = random_scores(R, V, torch.float32, device)
    x[0, 250:] = -float("inf")
    x[1, 100:300] = float(x[1].max()) + 1                        # ties inside and across blocks
    x[2, 499] = float("nan")
    x[3, 257] = float("inf")
    tok = random_tokens(R, V, device, invalid=0.0)
    for log_norm, mode in ((True, "raw_logprobs"), (False, "raw_logits")):
        ids = torch.empty(R, 2, dtype=torch.int64, device=device)
        vals = torch.empty(R, 2, device=device)
        ranks = torch.empty(R, dtype=torch.int64, device=device)
        lse = torch.empty(R, device=device)
        logprob_stats(x, tok, ids, vals, ranks, lse, log_norm=log_norm, top1=True, block=16, max_chunks=4)
        check(x, tok, 1, mode, out=LogprobsTensors(ids, vals, ranks))
        torch.testing.assert_close(lse, torch.logsumexp(x, dim=-1), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_batch_invariance(device):
    """A row's result is bitwise the same alone and inside a larger batch."""
    V = vocabs(device)[-1]
    x = random_scores(33, V, torch.bfloat16, device)
    tok = random_tokens(33, V, device, invalid=0.0)
    full = compute_logprobs("raw_logprobs", 1, tok, raw_logits=x, backend="triton")
    for r in (0, 17, 32):
        one = compute_logprobs("raw_logprobs", 1, tok[r:r + 1], raw_logits=x[r:r + 1], backend="triton")
        assert torch.equal(one.token_ids, full.token_ids[r:r + 1]) and torch.equal(one.ranks, full.ranks[r:r + 1])
        assert torch.equal(one.logprobs, full.logprobs[r:r + 1])


def test_auto_backend_dispatch(device, monkeypatch):
    """backend="auto" runs the Triton kernel on CUDA and torch elsewhere; "triton" always runs it
    (under the interpreter on CPU)."""
    want = "triton" if device == "cuda" else "torch"
    assert resolve_backend("auto", torch.device(device)) == want
    calls = []

    def recording(scores, *args, **kwargs):   # the Triton launcher, which the triton path imports per call
        calls.append(scores.device.type)
        return logprob_stats(scores, *args, **kwargs)

    monkeypatch.setattr(logprob_stats_module, "logprob_stats", recording)
    x = random_scores(3, 1000, torch.float32, device)
    tok = random_tokens(3, 1000, device)
    auto = compute_logprobs("raw_logprobs", 1, tok, raw_logits=x)
    assert calls == ([device] if want == "triton" else []), calls
    check(x, tok, 1, "raw_logprobs", out=auto)
    calls.clear()
    tri = compute_logprobs("raw_logprobs", 1, tok, raw_logits=x, backend="triton")
    assert calls == [device], calls
    check(x, tok, 1, "raw_logprobs", out=tri)          # the kernel's result, against torch
    assert torch.equal(auto.token_ids, tri.token_ids) and torch.equal(auto.ranks, tri.ranks)
    if want == "triton":                                # the same kernel: bitwise (a -1 token's row is NaN)
        torch.testing.assert_close(auto.logprobs, tri.logprobs, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(auto.logprobs, tri.logprobs, rtol=1e-5, atol=1e-5, equal_nan=True)
    with pytest.raises(ValueError, match="backend"):
        compute_logprobs("raw_logprobs", 1, tok, raw_logits=x, backend="cuda")


@pytest.mark.skipif(CUDA, reason="CUDA runs full vocabularies in every test")
def test_full_vocab_row_cpu():
    """One 128256-token row under the interpreter (CUDA covers full vocabularies everywhere)."""
    x = random_scores(1, 128256, torch.bfloat16, "cpu")
    tok = torch.tensor([4242])
    check(x, tok, 1, "raw_logprobs")


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_cuda_graph_capture():
    R, V = 32, 128256
    x = random_scores(R, V, torch.bfloat16, "cuda")
    tok = random_tokens(R, V, "cuda")
    for n in (1, 5):
        fn = lambda: compute_logprobs("raw_logprobs", n, tok, raw_logits=x, backend="triton")  # noqa: E731
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        x.copy_(random_scores(R, V, torch.bfloat16, "cuda"))
        g.replay()
        torch.cuda.synchronize()
        check(x, tok, n, "raw_logprobs", out=out)


def test_bad_arguments_are_refused_before_any_launch():
    logits, tokens = torch.randn(3, 50), torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match=r"tokens must have shape \[3\], got \(2,\)"):
        compute_logprobs("raw_logprobs", 2, tokens[:2], raw_logits=logits)
    with pytest.raises(TypeError, match="tokens must have dtype in"):
        compute_logprobs("raw_logprobs", 2, tokens.float(), raw_logits=logits)
    with pytest.raises(ValueError, match=r"must be a \[rows, vocab\] tensor, got \(50,\)"):
        compute_logprobs("raw_logprobs", 2, tokens, raw_logits=logits[0])
    with pytest.raises(ValueError, match=r"num_logprobs must be an int in \[0, 50\], got 51"):
        compute_logprobs("raw_logprobs", 51, tokens, raw_logits=logits)
    with pytest.raises(ValueError, match="processed_logprobs needs processed_logits"):
        compute_logprobs("processed_logprobs", 2, tokens, raw_logits=logits)


def test_tied_top1_is_the_first_index_and_int32_tokens_are_taken(device):
    """Both backends name the first of tied maxima as the top-1 (torch.topk ordered ties
    freely on CPU: another index in most small rows), and the Triton one takes int32 tokens
    as compute_logprobs documents (it failed with a bare AssertionError)."""
    scores = torch.tensor([[float(v) for v in "0120212010221002120120201201221"]], device=device)
    for dtype in (torch.int64, torch.int32):
        tok = torch.tensor([0], dtype=dtype, device=device)
        for backend in ("torch", "triton"):
            out = compute_logprobs("raw_logprobs", 1, tok, raw_logits=scores, backend=backend)
            assert out.token_ids[0].tolist() == [0, 2], (backend, dtype)


# ---- the processed modes ("processed_logprobs" / "processed_logits") ---------------------------

def processed_case(R, V, dtype, device, seed=0):
    """Processed logits, 1/T (greedy rows -1), a draw's distribution and tokens: rows keep their top
    k_r values (k_r random), row 1 is invalid (a NaN: threshold NaN, token -1), and the tokens of
    rows 2 and 3 lie below their threshold (what `widen` widens to)."""
    from specops.sampling.sampler_torch import SampleResult, scale_logits
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(R, V, generator=g) * 3).to(dtype)
    inv_t = torch.rand(R, generator=g) * 1.5 + 0.4
    inv_t[0] = -1.0                                               # a greedy row
    logits = logits.to(device)
    inv_t = inv_t.to(device)
    if R > 1:
        logits[1, V // 3] = float("nan")
    x = scale_logits(logits, inv_t)
    k = torch.randint(1, V + 1, (R,), generator=g).to(device)
    thr = x.nan_to_num(float("-inf")).sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
    thr = torch.where(k == V, torch.full_like(thr, float("-inf")), thr)
    row_max = x.nan_to_num(float("-inf")).max(dim=-1).values
    log_norm = torch.logsumexp(torch.where(x >= thr.unsqueeze(1), x - row_max.unsqueeze(1), float("-inf")), dim=-1)
    kept = x >= thr.unsqueeze(1)
    pick = torch.rand(R, V, generator=g).to(device)
    tokens = torch.where(kept, pick, -1.0).argmax(dim=-1)
    below = torch.where(~kept & (x > float("-inf")), pick, -1.0).argmax(dim=-1)
    for r in (2, 3):
        if r < R and bool((~kept[r] & (x[r] > float("-inf"))).any()):
            tokens[r] = below[r]
    if R > 1:
        thr[1], row_max[1], log_norm[1], tokens[1] = float("nan"), float("nan"), float("nan"), -1
    return logits, inv_t, SampleResult(tokens=tokens, threshold=thr, row_max=row_max, log_norm=log_norm), tokens


def check_processed(logits, inv_t, res, tokens, n, mode, widen, **kw):
    """Triton (compute_processed_logprobs) against the torch path on the same inputs."""
    from specops.sampling.logprobs import compute_processed_logprobs
    a, ra = compute_processed_logprobs(mode, n, tokens, logits, inv_t, res, widen=widen, backend="triton", **kw)
    b, rb = compute_processed_logprobs(mode, n, tokens, logits, inv_t, res, widen=widen, backend="torch")
    assert torch.equal(a.ranks, b.ranks)
    assert torch.equal(a.token_ids[:, 0], b.token_ids[:, 0])
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.equal(ra.threshold.nan_to_num(7.0), rb.threshold.nan_to_num(7.0))
    torch.testing.assert_close(ra.log_norm, rb.log_norm, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.equal(ra.tokens, rb.tokens)
    if n >= 1:
        ia, ib = a.token_ids[:, 1:], b.token_ids[:, 1:]
        diff = ia != ib
        if diff.any():                                  # only ties may come in another order
            from specops.sampling.sampler_torch import scale_logits
            x = scale_logits(logits, inv_t)
            va, vb = x.gather(1, ia.clamp(min=0)), x.gather(1, ib.clamp(min=0))
            assert bool(((va == vb) | (torch.isnan(va) & torch.isnan(vb)))[diff].all())
    return a, ra


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_processed_modes_match_torch(device, dtype):
    for V in vocabs(device):
        for R in (1, 6):
            logits, inv_t, res, tokens = processed_case(R, V, dtype, device, seed=V + R)
            for mode in ("processed_logprobs", "processed_logits"):
                for n in (0, 1, 4):
                    for widen in (False, True):
                        check_processed(logits, inv_t, res, tokens, n, mode, widen)


def test_processed_widen_changes_only_rows_whose_token_is_cut(device):
    """`widen` lowers the threshold of rows 2 and 3 (tokens below it) to their token and sums
    log_norm again; every other row keeps the distribution bit for bit, and the widened token's
    logprob is finite where it was -inf."""
    from specops.sampling.logprobs import compute_processed_logprobs
    from specops.sampling.sampler_torch import scale_logits
    logits, inv_t, res, tokens = processed_case(6, 1000, torch.float32, device, seed=3)
    x = scale_logits(logits, inv_t)
    assert bool((x[[2, 3]].gather(1, tokens[[2, 3]].unsqueeze(1)).squeeze(1) < res.threshold[[2, 3]]).all())
    before, _ = compute_processed_logprobs("processed_logprobs", 1, tokens, logits, inv_t, res, backend="triton")
    after, wide = check_processed(logits, inv_t, res, tokens, 1, "processed_logprobs", True)
    assert bool((before.logprobs[[2, 3], 0] == float("-inf")).all())
    assert bool(torch.isfinite(after.logprobs[[2, 3], 0]).all())
    same = [0, 1, 4, 5]
    for name in ("threshold", "log_norm"):
        assert torch.equal(getattr(wide, name)[same].nan_to_num(7.0), getattr(res, name)[same].nan_to_num(7.0))
    for r in (2, 3):
        assert wide.threshold[r] == x[r, tokens[r]]
        kept = x[r][x[r] >= x[r, tokens[r]]].double()
        want = torch.logsumexp(kept - float(res.row_max[r]), 0)
        assert abs(float(wide.log_norm[r]) - float(want)) < 1e-5 * max(1.0, abs(float(want)))


def test_processed_strided_rows(device):
    """Rows with a stride past their width (a view into wider logits) give what contiguous rows give
    (one block per row at V = 500: several blocks per program are test_processed_blocks_of_16's)."""
    logits, inv_t, res, tokens = processed_case(5, 500, torch.float32, device, seed=11)
    for widen in (False, True):
        check_processed(logits, inv_t, res, tokens, 1, "processed_logprobs", widen)
    wide = torch.randn(5, 537, device=device)
    wide[:, 3:503] = logits
    for widen in (False, True):
        check_processed(wide[:, 3:503], inv_t, res, tokens, 3, "processed_logprobs", widen)


def test_processed_blocks_of_16(device, monkeypatch):
    """Several blocks per program of pass 1: the running sums over x >= the chosen value."""
    import specops.triton_kernels.logprob_stats as mod
    logits, inv_t, res, tokens = processed_case(5, 500, torch.float32, device, seed=12)
    orig = mod.processed_logprob_stats
    monkeypatch.setattr(mod, "processed_logprob_stats", lambda *a, **kw: orig(*a, **kw, block=16, max_chunks=4))
    assert chunk_geometry(500, 16, 4) == (16, 8, 4)
    for widen in (False, True):
        for n in (1, 5):
            check_processed(logits, inv_t, res, tokens, n, "processed_logprobs", widen)


def test_processed_batch_invariance(device):
    from specops.sampling.logprobs import compute_processed_logprobs
    from specops.sampling.sampler_torch import SampleResult
    V = vocabs(device)[-1]
    logits, inv_t, res, tokens = processed_case(9, V, torch.bfloat16, device, seed=5)
    full, wfull = compute_processed_logprobs("processed_logprobs", 1, tokens, logits, inv_t, res, widen=True,
                                             backend="triton")
    for r in (0, 3, 8):
        one_res = SampleResult(*(t[r:r + 1] for t in (res.tokens, res.threshold, res.row_max, res.log_norm)))
        one, wone = compute_processed_logprobs("processed_logprobs", 1, tokens[r:r + 1], logits[r:r + 1],
                                               inv_t[r:r + 1], one_res, widen=True, backend="triton")
        assert torch.equal(one.logprobs, full.logprobs[r:r + 1]) and torch.equal(one.ranks, full.ranks[r:r + 1])
        assert torch.equal(wone.log_norm, wfull.log_norm[r:r + 1])


# ---- the top n listed by the kernels (2 <= n <= MAX_TOP_N; more: torch.topk) --------------------

def assert_ties_in_index_order(out, x):
    """The kernels' top-n columns: values not increasing, equal values in increasing index order."""
    ids = out.token_ids[:, 1:]
    ok = (ids >= 0).all(dim=1)
    v = x.float().gather(1, ids.clamp(min=0))
    v = torch.where(torch.isnan(v), float("inf"), v)               # NaN first, as torch.topk
    same = (v[:, 1:] == v[:, :-1]) & ok.unsqueeze(1)
    assert bool((v[:, 1:] <= v[:, :-1])[ok].all())
    assert bool((ids[:, 1:] > ids[:, :-1])[same].all())


@pytest.mark.parametrize("n", [2, 7, 32, 33])
def test_top_n_lists(device, n):
    from specops.triton_kernels.logprob_stats import MAX_TOP_N
    assert MAX_TOP_N == 32                      # n = 33 takes torch.topk
    for V in vocabs(device):
        if n > V:
            continue
        R = 7
        x = random_scores(R, V, torch.float32, device)
        x[1] = torch.round(x[1])                # a few distinct values: ties inside and across chunks
        x[2, [5, V - 1]] = float("nan")         # NaN first
        x[3, :] = 2.0                           # every token tied: the first n indices
        x[4, [0, V // 2, V - 1]] = float("inf")
        x[5, torch.rand(V, device=device) < 0.7] = float("-inf")
        tok = random_tokens(R, V, device)
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            for mode in ("raw_logprobs", "raw_logits"):
                out = compute_logprobs(mode, n, tok, raw_logits=xd, backend="triton")
                check(xd, tok, n, mode, out=out)
                if n <= MAX_TOP_N:
                    assert_ties_in_index_order(out, xd)
                    valid = tok >= 0
                    assert out.token_ids[3, 1:].tolist() == (list(range(n)) if bool(valid[3]) else [-1] * n)


@pytest.mark.parametrize("block, max_chunks", [(2048, 256), (16, 4)], ids=["one-chunk", "chunks-of-64"])
def test_top_n_values_keep_the_sign_of_zero(device, block, max_chunks):
    """The top-n lists rank -0.0 and +0.0 as one value (their int32 keys are equal); the values
    reported are each token's own, bitwise: -0.0 stays -0.0 (it came back as +0.0 from the key).
    Raw and processed logits (not the logprob modes: there the sign of a zero depends on how
    the normaliser is subtracted), fp32 / bf16 / fp16, a greedy row (1/T <= 0), random rows with
    the zeros' signs flipped, and a row whose top values are +-2^-149, which 1/T = 0.5 scales to
    +-0.0 (the value read back must be scaled too); in one chunk or spread over several."""
    from specops.sampling.logprobs import compute_processed_logprobs
    from specops.sampling.sampler_torch import SampleResult, scale_logits
    from specops.triton_kernels.logprob_stats import processed_logprob_stats
    R, V, n = 3, 300, 6
    top = [3, 40, 90, 177, 260]
    x = -torch.rand(R, V, device=device) - 0.5                # every value below -0.5 ...
    x[:, top] = torch.tensor([-0.0, -0.0, 0.0, -0.0, 0.0], device=device)   # ... but five zeros
    x[1, top] = -x[1, top]                                    # the other signs in row 1
    tiny = 2.0 ** -149
    x[2, top] = torch.tensor([tiny, -tiny, tiny, -tiny, -tiny], device=device)
    tok = torch.tensor([5, 40, 3], device=device)
    inv_t = torch.tensor([-1.0, 1.25, 0.5], device=device)  # greedy, random, random (tiny * 0.5 -> +-0.0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        rows = R if dtype == torch.float32 else 2                # 2^-149 is an fp32 value only
        xd, tk, it = x[:rows].to(dtype), tok[:rows], inv_t[:rows]
        ids, vals, ranks, lse = empty_outputs(rows, n, device)
        logprob_stats(xd, tk, ids, vals, ranks, lse, log_norm=False, top1=False, top_n=n, block=block,
                      max_chunks=max_chunks)
        raw_order = [top, top, [3, 90, 40, 177, 260]][:rows]        # ties: lowest index first; +-2^-149 are not ties
        assert ids[:, 1:6].tolist() == raw_order
        want = xd.float().gather(1, ids[:, 1:])
        assert torch.equal(torch.signbit(vals[:, 1:]), torch.signbit(want)) and torch.equal(vals[:, 1:], want)
        scaled = scale_logits(xd, it)
        row_max = scaled.max(dim=-1).values
        res = SampleResult(tk, torch.full((rows,), float("-inf"), device=device), row_max,
                           torch.logsumexp(scaled - row_max.unsqueeze(1), dim=-1))
        if block == 2048:
            pout, _ = compute_processed_logprobs("processed_logits", n, tk, xd, it, res, backend="triton")
            ids, vals = pout.token_ids, pout.logprobs
        else:
            out = [torch.empty(rows, device=device) for _ in range(2)]
            processed_logprob_stats(xd, tk, it, res.threshold, res.row_max, res.log_norm, ids, vals, ranks, *out,
                                    logprobs=False, top1=False, widen=False, top_n=n, block=block,
                                    max_chunks=max_chunks)
        assert ids[:, 1:6].tolist() == [top] * rows
        want = scaled.gather(1, ids[:, 1:])
        if rows == 3:
            assert bool((want[2, :5] == 0).all()) and torch.signbit(want[2, :5]).tolist() == [False, True] * 2 + [True]
        assert torch.equal(torch.signbit(vals[:, 1:]), torch.signbit(want)) and torch.equal(vals[:, 1:], want)


def test_top1_value_keeps_the_sign_of_zero(device):
    """n = 1: the top-1 id is the first of the tied maxima and its value is that token's own:
    the row max, a reduction over -0.0 and +0.0, may come out as either (on the GPU), so a zero
    is read back. Raw and processed logits, zeros of both signs first, over several chunks. (The
    interpreter's max happens to keep the first zero's sign: without the read-back this fails on
    the GPU only.)"""
    from specops.sampling.logprobs import compute_processed_logprobs
    from specops.sampling.sampler_torch import SampleResult, scale_logits
    R, V = 4, 5000
    x = -torch.rand(R, V, device=device) - 0.5
    x[0, [7, 2100, 4999]] = torch.tensor([-0.0, 0.0, 0.0], device=device)      # first zero negative
    x[1, [7, 2100, 4999]] = torch.tensor([0.0, -0.0, -0.0], device=device)      # first zero positive
    x[2, [3000, 3001]] = torch.tensor([-0.0, 0.0], device=device)              # in one chunk
    x[3, [4000]] = -0.0                                                         # one zero only
    tok = torch.tensor([1, 2, 3, 4], device=device)
    inv_t = torch.tensor([-1.0, 1.25, 0.5, 2.0], device=device)
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        out = compute_logprobs("raw_logits", 1, tok, raw_logits=xd, backend="triton")
        assert out.token_ids[:, 1].tolist() == [7, 7, 3000, 4000]
        want = xd.float().gather(1, out.token_ids[:, 1:])
        assert torch.equal(torch.signbit(out.logprobs[:, 1:]), torch.signbit(want))
        scaled = scale_logits(xd, inv_t)
        row_max = scaled.max(dim=-1).values
        res = SampleResult(tok, torch.full((R,), float("-inf"), device=device), row_max,
                           torch.logsumexp(scaled - row_max.unsqueeze(1), dim=-1))
        pout, _ = compute_processed_logprobs("processed_logits", 1, tok, xd, inv_t, res, backend="triton")
        assert pout.token_ids[:, 1].tolist() == [7, 7, 3000, 4000]
        want = scaled.gather(1, pout.token_ids[:, 1:])
        assert torch.equal(torch.signbit(pout.logprobs[:, 1:]), torch.signbit(want))
        assert torch.signbit(pout.logprobs[:, 1]).tolist() == [True, False, True, True]


@pytest.mark.parametrize("block, max_chunks, n", [(16, 4, 9), (64, 2, 9), (64, 2, 3)])
def test_top_n_several_blocks_per_program(device, block, max_chunks, n):
    """Several blocks per program (of 16 or 64 tokens): the running list merged with each block,
    ties inside a block and across blocks."""
    R, V = 5, 500
    x = random_scores(R, V, torch.float32, device)
    x[1] = torch.round(x[1] / 2)
    x[2, 499] = float("nan")
    x[3, 64:200] = 1.5                                  # every key of some blocks tied
    tok = random_tokens(R, V, device, invalid=0.0)
    ids, vals, ranks, lse = empty_outputs(R, n, device)
    logprob_stats(x, tok, ids, vals, ranks, lse, log_norm=True, top1=False, top_n=n, block=block,
                  max_chunks=max_chunks)
    out = LogprobsTensors(ids, vals, ranks)
    check(x, tok, n, "raw_logprobs", out=out)
    assert_ties_in_index_order(out, x)


@pytest.mark.parametrize("n", [2, 7, 33])
def test_processed_top_n(device, n):
    for V in vocabs(device)[1:]:
        logits, inv_t, res, tokens = processed_case(6, V, torch.bfloat16, device, seed=n + V)
        for mode in ("processed_logprobs", "processed_logits"):
            for widen in (False, True):
                out, _ = check_processed(logits, inv_t, res, tokens, n, mode, widen)
    from specops.sampling.logprobs import compute_processed_logprobs
    from specops.sampling.sampler_torch import scale_logits
    logits, inv_t, res, tokens = processed_case(6, 1000, torch.float32, device, seed=1)
    out, _ = compute_processed_logprobs("processed_logprobs", n, tokens, logits, inv_t, res, backend="triton")
    if n <= 32:
        assert_ties_in_index_order(out, scale_logits(logits, inv_t))


def test_a_rows_values_do_not_depend_on_how_many_logprobs_the_batch_asks_for(device):
    """n is the batch's largest request: a row's own logprob (and processed value) must be bitwise
    the same whether the kernels list a top 1, a top 5 or fall back to torch.topk for 40."""
    V = vocabs(device)[-1]
    x = random_scores(5, V, torch.bfloat16, device)
    tok = random_tokens(5, V, device, invalid=0.0)
    outs = [compute_logprobs("raw_logprobs", n, tok, raw_logits=x, backend="triton") for n in (0, 1, 5, 40)]
    for o in outs[1:]:
        assert torch.equal(o.logprobs[:, 0], outs[0].logprobs[:, 0]) and torch.equal(o.ranks, outs[0].ranks)
        assert torch.equal(o.logprobs[:, 1], outs[1].logprobs[:, 1])
    from specops.sampling.logprobs import compute_processed_logprobs
    logits, inv_t, res, tokens = processed_case(5, V, torch.float32, device, seed=9)
    outs = [compute_processed_logprobs("processed_logprobs", n, tokens, logits, inv_t, res, widen=True,
                                       backend="triton") for n in (0, 1, 5, 40)]
    for o, r in outs[1:]:
        assert torch.equal(o.logprobs[:, 0].nan_to_num(7.0), outs[0][0].logprobs[:, 0].nan_to_num(7.0))
        assert torch.equal(r.log_norm.nan_to_num(7.0), outs[0][1].log_norm.nan_to_num(7.0))


def test_processed_num_logprobs_is_checked_before_any_launch():
    """The Sampler calls compute_processed_logprobs directly: an n outside [0, V] raises there too
    (it was clamped silently), and so does a mode that is not a processed one."""
    from specops.sampling.logprobs import compute_processed_logprobs
    logits, inv_t, res, tokens = processed_case(3, 50, torch.float32, "cpu", seed=2)
    for n in (51, -1, 2.0):
        for backend in ("torch", "triton"):
            with pytest.raises(ValueError, match=r"num_logprobs must be an int in \[0, 50\]"):
                compute_processed_logprobs("processed_logprobs", n, tokens, logits, inv_t, res, backend=backend)
    for backend in ("torch", "triton"):          # a raw mode was read as "processed_logits"
        with pytest.raises(ValueError, match="mode must be 'processed_logprobs' or 'processed_logits', got 'raw_logprobs'"):
            compute_processed_logprobs("raw_logprobs", 2, tokens, logits, inv_t, res, backend=backend)
