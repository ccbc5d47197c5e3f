"""Scheduler: which requests run this step and with how many tokens.

One token budget covers prompt chunks and decodes alike (vLLM v1): running requests are
served first, in admission order, each with `num_tokens_with_spec - num_computed_tokens`
tokens (capped by what is left of the budget, so a long prompt is prefilled in chunks);
then waiting requests are admitted while budget, rows (max_num_seqs) and KV blocks last.
When a running request cannot get a block, the most recently admitted running request is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be
recomputed from its prompt and outputs (prefix caching usually gives most of it back).

Speculative decoding (seeds/01 ch. 3): a decoding request's draft tokens
(`spec_token_ids`, set by the engine's proposer after the previous step) are scheduled
with it, 1 + K tokens, and count in the token budget; when the budget is short the drafts
are truncated, when the KV pool is short they are dropped before anyone is preempted (vLLM
preempts for them), and a request still in a prefill chunk never schedules drafts. The bound
num_computed + new <= max_model_len - 1 leaves a position for the bonus token. After
verification `update_from_output` rolls num_computed_tokens back by the number of
rejected drafts, before any block is registered in the prefix cache, so rejected tokens
never reach it (their slots are simply overwritten by later steps).

Prefix caching: a waiting request whose next uncached prompt block is one this step fills
(another sample of an n > 1 request, the same prompt sent twice) is passed over for the
step, keeping its place in the queue, and finds that block in the cache the step after (a
full block is registered once its tokens are committed, after the forward): the prompt is
computed and held once, not once per sample.

Structured output: a waiting request whose grammar is still compiling is listed in
`blocked` (by the engine); admission passes over it, keeping its place in the queue,
so the requests behind it are admitted as if it were not there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .config import EngineConfig
from .request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """What one step computes: requests in order and their token counts."""

    scheduled: list[Request]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted: list[Request] = field(default_factory=list)
    # Draft tokens scheduled for verification, per request that has any (speculative decoding).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Waiting/running queues over one BlockManager.

    Parameters
    ----------
    config : EngineConfig
        Uses max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, block_size.
    max_model_len : int
        Context length: a request stops when it holds this many tokens.
    block_manager : BlockManager
    num_lookahead_tokens : int
        KV slots reserved beyond the scheduled tokens for draft tokens (speculative decoding).
    """

    def __init__(self, config: EngineConfig, max_model_len: int, block_manager: BlockManager,
                 num_lookahead_tokens: int = 0):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.max_model_len = max_model_len
        self.block_manager = block_manager
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # unfinished requests
        self.num_preemptions = 0
        self.blocked: set[str] = set()  # waiting requests not to admit yet (grammar compiling)

    # ---- queues -------------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use")
        req.status = RequestStatus.WAITING
        self.waiting.append(req)
        self.requests[req.request_id] = req

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def finish_request(self, req: Request, status: RequestStatus) -> None:
        """End req (stop, length, abort, error): leave the queues and free its blocks."""
        assert status.finished, status
        if req.is_finished:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.request_id in self.requests:
            self.waiting.remove(req)
        self.block_manager.free(req)
        req.status = status
        self.requests.pop(req.request_id, None)

    def abort_request(self, request_id: str) -> Request | None:
        req = self.requests.get(request_id)
        if req is not None:
            self.finish_request(req, RequestStatus.FINISHED_ABORTED)
        return req

    # ---- one step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[Request] = []
        num_tokens: dict[str, int] = {}
        preempted: list[Request] = []
        spec_tokens: dict[str, list[int]] = {}

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            # Drafts count in the budget; one position stays free for the bonus token.
            n = min(req.num_tokens_with_spec - req.num_computed_tokens, budget,
                    self.max_model_len - 1 - req.num_computed_tokens)
            assert n > 0, req
            n_plain = min(n, req.num_tokens - req.num_computed_tokens)   # without the drafts
            n_want = n
            while not self.block_manager.allocate_slots(req, n, num_lookahead_tokens=self._lookahead(
                    req.num_computed_tokens, n)):
                if n > n_plain > 0:   # drafts are optional: drop them before preempting anyone for them
                    n = n_plain
                    continue
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
                n = n_want        # the preemption freed blocks: the drafts may fit now
            else:
                scheduled.append(req)
                num_tokens[req.request_id] = n
                budget -= n
                i += 1
                if req.spec_token_ids:  # <= 0 during a prefill chunk: the drafts are dropped
                    num_spec = req.num_computed_tokens + n - req.num_tokens
                    if num_spec > 0:
                        spec_tokens[req.request_id] = req.spec_token_ids[:num_spec]
                    req.spec_token_ids = []  # the proposer sets the next step's drafts

        # Blocks of a prompt this step fills (made when the first waiting request is looked at): a
        # waiting request that needs one next (another sample of the same prompt, a repeated
        # prompt) waits a step and takes it from the prefix cache, instead of computing the same
        # prompt again beside it and keeping a copy of its KV. At most max_num_seqs of them are
        # passed over in one step (a long queue sharing one prefix is not scanned whole).
        filling = None
        num_deferred = 0

        # Admit waiting requests only when nothing was preempted: the pool is full otherwise.
        skipped: list[Request] = []
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.request_id in self.blocked:
                skipped.append(self.waiting.popleft())
                continue
            hits, num_hit = self.block_manager.get_computed_blocks(req)
            if filling is None:
                filling = {key for r in scheduled for key in self.block_manager.prompt_blocks_filled(
                    r, r.num_computed_tokens, num_tokens[r.request_id])}
            if filling and self.block_manager.next_block_key(req, len(hits)) in filling:
                if num_deferred == self.max_num_seqs:
                    break
                num_deferred += 1
                skipped.append(self.waiting.popleft())
                continue
            n = req.num_tokens - num_hit
            # without chunked prefill a prompt runs whole; a preempted request's recompute (prompt +
            # output) may not fit the budget at all, so it is recomputed in chunks (else it blocks
            # the queue for good)
            if n > budget and not self.chunked_prefill and req.status != RequestStatus.PREEMPTED:
                break
            n = min(n, budget)
            if not self.block_manager.allocate_slots(req, n, hits, self._lookahead(num_hit, n)):
                break
            self.block_manager.record_prefix_lookup(req.num_tokens, num_hit)
            self.waiting.popleft()
            if req.status == RequestStatus.WAITING:
                req.num_cached_tokens = num_hit
            req.num_computed_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(req)
            num_tokens[req.request_id] = n
            budget -= n
            filling.update(self.block_manager.prompt_blocks_filled(req, num_hit, n))
        self.waiting.extendleft(reversed(skipped))  # back in their places, ahead of the rest

        return SchedulerOutput(scheduled, num_tokens, self.max_num_batched_tokens - budget, preempted, spec_tokens)

    def _lookahead(self, num_computed: int, n: int) -> int:
        """Lookahead slots for a request with num_computed tokens in the cache and n scheduled:
        none past max_model_len, where no token can ever go (reserving them could preempt the
        request itself for good when the pool holds exactly max_model_len tokens)."""
        return max(0, min(self.num_lookahead_tokens, self.max_model_len - num_computed - n))

    def _preempt(self, req: Request) -> None:
        self.block_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> list[Request]:
        """Commit the step: advance num_computed_tokens, append sampled tokens, check stops.

        sampled maps request id -> emitted tokens: one per request without speculation; with
        K drafts, the accepted drafts followed by the recovered or bonus token (1..K+1).
        Requests that were mid-prompt have no entry. The KV of the rejected drafts is
        dropped by rolling num_computed_tokens back; only committed tokens' full blocks
        are registered in the prefix cache. Returns the requests that got tokens.
        """
        updated = []
        for req in out.scheduled:
            if req.is_finished:
                continue
            rid = req.request_id
            new = sampled.get(rid)
            drafts = out.scheduled_spec_decode_tokens.get(rid, ())
            num_rejected = len(drafts) + 1 - len(new) if drafts and new else 0
            req.num_computed_tokens += out.num_scheduled_tokens[rid] - num_rejected
            if not new:
                self.block_manager.cache_blocks(req, min(req.num_computed_tokens, req.num_tokens))
                continue
            updated.append(req)
            status = None
            for tok in new:
                if tok < 0:  # the sampler flags rows whose logits were NaN/inf
                    req.error = ("sampling failed: no token could be sampled: every logit was -inf after the "
                                 "grammar, min_tokens, allowed_token_ids, bad_words and logit_bias (e.g. min_tokens "
                                 "beyond the end of the grammar), or a logit was NaN or +inf (NaN logits from the "
                                 "model, or a repetition_penalty near 0 that overflowed float32)")
                    status = RequestStatus.FINISHED_ERROR
                    break
                req.append_token(tok)
                status = self.check_stop(req, tok)
                if status is not None:
                    break
            # Committed = computed and kept: the last emitted token's KV is computed next step.
            self.block_manager.cache_blocks(req, min(req.num_computed_tokens, req.num_tokens))
            if status is not None:
                self.finish_request(req, status)
        return updated

    def check_stop(self, req: Request, tok: int) -> RequestStatus | None:
        """Stop conditions known from token ids (stop strings are checked on the text by the engine)."""
        sp = req.sampling_params
        if req.num_output_tokens >= sp.min_tokens:
            if not sp.ignore_eos and tok in req.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if sp.stop_token_ids and tok in sp.stop_token_ids:
                req.stop_reason = tok
                return RequestStatus.FINISHED_STOPPED
        if req.num_tokens >= self.max_model_len or (
                sp.max_tokens is not None and req.num_output_tokens >= sp.max_tokens):
            return RequestStatus.FINISHED_LENGTH
        return None

    def check(self) -> None:
        """Assert queue and pool invariants (for tests)."""
        ids = [r.request_id for r in self.waiting] + [r.request_id for r in self.running]
        assert len(ids) == len(set(ids)) == len(self.requests), (ids, list(self.requests))
        assert all(r.status == RequestStatus.RUNNING for r in self.running)
        assert all(r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) for r in self.waiting)
        assert all(not r.block_ids for r in self.waiting)
        assert len(self.running) <= self.max_num_seqs
        self.block_manager.check(self.running)
