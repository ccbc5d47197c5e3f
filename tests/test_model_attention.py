"""Paged attention backends against a dense float64 reference, and the KV-cache write."""

import math

import pytest
import torch

from specops.engine.model.attention import AttnMetadata, flashinfer_available, make_attention_backend, write_kv
from specops.engine.model.attention_torch import paged_attention_torch

# (context_len, query_len) per sequence: fresh prefill, decode, chunk on top of a context,
# long decode, a one-token prompt.
MIXED = [(0, 7), (13, 1), (4, 9), (30, 1), (0, 1)]
DECODE_ONLY = [(5, 1), (0, 1), (17, 1)]
# One sequence: the unmasked decode and plain-causal prefill fast paths, and a chunk on a context.
SINGLES = {"one_decode": [(9, 1)], "one_prefill": [(0, 12)], "one_chunk": [(7, 5)]}


def dense_reference(q, k_full, v_full, seqs, scale):
    """q [T, H, d]; k_full/v_full: per sequence [seq_len, KVH, d]. float64 causal attention."""
    out, start = [], 0
    for (ctx, qlen), k, v in zip(seqs, k_full, v_full):
        group = q.shape[1] // k.shape[1]
        qs = q[start:start + qlen].double()
        kk = k.double().repeat_interleave(group, 1)
        vv = v.double().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", qs, kk) * scale
        qpos = torch.arange(ctx, ctx + qlen, device=q.device)[:, None]
        kpos = torch.arange(ctx + qlen, device=q.device)[None, :]
        scores = scores.masked_fill(kpos > qpos, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv))
        start += qlen
    return torch.cat(out)


