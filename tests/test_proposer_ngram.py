"""N-gram prompt lookup: batch search vs the plain-Python rule, edge cases, the proposer, speed."""

import time
from types import SimpleNamespace as NS

import numpy as np
import pytest

from specops.engine.spec_decode.ngram import NgramProposer, ngram_propose, ngram_propose_naive


def planted_context(rng, length, vocab):
    """Random tokens with copies of earlier spans planted in (so matches of every length exist)."""
    toks = rng.integers(0, vocab, size=length)
    for _ in range(int(rng.integers(0, 4))):
        if length < 4:
            break
        n = int(rng.integers(1, min(12, length // 2) + 1))
        src = int(rng.integers(0, length - n + 1))
        dst = int(rng.integers(0, length - n + 1))
        toks[dst:dst + n] = toks[src:src + n].copy()
    return toks


def batch_vs_naive(contexts, k, min_n, max_n, periodic):
    width = max([len(c) for c in contexts] + [1])
    tok = np.full((len(contexts), width), -1, dtype=np.int64)
    for i, c in enumerate(contexts):
        tok[i, :len(c)] = c
    lens = np.array([len(c) for c in contexts])
    drafts, num = ngram_propose(tok, lens, k, min_n, max_n, periodic)
    ks = np.broadcast_to(np.asarray(k), (len(contexts),))
    assert drafts.shape == (len(contexts), int(ks.max()) if len(contexts) else 0)
    for i, c in enumerate(contexts):
        want = ngram_propose_naive(list(c), int(ks[i]), min_n, max_n, periodic)
        got = drafts[i, :num[i]].tolist()
        assert got == want, (list(c), int(ks[i]), min_n, max_n, periodic, got, want)
        assert (drafts[i, num[i]:] == -1).all()


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 3), (2, 4), (3, 3), (1, 6)])
def test_batch_matches_naive_on_planted_repeats(min_n, max_n, periodic, _fresh_seed):
    rng = np.random.default_rng(_fresh_seed)
    for vocab in (2, 5, 50):
        contexts = [planted_context(rng, int(rng.integers(0, 70)), vocab) for _ in range(37)]
        k = rng.integers(0, 9, size=len(contexts))  # per-request K, zeros included
        batch_vs_naive(contexts, k, min_n, max_n, periodic)
        batch_vs_naive(contexts, 5, min_n, max_n, periodic)  # one K for all


def test_edge_cases():
    # context shorter than n + 1: no drafts
    assert ngram_propose(np.array([[4, 4]]), np.array([2]), 3, min_n=2, max_n=3)[1].tolist() == [0]
    assert ngram_propose(np.array([[7]]), np.array([1]), 3)[1].tolist() == [0]
    assert ngram_propose(np.zeros((1, 4), dtype=np.int64), np.array([0]), 3)[1].tolist() == [0]
    # no match: no drafts
    d, n = ngram_propose(np.array([[1, 2, 3, 4, 5]]), np.array([5]), 4)
    assert n.tolist() == [0] and (d == -1).all()
    # match at the very end (overlapping the suffix): period 1 continues, non-periodic gives one token
    ctx = [9, 1, 2, 2, 2, 2]
    assert ngram_propose_naive(ctx, 4, 1, 3) == [2, 2, 2, 2]
    assert ngram_propose_naive(ctx, 4, 1, 3, periodic=False) == [2]
    batch_vs_naive([ctx], 4, 1, 3, True)
    batch_vs_naive([ctx], 4, 1, 3, False)
    # several matches of the same length: the most recent one wins
    ctx = [5, 6, 10, 11, 5, 6, 20, 21, 5, 6]
    assert ngram_propose_naive(ctx, 2, 2, 2) == [20, 21]
    d, n = ngram_propose(np.array([ctx]), np.array([len(ctx)]), 2, min_n=2, max_n=2)
    assert d[0, :n[0]].tolist() == [20, 21]
    # a longer match beats a more recent shorter one
    ctx = [1, 5, 6, 30, 31, 9, 6, 40, 1, 5, 6]
    d, n = ngram_propose(np.array([ctx]), np.array([len(ctx)]), 2, min_n=1, max_n=3)
    assert d[0, :n[0]].tolist() == [30, 31]
    # min_n filters: only a 1-token match exists
    assert ngram_propose(np.array([ctx[6:]]), np.array([5]), 2, min_n=2, max_n=3)[1].tolist() == [0]
    # padding past num_tokens is ignored, even when it equals the last token
    d, n = ngram_propose(np.array([[3, 8, 3, 3, 3, 3]]), np.array([3]), 2, min_n=1, max_n=1)
    assert d[0, :n[0]].tolist() == [8, 3]
    # max_n far above the context (>= 2 L + 1) and no wider row to pad it: an IndexError that took
    # the engine down (found by a review); now the naive rule's drafts
    assert ngram_propose_naive([7, 7], 4, 1, 5) == [7, 7, 7, 7]
    d, n = ngram_propose(np.array([[7, 7]]), np.array([2]), 4, min_n=1, max_n=5)
    assert d[0, :n[0]].tolist() == [7, 7, 7, 7]
    batch_vs_naive([[7, 7], [1, 2, 1]], 4, 1, 9, True)


