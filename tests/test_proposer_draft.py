"""Draft-model proposer on a tiny generated checkpoint (target = draft).

Greedy drafts equal step-by-step greedy decoding (non-paged reference forward) across
rounds of accepts and rejects; the draft KV after any mix equals a from-scratch
recomputation; sampled drafts follow the returned draft distributions; seeded drafts are
batch invariant; no host sync inside the K-step loop (checked on CUDA with
torch.cuda.set_sync_debug_mode("error"), with the torch and FlashInfer attention backends).
"""

import inspect
import math
from types import SimpleNamespace as NS

import pytest
import torch
from model_fixtures import make_tiny_checkpoint

from specops.engine.model import load_model, reference_forward
from specops.engine.spec_decode.draft_model import DraftModelProposer, draft_pool_blocks
from specops.engine.spec_decode.proposer import ProposeContext

TIE_MARGIN = 1e-3  # reference top-2 logit gap below which paged/reference rounding may pick either


@pytest.fixture(autouse=True)
def _one_thread_no_tf32():
    # Tiny shapes: one thread avoids oversubscription on a shared 2-core machine; fp32
    # comparisons on CUDA need fp32 matmuls whatever other tests set.
    n, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.set_num_threads(n)
    torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # Untied embeddings: a tied random model mostly repeats its last token.
    return make_tiny_checkpoint(tmp_path_factory.mktemp("draft_tiny"), tie_word_embeddings=False)


_models = {}


def tiny(ckpt, device, dtype=torch.float32, attn_backend=None):
    key = (ckpt, device, dtype, attn_backend)
    if key not in _models:
        _models[key] = load_model(ckpt, device=device, dtype=dtype, attn_backend=attn_backend).model
    return _models[key]


def request(rid, tokens, temperature=0.0, seed=None):
    return NS(request_id=rid, all_token_ids=list(tokens), sampling_params=NS(temperature=temperature, seed=seed))


def greedy_reference(model, tokens, k):
    """k greedy tokens by full recomputation, and the top-2 margin at each."""
    toks, out, margins = list(tokens), [], []
    for _ in range(k):
        logits = reference_forward(model, toks)[-1].double()
        top = logits.topk(2).values
        out.append(int(logits.argmax()))
        margins.append(float(top[0] - top[1]))
        toks.append(out[-1])
    return out, margins


def assert_greedy_equal(model, req, drafts, k):
    want, margins = greedy_reference(model, req.all_token_ids, k)
    assert len(drafts) == k, (req.request_id, drafts)
    for i, (d, w) in enumerate(zip(drafts, want)):
        if margins[i] < TIE_MARGIN:
            return  # a near tie: paged and reference rounding may differ from here on
        assert d == w, (req.request_id, i, drafts, want, margins)


