"""Scheduler with speculative decoding, driven by a fake model over a simulated paged KV cache:
drafts count in the token budget and are truncated when it is short, never run during a prefill
chunk, respect max_model_len with room for the bonus token; after verification num_computed_tokens
rolls back by the rejected count, the committed context read back from the cache is never
corrupted by rejected drafts, the prefix cache holds committed tokens only, and the outputs equal
plain decoding's under every budget, pool size and chunking."""

import random

import pytest
from engine_runs import EOS, VOCAB, expected, fake_next

from specops.engine.block_manager import BlockManager
from specops.engine.config import EngineConfig
from specops.engine.request import Request, RequestStatus
from specops.engine.sampling_params import SamplingParams
from specops.engine.scheduler import Scheduler
from specops.engine.spec_decode import KSchedule

MAX_LEN = 64


class FakeSpecRunner:
    """Writes every scheduled token (drafts included) into its slot, reads the context back through
    the block table, and verifies drafts greedily against fake_next."""

    def __init__(self, sched: Scheduler):
        bm = sched.block_manager
        self.sched = sched
        self.bs = bm.block_size
        self.kv = [None] * (bm.num_blocks * bm.block_size)
        self.num_drafts = self.num_accepted = 0

    def slot(self, req, p):
        return req.block_ids[p // self.bs] * self.bs + p % self.bs

    def execute(self, out):
        sampled = {}
        for req in out.scheduled:
            drafts = out.scheduled_spec_decode_tokens.get(req.request_id, [])
            c, n = req.num_computed_tokens, out.num_scheduled_tokens[req.request_id]
            assert c + n <= self.sched.max_model_len - 1 or (not drafts and c + n == req.num_tokens)
            for p, tok in zip(range(c, c + n), (req.all_token_ids + drafts)[c:c + n]):
                self.kv[self.slot(req, p)] = tok
        for req in out.scheduled:
            drafts = out.scheduled_spec_decode_tokens.get(req.request_id, [])
            c, n = req.num_computed_tokens, out.num_scheduled_tokens[req.request_id]
            ctx = [self.kv[self.slot(req, p)] for p in range(c + n)]
            assert ctx == (req.all_token_ids + drafts)[:c + n], f"{req} read a corrupted context"
            if c + n < req.num_tokens:
                assert not drafts, "drafts scheduled during a prefill chunk"
                continue
            assert c + n == req.num_tokens + len(drafts)
            emitted = []
            for j in range(len(drafts) + 1):
                t = fake_next(req.all_token_ids + drafts[:j])
                emitted.append(t)
                if j == len(drafts) or t != drafts[j]:
                    break
            self.num_drafts += len(drafts)
            self.num_accepted += len(emitted) - 1
            sampled[req.request_id] = emitted
        return sampled


def propose(sched, rng, k_schedule, p_right=0.6):
    """Fake proposer: drafts right with probability p_right each, for requests in pure decode."""
    decoding = [r for r in sched.running if r.num_computed_tokens == r.num_tokens - 1]
    ks = k_schedule.k_for_requests(decoding, sched.max_model_len, batch_size=len(sched.running))
    for req, k in zip(decoding, ks.tolist()):
        drafts = []
        for _ in range(k):
            right = fake_next(req.all_token_ids + drafts)
            drafts.append(right if rng.random() < p_right else rng.randrange(VOCAB))
        req.spec_token_ids = drafts


def check_prefix_cache(sched):
    """Every registered block of a running request holds committed tokens only."""
    bm = sched.block_manager
    for req in sched.running:
        assert req.num_hashed_blocks * bm.block_size <= req.num_computed_tokens
        for i in range(req.num_hashed_blocks):
            block = bm.blocks[req.block_ids[i]]
            if block.key is not None:
                assert list(block.key[1]) == req.all_token_ids[i * bm.block_size:(i + 1) * bm.block_size]


def make_sched(num_blocks, block_size=4, max_model_len=MAX_LEN, **kw):
    cfg = EngineConfig(block_size=block_size, **kw)
    return Scheduler(cfg, max_model_len, BlockManager(num_blocks, block_size, cfg.enable_prefix_caching))


def run(sched, arrivals, k=4, schedule=None, seed=0, max_steps=5000):
    runner = FakeSpecRunner(sched)
    rng = random.Random(seed)
    ks = KSchedule(k, schedule)
    finished, step = {}, 0
    pending = dict(arrivals)
    while pending or sched.has_unfinished_requests():
        for req in pending.pop(step, []):
            sched.add_request(req)
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
        assert sum(out.num_scheduled_tokens.values()) == out.total_num_scheduled_tokens
        assert all(not r.spec_token_ids for r in out.scheduled)  # moved to the output
        sched.check()
        sched.update_from_output(out, runner.execute(out))
        for req in out.scheduled:
            if req.is_finished:
                assert req.request_id not in finished, "finished twice"
                finished[req.request_id] = req
            else:  # rollback: everything but the last emitted token is computed
                assert req.num_computed_tokens == req.num_tokens - 1 or not out.scheduled_spec_decode_tokens.get(
                    req.request_id)
        sched.check()
        check_prefix_cache(sched)
        propose(sched, rng, ks)
        step += 1
        assert step < max_steps, "no progress"
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    return finished, runner


def random_workload(rng, n, max_tokens=(1, 24)):
    prefix = [rng.randrange(1, VOCAB) for _ in range(10)]
    arrivals = {}
    for i in range(n):
        body = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
        prompt = prefix[:rng.randrange(0, 11)] + body
        sp = SamplingParams(max_tokens=rng.randrange(*max_tokens))
        arrivals.setdefault(rng.randrange(0, 20), []).append(Request(f"r{i}", prompt, sp, eos_token_ids=[EOS]))
    return arrivals


CONFIGS = {
    "roomy": dict(num_blocks=400, max_num_batched_tokens=512, max_num_seqs=64),
    "chunked": dict(num_blocks=400, max_num_batched_tokens=7, max_num_seqs=3),  # drafts truncated often
    "no-prefix-cache": dict(num_blocks=400, max_num_batched_tokens=64, enable_prefix_caching=False),
    "preempt": dict(num_blocks=18, max_num_batched_tokens=32, max_num_seqs=8),
    "block-size-1": dict(num_blocks=500, block_size=1, max_num_batched_tokens=40),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_spec_outputs_equal_plain_decoding(name):
    rng = random.Random(4321)
    arrivals = random_workload(rng, 40)
    reqs = {r.request_id: r for rs in arrivals.values() for r in rs}
    sched = make_sched(**CONFIGS[name])
    finished, runner = run(sched, arrivals)
    assert set(finished) == set(reqs), "a request was lost"
    for rid, req in reqs.items():
        assert req.output_token_ids == expected(req.prompt_token_ids, req.sampling_params.max_tokens, MAX_LEN), rid
        assert req.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)
    assert runner.num_accepted > 50 and runner.num_drafts - runner.num_accepted > 50  # accepts and rejects
    if name == "preempt":
        assert sched.num_preemptions > 0


def test_batch_schedule_turns_speculation_off_at_large_batch():
    for schedule, speculates in (("1:4,8:0", False), ("1:4,16:0", True)):
        rng = random.Random(5)
        arrivals = {0: [Request(f"r{i}", [rng.randrange(1, VOCAB) for _ in range(5)],
                                SamplingParams(max_tokens=12, ignore_eos=True)) for i in range(12)]}
        sched = make_sched(num_blocks=400, max_num_batched_tokens=512)
        finished, runner = run(sched, arrivals, schedule=schedule)
        assert (runner.num_drafts > 0) == speculates
        for req in finished.values():
            assert len(req.output_token_ids) == 12


def decoding_request(sched, rid="a", prompt=(1, 2, 3, 4, 5), max_tokens=50):
    """A request that has prefilled its prompt and sampled one token."""
    req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    sched.add_request(req)
    out = sched.schedule()
    sched.update_from_output(out, {rid: [fake_next(req.all_token_ids)]})
    return req


def decoding_requests(sched, prompt_a, prompt_b):
    """Requests a and b, prefilled in one step, each with one sampled token."""
    a = Request("a", list(prompt_a), SamplingParams(max_tokens=50, ignore_eos=True))
    b = Request("b", list(prompt_b), SamplingParams(max_tokens=50, ignore_eos=True))
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert out.scheduled == [a, b]
    sched.update_from_output(out, {"a": [fake_next(a.all_token_ids)], "b": [fake_next(b.all_token_ids)]})
    return a, b


def test_drafts_count_in_budget_and_are_truncated():
    sched = make_sched(num_blocks=100, max_num_batched_tokens=3)
    a = Request("a", [1, 2], SamplingParams(max_tokens=50))
    sched.add_request(a)
    sched.update_from_output(sched.schedule(), {"a": [7]})
    a.spec_token_ids = [11, 12, 13, 14]
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3}  # the last token + 2 of the 4 drafts
    assert out.scheduled_spec_decode_tokens == {"a": [11, 12]} and a.spec_token_ids == []
    sched.update_from_output(out, {"a": [11, 5]})  # draft 11 accepted, 12 rejected (5 emitted instead)
    assert a.output_token_ids == [7, 11, 5] and a.num_computed_tokens == 4 == a.num_tokens - 1
    # Drafts of a request that lost the budget to an earlier one are dropped for this step.
    b = Request("b", [3, 4], SamplingParams(max_tokens=50))
    sched.add_request(b)
    a.spec_token_ids = [1, 1]
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3} and "b" not in out.num_scheduled_tokens