def test_bad_arguments():
    tok, lens = np.array([[1, 2, 1]]), np.array([3])
    with pytest.raises(ValueError, match="min_n"):
        ngram_propose(tok, lens, 2, min_n=0)
    with pytest.raises(ValueError, match="min_n must be <= max_n"):
        ngram_propose(tok, lens, 2, min_n=3, max_n=2)
    with pytest.raises(ValueError, match="num_tokens"):
        ngram_propose(tok, np.array([4]), 2)
    with pytest.raises(ValueError, match="num_spec_tokens"):
        ngram_propose(tok, lens, -1)
    with pytest.raises(ValueError, match="num_spec_tokens"):
        ngram_propose(tok, lens, [1, 2])
    with pytest.raises(ValueError, match="token_ids"):
        ngram_propose(np.array([1, 2, 1]), lens, 2)


def test_proposer_follows_growing_contexts(_fresh_seed):
    """The proposer's incremental per-request buffers give the rule's drafts step after step."""
    rng = np.random.default_rng(_fresh_seed)
    prop = NgramProposer(min_n=1, max_n=3)
    reqs = [NS(request_id=f"r{i}", all_token_ids=planted_context(rng, int(rng.integers(1, 40)), 6).tolist(),
               sampling_params=None) for i in range(9)]
    for step in range(12):
        k = rng.integers(0, 6, size=len(reqs))
        out = prop.propose(reqs, k)
        assert out.request_ids == [r.request_id for r in reqs] and out.probs is None
        for r, kk, d in zip(reqs, k, out.token_ids):
            assert d == ngram_propose_naive(r.all_token_ids, int(kk), 1, 3)
        for r in reqs:  # commit 1-4 tokens, often copies (as accepted drafts would be)
            r.all_token_ids += rng.integers(0, 6, size=int(rng.integers(1, 5))).tolist()
        if step == 5:  # a request restarts with a shorter context: its buffer is rebuilt
            reqs[0].all_token_ids = reqs[0].all_token_ids[:3]
            prop.free(reqs[1].request_id)
    assert prop.propose([], 4).token_ids == []
    assert prop.propose(reqs, 0).token_ids == [[] for _ in reqs]


def test_speed_128_requests_4k_context(_fresh_seed):
    rng = np.random.default_rng(_fresh_seed)
    num_reqs, length = 128, 4096
    reqs = [NS(request_id=str(i), all_token_ids=planted_context(rng, length, 49152).tolist(), sampling_params=None)
            for i in range(num_reqs)]
    prop = NgramProposer(min_n=1, max_n=3)
    prop.propose(reqs, 4)  # fills the per-request buffers (once per request in an engine)
    best = float("inf")
    for _ in range(5):
        for r in reqs:
            r.all_token_ids.append(int(rng.integers(0, 49152)))
        t0 = time.perf_counter()
        prop.propose(reqs, 4)
        best = min(best, time.perf_counter() - t0)
    per_req_us = best / num_reqs * 1e6
    print(f"\nngram propose: {num_reqs} requests x {length} tokens: {best * 1e3:.2f} ms per batch, "
          f"{per_req_us:.1f} us per request")
    assert per_req_us < 1000.0
