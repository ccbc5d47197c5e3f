"""ModelRunner: turns a SchedulerOutput into one forward over the paged cache and sampled tokens.

Per step: update the persistent batch (rows, block tables, BatchUpdate to the sampling
state); flatten the scheduled tokens row by row (input ids, positions, slot mapping,
query_start_loc, seq_lens, block tables) with numpy and move them to the device in one
go; run the model; compute logits only at the last position of each sequence that
completes its prompt or decodes this step; sample; read the tokens back (the step's one
host sync).

Speculative decoding: a request with K scheduled drafts runs 1 + K tokens (its last
sampled token and the drafts); the logits of those 1 + K positions are kept
(`build_spec_decode_metadata`) and `BatchSampler.verify` emits the accepted drafts plus
one token. The draft distributions of a draft-model proposer come from `last_drafts`,
the DraftBatch that the engine's proposer made after the previous step.

Structured output: when the engine set `structured` (a StructuredOutputManager), the
grammar bitmask of the sampling rows (1 + K rows for a request with K drafts) is filled
on the host right after the forward is launched, so it overlaps the GPU's work, and is
applied to the logits with `specops.ops.apply_token_bitmask_` before the Sampler or the
RejectionSampler sees them.

Hidden states for EAGLE/MTP-style proposers: when `keep_hidden_states` is set (the engine
sets it for a proposer with `needs_hidden_states`), each step leaves in `last_hidden` a
`TargetHiddenStates`: the forward's final-normed hidden states and, per request, which
rows were committed (rejected drafts' rows left out), built from the host values the
step already read back. Otherwise nothing is kept.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from specops.sampling.logprobs import compute_logprobs
from specops.spec_decode.metadata import SpecDecodeMetadata, build_spec_decode_metadata
from specops.spec_decode.parse import parse_output

from .input_batch import InputBatch
from .readback import to_logprobs
from .request import Logprob, Request
from .sampling import BatchSampler
from .scheduler import SchedulerOutput
from .spec_decode.proposer import TargetHiddenStates
from .structured_output.batch_bitmask import apply_batch_bitmask


@dataclass
class ModelRunnerOutput:
    sampled: dict[str, list[int]] = field(default_factory=dict)  # request id -> accepted tokens
    logprobs: dict[str, list[Logprob]] = field(default_factory=dict)


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: object  # AttnMetadata
    logits_indices: torch.Tensor  # [N] int64: token index of each sampled sequence's last position
    sample_rows: list[int]  # persistent-batch row of each sampled sequence
    sample_positions: list[int]  # position of the token being sampled (the bonus token's, with drafts)
    sample_reqs: list[Request]
    # speculative decoding (None / empty when no sampled request has drafts this step)
    spec: SpecDecodeMetadata | None = None
    drafts: list[list[int]] = field(default_factory=list)  # per sampled request, its scheduled drafts
    # every scheduled request, in batch order (host)
    req_ids: list[str] = field(default_factory=list)
    query_start_loc: np.ndarray | None = None  # [num_reqs + 1] int64
    start_positions: np.ndarray | None = None  # [num_reqs] int64: position of each request's first token


class ModelRunner:
    """Owns the model, the KV caches, the persistent batch and the sampler.

    Parameters
    ----------
    model : nn.Module
        Follows the engine/model interface (forward, compute_logits, make_kv_caches).
    vocab_size : int
    num_blocks, block_size : int
        KV pool shape.
    max_num_reqs : int
        Rows of the persistent batch.
    max_model_len : int
    seed : int
        Engine seed for unseeded requests.
    synthetic_acceptance : SyntheticAcceptance or None
        Benchmarks only: decide acceptance by these rates instead of verifying drafts.
    sampler_cuda_graphs : bool
        Replay steady sampling steps from a CUDA graph (see BatchSampler).
    """

    def __init__(self, model, vocab_size: int, num_blocks: int, block_size: int, max_num_reqs: int,
                 max_model_len: int, seed: int = 0, num_lookahead_tokens: int = 0, eos_token_ids: list[int] = (),
                 logits_processors: list = (), synthetic_acceptance=None, sampler_cuda_graphs: bool = True):
        from .model.attention import AttnMetadata

        self._attn_cls = AttnMetadata
        self.model = model
        self.device = next(model.parameters()).device
        self.block_size = block_size
        self.kv_caches = model.make_kv_caches(num_blocks, block_size)
        # whether compute_logits can write into the sampler graph's input (saves a copy)
        self._logits_out = "out" in inspect.signature(model.compute_logits).parameters
        max_blocks = -(-(max_model_len + num_lookahead_tokens) // block_size)
        self.input_batch = InputBatch(max_num_reqs, max_blocks)
        self.sampler = BatchSampler(max_num_reqs, vocab_size, self.device, seed, eos_token_ids, logits_processors,
                                    cuda_graphs=sampler_cuda_graphs)
        self.time_forward = 0.0  # seconds, for benchmarks (synchronised only when profile=True)
        self.time_sample = 0.0
        self.profile = False
        self.last_drafts = None  # DraftBatch of the proposer's last call (draft probabilities)
        self.synthetic = synthetic_acceptance
        self.structured = None  # StructuredOutputManager, set by the engine for structured requests
        self.time_bitmask = 0.0  # host seconds spent filling grammar bitmasks
        self.keep_hidden_states = False  # set for a proposer with needs_hidden_states
        self.last_hidden: TargetHiddenStates | None = None  # the last step's, when keep_hidden_states

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        upd = self.input_batch.update(sched.scheduled)
        self.sampler.update_state(upd, self.input_batch.reqs[:self.input_batch.num_reqs])
        self.last_hidden = None
        if sched.is_empty:
            return ModelRunnerOutput()
        inputs = self._prepare_inputs(sched)
        t0 = self._now()
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.attn)
        out = self._sample(hidden, inputs, t0)
        if self.keep_hidden_states:
            self.last_hidden = self._committed_hidden(hidden, inputs, sched, out.sampled)
        return out

    def _committed_hidden(self, hidden: torch.Tensor, inputs: StepInputs, sched: SchedulerOutput,
                          sampled: dict[str, list[int]]) -> TargetHiddenStates:
        """The step's hidden states [T, hidden] and each request's committed rows (no device sync)."""
        num_rows = np.diff(inputs.query_start_loc)
        spec_tokens = sched.scheduled_spec_decode_tokens
        if spec_tokens:
            for i, rid in enumerate(inputs.req_ids):
                drafts, new = spec_tokens.get(rid), sampled.get(rid)
                if drafts and new:
                    num_rows[i] -= len(drafts) + 1 - len(new)  # the scheduler's rollback of rejected drafts
        return TargetHiddenStates(hidden, inputs.req_ids, inputs.query_start_loc[:-1], num_rows,
                                  inputs.start_positions)

    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, t0: float) -> ModelRunnerOutput:
        """Logits at the sampled positions, then the tokens (verified drafts + one under speculation)."""
        out = ModelRunnerOutput()
        if not inputs.sample_reqs:
            self.time_forward += self._now() - t0
            return out
        mask = self._build_bitmask(inputs)  # host work while the device runs the forward
        if inputs.spec is not None:
            return self._execute_spec(hidden, inputs, t0, mask)
        rows = hidden[inputs.logits_indices]
        buf = self.sampler.logits_buffer(rows.shape[0]) if self._logits_out else None
        logits = self.model.compute_logits(rows) if buf is None else self.model.compute_logits(rows, out=buf)
        apply_batch_bitmask(logits, mask)
        t1 = self._now()
        tokens, logprobs = self.sampler.sample_to_host(logits, inputs.sample_rows, inputs.sample_positions)
        # No second synchronisation: sample_to_host returns after its readback has synchronised the
        # stream, so the device holds no sampling work; a device sync here would only add its latency.
        t2 = time.perf_counter()
        self.time_forward += t1 - t0
        self.time_sample += t2 - t1
        for req, tok, entry in zip(inputs.sample_reqs, tokens, logprobs):
            out.sampled[req.request_id] = [tok]
            if entry is not None:
                out.logprobs[req.request_id] = [entry]
        return out

    def _build_bitmask(self, inputs: StepInputs):
        """The grammar bitmask of the step's logits rows (None: no structured request samples)."""
        so = self.structured
        if so is None:
            return None
        reqs = inputs.sample_reqs
        if not any(r.sampling_params.structured_outputs is not None for r in reqs):
            return None
        t = time.perf_counter()
        drafts = inputs.drafts or [[] for _ in reqs]
        batch = [(r.request_id if r.sampling_params.structured_outputs is not None else None, 1 + len(d), d)
                 for r, d in zip(reqs, drafts)]
        mask = so.build_bitmask(batch)
        self.time_bitmask += time.perf_counter() - t
        return mask

    def _execute_spec(self, hidden: torch.Tensor, inputs: StepInputs, t0: float, mask=None) -> ModelRunnerOutput:
        """Verify the step's drafts: logits at the 1 + K positions of each request, then emitted tokens."""
        spec, reqs, drafts = inputs.spec, inputs.sample_reqs, inputs.drafts
        logits = self.model.compute_logits(hidden[spec.logits_indices.long()])  # [sum(nd) + N, vocab]
        apply_batch_bitmask(logits, mask)  # 1 + K grammar rows per structured request
        t1 = self._now()
        want = [i for i, r in enumerate(reqs) if r.sampling_params.logprobs is not None]
        raw = logits.clone() if want else None  # the Sampler may process the logits in place
        first = [p - len(d) for p, d in zip(inputs.sample_positions, drafts)]  # position of draft 0
        if self.synthetic is not None:
            emitted = self._synthetic_emit(logits, spec, inputs, first)
        else:
            probs = None
            if self.last_drafts is not None and spec.total_draft_tokens:
                probs = self.last_drafts.gather_probs([r.request_id for r in reqs], spec.num_draft_tokens)
            verified = self.sampler.verify(logits, spec, inputs.sample_rows, first, drafts, probs)
            emitted = parse_output(verified)  # the step's one host sync
            # A verified row ends with a token that is not its draft (recovered or bonus); when
            # all it holds are drafts, the row that should have ended it was invalid (-1).
            emitted = [e + [-1] if e == d[:len(e)] else e for e, d in zip(emitted, drafts)]
        out = ModelRunnerOutput()
        for req, e in zip(reqs, emitted):
            out.sampled[req.request_id] = e
        if want:
            self._spec_logprobs(raw, spec, [reqs[i] for i in want], [emitted[i] for i in want], want, out)
        t2 = self._now()
        self.time_forward += t1 - t0
        self.time_sample += t2 - t1
        return out

    def _synthetic_emit(self, logits: torch.Tensor, spec: SpecDecodeMetadata, inputs: StepInputs,
                        first: list[int]) -> list[list[int]]:
        """Benchmark mode: the first n drafts (n drawn at the configured rates), then the target's argmax."""
        reqs, drafts = inputs.sample_reqs, inputs.drafts
        top = logits.argmax(dim=-1).tolist()
        starts = np.cumsum([0] + [len(d) + 1 for d in drafts]).tolist()
        target = [top[s:s + len(d) + 1] for s, d in zip(starts, drafts)]
        n = self.synthetic.num_accepted([r.request_id for r in reqs], first, [len(d) for d in drafts])
        emitted = self.synthetic.emit(drafts, target, n.tolist())
        self.sampler.count_emitted(inputs.sample_rows, emitted)
        return emitted

    @staticmethod
    def _spec_logprobs(raw: torch.Tensor, spec: SpecDecodeMetadata, reqs: list[Request], emitted: list[list[int]],
                       index: list[int], out: ModelRunnerOutput) -> None:
        """Raw logprobs of every emitted token: token j of a request comes from its j-th kept row."""
        first_row = spec.bonus_logits_indices.cpu().numpy() - np.asarray(spec.num_draft_tokens)
        rows, toks, num_top, counts = [], [], [], []
        for i, req, e in zip(index, reqs, emitted):
            e = [t for t in e if t >= 0]
            rows += range(int(first_row[i]), int(first_row[i]) + len(e))
            toks += e
            num_top += [req.sampling_params.logprobs] * len(e)
            counts.append(len(e))
        if not rows:
            return
        dev = raw.device
        lp = compute_logprobs("raw_logprobs", max(num_top), torch.tensor(toks, dtype=torch.int64).to(dev),
                              raw_logits=raw[torch.tensor(rows, dtype=torch.int64).to(dev)])
        entries = to_logprobs(lp, list(range(len(rows))), num_top)
        start = 0
        for req, c in zip(reqs, counts):
            out.logprobs[req.request_id] = entries[start:start + c]
            start += c

    def _now(self) -> float:
        if self.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _prepare_inputs(self, sched: SchedulerOutput) -> StepInputs:
        batch = self.input_batch
        n = batch.num_reqs
        reqs = batch.reqs[:n]
        num_new = np.array([sched.num_scheduled_tokens[r.request_id] for r in reqs], dtype=np.int64)
        start = np.array([r.num_computed_tokens for r in reqs], dtype=np.int64)
        total_tokens = np.array([r.num_tokens for r in reqs], dtype=np.int64)
        qsl = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(num_new, out=qsl[1:])
        num_tokens = int(qsl[-1])
        ids: list[int] = []
        spec_tokens = sched.scheduled_spec_decode_tokens
        for req, s, k in zip(reqs, start.tolist(), num_new.tolist()):
            drafts = spec_tokens.get(req.request_id)
            ids.extend((req.all_token_ids + drafts)[s:s + k] if drafts else req.all_token_ids[s:s + k])
        positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(qsl[:-1] - start, num_new)
        row_of_token = np.repeat(np.arange(n), num_new)
        bs = self.block_size
        slots = batch.block_table[row_of_token, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = start + num_new
        max_blocks = int(-(-seq_lens.max() // bs))
        done = seq_lens >= total_tokens  # prompt complete (or decoding): sample the next token
        sample_rows = np.nonzero(done)[0]

        dev = self.device
        to = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dt, non_blocking=True)  # noqa: E731
        attn = self._attn_cls(
            kv_caches=self.kv_caches,
            slot_mapping=to(slots, torch.int64),
            query_start_loc=to(qsl, torch.int32),
            seq_lens=to(seq_lens, torch.int32),
            block_tables=to(batch.block_table[:n, :max_blocks], torch.int32),
            max_query_len=int(num_new.max()),
            max_seq_len=int(seq_lens.max()),
            block_size=bs,
        )
        input_ids = torch.tensor(ids, dtype=torch.int64).to(dev, non_blocking=True)
        sample_reqs = [reqs[i] for i in sample_rows.tolist()]
        spec, drafts = None, []
        if spec_tokens:
            drafts = [spec_tokens.get(r.request_id, []) for r in sample_reqs]
            spec = build_spec_decode_metadata([len(d) for d in drafts], qsl[1:][sample_rows], input_ids=input_ids)
        return StepInputs(
            input_ids=input_ids,
            positions=to(positions, torch.int64),
            attn=attn,
            logits_indices=to(qsl[1:][sample_rows] - 1, torch.int64),
            sample_rows=sample_rows.tolist(),
            sample_positions=seq_lens[sample_rows].tolist(),
            sample_reqs=sample_reqs,
            spec=spec,
            drafts=drafts,
            req_ids=[r.request_id for r in reqs],
            query_start_loc=qsl,
            start_positions=start,
        )
