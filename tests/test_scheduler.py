"""Scheduler + BlockManager driven by a fake model that reads its context back from a simulated
paged KV cache: outputs must not depend on budget, chunking, prefix caching or preemption, and no
request may be lost or duplicated."""

import random

import pytest
from engine_runs import EOS, VOCAB, expected, fake_next

from specops.engine.block_manager import BlockManager
from specops.engine.config import EngineConfig
from specops.engine.request import Request, RequestStatus
from specops.engine.sampling_params import SamplingParams
from specops.engine.scheduler import Scheduler


class FakeRunner:
    """Writes each scheduled token into its slot, then reads every position back through the block table."""

    def __init__(self, sched: Scheduler):
        bm = sched.block_manager
        self.bs = bm.block_size
        self.kv = [None] * (bm.num_blocks * bm.block_size)

    def slot(self, req, p):
        return req.block_ids[p // self.bs] * self.bs + p % self.bs

    def execute(self, out):
        sampled = {}
        for req in out.scheduled:  # write everything first, as one forward does per layer
            c, n = req.num_computed_tokens, out.num_scheduled_tokens[req.request_id]
            for p in range(c, c + n):
                self.kv[self.slot(req, p)] = req.all_token_ids[p]
        for req in out.scheduled:
            c, n = req.num_computed_tokens, out.num_scheduled_tokens[req.request_id]
            ctx = [self.kv[self.slot(req, p)] for p in range(c + n)]
            assert ctx == req.all_token_ids[:c + n], f"{req} read a corrupted context"
            if c + n == req.num_tokens:
                sampled[req.request_id] = [fake_next(ctx)]
        return sampled


def make_sched(num_blocks, block_size=4, max_model_len=64, **kw):
    cfg = EngineConfig(block_size=block_size, **kw)
    return Scheduler(cfg, max_model_len, BlockManager(num_blocks, block_size, cfg.enable_prefix_caching))


def run(sched, arrivals, abort_at=None, max_steps=5000):
    """arrivals: {step: [Request]}; abort_at: {step: [request_id]}. Returns finished requests by id."""
    runner = FakeRunner(sched)
    finished, step = {}, 0
    pending = dict(arrivals)
    while pending or sched.has_unfinished_requests():
        for req in pending.pop(step, []):
            sched.add_request(req)
        for rid in (abort_at or {}).get(step, []):
            req = sched.abort_request(rid)
            if req is not None:
                assert rid not in finished
                finished[rid] = req
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
        assert len(out.scheduled) <= sched.max_num_seqs
        assert len({r.request_id for r in out.scheduled}) == len(out.scheduled)
        assert sum(out.num_scheduled_tokens.values()) == out.total_num_scheduled_tokens
        sched.check()
        sampled = runner.execute(out)
        sched.update_from_output(out, sampled)
        for req in out.scheduled:
            if req.is_finished and req.status != RequestStatus.FINISHED_ABORTED:
                assert req.request_id not in finished, "finished twice"
                finished[req.request_id] = req
        sched.check()
        step += 1
        assert step < max_steps, "no progress"
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    return finished


def random_workload(rng, n, shared_prefix=True, max_tokens=(1, 12)):
    prefix = [rng.randrange(1, VOCAB) for _ in range(10)]
    arrivals = {}
    for i in range(n):
        body = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
        prompt = (prefix[:rng.randrange(0, 11)] if shared_prefix else []) + body
        sp = SamplingParams(max_tokens=rng.randrange(*max_tokens))
        arrivals.setdefault(rng.randrange(0, 20), []).append(Request(f"r{i}", prompt, sp, eos_token_ids=[EOS]))
    return arrivals


CONFIGS = [
    dict(num_blocks=400, max_num_batched_tokens=512, max_num_seqs=64),  # everything fits
    dict(num_blocks=400, max_num_batched_tokens=7, max_num_seqs=3),  # chunked prefill, few rows
    dict(num_blocks=400, max_num_batched_tokens=64, enable_prefix_caching=False),
    dict(num_blocks=16, max_num_batched_tokens=32, max_num_seqs=8),  # tiny pool: preemption
    dict(num_blocks=16, max_num_batched_tokens=64, max_num_seqs=64, enable_chunked_prefill=False),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["roomy", "chunked", "no-prefix-cache", "preempt", "no-chunking"])
def test_outputs_independent_of_scheduling(cfg):
    rng = random.Random(1234)
    arrivals = random_workload(rng, 40)
    reqs = {r.request_id: r for rs in arrivals.values() for r in rs}
    sched = make_sched(**cfg)
    finished = run(sched, arrivals)
    assert set(finished) == set(reqs), "a request was lost"
    for rid, req in reqs.items():
        assert req.output_token_ids == expected(req.prompt_token_ids, req.sampling_params.max_tokens, 64), rid
        assert req.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)
        assert (req.status == RequestStatus.FINISHED_STOPPED) == (req.output_token_ids[-1] == EOS)
    if cfg["num_blocks"] == 16 and cfg.get("enable_chunked_prefill", True):
        assert sched.num_preemptions > 0
    if cfg.get("enable_prefix_caching", True) and cfg["num_blocks"] > 16:
        assert sum(r.num_cached_tokens for r in reqs.values()) > 0