def test_no_drafts_during_a_prefill_chunk():
    sched = make_sched(num_blocks=100, max_num_batched_tokens=4)
    a = Request("a", list(range(1, 11)), SamplingParams(max_tokens=50))
    sched.add_request(a)
    sched.update_from_output(sched.schedule(), {})  # first chunk: 4 of 10 prompt tokens
    a.spec_token_ids = [5, 6]  # a (buggy) proposer drafting mid-prompt
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_decode_tokens == {}
    assert a.spec_token_ids == []


def test_max_model_len_leaves_room_for_the_bonus_token():
    sched = make_sched(num_blocks=100, max_model_len=12)
    a = decoding_request(sched, prompt=range(1, 8))  # 8 tokens after the first sample
    a.spec_token_ids = [1, 2, 3, 4, 5]
    out = sched.schedule()
    # positions 7..10 may be computed (11 = max_model_len - 1 is the bonus token's): 3 drafts
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_decode_tokens == {"a": [1, 2, 3]}
    sched.update_from_output(out, {"a": [1, 2, 3, 9]})
    assert a.num_tokens == 12 and a.status == RequestStatus.FINISHED_LENGTH


def test_rejected_drafts_never_reach_the_prefix_cache():
    sched = make_sched(num_blocks=100, block_size=4)
    a = decoding_request(sched, prompt=[1, 2, 3])  # 4 tokens: block 0 is full
    a.spec_token_ids = [21, 22, 23, 24, 25, 26]  # fill blocks 1 and 2 with drafts
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 7}
    sched.update_from_output(out, {"a": [21, 9]})  # one accepted, five rejected
    assert a.num_computed_tokens == 5 and a.all_token_ids[4:] == [21, 9]
    assert a.num_hashed_blocks == 1  # block 1 holds rejected drafts' KV: not registered
    assert len(sched.block_manager.cached) == 1
    check_prefix_cache(sched)
    # A new request with the rejected continuation must not hit block 1.
    b = Request("b", [1, 2, 3, a.all_token_ids[3], 21, 22, 23, 24, 25], SamplingParams(max_tokens=5))
    hits, num_hit = sched.block_manager.get_computed_blocks(b)
    assert num_hit == 4


