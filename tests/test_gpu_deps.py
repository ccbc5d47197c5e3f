"""The peers carried to the GPU machine work there: FlashInfer's prebuilt modules and xgrammar.

CUDA only (skipped elsewhere), and skipped per peer when it is absent. bench/gpu_check.sh runs
this file first as its smoke step, so a broken peer shows at once with its error. Each check
compares the peer with a plain torch reference; the statistical one uses a bound that a correct
sampler passes with overwhelming probability.
"""

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DEV = "cuda"


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


@pytest.fixture(scope="module")
def flashinfer():
    return pytest.importorskip("flashinfer")


@pytest.fixture(scope="module")
def xgr():
    return pytest.importorskip("xgrammar")


# ------------------------------------------------------------------ FlashInfer sampling
def test_flashinfer_top_k_top_p_distribution(flashinfer):
    """Per-row top_k/top_p tensors: empirical frequencies match the renormalised kept set."""
    g = _gen(1)
    V, N = 64, 200_000
    row = torch.randn(V, device=DEV, generator=g) * 2
    logits = row.expand(N, V).contiguous()
    top_k = torch.full((N,), 12, device=DEV, dtype=torch.int32)
    top_p = torch.full((N,), 0.8, device=DEV)
    samples = flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, top_k, top_p, generator=g)
    # reference: top-k, then the smallest prefix (by probability) reaching top_p of the renormalised mass
    p = torch.softmax(row.double(), -1)
    order = p.argsort(descending=True)
    pk = torch.zeros_like(p)
    pk[order[:12]] = p[order[:12]]
    pk /= pk.sum()
    cum = pk[order].cumsum(0)
    keep = order[: int((cum < 0.8).sum()) + 1]
    target = torch.zeros_like(p)
    target[keep] = pk[keep]
    target /= target.sum()
    freq = torch.bincount(samples.long(), minlength=V).double() / N
    assert freq[target == 0].sum().item() == 0, "sampled a token outside the top-k/top-p set"
    tv = 0.5 * (freq - target).abs().sum().item()
    assert tv < 0.02, f"total variation {tv:.4f} from the truncated distribution"


def test_flashinfer_int_top_k_fast_path(flashinfer):
    """int top_k <= 256 at vocab >= 65536 takes the radix top-k module (prebuilt 'topk')."""
    g = _gen(2)
    logits = torch.randn(6, 128256, device=DEV, generator=g)
    s = flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, 20, 0.9)
    top = logits.topk(20, dim=-1).indices
    assert bool((top == s.long()[:, None]).any(-1).all())


def test_flashinfer_softmax_mask_and_sampling(flashinfer):
    g = _gen(3)
    logits = torch.randn(5, 1001, device=DEV, generator=g)
    probs = flashinfer.sampling.softmax(logits)
    torch.testing.assert_close(probs, torch.softmax(logits, -1), rtol=1e-4, atol=1e-6)
    masked = flashinfer.sampling.top_k_mask_logits(logits, 10)
    ref = logits.masked_fill(logits < logits.topk(10, -1).values[:, -1:], float("-inf"))
    assert torch.equal(torch.isinf(masked), torch.isinf(ref))
    s = flashinfer.sampling.sampling_from_logits(logits)
    assert s.shape == (5,) and bool(((s >= 0) & (s < 1001)).all())


def test_flashinfer_chain_speculative_sampling(flashinfer):
    """Target == draft distribution: every draft token is accepted, then one bonus token."""
    g = _gen(4)
    B, K, V = 4, 3, 500
    dp = torch.softmax(torch.randn(B, K, V, device=DEV, generator=g), -1)
    tp = torch.cat([dp, torch.softmax(torch.randn(B, 1, V, device=DEV, generator=g), -1)], 1)
    ids = torch.multinomial(dp.view(-1, V), 1, generator=g).view(B, K).int()
    out, _, emitted = flashinfer.sampling.chain_speculative_sampling(dp, ids, tp)
    assert out.shape == (B, K + 1)
    assert torch.equal(out[:, :K].int(), ids)
    assert bool(((out[:, K] >= 0) & (out[:, K] < V)).all())


