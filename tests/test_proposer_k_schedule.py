"""K schedule (batch size, per-request caps) and synthetic acceptance."""

import math
import re
from types import SimpleNamespace as NS

import numpy as np
import pytest

from specops.engine.spec_decode.k_schedule import KSchedule, SyntheticAcceptance, parse_batch_schedule


def req(num_prompt, num_out, max_tokens=None, own_k=None):
    return NS(all_token_ids=[0] * (num_prompt + num_out), output_token_ids=[0] * num_out,
              sampling_params=NS(max_tokens=max_tokens, extra_args={} if own_k is None else {"num_spec_tokens": own_k}))


def test_parse_batch_schedule_forms():
    want = [(1, 4), (16, 2), (64, 0)]
    assert parse_batch_schedule("1:4,16:2,64:0") == want
    assert parse_batch_schedule(" 64:0 , 1:4,16:2") == want
    assert parse_batch_schedule({16: 2, 1: 4, 64: 0}) == want
    assert parse_batch_schedule([(64, 0), (1, 4), (16, 2)]) == want
    assert parse_batch_schedule(None) is None and parse_batch_schedule("") is None
    look = re.escape("batch schedule must look like '1:4,16:2,64:0', got ")
    pairs = re.escape("batch schedule must be (min_batch_size, K) pairs, got ")
    ints = re.escape("batch schedule pairs must hold ints, got ")
    for bad, match in [("1-4", look), ("1:4,1:2", "batch schedule lists a batch size twice"),
                       ("0:4", re.escape("batch schedule needs min_batch_size >= 1 and K >= 0, got (0, 4)")),
                       ("1:-1", look), ([(1, 2, 3)], pairs), ("a:b", look),
                       # int() took these as other values (found by a review): 16, 4, truncations, a bool
                       ("1_6:2", look), ("1:\u0664", look), ("1:", look), ({1.9: 4}, ints), ([(1, 2.7)], ints),
                       ({True: 3}, ints), ([(1, None)], ints), (5, pairs)]:
        with pytest.raises(ValueError, match="^" + match):   # the schedule's own message, not int()'s
            parse_batch_schedule(bad)
    assert parse_batch_schedule({np.int64(16): np.int32(2)}) == [(16, 2)]


def test_k_for_batch_falls_to_zero():
    s = KSchedule(4, "1:4,16:2,64:0")
    assert [s.k_for_batch(b) for b in (1, 8, 15, 16, 63, 64, 1024)] == [4, 4, 4, 2, 2, 0, 0]
    assert KSchedule(3, "1:8").k_for_batch(1) == 3  # never above num_spec_tokens
    assert KSchedule(5, "4:2").k_for_batch(1) == 2  # below the first threshold: the first K
    assert KSchedule(6).k_for_batch(10**6) == 6
    assert KSchedule(0).k_for_batch(1) == 0
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="num_spec_tokens"):
            KSchedule(bad)


def test_k_for_requests_caps():
    s = KSchedule(4, "1:4,3:3,100:0")
    reqs = [
        req(10, 5),                      # free: K for batch of 4 = 3
        req(10, 5, own_k=1),             # its own K
        req(90, 5),                      # max_model_len 100: L=95, 1 + K + bonus <= 100 - 95 + 1 -> K <= 4
        req(97, 0),                      # L=97: K <= 2
        req(10, 5, max_tokens=7),        # 2 more outputs allowed: K <= 1
        req(10, 5, max_tokens=6),        # 1 more output: K = 0
        req(99, 0),                      # L = max_model_len - 1: K = 0
    ]
    k = s.k_for_requests(reqs, max_model_len=100, batch_size=4)
    assert k.tolist() == [3, 1, 3, 2, 1, 0, 0]
    assert s.k_for_requests(reqs, max_model_len=100).tolist() == [3, 1, 3, 2, 1, 0, 0]  # batch 7 -> K 3
    assert s.k_for_requests(reqs[:2], max_model_len=100).tolist() == [4, 1]
    # the bound the scheduler enforces holds with the bonus token: L - 1 + (1 + K) + 1 <= max_model_len
    for r, kk in zip(reqs, k):
        assert len(r.all_token_ids) + kk + 1 <= 100 or kk == 0


def test_synthetic_acceptance_rate_and_determinism():
    rate = 0.7
    sa = SyntheticAcceptance(rate, seed=3)
    n_req, k = 4000, 4
    ids = [f"req-{i}" for i in range(n_req)]
    pos = np.arange(n_req) * 7 + 11
    acc = sa.num_accepted(ids, pos, [k] * n_req)
    assert acc.min() >= 0 and acc.max() <= k
    # P(accepted >= i) = rate^i: each binomial count within 5 sigma
    for i in range(1, k + 1):
        p = rate ** i
        count = int((acc >= i).sum())
        assert abs(count - n_req * p) < 5 * math.sqrt(n_req * p * (1 - p)), (i, count)
    # deterministic by seed, batch invariant (subset / reorder), different with another seed
    assert (sa.num_accepted(ids, pos, [k] * n_req) == acc).all()
    sub = [5, 1, 3000, 17]
    got = sa.num_accepted([ids[i] for i in sub], pos[sub], [k] * len(sub))
    assert got.tolist() == acc[sub].tolist()
    assert (SyntheticAcceptance(rate, seed=4).num_accepted(ids, pos, [k] * n_req) != acc).any()
    # fewer drafts cap the count; zero drafts accept nothing
    few = sa.num_accepted(ids[:50], pos[:50], [1] * 50)
    assert few.max() <= 1 and (few == np.minimum(acc[:50], 1)).all()
    assert sa.num_accepted(ids[:3], pos[:3], [0, 0, 0]).tolist() == [0, 0, 0]
    # per-position rates; 0 and 1 are exact
    assert (SyntheticAcceptance([1.0, 1.0, 0.0]).num_accepted(ids[:20], pos[:20], [4] * 20) == 2).all()
    assert (SyntheticAcceptance(1.0).num_accepted(ids[:20], pos[:20], [3] * 20) == 3).all()
    with pytest.raises(ValueError, match="rates"):
        SyntheticAcceptance(1.5)


def test_synthetic_emit():
    drafts = [[5, 6, 7], [8], []]
    target = [[5, 6, 9, 4], [1, 2], [3]]
    assert SyntheticAcceptance.emit(drafts, target, [3, 0, 0]) == [[5, 6, 7, 4], [1], [3]]
    assert SyntheticAcceptance.emit(drafts, target, [1, 1, 0]) == [[5, 6], [8, 2], [3]]
    with pytest.raises(ValueError, match=re.escape("need len(target_tokens) = len(drafts) + 1 and "
                                                   "0 <= n <= len(drafts), got 2, 2, 0")):
        SyntheticAcceptance.emit([[1, 2]], [[1, 2]], [0])
