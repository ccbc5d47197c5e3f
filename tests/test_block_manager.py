"""BlockManager: reference counts, block tables, prefix cache over committed full blocks, eviction."""

import pytest

from specops.engine.block_manager import BlockManager
from specops.engine.request import Request
from specops.engine.sampling_params import SamplingParams


def make_req(rid, tokens):
    return Request(str(rid), tokens, SamplingParams())


def run_prefill(bm, req, hits=(), num_hit=0):
    """Admit req with its prefix hits, compute the whole prompt, commit it."""
    assert bm.allocate_slots(req, req.num_tokens - num_hit, list(hits))
    req.num_computed_tokens = req.num_tokens
    bm.cache_blocks(req, req.num_tokens)


def test_allocate_and_free_counts():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = make_req("a", list(range(9)))  # 9 tokens -> 3 blocks
    assert bm.allocate_slots(a, 9)
    assert len(a.block_ids) == 3 and bm.num_free_blocks == 7
    a.num_computed_tokens = 9
    assert bm.allocate_slots(a, 1, num_lookahead_tokens=2)  # 12 slots: still 3 blocks
    assert len(a.block_ids) == 3
    assert bm.allocate_slots(a, 3)  # 12 tokens -> 3 blocks
    assert len(a.block_ids) == 3
    assert bm.allocate_slots(a, 4)  # 13 -> 4 blocks
    assert len(a.block_ids) == 4
    bm.check([a])
    bm.free(a)
    assert bm.num_free_blocks == 10 and a.block_ids == []
    bm.check([])


def test_allocation_failure_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    a = make_req("a", list(range(8)))
    assert bm.allocate_slots(a, 8)
    b = make_req("b", list(range(100, 108)))
    assert not bm.allocate_slots(b, 8)
    assert b.block_ids == [] and bm.num_free_blocks == 1
    bm.check([a])


def test_prefix_hit_shares_blocks_and_caps_at_last_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 11))  # 10 tokens: 2 full blocks
    a = make_req("a", prompt)
    run_prefill(bm, a)
    b = make_req("b", prompt + [99])
    hits, n = bm.get_computed_blocks(b)
    assert hits == a.block_ids[:2] and n == 8
    run_prefill(bm, b, hits, n)
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert bm.blocks[a.block_ids[0]].ref_cnt == 2
    bm.check([a, b])
    # A prompt made exactly of cached full blocks keeps its last token to compute.
    c = make_req("c", prompt[:8])
    hits, n = bm.get_computed_blocks(c)
    assert n == 4 and hits == a.block_ids[:1]
    # A different first block breaks the chain even when the second block matches.
    d = make_req("d", [7, 7, 7, 7] + prompt[4:])
    assert bm.get_computed_blocks(d) == ([], 0)


def test_prefix_chain_does_not_rest_on_pythons_hash(monkeypatch):
    """The chain linked a block to its parent by Python's hash() of the parent's key, whose
    collisions on int tuples can be built on purpose: a request whose first block collided with
    another prompt's first block took that prompt's K/V for the next block. Simulated with a
    constant hash(): the link is now a SHA-256 digest, so only the true prefix is reused."""
    import builtins
    monkeypatch.setattr(builtins, "hash", lambda obj: 0)
    bm = BlockManager(num_blocks=16, block_size=4)
    shared = [50, 51, 52, 53]
    a = make_req("a", [1, 2, 3, 4] + shared + [9])        # caches (x, C)
    run_prefill(bm, a)
    b0 = make_req("b0", [5, 6, 7, 8] + [60, 61, 62, 63] + [9])   # caches block y
    run_prefill(bm, b0)
    b = make_req("b", [5, 6, 7, 8] + shared + [9])        # (y, C): only y is its true prefix
    hits, n = bm.get_computed_blocks(b)
    assert hits == b0.block_ids[:1] and n == 4


def test_freed_blocks_stay_cached_until_evicted():
    bm = BlockManager(num_blocks=4, block_size=4)
    prompt = list(range(1, 10))  # 9 tokens -> 3 blocks, 2 full
    a = make_req("a", prompt)
    run_prefill(bm, a)
    full = a.block_ids[:2]
    bm.free(a)
    b = make_req("b", prompt)
    hits, n = bm.get_computed_blocks(b)
    assert hits == full and n == 8
    bm.free(b)
    # Fill the pool with other content: the cached blocks are evicted, tail first.
    c = make_req("c", list(range(50, 62)))
    assert bm.allocate_slots(c, 12)  # takes the never-used block, then a's tail, then its 2nd block
    assert bm.get_computed_blocks(make_req("x", prompt)) == (full[:1], 4)  # the head survives longest
    bm.check([c])
    bm.free(c)
    d = make_req("d", list(range(70, 86)))
    assert bm.allocate_slots(d, 16)
    assert bm.get_computed_blocks(make_req("y", prompt)) == ([], 0)
    bm.check([d])


def test_uncommitted_tokens_are_not_cached():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_req("a", list(range(1, 13)))
    assert bm.allocate_slots(a, 6)  # first chunk of 6 computed
    a.num_computed_tokens = 6
    bm.cache_blocks(a, 6)
    assert len(bm.cached) == 1 and a.num_hashed_blocks == 1
    b = make_req("b", list(range(1, 13)))
    assert bm.get_computed_blocks(b)[1] == 4


def test_duplicate_content_stays_private():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(1, 9))
    a, b = make_req("a", prompt), make_req("b", prompt)
    assert bm.allocate_slots(a, 8) and bm.allocate_slots(b, 8)  # admitted in the same step
    for r in (a, b):
        r.num_computed_tokens = 8
        bm.cache_blocks(r, 8)
    assert len(bm.cached) == 2
    bm.check([a, b])
    bm.free(a)
    bm.free(b)
    bm.check([])
    assert bm.num_free_blocks == 8


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)
    bm = BlockManager(8, 4)
    a = make_req("a", list(range(10)))
    assert bm.allocate_slots(a, 4)
    with pytest.raises(ValueError, match="computed_blocks"):
        bm.allocate_slots(a, 4, [1])
