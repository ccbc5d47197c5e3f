"""Draft-model proposer: a small Llama-family model with its own paged KV cache.

Per request the proposer keeps its own block list and how far its KV mirrors the
request's committed tokens. ``propose`` does, for the requests that want drafts:

1. host side, before any launch: roll back the draft KV to the committed tokens (drafts
   of the last round that were accepted stay valid, the rest is simply overwritten
   later), allocate blocks for L + K - 1 positions (L = committed tokens), and build the
   metadata of all K forwards at once (positions, slots, sequence lengths, noise keys),
   moved to the device in a few copies; FlashInfer plans are made here too, one wrapper
   per draft step;
2. device side, ``_draft_loop``: step 1 runs the tokens the draft has not seen yet
   (usually the one token sampled last step, plus any accepted drafts it did not write,
   or a whole prompt) and samples draft 1 from its last position; steps 2..K feed the
   previous draft back, one token per request. Sampling is argmax for greedy requests
   and otherwise the specops Sampler's draw (``specops.sampling.topk_topp.sample``,
   temperature only, p = softmax(logits / T): a sub-chunk of the vocabulary by an
   exponential race of its mass, then argmax p / E inside it, E ~ Exp(1) keyed by the
   request's (seed, position) on Philox streams ``STREAM_DRAFT`` + ``SUB_STREAM`` and
   ``STREAM_DRAFT``). Nothing
   is read back to the host between steps; the draft distributions [num_reqs, K, vocab]
   are kept for probabilistic verification;
3. one copy of the [num_reqs, K] drafts to the host.

The draft model must share the target's tokenizer (same vocabulary size).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from specops._arg_checks import check_seed
from specops.sampling.topk_topp import sample as sample_draw

from .proposer import (DraftBatch, DraftRequest, ProposeContext, Proposer, check_num_spec_tokens,
                       verifiable_drafts)

STREAM_DRAFT = 3
"""Philox stream of draft sampling noise (0: Sampler, 1: accept uniforms, 2: recovered tokens)."""
MAX_DRAFT_STEPS = 256
"""Unseeded rows key their noise by step * MAX_DRAFT_STEPS + draft index."""
_M32 = 0xFFFFFFFF


@dataclass
class _ReqState:
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0  # positions [0, num_computed) hold the KV of committed tokens
    spec_start: int = 0  # positions [spec_start, spec_start + len(spec_tokens)) hold these drafts' KV
    spec_tokens: list[int] = field(default_factory=list)


@dataclass
class _LoopPlan:
    """Device inputs of the K draft forwards (built before the loop)."""

    num_steps: int
    input_ids: torch.Tensor  # [T1] int64: step-1 tokens
    positions: list[torch.Tensor]  # K x ([T1] or [R]) int64
    attn: list  # K x AttnMetadata
    last_index: torch.Tensor  # [R] int64: row of each request's last step-1 token
    inv_temperature: torch.Tensor | None  # [R] fp32: 1/T on sampled rows, -1 on greedy rows
    scale: torch.Tensor | None  # [R] fp32: 1/T on sampled rows, 1 on greedy rows (for the probs)
    noise_seeds: torch.Tensor | None  # [R] int64
    noise_positions: torch.Tensor | None  # [K, R] int64


class DraftModelProposer(Proposer):
    """Drafts from a separate small model (``--spec draft --draft-model PATH``).

    Parameters
    ----------
    model : LlamaForCausalLM
        The draft model (``forward``, ``compute_logits``, ``make_kv_caches``, ``config``).
    num_blocks : int
        Blocks of the draft KV pool. Enough for every running request:
        ``max_num_seqs * ceil((max_model_len + K) / block_size)``; when the pool is short,
        the least recently used requests not in the batch are evicted, then requests that
        still do not fit get no drafts this step.
    block_size : int
    seed : int
        Engine seed for the noise of unseeded requests.
    target_vocab_size : int or None
        When given, must equal the draft model's vocabulary size.

    Notes
    -----
    ``propose`` wants requests in pure decode (their last sampled token committed). The
    engine calls ``free(request_id)`` when a request finishes or is preempted.
    """

    method = "draft"

    def __init__(self, model, num_blocks: int, block_size: int = 16, seed: int = 0,
                 target_vocab_size: int | None = None):
        vocab = model.config.vocab_size
        if target_vocab_size is not None and target_vocab_size != vocab:
            raise ValueError(f"draft model vocabulary ({vocab}) must equal the target's ({target_vocab_size}): "
                             "the draft model must share the target's tokenizer")
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.model = model
        self.vocab_size = vocab
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.seed = check_seed("seed", seed)   # int64 bits, as the target's sampler keys it
        self.kv_caches = model.make_kv_caches(num_blocks, block_size)
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives 0, 1, ...
        self.states: OrderedDict[str, _ReqState] = OrderedDict()  # least recently used first
        self._fi_backends: list = []  # one planned FlashInfer wrapper per draft step

    @classmethod
    def from_path(cls, path: str, num_blocks: int, block_size: int = 16, device="cpu", dtype=None,
                  attn_backend: str | None = None, seed: int = 0,
                  target_vocab_size: int | None = None) -> "DraftModelProposer":
        """Load the draft checkpoint (HF directory or .gguf) with ``load_model`` and wrap it."""
        from ..model.loader import load_model

        loaded = load_model(path, device=device, dtype=dtype, attn_backend=attn_backend)
        return cls(loaded.model, num_blocks, block_size, seed, target_vocab_size)

    # ---- bookkeeping --------------------------------------------------------------------

    def free(self, request_id: str) -> None:
        st = self.states.pop(request_id, None)
        if st is not None:
            self.free_blocks.extend(reversed(st.blocks))

    def _rollback(self, st: _ReqState, tokens: list[int]) -> None:
        """Keep the draft KV that still matches the committed tokens (at least one token left to run)."""
        n = len(tokens)
        valid = st.num_computed if st.num_computed <= n else 0
        if st.spec_tokens and st.spec_start == valid:
            ahead = tokens[valid:valid + len(st.spec_tokens)]
            m = 0
            while m < len(ahead) and ahead[m] == st.spec_tokens[m]:
                m += 1
            valid += m
        st.num_computed = min(valid, n - 1)
        st.spec_tokens = []

    def _reserve(self, rid: str, st: _ReqState, num_slots: int, protect: set[str]) -> bool:
        need = -(-num_slots // self.block_size) - len(st.blocks)
        if need <= 0:
            return True
        if need > len(self.free_blocks):
            evictable = [r for r in self.states if r not in protect]  # least recently used first
            if need > len(self.free_blocks) + sum(len(self.states[r].blocks) for r in evictable):
                return False
            for other in evictable:
                self.free(other)
                if need <= len(self.free_blocks):
                    break
        st.blocks.extend(self.free_blocks.pop() for _ in range(need))
        return True

    # ---- propose ------------------------------------------------------------------------

    def propose(self, requests: Sequence[DraftRequest], num_spec_tokens, context: ProposeContext | None = None
                ) -> DraftBatch:
        k_req = check_num_spec_tokens(num_spec_tokens, len(requests))
        ids = [r.request_id for r in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        want = [i for i in range(len(requests)) if k_req[i] > 0]
        if not want:
            return DraftBatch(ids, drafts)
        num_steps = int(k_req[want].max())
        protect = {ids[i] for i in want}
        active, states, token_lists = [], [], []
        for i in want:
            req = requests[i]
            tokens = req.all_token_ids
            if not tokens:
                raise ValueError(f"request {req.request_id!r} has no tokens to draft from")
            st = self.states.pop(req.request_id, None) or _ReqState()
            self.states[req.request_id] = st  # most recently used last
            self._rollback(st, tokens)
            if not self._reserve(req.request_id, st, len(tokens) + num_steps - 1, protect):
                continue  # the pool is full: no drafts for this request this step
            active.append(i)
            states.append(st)
            token_lists.append(tokens)
        if not active:
            return DraftBatch(ids, drafts)

        step = context.step if context is not None else 0
        plan = self._plan([requests[i] for i in active], states, token_lists, num_steps, step)
        backends = self._plan_backends(plan)
        tokens_dev, probs = self._draft_loop(plan, backends)
        tokens_host = tokens_dev.cpu().numpy()  # the one device -> host copy of propose

        for row, (i, st, toks) in enumerate(zip(active, states, token_lists)):
            drafts[i] = verifiable_drafts(tokens_host[row].tolist(), int(k_req[i]), self.vocab_size)
            st.num_computed = len(toks)
            st.spec_start = len(toks)
            st.spec_tokens = tokens_host[row, :num_steps - 1].tolist()  # drafts 1..K-1 were written
        return DraftBatch(ids, drafts, probs, prob_request_ids=[ids[i] for i in active])

    def _plan(self, reqs: list, states: list[_ReqState], token_lists: list[list[int]], num_steps: int,
              step: int) -> _LoopPlan:
        from ..model.attention import AttnMetadata

        bs, num_reqs = self.block_size, len(reqs)
        lens = np.array([len(t) for t in token_lists], dtype=np.int64)  # L per request
        start = np.array([st.num_computed for st in states], dtype=np.int64)
        q1 = lens - start  # step-1 tokens per request (>= 1)
        qsl1 = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(q1, out=qsl1[1:])
        t1 = int(qsl1[-1])
        ids1 = np.fromiter((t for toks, s in zip(token_lists, start.tolist()) for t in toks[s:]),
                           dtype=np.int64, count=t1)
        pos1 = np.arange(t1, dtype=np.int64) - np.repeat(qsl1[:-1] - start, q1)
        width = max(len(st.blocks) for st in states)
        table = np.zeros((num_reqs, width), dtype=np.int64)
        for r, st in enumerate(states):
            table[r, :len(st.blocks)] = st.blocks
        slots1 = table[np.repeat(np.arange(num_reqs), q1), pos1 // bs] * bs + pos1 % bs
        # steps 2..K: one token per request at position L + j - 2
        posd = lens[None, :] + np.arange(num_steps - 1, dtype=np.int64)[:, None]  # [K-1, R]
        slotsd = table[np.arange(num_reqs)[None, :], posd // bs] * bs + posd % bs
        seq_lens = lens[None, :] + np.arange(num_steps, dtype=np.int64)[:, None]  # [K, R]

        ints = np.concatenate([ids1, pos1, slots1, posd.ravel(), slotsd.ravel(), qsl1[1:] - 1])
        smalls = np.concatenate([qsl1, np.arange(num_reqs + 1), seq_lens.ravel(), table.ravel()]).astype(np.int32)
        dev = self.device
        ints_d = torch.from_numpy(ints).to(dev, non_blocking=True)
        smalls_d = torch.from_numpy(smalls).to(dev, non_blocking=True)

        o = 0
        ids1_d, pos1_d, slots1_d = ints_d[0:t1], ints_d[t1:2 * t1], ints_d[2 * t1:3 * t1]
        o = 3 * t1
        nd = (num_steps - 1) * num_reqs
        posd_d = ints_d[o:o + nd].view(num_steps - 1, num_reqs)
        slotsd_d = ints_d[o + nd:o + 2 * nd].view(num_steps - 1, num_reqs)
        last_index = ints_d[o + 2 * nd:o + 2 * nd + num_reqs]
        qsl1_d, qsld_d = smalls_d[:num_reqs + 1], smalls_d[num_reqs + 1:2 * num_reqs + 2]
        o = 2 * num_reqs + 2
        seq_lens_d = smalls_d[o:o + num_steps * num_reqs].view(num_steps, num_reqs)
        table_d = smalls_d[o + num_steps * num_reqs:].view(num_reqs, width)

        attn, positions = [], []
        for j in range(num_steps):
            slots = slots1_d if j == 0 else slotsd_d[j - 1]
            a = AttnMetadata(
                kv_caches=self.kv_caches, slot_mapping=slots,
                query_start_loc=qsl1_d if j == 0 else qsld_d,
                seq_lens=seq_lens_d[j], block_tables=table_d,
                max_query_len=int(q1.max()) if j == 0 else 1,
                max_seq_len=int(seq_lens[j].max()), block_size=bs)
            a.cache["write_rows"] = (None, slots)  # every slot is valid: write_kv need not check (no sync)
            attn.append(a)
            positions.append(pos1_d if j == 0 else posd_d[j - 1])

        plan = _LoopPlan(num_steps, ids1_d, positions, attn, last_index, None, None, None, None)
        temps = np.array([float(r.sampling_params.temperature) for r in reqs], dtype=np.float32)
        if (temps > 0).any():  # host values: the loop knows whether to sample without a sync
            seeded = np.array([r.sampling_params.seed is not None for r in reqs])
            seeds = np.array([r.sampling_params.seed if r.sampling_params.seed is not None else self.seed
                              for r in reqs], dtype=np.int64)
            lane = np.arange(1, num_reqs + 1, dtype=np.int64) << 32
            j = np.arange(num_steps, dtype=np.int64)[:, None]
            unseeded = lane[None, :] | ((step * MAX_DRAFT_STEPS + j) & _M32)
            noise_pos = np.where(seeded[None, :], lens[None, :] + j, unseeded)  # seeded: draft j's position
            inv_t = np.where(temps > 0, 1.0 / np.maximum(temps, 1e-30), -1.0).astype(np.float32)
            plan.inv_temperature = torch.from_numpy(inv_t).to(dev)  # the Sampler's convention: -1 = greedy
            plan.scale = torch.from_numpy(np.where(temps > 0, inv_t, 1.0).astype(np.float32)).to(dev)
            plan.noise_seeds = torch.from_numpy(seeds).to(dev)
            plan.noise_positions = torch.from_numpy(noise_pos).to(dev)
        return plan

    def _plan_backends(self, plan: _LoopPlan) -> list | None:
        """FlashInfer: one wrapper per draft step, all planned before the loop (planning syncs)."""
        base = getattr(self.model, "attn_backend", None)
        if getattr(base, "name", None) != "flashinfer":
            return None
        from ..model.attention_flashinfer import FlashInferAttention

        c = self.model.config
        while len(self._fi_backends) < plan.num_steps:
            self._fi_backends.append(FlashInferAttention(self.device))
        for backend, attn in zip(self._fi_backends, plan.attn):
            backend.plan(attn, c.num_heads, c.num_kv_heads, c.head_dim, self.model.dtype, c.head_dim ** -0.5)
        return self._fi_backends[:plan.num_steps]

    @torch.inference_mode()
    def _draft_loop(self, plan: _LoopPlan, backends: list | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [R, K] int64, [R, K, vocab] fp32
        """The K draft forwards and draws, all on the device: no host sync inside."""
        model = self.model
        num_reqs = plan.last_index.shape[0]
        out = torch.empty(num_reqs, plan.num_steps, dtype=torch.int64, device=self.device)
        probs = None
        if plan.inv_temperature is not None:
            probs = torch.empty(num_reqs, plan.num_steps, self.vocab_size, dtype=torch.float32, device=self.device)
        saved = model.attn_backend
        try:
            tok = plan.input_ids
            for j in range(plan.num_steps):
                if backends is not None:
                    model.attn_backend = backends[j]
                hidden = model(tok, plan.positions[j], plan.attn[j])
                if j == 0:
                    hidden = hidden.index_select(0, plan.last_index)
                logits = model.compute_logits(hidden)  # [R, vocab] fp32
                if probs is None:
                    tok = logits.argmax(dim=-1)
                else:  # the Sampler's draw: argmax on greedy rows, exp race on the others
                    tok = sample_draw(logits, plan.inv_temperature, None, None, None, plan.noise_seeds,
                                      plan.noise_positions[j], STREAM_DRAFT).tokens
                    probs[:, j] = torch.softmax(logits * plan.scale[:, None], dim=-1)
                out[:, j] = tok
                # a row with no valid draw (-1: a NaN / inf logit of the draft) feeds token 0 on; its
                # drafts end before that -1 (propose), so nothing drawn after it is used
                tok = tok.clamp_min(0)
        finally:
            model.attn_backend = saved
        return out, probs

    # ---- introspection (tests) ----------------------------------------------------------

    def committed_kv(self, request_id: str, layer: int = 0) -> torch.Tensor:  # [2, n, kv_heads, head_dim]
        """The draft KV of a request's committed positions (num_computed of them)."""
        st = self.states[request_id]
        cache = self.kv_caches[layer]
        pos = torch.arange(st.num_computed)
        blocks = torch.tensor(st.blocks, dtype=torch.int64)[pos // self.block_size]
        return cache[:, blocks.to(cache.device), (pos % self.block_size).to(cache.device)]


def draft_pool_blocks(max_num_seqs: int, max_model_len: int, num_spec_tokens: int, block_size: int) -> int:
    """Draft KV blocks that hold every request at full length plus its K - 1 draft positions."""
    return max_num_seqs * -(-(max_model_len + num_spec_tokens) // block_size)
