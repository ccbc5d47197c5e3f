"""Engine pieces without a model: SamplingParams validation, the persistent batch and its BatchUpdates."""

import random

import numpy as np
import pytest

from specops.engine.input_batch import InputBatch
from specops.engine.request import Request
from specops.engine.sampling_params import SamplingParams


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=2.0), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(frequency_penalty=3.0), "frequency_penalty"),
    (dict(presence_penalty=-2.5), "presence_penalty"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens"),
    (dict(n=0), r"^n must be in \[1, 64\], got 0$"),
    (dict(logprobs=-1), "logprobs"),
    (dict(logprobs=100), "logprobs"),
    (dict(seed=2**64), "seed"),
    (dict(seed=2**63 - 1, n=2), "seed"),                    # sample 1 would take seed 2**63
    (dict(temperature=1e39), "temperature"),                # inf in fp32: 1/T = 0 would be greedy
    (dict(repetition_penalty=1e39), "repetition_penalty"),
    (dict(repetition_penalty=1e-40), "repetition_penalty"),         # subnormal in fp32: logits / it overflow
    (dict(temperature=10**400), r"temperature must be in .* int of 1329 bits"),   # float() overflowed
    (dict(logit_bias={5: 10**400}), r"logit_bias\[5\]"),
    (dict(stop=["ok", "\ud800"]), "stop must be valid Unicode"),      # the tokenizer would refuse it
    (dict(bad_words=["\udfff x"]), "bad_words must be valid Unicode"),
    (dict(logit_bias=[1, 2]), "logit_bias"),
    (dict(logit_bias={5: 1e9}), r"logit_bias\[5\]"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[1, 1000]), "allowed_token_ids"),
    (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(stop=[1]), r"^stop must be a list of strings, got \[1\]$"),
    (dict(stop=[""]), "^stop must not contain the empty string$"),
    (dict(bad_words=[""]), "bad_words"),
    (dict(ignore_eos=1), "ignore_eos"),
    (dict(extra_args=[1]), "extra_args"),
    (dict(extra_args={"num_spec_tokens": "two"}), "num_spec_tokens"),  # once failed every request, every step
    (dict(extra_args={"num_spec_tokens": -1}), "num_spec_tokens"),
    (dict(extra_args={"num_spec_tokens": 2.5}), "num_spec_tokens"),
])
def test_sampling_params_rejects(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SamplingParams(**kwargs).validate(vocab_size=1000)


def test_sampling_params_accepts():
    SamplingParams(temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0, logit_bias={3: -100.0}, seed=-5,
                   allowed_token_ids=[0, 999], stop="x", logprobs=0, max_tokens=None).validate(1000)
    assert SamplingParams(stop="x").stop == ["x"]
    SamplingParams(seed=2**63 - 2, n=2).validate(1000)
    SamplingParams(logprobs=10).validate(10)
    with pytest.raises(ValueError, match="logprobs"):                # more than the vocabulary
        SamplingParams(logprobs=11).validate(10)
    assert SamplingParams(temperature=0).greedy and not SamplingParams().has_penalties


def test_input_batch_updates_follow_the_rows():
    """Random admissions/removals: rows stay dense, BatchUpdates replayed on a mirror give the same rows."""
    rng = random.Random(0)
    batch = InputBatch(max_num_reqs=8, max_blocks_per_req=4)
    mirror = [None] * 8
    live: list[Request] = []
    pool = [Request(f"r{i}", [1, 2, 3], SamplingParams(seed=i)) for i in range(200)]
    for step in range(80):
        keep = [r for r in live if rng.random() < 0.7]
        new = [pool.pop() for _ in range(min(len(pool), rng.randrange(0, 9 - len(keep))))]
        scheduled = keep + new
        for r in scheduled:
            r.block_ids = r.block_ids + [rng.randrange(100)] * (len(r.block_ids) < 4 and rng.random() < 0.5)
        before = {r.request_id: batch.index.get(r.request_id) for r in keep}
        upd = batch.update(scheduled)
        live = scheduled
        assert batch.num_reqs == len(scheduled)
        assert sorted(batch.req_ids) == sorted(r.request_id for r in scheduled)
        if upd is None:
            assert not new and len(keep) == len(before)
            continue
        assert upd.batch_size == len(scheduled)
        assert list(upd.removed) == sorted(upd.removed, reverse=True)
        for row in upd.removed:
            mirror[row] = None
        for row, params, prompt, out in upd.added:
            mirror[row] = params
        for src, dst, _ in upd.moved:
            mirror[dst], mirror[src] = mirror[src], None
        assert mirror[:batch.num_reqs] == [r.sampling_params for r in batch.reqs[:batch.num_reqs]]
        assert all(m is None for m in mirror[batch.num_reqs:])
        for row in range(batch.num_reqs):  # block tables follow their rows
            ids = batch.reqs[row].block_ids
            assert batch.num_blocks[row] == len(ids)
            assert np.array_equal(batch.block_table[row, :len(ids)], ids)
        for r in keep:  # a request that stays keeps its row unless moved into a hole
            moved_from = {src for src, _, _ in upd.moved}
            assert batch.index[r.request_id] == before[r.request_id] or before[r.request_id] in moved_from