def test_greedy_drafts_match_stepwise_decoding_and_kv_rolls_back(ckpt, device):
    model = tiny(ckpt, device)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(7)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    reqs = [request(f"r{i}", rand(n)) for i, n in enumerate([1, 5, 8, 16, 23])]
    prop = DraftModelProposer(model, num_blocks=draft_pool_blocks(5, 96, 4, 4), block_size=4, target_vocab_size=vocab)
    for rnd in range(6):
        k = torch.randint(0, 5, (len(reqs),), generator=g).tolist()
        if rnd == 0:
            k = [4] * len(reqs)
        batch = prop.propose(reqs, k, ProposeContext(step=rnd))
        assert batch.request_ids == [r.request_id for r in reqs] and batch.probs is None
        for req, kk, drafts in zip(reqs, k, batch.token_ids):
            if kk:
                assert_greedy_equal(model, req, drafts, kk)
            else:
                assert drafts == []
        # Verification outcome: a accepted drafts then a token that is not the next draft
        # (a rejection's recovered token), or all accepted plus a bonus token.
        for req, drafts in zip(reqs, batch.token_ids):
            a = int(torch.randint(0, len(drafts) + 1, (1,), generator=g))
            nxt = rand(1)[0]
            while a < len(drafts) and nxt == drafts[a]:
                nxt = rand(1)[0]
            req.all_token_ids += drafts[:a] + [nxt]
        if rnd == 2:
            prop.free("r1")  # preempted: its draft state is rebuilt from scratch
            reqs[2].all_token_ids = reqs[2].all_token_ids[:3]  # a context that shrank is recomputed
    # Rollback: every request's committed draft KV equals a fresh proposer's recomputation.
    fresh = DraftModelProposer(model, num_blocks=draft_pool_blocks(5, 96, 4, 4), block_size=4)
    prop.propose(reqs, 1)
    fresh.propose(reqs, 1)
    for req in reqs:
        for layer in range(model.config.num_layers):
            got, want = prop.committed_kv(req.request_id, layer), fresh.committed_kv(req.request_id, layer)
            assert got.shape[1] == len(req.all_token_ids)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sampled_drafts_follow_returned_distributions(ckpt, device):
    """Many unseeded rows with one context: draft 1 frequencies match probs (chi-square),
    probs equal softmax(reference logits / T) for drafts 1 and 2."""
    model = tiny(ckpt, device)
    vocab = model.config.vocab_size
    temp, rows = 0.7, 3000
    ctx = torch.randint(3, vocab, (6,), generator=torch.Generator().manual_seed(3)).tolist()
    reqs = [request(f"s{i}", ctx, temperature=temp) for i in range(rows)]
    prop = DraftModelProposer(model, num_blocks=draft_pool_blocks(rows, 8, 2, 16), block_size=16)
    batch = prop.propose(reqs, 2, ProposeContext(step=11))
    probs = batch.probs
    assert probs.shape == (rows, 2, vocab) and probs.dtype == torch.float32
    p1 = torch.softmax(reference_forward(model, ctx)[-1].double() / temp, -1)
    torch.testing.assert_close(probs[:, 0].double().cpu(), p1.cpu().expand(rows, -1), atol=2e-5, rtol=1e-4)
    d1 = torch.tensor([d[0] for d in batch.token_ids])
    for i in (0, 1, rows - 1):  # draft 2's distribution is conditioned on draft 1
        p2 = torch.softmax(reference_forward(model, ctx + [batch.token_ids[i][0]])[-1].double() / temp, -1)
        torch.testing.assert_close(probs[i, 1].double().cpu(), p2.cpu(), atol=2e-5, rtol=1e-4)
    # chi-square over categories with expected count >= 10, the rest pooled
    expected = p1.cpu() * rows
    counts = torch.bincount(d1, minlength=vocab).double()
    big = expected >= 10
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    chi2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    assert df >= 3, "the tiny model's distribution is too peaked for this test"
    assert chi2 < df + 7 * math.sqrt(2 * df), (chi2, df)  # ~5 sigma above the mean


def test_seeded_drafts_are_batch_invariant_and_mixed_batches(ckpt, device):
    model = tiny(ckpt, device)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    ctx_a = torch.randint(3, vocab, (9,), generator=g).tolist()
    ctx_b = torch.randint(3, vocab, (4,), generator=g).tolist()
    pool = draft_pool_blocks(8, 32, 4, 16)

    def run(reqs, step=0):
        return DraftModelProposer(model, num_blocks=pool, block_size=16).propose(reqs, 3, ProposeContext(step=step))

    alone = run([request("x", ctx_a, 1.0, seed=123)]).token_ids[0]
    mixed = run([request("g", ctx_b), request("u", ctx_b, 1.0), request("x", ctx_a, 1.0, seed=123)], step=9)
    assert mixed.token_ids[2] == alone  # same seed, context and positions: same drafts in any batch
    flat = mixed.gather_probs(["x", "g", "u"], [2, 0, 1])  # the next step's order, drafts truncated
    assert torch.equal(flat, torch.stack([mixed.probs[2, 0], mixed.probs[2, 1], mixed.probs[1, 0]]))
    torch.testing.assert_close(flat.sum(-1), torch.ones(3, device=flat.device))
    assert_greedy_equal(model, request("g", ctx_b), mixed.token_ids[0], 3)  # greedy row in a sampled batch
    # the noise changes with the seed (unseeded: with the step); 3 draws agreeing by chance is unlikely
    others = [tuple(run([request("x", ctx_a, 1.0, seed=s)]).token_ids[0]) for s in (1, 2, 3, 4)]
    assert len(set(others + [tuple(alone)])) > 1
    steps = [tuple(run([request("u", ctx_a, 1.0)], step=s).token_ids[0]) for s in range(5)]
    assert len(set(steps)) > 1


