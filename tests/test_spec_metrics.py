"""Spec-decoding metrics: counts, rates, the periodic log line, snapshot and summary."""

import logging
import re

import pytest
import torch

from specops.engine.spec_decode.metrics import SpecDecodingMetrics, SpecDecodingStats, count_accepted, format_line
from specops.engine.spec_decode.proposer import DraftBatch


def test_stats_arithmetic():
    s = SpecDecodingStats()
    s.observe([4, 4, 0, 2], [4, 1, 0, 0])  # the 0-draft request is ignored
    s.observe([4], [2])
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (4, 14, 7)
    assert s.drafted_per_pos == [4, 4, 3, 3]
    assert s.accepted_per_pos == [3, 2, 1, 1]
    assert s.mean_acceptance_length == pytest.approx(1 + 7 / 4)
    assert s.acceptance_rate == pytest.approx(7 / 14)
    assert s.per_position_acceptance_rate == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 3])
    # merging equals observing everything at once
    a, b, both = SpecDecodingStats(), SpecDecodingStats(), SpecDecodingStats()
    a.observe([2, 3], [2, 0])
    b.observe([5], [3])
    a.merge(b)
    both.observe([2, 3, 5], [2, 0, 3])
    assert a == both
    assert SpecDecodingStats().mean_acceptance_length == 0.0 and SpecDecodingStats().acceptance_rate == 0.0
    with pytest.raises(ValueError, match=re.escape("accepted tokens must be in [0, drafts], got 3 of 2")):
        s.observe([2], [3])
    with pytest.raises(ValueError, match="num_draft_tokens and num_accepted must have the same length, got 2 and 1"):
        s.observe([2, 2], [1])


def test_count_accepted():
    assert count_accepted([3, 0, 2, 4], [[1, 2, 3, 4], [7], [5], [1, 2]]) == [3, 0, 0, 1]


def test_log_line_snapshot_summary(caplog):
    now = [100.0]
    m = SpecDecodingMetrics(log_interval_s=5.0, clock=lambda: now[0])
    m.record([4, 4], [4, 2])
    now[0] = 102.0
    assert m.maybe_log() is None  # interval not reached
    now[0] = 110.0
    with caplog.at_level(logging.INFO, logger="specops.engine.spec_decode"):
        line = m.maybe_log()
    assert line in caplog.text
    assert line.startswith("SpecDecoding metrics: Mean acceptance length: 4.00")
    assert "Accepted throughput: 0.60 tokens/s" in line and "Drafted throughput: 0.80 tokens/s" in line
    assert "Accepted: 6 tokens" in line and "Drafted: 8 tokens" in line
    assert "Per-position acceptance rate: 1.000, 1.000, 0.500, 0.500" in line
    assert "Avg Draft acceptance rate: 75.0%" in line
    now[0] = 120.0
    assert m.maybe_log() is None  # nothing new since the last line
    m.record([2], [0])
    now[0] = 125.0
    line2 = m.maybe_log()
    assert "Accepted: 0 tokens, Drafted: 2 tokens" in line2
    assert "Drafted throughput: 0.13 tokens/s" in line2  # 2 tokens over the 15 s since the last line
    snap = m.snapshot()
    assert snap["num_drafts"] == 3 and snap["num_draft_tokens"] == 10 and snap["num_accepted_tokens"] == 6
    assert snap["mean_acceptance_length"] == pytest.approx(3.0)
    assert snap["elapsed_s"] == pytest.approx(25.0)
    assert m.summary() == format_line(m.total, 25.0)
    assert SpecDecodingMetrics(log_interval_s=None).maybe_log() is None


def test_draft_batch_gather_probs():
    probs = torch.arange(3 * 4 * 5, dtype=torch.float32).view(3, 4, 5)
    db = DraftBatch(["a", "b", "c"], [[1, 2, 3, 4], [5], []], probs)
    assert db.as_dict() == {"a": [1, 2, 3, 4], "b": [5], "c": []} and db.num_draft_tokens == 5
    got = db.gather_probs(["b", "c", "a"], [1, 0, 2])  # next step's order, drafts of a truncated to 2
    assert torch.equal(got, torch.stack([probs[1, 0], probs[0, 0], probs[0, 1]]))
    assert db.gather_probs(["c"], [0]).shape == (0, 5)
    with pytest.raises(ValueError, match="^request 'b': 2 drafts to verify but 1 were proposed$"):
        db.gather_probs(["b"], [2])
    with pytest.raises(ValueError, match=re.escape("request 'zz': 1 drafts to verify but 0 were proposed "
                                                   "(with no draft probabilities)")):
        db.gather_probs(["zz"], [1])
    assert DraftBatch(["a"], [[1]]).gather_probs(["a"], [1]) is None
