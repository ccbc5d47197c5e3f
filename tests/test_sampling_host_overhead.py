"""The engine's lean sampling step gives what the plain one gave: metadata from checked rows
equals `from_sampling_params`, steady-step keys equal `rng.row_keys`, the cached processor
tensors follow the batch, the one-pass checked argmax and the logprobs readback equal their
references. On CUDA the same runs with pinned, asynchronous copies."""

import random

import pytest
import torch

from specops import rng
from specops.engine.input_batch import InputBatch
from specops.engine.request import Request
from specops.engine.readback import to_logprobs
from specops.engine.sampling import BatchSampler, _checked_argmax
from specops.engine.sampling_params import SamplingParams
from specops.sampling.logits_processors import LogitBiasLogitsProcessor, LogitsRows, MinTokensLogitsProcessor
from specops.sampling.logits_processors.interface import BatchUpdate
from specops.sampling.logprobs import LogprobsTensors
from specops.sampling.metadata import RowParams, SamplingMetadata

V = 300
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def random_params(r: random.Random, i: int, penalties: bool = True) -> SamplingParams:
    return SamplingParams(
        temperature=r.choice([0.0, 1e-6, 0.7, 1.0]), top_k=r.choice([-1, 0, 5, V, V + 3]),
        top_p=r.choice([1.0, 0.9]), min_p=r.choice([0.0, 0.05]), seed=r.choice([None, i, -5, 2**62]),
        repetition_penalty=r.choice([1.0, 1.2]) if penalties else 1.0,
        frequency_penalty=r.choice([0.0, -0.3]) if penalties else 0.0,
        presence_penalty=r.choice([0.0, 0.5]) if penalties else 0.0,
        allowed_token_ids=r.sample(range(V), 7) if i % 4 == 1 else None, logprobs=r.choice([None, 0, 2]))