def test_decodes_first_then_chunks():
    sched = make_sched(num_blocks=100, max_num_batched_tokens=10)
    a = Request("a", list(range(1, 6)), SamplingParams(max_tokens=20))
    sched.add_request(a)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 5}
    sched.update_from_output(out, {"a": [7]})
    b = Request("b", list(range(100, 129)), SamplingParams(max_tokens=20))
    sched.add_request(b)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1, "b": 9}  # a decodes, b gets the rest of the budget
    sched.update_from_output(out, {"a": [8]})  # b is mid-prompt: nothing sampled for it
    assert b.num_computed_tokens == 9 and b.num_output_tokens == 0
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1, "b": 9}


def test_preemption_order_and_recompute():
    sched = make_sched(num_blocks=4, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    a = Request("a", list(range(1, 8)), SamplingParams(max_tokens=30))  # 7 tokens: 2 blocks
    b = Request("b", list(range(11, 18)), SamplingParams(max_tokens=30))
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert [r.request_id for r in out.scheduled] == ["a", "b"]
    sched.update_from_output(out, {"a": [1], "b": [2]})
    out = sched.schedule()  # position 7 still fits in each request's 2 blocks
    assert [r.request_id for r in out.scheduled] == ["a", "b"]
    sched.update_from_output(out, {"a": [3], "b": [4]})
    out = sched.schedule()  # a needs a 3rd block: b (admitted last) is preempted
    assert [r.request_id for r in out.scheduled] == ["a"] and out.preempted == [b]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_ids == []
    assert sched.waiting[0] is b and b.output_token_ids == [2, 4]
    sched.check()
    sched.update_from_output(out, {"a": [5]})
    sched.finish_request(a, RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()  # b comes back and recomputes its prompt and its outputs
    assert out.scheduled == [b] and out.num_scheduled_tokens == {"b": 9}
    sched.check()


def test_abort_frees_everything():
    rng = random.Random(7)
    arrivals = random_workload(rng, 30, max_tokens=(5, 20))
    ids = [r.request_id for rs in arrivals.values() for r in rs]
    abort_at = {s: rng.sample(ids, 3) for s in range(0, 30, 4)}
    sched = make_sched(num_blocks=40, max_num_batched_tokens=32, max_num_seqs=8)
    finished = run(sched, arrivals, abort_at)
    assert set(finished) == set(ids)
    aborted = [r for r in finished.values() if r.status == RequestStatus.FINISHED_ABORTED]
    assert aborted and all(not r.block_ids for r in finished.values())
    for r in finished.values():
        if r.status != RequestStatus.FINISHED_ABORTED:
            assert r.output_token_ids == expected(r.prompt_token_ids, r.sampling_params.max_tokens, 64)
    assert sched.abort_request("nope") is None


def test_max_model_len_and_duplicate_ids():
    sched = make_sched(num_blocks=50, max_model_len=12)
    r = Request("x", list(range(1, 11)), SamplingParams(max_tokens=100, ignore_eos=True))
    finished = run(sched, {0: [r]})
    assert finished["x"].status == RequestStatus.FINISHED_LENGTH and r.num_tokens == 12
    sched.add_request(Request("y", [1, 2], SamplingParams()))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(Request("y", [1, 2], SamplingParams()))


def test_stop_conditions():
    sched = make_sched(num_blocks=50)
    sp = SamplingParams(min_tokens=3, stop_token_ids=[5])
    r = Request("s", [1, 2, 3], sp, eos_token_ids=[EOS])
    sched.add_request(r)
    for tok, done in ((EOS, False), (5, False), (EOS, True)):
        out = sched.schedule()
        sched.update_from_output(out, {"s": [tok]})
        assert r.is_finished == done
    assert r.status == RequestStatus.FINISHED_STOPPED and r.output_token_ids == [EOS, 5, EOS]


def test_prefix_hit_rate_counts_a_request_once_when_admitted():
    # a request left waiting (the pool is short) was counted in the hit-rate statistics at every
    # step it was looked up; now once, when it is admitted (found by a review)
    bm = BlockManager(num_blocks=4, block_size=4)
    s = Scheduler(EngineConfig(max_num_seqs=4, max_num_batched_tokens=64), 64, bm)
    sp = SamplingParams(temperature=0.0, max_tokens=100)
    a = Request("a", list(range(3, 15)), sp)
    s.add_request(a)
    s.update_from_output(s.schedule(), {"a": [7]})
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (12, 0)
    b = Request("b", list(range(3, 11)) + [99] * 8, sp)   # its first 8 tokens are cached; no room for it
    s.add_request(b)
    for _ in range(5):
        out = s.schedule()
        s.update_from_output(out, {"a": [7]} if "a" in out.num_scheduled_tokens else {})
    assert b.status == RequestStatus.WAITING
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (12, 0)
    s.abort_request("a")                                  # room: b is admitted, and counted once
    out = s.schedule()
    assert "b" in out.num_scheduled_tokens
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (12 + 16, 8)


def test_lookahead_slots_stop_at_max_model_len():
    # lookahead slots past max_model_len were reserved too: with a pool of exactly max_model_len
    # tokens, a request one token from the end needed one block more than the pool and preempted
    # itself at every step (found by a review; no proposer uses lookahead today)
    bm = BlockManager(num_blocks=4, block_size=4)
    s = Scheduler(EngineConfig(max_num_seqs=1, max_num_batched_tokens=64), 16, bm, num_lookahead_tokens=2)
    r = Request("a", list(range(3, 17)), SamplingParams(temperature=0.0, max_tokens=100))   # 14 tokens
    s.add_request(r)
    s.update_from_output(s.schedule(), {"a": [5]})       # 15 tokens: one more reaches max_model_len
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and not out.preempted
    s.update_from_output(out, {"a": [6]})
    assert r.is_finished and r.finish_reason == "length" and bm.num_free_blocks == bm.num_blocks