# ------------------------------------------------------------------ FlashInfer paged prefill
def _attention_torch(q, k, v, kv_len):
    """Causal attention of q (the last len(q) positions of a kv_len context) over k, v; fp32."""
    hq, hkv, hd = q.shape[1], k.shape[1], q.shape[2]
    k, v = k.float().repeat_interleave(hq // hkv, 1), v.float().repeat_interleave(hq // hkv, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) / hd**0.5
    q_pos = torch.arange(kv_len - q.shape[0], kv_len, device=q.device)[:, None]
    s = s.masked_fill(torch.arange(kv_len, device=q.device)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


@pytest.mark.parametrize("head_dim,hq,hkv", [(64, 9, 3), (128, 32, 8)])
def test_flashinfer_paged_prefill(flashinfer, head_dim, hq, hkv):
    """BatchPrefillWithPagedKVCacheWrapper (fa2, NHD, causal, bf16) as the engine calls it:
    decodes and prefill chunks in one plan, K/V as the two halves of one cache tensor."""
    g = _gen(5)
    dtype, page = torch.bfloat16, 16
    q_lens, kv_lens = [1, 7, 33, 1], [45, 7, 80, 129]
    n_pages = [(n + page - 1) // page for n in kv_lens]
    total = sum(n_pages) + 3
    cache = torch.randn(2, total, page, hkv, head_dim, device=DEV, dtype=dtype, generator=g)
    perm = torch.randperm(total, device=DEV, generator=g).int()
    starts = [sum(n_pages[:i]) for i in range(len(n_pages))]
    pages = [perm[s:s + n] for s, n in zip(starts, n_pages)]
    qo_indptr = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(n_pages).cumsum(0).tolist(), device=DEV, dtype=torch.int32)
    kv_last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, n_pages)], device=DEV, dtype=torch.int32)
    q = torch.randn(sum(q_lens), hq, head_dim, device=DEV, dtype=dtype, generator=g)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(qo_indptr, kv_indptr, torch.cat(pages), kv_last, hq, hkv, head_dim, page, causal=True,
           q_data_type=dtype, kv_data_type=dtype)
    out = w.run(q, (cache[0], cache[1]))
    assert out.shape == q.shape and out.dtype == dtype
    for i, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        k = cache[0][pages[i].long()].reshape(-1, hkv, head_dim)[:kl]
        v = cache[1][pages[i].long()].reshape(-1, hkv, head_dim)[:kl]
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref = _attention_torch(q[rows], k, v, kl)
        torch.testing.assert_close(out[rows].float(), ref, atol=3e-2, rtol=3e-2)


# ------------------------------------------------------------------ xgrammar
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_xgrammar_bitmask_apply(xgr, backend):
    if backend == "cuda" and os.environ.get("XGR_CUDA") != "1":
        pytest.skip("xgrammar's CUDA backend compiles for ~60 s on first use; set XGR_CUDA=1")
    g = _gen(6)
    B, V = 5, 128256
    logits = torch.randn(B, V, device=DEV, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (B, (V + 31) // 32), device=DEV, dtype=torch.int32, generator=g)
    bits = ((bitmask.cpu()[:, :, None] >> torch.arange(32)) & 1).reshape(B, -1)[:, :V].bool().to(DEV)
    ref = logits.masked_fill(~bits, float("-inf"))
    xgr.apply_token_bitmask_inplace(logits, bitmask, backend=backend)
    assert torch.equal(logits, ref)


def test_xgrammar_json_grammar(xgr):
    """The native grammar library loads and compiles here: JSON must start with { or [."""
    vocab = ["{", "}", '"', "a", "b", ":", ",", " ", "1", "[", "]", "</s>"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[11])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_builtin_json_grammar())
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    allowed = {vocab[i] for i in range(len(vocab)) if (int(bitmask[0, i // 32]) >> (i % 32)) & 1}
    assert "{" in allowed and "[" in allowed and "}" not in allowed and "a" not in allowed