def test_pool_limits_eviction_and_arguments(ckpt, device):
    model = tiny(ckpt, device)
    vocab = model.config.vocab_size
    prop = DraftModelProposer(model, num_blocks=4, block_size=4)
    a, b, c = request("a", range(3, 10)), request("b", range(3, 10)), request("c", range(3, 20))
    out = prop.propose([a, b], 2)  # 7 + 1 positions = 2 blocks each: the pool is full
    assert [len(d) for d in out.token_ids] == [2, 2] and prop.free_blocks == []
    out = prop.propose([c], 2)  # 18 positions = 5 blocks > the whole pool: no drafts, nobody evicted
    assert out.token_ids == [[]] and prop.states["a"].blocks and prop.states["b"].blocks
    c.all_token_ids = c.all_token_ids[:6]
    out = prop.propose([c], 2)  # 6 + 1 positions = 2 blocks: a (least recently used) is evicted
    assert len(out.token_ids[0]) == 2 and "a" not in prop.states and prop.states["b"].blocks
    out = prop.propose([a], 2)  # a is recomputed from scratch after evicting b
    assert len(out.token_ids[0]) == 2 and "b" not in prop.states
    assert_greedy_equal(model, a, out.token_ids[0], 2)
    prop.free("a")
    prop.free("c")
    assert sorted(prop.free_blocks) == [0, 1, 2, 3] and not prop.states
    assert prop.propose([a, b], [0, 0]).token_ids == [[], []]
    with pytest.raises(ValueError, match="vocabulary"):
        DraftModelProposer(model, num_blocks=4, target_vocab_size=vocab + 1)
    with pytest.raises(ValueError, match="num_spec_tokens"):
        prop.propose([a], [-1])
    with pytest.raises(ValueError, match="num_blocks"):
        DraftModelProposer(model, num_blocks=0)


def test_loop_has_no_host_sync_by_design():
    src = inspect.getsource(DraftModelProposer._draft_loop)
    for bad in (".item(", ".tolist(", ".cpu(", ".numpy(", "nonzero", "bool(", "int(", "float(",
                "synchronize", "multinomial", ".to(\"cpu\"", "print("):
        assert bad not in src, bad


def _sync_free_loop(model):
    prop = DraftModelProposer(model, num_blocks=64, block_size=16)
    reqs = [request("a", range(3, 40), 0.8, seed=1), request("b", range(5, 12)), request("c", range(9, 70), 1.0)]
    prop.propose(reqs, 4)  # warm-up (allocations, first-call work)
    for r in reqs:
        r.all_token_ids += [17, 18]
    for st, r in zip([prop.states[r.request_id] for r in reqs], reqs):
        prop._rollback(st, r.all_token_ids)
        prop._reserve(r.request_id, st, len(r.all_token_ids) + 3, set())
    plan = prop._plan(reqs, [prop.states[r.request_id] for r in reqs], [r.all_token_ids for r in reqs], 4, step=1)
    backends = prop._plan_backends(plan)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens, probs = prop._draft_loop(plan, backends)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (3, 4) and probs.shape == (3, 4, model.config.vocab_size)
    return tokens


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loop_has_no_host_sync_cuda_torch_attention(ckpt):
    _sync_free_loop(tiny(ckpt, "cuda", torch.float32, "torch"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loop_has_no_host_sync_cuda_flashinfer(ckpt):
    from specops.engine.model import flashinfer_available

    if not flashinfer_available():
        pytest.skip("flashinfer is not installed")
    model = tiny(ckpt, "cuda", torch.bfloat16, "flashinfer")
    assert model.attn_backend.name == "flashinfer"
    _sync_free_loop(model)
