"""Batch bitmasks: building (per request or in threaded waves), applying to logits on every device,
and a simulated speculative decoding loop in which everything emitted is grammatical."""

import json

import numpy as np
import pytest
import torch

from specops.engine.structured_output import (BatchBitmask, BitmaskBuilder, BitmaskRequest, GrammarState,
                                              StructuredOutputManager, StructuredOutputOptions, XgrammarBackend,
                                              apply_batch_bitmask, apply_token_bitmask, apply_token_bitmask_torch,
                                              bitmask_width)
from specops.engine.structured_output.testing import random_walk, small_tokenizer


def _apply_ref(logits, bitmask, indices=None):
    """Plain loop reference in float64: -inf where the bit is 0, rows from indices (or all)."""
    out = logits.double().clone()
    vocab = min(logits.shape[1], bitmask.shape[1] * 32)
    rows = range(logits.shape[0]) if indices is None else [int(i) for i in indices]
    bm = bitmask.cpu().numpy().view(np.uint32)
    for r in rows:
        bits = np.unpackbits(bm[r].view(np.uint8), bitorder="little")[:vocab].astype(bool)
        out[r, :vocab][torch.from_numpy(~bits).to(out.device)] = float("-inf")
    return out


@pytest.mark.parametrize("rows,vocab,wide", [(1, 17, 0), (5, 289, 0), (3, 1000, 24), (9, 49152 + 7, 0), (0, 33, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_token_bitmask_matches_reference(device, rows, vocab, wide, dtype):
    """Dispatch (specops op when built, else torch) and the torch implementation against the
    reference; a logits row wider than the bitmask keeps its extra columns."""
    width = bitmask_width(vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, width), dtype=torch.int32, device=device)
    if rows:
        bitmask[0] = -1  # an all-allowed row
    logits = torch.randn(rows, vocab + wide, device=device).to(dtype)
    for indices in (None, [r for r in range(rows) if r % 2 == 0]):
        expect = _apply_ref(logits, bitmask, indices)
        for fn in (apply_token_bitmask, apply_token_bitmask_torch):
            got = logits.clone()
            idx = None if indices is None else torch.tensor(indices, dtype=torch.int32, device=device)
            fn(got, bitmask, idx)
            assert torch.equal(got.double(), expect), fn.__name__


def test_apply_batch_bitmask(device):
    vocab = 100
    bm = torch.randint(-(2**31), 2**31 - 1, (4, bitmask_width(vocab)), dtype=torch.int32)
    logits = torch.randn(4, vocab, device=device)
    got = logits.clone()
    apply_batch_bitmask(got, BatchBitmask(bm, [1, 3]))
    assert torch.equal(got.double(), _apply_ref(logits, bm.to(device), [1, 3]))
    apply_batch_bitmask(got, None)  # nothing constrained: no-op
    with pytest.raises(ValueError, match="bitmask has 4 rows but logits has 3"):
        apply_batch_bitmask(logits[:3], BatchBitmask(bm, None))


# ---- building ------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": -20, "maximum": 300},
    "tags": {"type": "array", "items": {"enum": ["aa", "xy", "abc"]}, "maxItems": 3}},
    "required": ["ok", "n", "tags"]}


@pytest.fixture(scope="module")
def backend():
    pytest.importorskip("xgrammar")
    return XgrammarBackend.from_tokenizer(small_tokenizer())


def _states_and_plans(backend, rng, n_req):
    """Requests at random points of their grammars, with random draft windows (some invalid)."""
    specs = [StructuredOutputOptions(json_schema=SCHEMA), StructuredOutputOptions(regex=r"(ab|xy)+\d{1,3}"),
             StructuredOutputOptions(choice=["aaaa", "abc", "xyz"])]
    compiled = [backend.compile(s) for s in specs]
    plans = []
    for i in range(n_req):
        if i % 4 == 3:
            plans.append(BitmaskRequest(None, int(rng.integers(1, 4))))
            continue
        c = compiled[i % 3]
        walk_state = GrammarState(backend.new_matcher(c))
        seq, _ = random_walk(walk_state, backend.vocab_size, rng, max_tokens=12, stop_prob=0.0,
                             stop_token_ids=tuple(backend.stop_token_ids))
        cut = int(rng.integers(0, len(seq) + 1))
        state = GrammarState(backend.new_matcher(c))
        assert state.accept_tokens(seq[:cut])
        drafts = seq[cut: cut + int(rng.integers(0, 5))]
        if drafts and rng.random() < 0.4:
            drafts[int(rng.integers(len(drafts)))] = int(rng.integers(backend.vocab_size))
        first = int(rng.integers(0, len(drafts) + 2)) if rng.random() < 0.25 else 0
        plans.append(BitmaskRequest(state, len(drafts) + 1, drafts, first))
    return plans


def _snapshot(plans, width):
    bm = torch.zeros((len(plans), width), dtype=torch.int32)
    for i, p in enumerate(plans):
        if p.grammar is not None:
            p.grammar.fill_bitmask(bm, i)
    return bm, [p.grammar.num_accepted if p.grammar else 0 for p in plans]