def assert_same_metadata(a: SamplingMetadata, b: SamplingMetadata) -> None:
    for name in ("temperature", "inv_temperature", "seeds", "positions", "request_seeds", "has_seed",
                 "token_positions", "step", "top_k", "top_p", "min_p", "repetition_penalties",
                 "frequency_penalties", "presence_penalties", "prompt_mask", "output_counts", "allowed_token_mask"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    for name in ("engine_seed", "all_greedy", "all_random", "bad_words_token_ids", "max_num_logprobs"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(6))
def test_from_rows_equals_from_sampling_params(device, case):
    r = random.Random(case)
    n = r.randrange(1, 12)
    params = [random_params(r, i, penalties=case % 2 == 0) for i in range(n)]
    if case == 5:
        params = [SamplingParams(temperature=0.0) for _ in range(n)]
    pm = torch.rand(n, V, device=device) < 0.1
    oc = torch.randint(0, 3, (n, V), dtype=torch.int32, device=device)
    step = torch.tensor(7, device=device)
    kw = dict(vocab_size=V, device=device, engine_seed=3, step=step, prompt_mask=pm, output_counts=oc)
    a = SamplingMetadata.from_sampling_params(params, **kw)
    b = SamplingMetadata.from_rows([RowParams.from_sampling_params(p, V) for p in params], **kw)
    assert_same_metadata(a, b)


def test_row_params_checks():
    with pytest.raises(ValueError, match="top_p"):
        RowParams.from_sampling_params(SamplingParams(top_p=0.0), V)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        RowParams.from_sampling_params(SamplingParams(allowed_token_ids=[V]), V)
    with pytest.raises(ValueError, match=f"num_logprobs of row 0 must be <= {V}"):   # each row's, not only the max
        SamplingMetadata.from_rows([RowParams.from_sampling_params(SamplingParams(logprobs=V + 1), V)], vocab_size=V)


def make_batch(device, n, seed=0):
    r = random.Random(seed)
    sampler = BatchSampler(16, V, device, seed=11, eos_token_ids=[2])
    batch = InputBatch(16, 4)
    reqs = []
    for i in range(n):
        sp = SamplingParams(temperature=0.8, top_k=20, seed=i if i % 2 else None, repetition_penalty=1.1,
                            logit_bias={5: 1.0, 9: -2.0} if i % 3 == 0 else None, min_tokens=3 if i % 2 else 0,
                            logprobs=1)
        req = Request(f"r{i}", [r.randrange(V) for _ in range(5)], sp)
        req.output_token_ids.extend(r.randrange(V) for _ in range(i % 3))
        reqs.append(req)
    upd = batch.update(reqs)
    sampler.update_state(upd, batch.reqs[:batch.num_reqs])
    return sampler, batch


@pytest.mark.parametrize("device", DEVICES)
def test_steady_keys_equal_row_keys(device):
    sampler, batch = make_batch(device, 6)
    md = sampler._batch_metadata()
    for step in range(3):
        sampler._host_step = step
        positions = [10 + 3 * i + step for i in range(6)]
        rows = LogitsRows(list(range(6)), [0] * 6)
        got = sampler._steady_metadata(md, positions, rows, None)
        pos = torch.tensor(positions, device=device)
        seeds, keys = rng.row_keys(md.request_seeds, md.has_seed, pos, 11, torch.tensor(step, device=device))
        assert torch.equal(got.seeds, seeds) and torch.equal(got.positions, keys)
        assert torch.equal(got.token_positions, pos)


@pytest.mark.parametrize("device", DEVICES)
def test_steady_sample_equals_expand(device):
    """All rows sampling (steady path) draws what the general path (expand) draws."""
    torch.manual_seed(0)
    logits = torch.randn(6, V, device=device)
    out = []
    for steady in (True, False):
        sampler, batch = make_batch(device, 6)
        if not steady:
            sampler._batch_metadata()
            sampler._identity = None  # force the general path
        positions = [20 + i for i in range(6)]
        tokens, lp = sampler.sample(logits.clone(), list(range(6)), positions)
        out.append((tokens, lp, sampler.output_counts.clone()))
    (t1, lp1, c1), (t2, lp2, c2) = out
    assert torch.equal(t1, t2) and torch.equal(c1, c2)
    assert torch.equal(lp1.token_ids, lp2.token_ids) and torch.equal(lp1.ranks, lp2.ranks)
    assert torch.allclose(lp1.logprobs, lp2.logprobs, rtol=0, atol=0, equal_nan=True)


def reference_bias(logits, state, rows):
    x = logits.clone()
    for r, index in enumerate(rows.req_indices):
        if index in state:
            for t, v in zip(*state[index]):
                x[r, t] += v
    return x


@pytest.mark.parametrize("device", DEVICES)
def test_logit_bias_cache_follows_the_batch(device):
    proc = LogitBiasLogitsProcessor(8, V, device)
    sp = lambda b: SamplingParams(logit_bias=b)  # noqa: E731
    proc.update_state(BatchUpdate(3, added=[(0, sp({1: 1.0}), [], []), (2, sp({4: -1.0, 5: 2.0}), [], [])]))
    logits = torch.randn(4, V, device=device)
    for rows in (LogitsRows([0, 1, 2], [0] * 3), LogitsRows([0, 1, 2], [1] * 3), LogitsRows([2, 2, 0, 1], [0] * 4)):
        x = logits[:len(rows)]
        assert torch.equal(proc.apply(x.clone(), rows), reference_bias(x, proc.state, rows))
    proc.update_state(BatchUpdate(3, removed=[2], added=[(2, sp({7: 3.0}), [], [])]))
    rows = LogitsRows([0, 1, 2], [0] * 3)
    assert torch.equal(proc.apply(logits[:3].clone(), rows), reference_bias(logits[:3], proc.state, rows))


def test_logit_bias_merges_duplicate_ids_and_checks_the_sum():
    from types import SimpleNamespace
    proc = LogitBiasLogitsProcessor(4, V, "cpu")
    proc.update_state(BatchUpdate(1, added=[(0, SimpleNamespace(logit_bias={5: 1.5, "5": 2.0, 7: -1.0}), [], [])]))
    x = proc.apply(torch.zeros(1, V), LogitsRows([0], [0]))
    assert x[0, 5] == 3.5 and x[0, 7] == -1.0 and int((x != 0).sum()) == 2
    with pytest.raises(ValueError, match="float32"):
        proc.update_state(BatchUpdate(2, added=[(1, SimpleNamespace(logit_bias={3: 3e38, "3": 3e38}), [], [])]))


@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_cache_follows_progress(device):
    proc = MinTokensLogitsProcessor(8, V, device, eos_token_ids=[2])
    outs = [[], [7]]
    proc.update_state(BatchUpdate(2, added=[(0, SamplingParams(min_tokens=2), [], outs[0]),
                                            (1, SamplingParams(min_tokens=2, stop_token_ids=[9]), [], outs[1])]))
    logits = torch.zeros(2, V, device=device)
    for done0, done1 in ((0, 1), (1, 2), (1, 2), (2, 0)):
        x = proc.apply(logits.clone(), LogitsRows([0, 1], [done0, done1]))
        assert bool(torch.isinf(x[0, 2])) == (done0 < 2)
        assert bool(torch.isinf(x[1, 2])) == bool(torch.isinf(x[1, 9])) == (done1 < 2)
        assert int(torch.isinf(x).sum()) == (done0 < 2) + 2 * (done1 < 2)


@pytest.mark.parametrize("device", DEVICES)
def test_checked_argmax(device):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 3, (12, 50), generator=g).float()  # ties everywhere
    logits[0, 5] = float("nan")
    logits[1] = float("-inf")
    logits[2, 7] = float("inf")
    logits[3] = float("-inf")
    logits[3, 9] = 0.0
    logits[4, 3] = float("-inf")
    logits[5] = float("-inf")
    logits[5, 10] = float("nan")
    logits = logits.to(device)
    bad = torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | torch.isneginf(logits).all(-1)
    assert torch.equal(_checked_argmax(logits.clone()), torch.where(bad, -1, logits.argmax(dim=-1)))