def make_case(seqs, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed=0):
    """Random K/V for every sequence, context written straight into shuffled blocks, the new
    tokens' K/V still to be written; returns (q, k_new, v_new, cache, attn, k_full, v_full)."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-(c + n) // block_size) for c, n in seqs]
    num_blocks = sum(per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for n in per_seq:
        tables.append(perm[used:used + n])
        used += n
    cache = torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    # Stale garbage in never-used slots must not leak into results.
    cache.normal_(generator=None)
    k_full = [torch.randn(c + n, num_kv_heads, head_dim, generator=g).to(device, dtype) for c, n in seqs]
    v_full = [torch.randn(c + n, num_kv_heads, head_dim, generator=g).to(device, dtype) for c, n in seqs]
    for (ctx, _), table, k, v in zip(seqs, tables, k_full, v_full):
        for p in range(ctx):
            cache[0, table[p // block_size], p % block_size] = k[p]
            cache[1, table[p // block_size], p % block_size] = v[p]
    attn = AttnMetadata.build([cache], [c for c, _ in seqs], [n for _, n in seqs], tables, block_size, device)
    q = torch.randn(sum(n for _, n in seqs), num_heads, head_dim, generator=g).to(device, dtype)
    k_new = torch.cat([k[c:] for (c, _), k in zip(seqs, k_full)])
    v_new = torch.cat([v[c:] for (c, _), v in zip(seqs, v_full)])
    return q, k_new, v_new, cache, attn, k_full, v_full


@pytest.mark.parametrize("seqs", [MIXED, DECODE_ONLY, *SINGLES.values()], ids=["mixed", "decode", *SINGLES])
@pytest.mark.parametrize("block_size", [1, 5, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 4, 8), (6, 2, 16), (9, 3, 64)])
def test_torch_attention_matches_dense(device, seqs, block_size, num_heads, num_kv_heads, head_dim):
    q, k_new, v_new, cache, attn, k_full, v_full = make_case(
        seqs, num_heads, num_kv_heads, head_dim, block_size, torch.float32, device)
    write_kv(cache, k_new, v_new, attn)
    scale = head_dim ** -0.5
    out = paged_attention_torch(q, cache, attn, scale)
    ref = dense_reference(q, k_full, v_full, seqs, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    tol = 1e-5 if device == "cpu" else 1e-4  # CUDA SDPA kernels reduce in a different order
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_write_kv_skips_negative_slots(device):
    cache = torch.zeros(2, 4, 3, 2, 8, device=device)
    k = torch.randn(5, 2, 8, device=device)
    v = torch.randn(5, 2, 8, device=device)
    slots = torch.tensor([7, -1, 0, 11, -1], device=device)
    attn = AttnMetadata([cache], slots, torch.tensor([0, 5], dtype=torch.int32, device=device),
                        torch.tensor([5], dtype=torch.int32, device=device),
                        torch.zeros(1, 4, dtype=torch.int32, device=device), 5, 5, 3)
    write_kv(cache, k, v, attn)
    flat = cache.view(2, 12, 2, 8)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[0, s], k[t]) and torch.equal(flat[1, s], v[t])
    written = {7, 0, 11}
    untouched = [s for s in range(12) if s not in written]
    assert flat[:, untouched].abs().sum() == 0


def test_attn_metadata_build():
    attn = AttnMetadata.build([torch.zeros(1)], [3, 0], [2, 4], [[5, 1], [2]], 4)
    assert attn.slot_mapping.tolist() == [5 * 4 + 3, 1 * 4 + 0, 8, 9, 10, 11]
    assert attn.query_start_loc.tolist() == [0, 2, 6]
    assert attn.seq_lens.tolist() == [5, 4]
    assert attn.block_tables.tolist() == [[5, 1], [2, 0]]
    assert (attn.max_query_len, attn.max_seq_len, attn.block_size) == (4, 5, 4)
    with pytest.raises(ValueError, match="covers fewer"):
        AttnMetadata.build([torch.zeros(1)], [3], [2], [[5]], 4)
    with pytest.raises(ValueError, match="query_lens"):
        AttnMetadata.build([torch.zeros(1)], [3], [0], [[5]], 4)


def test_backend_choice():
    assert make_attention_backend(None, "cpu").name == "torch"
    assert make_attention_backend("torch", "cpu").name == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        make_attention_backend("flashinfer", "cpu")
    with pytest.raises(ValueError, match="attn_backend"):
        make_attention_backend("xformers", "cpu")


needs_flashinfer = pytest.mark.skipif(not flashinfer_available(), reason="needs CUDA and flashinfer")


@needs_flashinfer
def test_explicit_flashinfer_refuses_what_it_cannot_run_when_built():
    """attn_backend="flashinfer" named explicitly for an fp32 model or a head_dim it has no kernel for:
    a ValueError when the model is built, not at its first forward."""
    assert make_attention_backend("flashinfer", "cuda", torch.bfloat16, 128).name == "flashinfer"
    with pytest.raises(ValueError, match="supports dtype torch.float16 or torch.bfloat16, got torch.float32"):
        make_attention_backend("flashinfer", "cuda", torch.float32, 64)
    with pytest.raises(ValueError, match=r"supports head_dim \[64, 128, 256\], got 48"):
        make_attention_backend("flashinfer", "cuda", torch.bfloat16, 48)


@needs_flashinfer
@pytest.mark.parametrize("seqs", [MIXED, DECODE_ONLY, [(0, 100), (37, 70), (250, 1)]],
                         ids=["mixed", "decode", "long"])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (32, 8, 128)])
def test_flashinfer_matches_torch(seqs, block_size, num_heads, num_kv_heads, head_dim):
    q, k_new, v_new, cache, attn, k_full, v_full = make_case(
        seqs, num_heads, num_kv_heads, head_dim, block_size, torch.bfloat16, "cuda")
    write_kv(cache, k_new, v_new, attn)
    scale = 1 / math.sqrt(head_dim)
    fi = make_attention_backend("flashinfer", "cuda")
    plans = []
    plan = fi.plan
    fi.plan = lambda *a, **kw: (plans.append(1), plan(*a, **kw))
    outs = [fi(q, cache, attn, scale) for _ in range(3)]  # three "layers", one plan
    assert len(plans) == 1
    ref_torch = paged_attention_torch(q, cache, attn, scale)
    ref = dense_reference(q, k_full, v_full, seqs, scale)
    for out in outs:
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out.float(), ref_torch.float(), rtol=2e-2, atol=2e-2)
    # A new step (new metadata object) plans again.
    attn2 = AttnMetadata.build([cache], [c for c, _ in seqs], [n for _, n in seqs],
                               attn.block_tables.tolist(), block_size, "cuda")
    fi(q, cache, attn2, scale)
    assert len(plans) == 2