@pytest.mark.parametrize("seed", range(3))
def test_waves_equal_per_request_fill(backend, seed):
    rng = np.random.default_rng(seed)
    plans = _states_and_plans(backend, rng, 24)
    before = _snapshot(plans, backend.bitmask_width)
    each = BitmaskBuilder(backend.vocab_size, max_rows=4)  # grows on demand
    waves = BitmaskBuilder(backend.vocab_size, max_rows=4, num_threads=2, parallel_threshold=0)
    a = each.build(plans)
    b = waves.build(plans)
    assert a is not None and b is not None
    assert a.indices == b.indices
    idx = a.indices if a.indices is not None else list(range(a.bitmask.shape[0]))
    assert torch.equal(a.bitmask[idx], b.bitmask[idx])
    # reference for every row: the per-request 1+K fill; rows outside indices are unconstrained
    row = 0
    for p in plans:
        if p.grammar is not None:
            ref = torch.zeros((p.num_rows, backend.bitmask_width), dtype=torch.int32)
            n = p.grammar.fill_bitmask_rows(ref, 0, p.drafts, p.first)
            for j in range(p.num_rows):
                if p.first <= j < p.first + n:
                    assert row + j in idx and torch.equal(a.bitmask[row + j], ref[j])
                else:
                    assert row + j not in idx
        row += p.num_rows
    after = _snapshot(plans, backend.bitmask_width)
    assert torch.equal(before[0], after[0]) and before[1] == after[1]  # states restored


def test_build_all_rows_and_none(backend):
    c = backend.compile(StructuredOutputOptions(regex="[ab]+"))
    s1, s2 = GrammarState(backend.new_matcher(c)), GrammarState(backend.new_matcher(c))
    builder = BitmaskBuilder(backend.vocab_size, max_rows=8)
    out = builder.build([BitmaskRequest(s1), BitmaskRequest(s2)])
    assert out.indices is None and out.bitmask.shape == (2, backend.bitmask_width)
    assert builder.build([BitmaskRequest(None, 3)]) is None
    with pytest.raises(ValueError, match="1 \\+ 2 logits rows, got num_rows=2"):
        builder.build([BitmaskRequest(s1, 2, [5, 6])])


def _sample_step(logits, drafts, rng, greedy):
    """A minimal rejection step over masked logits: rows 0..K, drafts accepted while they agree
    with the target (greedy: argmax; random: accepted with the target's probability, else a
    recovered token drawn from the target without the draft)."""
    out = []
    for j in range(logits.shape[0]):
        probs = torch.softmax(logits[j].double(), -1)
        if greedy:
            tok = int(torch.argmax(probs))
        else:
            tok = int(rng.choice(len(probs), p=(probs / probs.sum()).numpy()))
        if j < len(drafts):
            d = drafts[j]
            accept = (tok == d) if greedy else (rng.random() < float(probs[d]))
            if accept:
                out.append(d)
                continue
            if not greedy:
                p = probs.clone()
                p[d] = 0
                if float(p.sum()) > 0:
                    tok = int(rng.choice(len(p), p=(p / p.sum()).numpy()))
        out.append(tok)
        break
    return out


@pytest.mark.parametrize("greedy", [True, False])
def test_simulated_speculative_decoding_is_always_grammatical(greedy):
    """The engine's calls in order, with random logits biased towards the drafts: every emitted
    token is accepted by the grammar and every finished output validates."""
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    tok = small_tokenizer()
    so = StructuredOutputManager(tok, max_rows=8 * 5)
    rng = np.random.default_rng(1 if greedy else 2)
    V = so.vocab_size
    reqs = {f"q{i}": [] for i in range(6)}
    for rid in reqs:
        so.add_request(rid, StructuredOutputOptions(json_schema=SCHEMA))
    for rid in reqs:
        assert so.wait(rid, 20).value == "ready"
    finished = {}
    drafts = {rid: [] for rid in reqs}
    n_drafted = n_accepted = n_invalid = 0
    for step in range(200):
        live = [r for r in reqs if r not in finished]
        if not live:
            break
        for rid in live:
            # drafts are validated before they are scheduled; sometimes not, to check that the
            # masked rows alone reject an invalid draft
            valid = so.validate_drafts(rid, drafts[rid])
            assert valid == drafts[rid][: len(valid)]
            n_invalid += len(valid) < len(drafts[rid])
            if rng.random() < 0.7:
                drafts[rid] = valid
        batch = [(rid, 1 + len(drafts[rid]), drafts[rid]) for rid in live]
        bm = so.build_bitmask([(None, 2, [])] + batch)  # an unconstrained request in front
        logits = torch.randn(2 + sum(b[1] for b in batch), V) * 2
        row = 2
        for rid, n, d in batch:
            for j, t in enumerate(d):
                logits[row + j, t] += 4.0
            row += n
        apply_batch_bitmask(logits, bm)
        row = 2
        for rid, n, d in batch:
            emitted = _sample_step(logits[row: row + n], d, rng, greedy)
            n_drafted += len(d)
            n_accepted += len(emitted) - 1
            if tok.eos_token_ids[0] in emitted:
                emitted = emitted[: emitted.index(tok.eos_token_ids[0]) + 1]
            assert so.accept_tokens(rid, emitted), (rid, reqs[rid], emitted)
            reqs[rid] += emitted
            if so.is_terminated(rid):
                finished[rid] = reqs[rid][:-1]
                so.remove_request(rid)
            row += n
        for rid in live:  # next drafts: a grammatical continuation half the time, noise otherwise
            if rid in finished:
                continue
            k = int(rng.integers(0, 5))
            drafts[rid] = [int(rng.integers(V)) for _ in range(k)]
            if rng.random() < 0.5:
                st = so._entries[rid].grammar
                walk, _ = random_walk(st, V, rng, max_tokens=k, stop_prob=0.2,
                                      stop_token_ids=tuple(tok.eos_token_ids))
                st.rollback(len(walk) + (1 if st.is_terminated() else 0))
                drafts[rid] = walk
    assert len(finished) >= 4, f"{len(finished)} of 6 finished"
    assert n_accepted > 0 and n_drafted > n_accepted and n_invalid > 5
    for rid, out in finished.items():
        jsonschema.validate(json.loads(tok.decode(out)), SCHEMA)
    so.shutdown()