def test_drafts_that_do_not_fit_the_pool_are_dropped_not_paid_for_by_a_preemption():
    sched = make_sched(num_blocks=4, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    a, b = decoding_requests(sched, range(1, 7), range(11, 17))   # 7 tokens each, in 2 blocks each
    a.spec_token_ids, b.spec_token_ids = [1, 2, 3], [4, 5, 6]
    out = sched.schedule()  # the drafts need a 3rd block each, the pool has none: both run without them
    assert out.preempted == [] and out.scheduled == [a, b] and out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert out.scheduled_spec_decode_tokens == {} and a.spec_token_ids == [] == b.spec_token_ids
    sched.update_from_output(out, {"a": [7], "b": [8]})
    a.spec_token_ids = [1, 2]   # position 7 + 2 drafts need a 3rd block; one is free once b is gone
    sched.finish_request(b, RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [1, 2]} and out.num_scheduled_tokens == {"a": 3}
    sched.check()


def test_preemption_drops_drafts():
    sched = make_sched(num_blocks=4, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    a, b = decoding_requests(sched, range(1, 9), range(11, 17))   # a: 9 tokens, position 8 needs a 3rd block
    a.spec_token_ids, b.spec_token_ids = [1, 2, 3], [4, 5, 6]
    out = sched.schedule()  # a needs a 3rd block even without drafts: b is preempted
    assert out.preempted == [b] and b.spec_token_ids == [] and b.num_computed_tokens == 0
    assert out.scheduled_spec_decode_tokens == {"a": [1, 2, 3]}