@pytest.mark.parametrize("device", DEVICES)
def test_to_logprobs(device):
    R, n = 5, 3
    ids = torch.randint(0, 2**31 - 1, (R, n + 1), device=device)
    ids[2] = -1
    vals = torch.randn(R, n + 1, device=device)
    vals[2] = float("nan")
    vals[1, 2] = float("-inf")
    lp = LogprobsTensors(ids, vals, torch.tensor([1, 4, -1, 2, 100000], device=device))
    for want, num_top in (([0, 1, 2, 3, 4], [3, 2, 0, 1, 3]), ([1, 3], [2, 3])):
        got = to_logprobs(lp, want, num_top)
        for entry, row, k in zip(got, want, num_top):
            i, v = ids[row].tolist(), vals[row].tolist()
            assert entry.token_id == i[0] and entry.rank == int(lp.ranks[row])
            assert entry.logprob == v[0] or (v[0] != v[0] and entry.logprob != entry.logprob)
            assert list(entry.top) == i[1:k + 1]
            assert all(a == b or (a != a and b != b) for a, b in zip(entry.top.values(), v[1:k + 1]))
            assert type(entry.token_id) is int and type(entry.rank) is int


def test_packed_readback_equals_to_logprobs():
    """One float64 readback gives the same tokens and Logprob entries as the per-field copies."""
    from specops.engine.request import Logprob
    from specops.engine.readback import pack_readback, to_logprobs, unpack_readback
    from specops.sampling.logprobs import LogprobsTensors

    g = torch.Generator().manual_seed(3)
    n_rows, k = 7, 4
    tokens = torch.randint(0, 151936, (n_rows,), generator=g)
    tokens[2] = -1  # an invalid row
    ids = torch.randint(0, 151936, (n_rows, k), generator=g)
    ids[2] = -1
    vals = torch.randn(n_rows, k, generator=g) * 30
    vals[2] = float("nan")
    lp = LogprobsTensors(ids, vals, torch.randint(1, 151936, (n_rows,), generator=g))
    num = [None, 0, 3, 1, None, 2, 3]
    got_tokens, got = unpack_readback(pack_readback(tokens, lp).numpy(), num)
    want = [i for i, n in enumerate(num) if n is not None]
    ref = [Logprob(int(ids[i, 0]), float(vals[i, 0]), int(lp.ranks[i]),
                   {int(t): float(v) for t, v in zip(ids[i, 1:num[i] + 1], vals[i, 1:num[i] + 1])}) for i in want]
    gathered = to_logprobs(lp, want, [num[i] for i in want])
    assert got_tokens == tokens.tolist()
    assert [got[i] is None for i in range(n_rows)] == [n is None for n in num]
    for a, entry in [(got[i], e) for i, e in zip(want, ref)] + list(zip(gathered, ref)):
        assert (a.token_id, a.rank, list(a.top)) == (entry.token_id, entry.rank, list(entry.top))
        assert a.logprob == entry.logprob or (a.logprob != a.logprob and entry.logprob != entry.logprob)
        assert all(a.top[t] == v or (v != v and a.top[t] != a.top[t]) for t, v in entry.top.items())
