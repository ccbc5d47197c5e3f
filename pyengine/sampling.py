"""The engine side of sampling: the persistent batch's sampling state, and the one call that draws.

`BatchSampler` follows the persistent batch through its BatchUpdates: it feeds them to the
logits processors (min_tokens, logit_bias, min_p and any custom ones), rebuilds the
batch's `SamplingMetadata` when the batch changed, and keeps the penalty state that
penalties need: a prompt-token mask and output-token counts per row ([rows, vocab] on
the device, allocated when the first request with penalties arrives, updated after
every step with `specops.ops.token_bincount_update_`, so the cost of a step does not
grow with the length of the outputs).

The metadata is rebuilt only when the batch changed, from each request's parameters checked
once (`RowParams`), with two copies to the device. In a steady step (every row samples) only
the generator keys change: they are built on the host and sent with one pinned, asynchronous
copy; nothing on the hot path waits for the device until the caller reads the tokens. On
CUDA the steady step is captured once and replayed from a CUDA graph (`SteadyStepGraph`,
pyengine/sampler_graph.py), whose last kernel also adds one to the keys: while every
position advances by one per step, a replay builds and copies no keys at all, and builds
no LogitsRows unless min_tokens still bans tokens. `sample_to_host` reads a step's tokens
and logprobs back in one copy of one float64 tensor, packed by one kernel (readback.py). A step over
other rows (prompt chunks, speculative verification) drops the graph.

Each step, `sample` gathers the metadata of the rows that sample (`expand`: rows that
are mid-prompt have no logits) and calls the specops `Sampler`: allowed tokens, bad words,
the argmax-changing processors, penalties, then temperature/min-p/top-k/top-p and the
counter-based draw, and raw logprobs. Seeded rows are keyed by (seed, token position), so
their draws do not depend on the rest of the batch.

With speculative decoding, `verify` replaces `sample` in steps where some request has
drafts: the specops `RejectionSampler` checks them (target rows processed per row with the
request's parameters, penalties counting the earlier drafts), and the penalty counts are
updated with the emitted tokens only, never with rejected drafts.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace

import numpy as np
import torch

from specops import rng
from specops._arg_checks import check_seed
from specops.ops import token_bincount_update_
from specops.sampling.logits_processors import LogitsRows, build_logits_processors
from specops.sampling.logits_processors.interface import to_device
from specops.sampling.logits_processors.builtin import MinPLogitsProcessor, MinTokensLogitsProcessor
from specops.sampling.logprobs import LogprobsTensors
from specops.sampling.metadata import RowParams, SamplingMetadata
from specops.sampling.sampler import Sampler
from specops.spec_decode.metadata import SpecDecodeMetadata
from specops.spec_decode.rejection_sampler import RejectionSampler

from .input_batch import BatchUpdate
from .readback import pack_readback, unpack_readback
from .request import Logprob, Request
from .sampler_graph import SteadyStepGraph


def sampler_name() -> str:
    """Which sampling path the engine uses (reported by benchmarks)."""
    return "specops.Sampler"


class BatchSampler:
    """Per-row sampling state of the persistent batch and the draw.

    Parameters
    ----------
    max_num_reqs : int
        Rows of the persistent batch.
    vocab_size : int
        Width of the logits.
    device : torch.device
    seed : int
        Engine seed for requests without one.
    eos_token_ids : list[int]
        Banned by min_tokens until a request has generated enough tokens.
    logits_processors : list
        Custom LogitsProcessor classes or "module:Class" names.
    cuda_graphs : bool
        On CUDA, capture the steady step (every row samples, same batch) in a CUDA graph and
        replay it (pyengine/sampler_graph.py). Not with custom logits processors or bad_words,
        whose device work can change from step to step without the engine knowing.
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device, seed: int = 0,
                 eos_token_ids: list[int] = (), logits_processors: list = (), cuda_graphs: bool = True):
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.seed = check_seed("seed", seed)   # int64 bits, as the metadata keys it
        self.procs = build_logits_processors(max_num_reqs, vocab_size, self.device, custom=logits_processors,
                                             eos_token_ids=eos_token_ids)
        self.sampler = Sampler()  # raw logprobs, fused Triton draw on CUDA, torch reference on CPU
        self.rejection_sampler = RejectionSampler(self.sampler)
        self._only_builtin_procs = len(self.procs) == 3 and not logits_processors
        self._plain_greedy = False
        self._host_step = 0  # steps sampled so far; steady steps build their generator keys from it
        # The counter on the device, read by the keys of `SamplingMetadata.expand`: set from the
        # host counter before each expand, so that steady steps need no increment.
        self.step = torch.zeros((), dtype=torch.int64, device=self.device)
        self.prompt_mask: torch.Tensor | None = None  # [rows, vocab] bool
        self.output_counts: torch.Tensor | None = None  # [rows, vocab] int32
        self._md: SamplingMetadata | None = None
        self._checked: dict[int, tuple] = {}  # id(sampling params) -> (params, RowParams)
        self._reqs: list[Request] = []
        self._md_version = 0  # bumped whenever the batch metadata is rebuilt (part of the graph key)
        self.graph = SteadyStepGraph(enabled=cuda_graphs and self.device.type == "cuda")
        self._pinned: dict[tuple, torch.Tensor] = {}  # (shape, dtype) -> pinned readback buffer
        self._min_tokens = self.procs.get(MinTokensLogitsProcessor)
        # The steady step's keys grow by one per step (see `_keys_advanced`): what they must be next step.
        self._next_positions: list[int] | None = None
        self._next_step = -1
        # Benchmarks: a list to append (label, time.perf_counter()) to at the steps of `sample_to_host`.
        self.trace: list | None = None

    # ---- following the batch ------------------------------------------------------------

    def check_request(self, params, prompt_token_ids: list[int]) -> None:
        """Raise ValueError with what a logits processor refuses in a request's parameters
        (its `check_update` on the request joining an empty batch), so that the engine fails
        that request when it arrives instead of the step that would add it to the batch."""
        update = BatchUpdate(1, added=[(0, params, list(prompt_token_ids), [])])
        for proc in self.procs.all:
            try:
                proc.check_update(update)
            except Exception as exc:   # a custom processor may raise anything
                raise ValueError(f"logits processor {type(proc).__name__} refused the request: "
                                 f"{type(exc).__name__}: {exc}") from exc

    def update_state(self, upd: BatchUpdate | None, reqs: list[Request]) -> None:
        """Apply the step's BatchUpdate; `reqs` are the batch's rows after it."""
        self.procs.update_state(upd)  # every step: min_tokens drops requests that reached their minimum
        if upd is None:
            return
        self._md = None
        self._reqs = reqs
        if self.output_counts is None:
            if any(r.sampling_params.has_penalties for r in reqs):
                shape = (self.max_num_reqs, self.vocab_size)
                self.prompt_mask = torch.zeros(shape, dtype=torch.bool, device=self.device)
                self.output_counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
                for row in range(len(reqs)):
                    self._fill_penalty_row(row, reqs[row])
            return
        for src, dst, _ in upd.moved:  # moves come after removals and additions
            self.prompt_mask[dst] = self.prompt_mask[src]
            self.output_counts[dst] = self.output_counts[src]
        for row, *_ in upd.added:
            self._fill_penalty_row(row, reqs[_final_row(row, upd.moved)])

    def _fill_penalty_row(self, row: int, req: Request) -> None:
        dev = self.device
        self.prompt_mask[row].zero_()
        self.prompt_mask[row, to_device(req.prompt_token_ids, torch.int64, dev)] = True
        self.output_counts[row].zero_()
        if req.output_token_ids:  # a resumed request: count what it generated before
            ids = to_device(req.output_token_ids, torch.int64, dev)   # (bincount would read its max back)
            self.output_counts[row].index_add_(0, ids, torch.ones(ids.shape, dtype=self.output_counts.dtype, device=dev))

    def _batch_metadata(self) -> SamplingMetadata:
        if self._md is None:
            reqs = self._reqs
            n = len(reqs)
            pen = self.output_counts is not None and any(r.sampling_params.has_penalties for r in reqs)
            bad = {i: r.banned_words for i, r in enumerate(reqs) if r.banned_words}
            self.step.fill_(self._host_step)
            md = SamplingMetadata.from_rows(
                self._row_params(reqs), vocab_size=self.vocab_size, device=self.device,
                engine_seed=self.seed, step=self.step,
                prompt_mask=self.prompt_mask[:n] if pen else None,
                output_counts=self.output_counts[:n] if pen else None,
                bad_words_token_ids=bad or None,
                output_token_ids=[r.output_token_ids for r in reqs] if bad else None,
                logitsprocs=self.procs)
            self._md_version += 1
            # min_p reaches the Sampler through the min_p processor (the same values): one op less.
            self._md = replace(md, min_p=None) if self.procs.get(MinPLogitsProcessor) is not None else md
            # Nothing to process and nobody samples: the pipeline reduces to an argmax.
            self._plain_greedy = self._only_builtin_procs and all(
                _plain_greedy(r.sampling_params) and not r.banned_words for r in reqs)
            # Constants of the steady step (every row samples): see `_steady_metadata`.
            md = self._md
            self._seeded = [r.sampling_params.seed is not None for r in reqs]
            self._steady_seeds = torch.where(md.has_seed, md.request_seeds,
                                             torch.full_like(md.request_seeds, self.seed))
            self._identity = list(range(n))
            self._num_logprobs = [r.sampling_params.logprobs for r in reqs]
            self._identity_index = {str(self.device): torch.arange(n, dtype=torch.int64, device=self.device)}
        return self._md

    def _row_params(self, reqs: list[Request]) -> list[RowParams]:
        """The checked parameters of every row: made once per request, kept while it is in the batch."""
        old, new = self._checked, {}
        for r in reqs:
            sp = r.sampling_params
            entry = old.get(id(sp))
            new[id(sp)] = entry if entry is not None and entry[0] is sp else (
                sp, RowParams.from_sampling_params(sp, self.vocab_size))
        self._checked = new
        return [new[id(r.sampling_params)][1] for r in reqs]

    def _steady_keys(self, positions: list[int]) -> list[list[int]]:
        """[2][N] token positions and generator keys of a steady step (host).

        Same keys as `rng.row_keys` (seeded rows: the token position; the others:
        (row + 1) << 32 | step).
        """
        step = self._host_step & rng._M32
        return [positions, [p if s else ((i + 1) << 32) | step
                            for i, (p, s) in enumerate(zip(positions, self._seeded))]]

    def _steady_metadata(self, batch_md: SamplingMetadata, positions: list[int],
                         lrows: LogitsRows, history, both: torch.Tensor | None = None) -> SamplingMetadata:
        """The batch metadata with this step's generator keys, when every row samples.

        `both` ([2, N] int64 on the device) holds `_steady_keys(positions)`; without it they
        are built on the host and sent in one copy.
        """
        if both is None:
            both = to_device(self._steady_keys(positions), torch.int64, self.device)
        md = copy.copy(batch_md)  # cheaper than dataclasses.replace, which re-runs __init__
        md.seeds, md.positions, md.token_positions = self._steady_seeds, both[1], both[0]
        md.rows, md.output_token_ids = lrows, history
        return md

    def _graph_key(self, logits: torch.Tensor, lrows: LogitsRows | None, history):
        """What the device work of a steady step depends on besides the logits and the keys;
        None when it may depend on more than the engine can see (see SteadyStepGraph).

        `lrows` may be None while min_tokens bans nothing (it is only read for the banned rows).
        """
        if history is not None or not self._only_builtin_procs:
            return None
        min_tokens = self._min_tokens
        banned = ()
        if min_tokens is not None and min_tokens.is_active():
            banned = tuple(r for r, _ in min_tokens.banned_rows(lrows, len(self._identity)))
        return (self._md_version, tuple(logits.shape), logits.dtype, banned)

    def _steady_rows(self) -> LogitsRows:
        """The LogitsRows of a steady step: every batch row, in order."""
        return LogitsRows(list(self._identity), [len(r.output_token_ids) for r in self._reqs],
                          _device_index=self._identity_index)

    def _keys_advanced(self, positions: list[int]) -> bool:
        """Whether this steady step's keys are the last steady step's plus one, so that a replayed
        graph (which adds one to the keys it read) already holds them: every position advanced by
        one, the step counter by one, and its low 32 bits did not wrap (an unseeded row's key is
        (row + 1) << 32 | step, where + 1 would carry into the row). Then records this step's."""
        step = self._host_step
        advanced = positions == self._next_positions and step == self._next_step and step & rng._M32 != 0
        self._next_positions, self._next_step = list(map(_plus_one, positions)), step + 1
        return advanced

    def _draw_steady(self, logits: torch.Tensor, both: torch.Tensor, batch_md: SamplingMetadata, lrows: LogitsRows,
                     history, advance_keys: bool) -> tuple[torch.Tensor, LogprobsTensors | None, torch.Tensor | None]:
        """Sampler + penalty counts of a steady step (eager, or recorded into the graph), and the
        step's tokens and logprobs packed for one readback. `advance_keys`: leave `both` + 1, the
        next steady step's keys (SteadyStepGraph's contract), in the packing kernel."""
        out = self.sampler(logits, self._steady_metadata(batch_md, [], lrows, history, both))
        if self.output_counts is not None:
            token_bincount_update_(self.output_counts, lrows.req_index_tensor(self.device), out.sampled_token_ids)
        packed = pack_readback(out.sampled_token_ids, out.logprobs, advance_keys=both if advance_keys else None)
        return out.sampled_token_ids, out.logprobs, packed

    def _forget_device_caches(self) -> None:
        """After a failed capture: device tensors built during it hold nothing; rebuild them."""
        self._md = None
        for proc in self.procs.all:
            for name in ("_cache", "_device_min_p"):
                if hasattr(proc, name):
                    setattr(proc, name, None)

    # ---- the draw -----------------------------------------------------------------------

    def sample(
        self,
        logits: torch.Tensor,  # [N, vocab] fp32 raw logits of the sampling rows (may be modified in place)
        rows: list[int],  # persistent-batch row of each logits row
        positions: list[int],  # sequence position of the token each row samples
    ) -> tuple[torch.Tensor, LogprobsTensors | None]:
        """Run the specops Sampler on the rows that sample this step: one token each ([N] int64,
        -1 where the logits were invalid: NaN, +inf or all -inf) and, when a row asked for them,
        raw logprobs of every row.

        On a replayed steady step (CUDA) the returned tensors belong to the graph and the next
        call overwrites them: read or clone them before sampling again.
        """
        return self._draw(logits, rows, positions)[:2]

    def logits_buffer(self, num_rows: int) -> torch.Tensor | None:
        """[num_rows, vocab] fp32: where to compute the next step's logits so that a replayed
        sampler graph reads them without a copy; None: anywhere."""
        return self.graph.input_buffer((num_rows, self.vocab_size), torch.float32)

    def sample_to_host(
        self,
        logits: torch.Tensor,  # [N, vocab] fp32 raw logits of the sampling rows (may be modified in place)
        rows: list[int],  # persistent-batch row of each logits row
        positions: list[int],  # sequence position of the token each row samples
        num_logprobs: list[int | None] | None = None,  # per row: top-n logprobs wanted, None = none
    ) -> tuple[list[int], list[Logprob | None]]:
        """`sample`, read back in one device-to-host copy: the tokens and each row's Logprob entry.

        `num_logprobs` None: what each row's request asked for (`SamplingParams.logprobs`).
        """
        trace = self.trace
        if trace is not None:
            trace.append(("start", time.perf_counter()))
        tokens, lp, packed = self._draw(logits, rows, positions)
        if num_logprobs is None:
            num_logprobs = (self._num_logprobs if rows == self._identity
                            else [self._reqs[r].sampling_params.logprobs for r in rows])
        if num_logprobs.count(None) == len(num_logprobs):
            return self._to_host(tokens).tolist(), [None] * len(rows)
        if packed is None:
            packed = pack_readback(tokens, lp)
        host = self._to_host(packed)
        if trace is not None:
            trace.append(("wait for the device + copy", time.perf_counter()))
        out = unpack_readback(host, num_logprobs)
        if trace is not None:
            trace.append(("unpack", time.perf_counter()))
        return out

    def _to_host(self, t: torch.Tensor) -> np.ndarray:
        """`t` on the host, through a pinned buffer kept per shape and dtype (an asynchronous
        copy and a stream sync: no pageable staging, no allocation per step). The array is
        a view of that buffer: valid until the next call."""
        if t.device.type != "cuda":
            return t.numpy()
        key = (tuple(t.shape), t.dtype)
        buf = self._pinned.get(key)
        if buf is None:
            if len(self._pinned) >= 4:  # shapes change with the batch: keep a few
                self._pinned.clear()
            buf = self._pinned[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return buf.numpy()

    def _draw(self, logits: torch.Tensor, rows: list[int],
              positions: list[int]) -> tuple[torch.Tensor, LogprobsTensors | None, torch.Tensor | None]:
        """(tokens [N] int64, logprobs or None, packed readback or None) of `sample`."""
        batch_md = self._batch_metadata()
        steady = rows == self._identity  # every row samples (steady decoding)
        if self._plain_greedy and steady:
            return self._draw_plain_greedy_steady(logits)
        if self._plain_greedy:
            tokens = _checked_argmax(logits)
            if self.output_counts is not None:
                index = (self._identity_index[str(self.device)] if steady
                         else to_device(rows, torch.int64, self.device))
                token_bincount_update_(self.output_counts, index, tokens)
            self._advance()
            return tokens, None, None
        if steady:  # only the logits and the generator keys change: replayed from a CUDA graph when it can
            return self._draw_steady_step(logits, rows, positions, batch_md)
        reqs = [self._reqs[r] for r in rows]
        lrows = LogitsRows(list(rows), [len(r.output_token_ids) for r in reqs])
        history = [r.output_token_ids for r in reqs] if batch_md.bad_words_token_ids else None
        # Other rows than the steady step's: processors rebuild their cached index tensors for
        # them, which frees the ones a captured graph reads. Drop the graph first.
        self.graph.reset()
        self._next_positions = None
        self.step.fill_(self._host_step)
        md = batch_md.expand(rows, position_offsets=positions, rows=lrows, output_token_ids=history)
        out = self.sampler(logits, md)
        tokens = out.sampled_token_ids
        if self.output_counts is not None:
            token_bincount_update_(self.output_counts, lrows.req_index_tensor(self.device), tokens)
        self._advance()
        return tokens, out.logprobs, None

    def _draw_steady_step(self, logits: torch.Tensor, rows: list[int], positions: list[int],
                          batch_md: SamplingMetadata):
        """`_draw` when every row samples. The host work of a replayed step is a key check, the
        graph key and the launch: LogitsRows are built only when min_tokens or the body needs them,
        and the generator keys only when the graph does not hold them already."""
        trace = self.trace
        history = [r.output_token_ids for r in self._reqs] if batch_md.bad_words_token_ids else None
        min_tokens = self._min_tokens
        lrows = self._steady_rows() if min_tokens is not None and min_tokens.is_active() else None
        advanced = self._keys_advanced(positions)
        key = self._graph_key(logits, lrows, history)
        if trace is not None:
            trace.append(("host before the launch", time.perf_counter()))

        def body(x, both, advance_keys=True):  # as the graph calls it: leaves both + 1 (SteadyStepGraph)
            return self._draw_steady(x, both, batch_md, lrows if lrows is not None else self._steady_rows(), history,
                                     advance_keys)

        graphs_on = self.graph.enabled
        out = self.graph.run(key, logits, lambda: self._steady_keys(positions), body, advanced=advanced)
        if out is None and graphs_on and not self.graph.enabled:  # the capture failed: start over eagerly
            self._forget_device_caches()
            self._next_positions = None
            return self._draw(logits, rows, positions)
        if out is None:
            out = body(logits, to_device(self._steady_keys(positions), torch.int64, self.device), advance_keys=False)
        if trace is not None:
            trace.append(("launch (graph replay or eager)", time.perf_counter()))
        self._advance()
        return out

    def _draw_plain_greedy_steady(self, logits: torch.Tensor):
        """`_draw` of a plain-greedy batch where every row samples: the checked argmax (and the
        penalty counts, when a past request made them) replayed from the step graph like a
        sampling step, so that a step costs one launch instead of four small eager ops. The
        graph's keys are not read: they are never copied (`advanced`), and the body need not
        advance them."""
        self._next_positions = None  # a later sampling step's keys were not left by this graph
        n = logits.shape[0]

        def body(x, _keys):
            tokens = _checked_argmax(x)
            if self.output_counts is not None:
                token_bincount_update_(self.output_counts, self._identity_index[str(self.device)], tokens)
            return tokens, None, None

        graphs_on = self.graph.enabled
        key = ("plain greedy", self._md_version, tuple(logits.shape), logits.dtype)
        out = self.graph.run(key, logits, lambda: [[0] * n, [0] * n], body, advanced=True)
        if out is None and graphs_on and not self.graph.enabled:  # the capture failed: eager from now on
            self._forget_device_caches()
            self._batch_metadata()
        if out is None:
            out = body(logits, None)
        self._advance()
        return out

    def _advance(self) -> None:
        self._host_step += 1

    # ---- speculative decoding: verification ---------------------------------------------

    def verify(
        self,
        logits: torch.Tensor,  # [sum(nd) + N, vocab] fp32 raw logits at spec.logits_indices
        spec: SpecDecodeMetadata,
        rows: list[int],  # persistent-batch row of each verifying request
        positions: list[int],  # position of each request's first draft (= its committed length)
        drafts: list[list[int]],  # the drafts of each request (len = spec.num_draft_tokens)
        draft_probs: torch.Tensor | None = None,  # [sum(nd), vocab] draft distributions (draft model)
    ) -> torch.Tensor:  # [N, max_spec_len + 1] int32: emitted tokens, then -1
        """Verify the drafts of the rows that sample this step with the RejectionSampler.

        Rows without drafts (plain decodes, the last chunk of a prompt) have one bonus row and
        are sampled as `sample` would. Plain-greedy batches take the rejection rule's greedy
        branch on one checked argmax of every row. The penalty counts then add the emitted
        tokens (the -1 placeholders after them are ignored by token_bincount_update_).
        """
        batch_md = self._batch_metadata()
        self.graph.reset()  # the processors see one row per draft: see the same line in `_draw`
        self._next_positions = None
        if self._plain_greedy:
            out = greedy_verify(_checked_argmax(logits), spec)
        else:
            reqs = [self._reqs[r] for r in rows]
            lrows = LogitsRows(list(rows), [len(r.output_token_ids) for r in reqs])
            history = [r.output_token_ids for r in reqs] if batch_md.bad_words_token_ids else None
            self.step.fill_(self._host_step)
            md = batch_md.expand(rows, position_offsets=positions, rows=lrows, output_token_ids=history)
            out = self.rejection_sampler(logits, spec, md, draft_probs=draft_probs,
                                         draft_token_lists=drafts).output_token_ids
        if self.output_counts is not None:
            row_index = to_device(rows, torch.int64, self.device)
            token_bincount_update_(self.output_counts, row_index.repeat_interleave(out.shape[1]),
                                   out.reshape(-1).long())
        self._advance()
        return out

    def count_emitted(self, rows: list[int], emitted: list[list[int]]) -> None:
        """Add tokens emitted outside `sample`/`verify` (synthetic acceptance) to the penalty counts."""
        if self.output_counts is None:
            return
        flat = [t for e in emitted for t in e]
        index = [r for r, e in zip(rows, emitted) for _ in e]
        token_bincount_update_(self.output_counts, to_device(index, torch.int64, self.device),
                               to_device(flat, torch.int64, self.device))


def greedy_verify(
    tokens: torch.Tensor,  # [sum(nd) + N] int64 argmax of every kept row (-1: invalid row)
    spec: SpecDecodeMetadata,
) -> torch.Tensor:  # [N, max_spec_len + 1] int32
    """The RejectionSampler's greedy rule from the argmax of every row, without a host sync.

    Request r accepts its drafts while each equals the argmax of its target row; it emits
    the accepted drafts, then the argmax at the first mismatch (or of the bonus row), then
    -1. An invalid row (-1) rejects its draft and emits -1, which the caller reports.
    """
    num_reqs, k = len(spec.num_draft_tokens), spec.max_spec_len
    dev = tokens.device
    bonus = spec.bonus_logits_indices.to(dev).long()  # [N]
    nd = torch.diff(spec.cu_num_draft_tokens.to(dev).long(), prepend=torch.zeros(1, dtype=torch.long, device=dev))
    j = torch.arange(k + 1, device=dev)
    first = bonus - nd  # row of each request's first kept logits row
    target = tokens[torch.minimum(first[:, None] + j, bonus[:, None])]  # [N, k+1]: argmax of row j
    draft = torch.full((num_reqs, k + 1), -2, dtype=torch.long, device=dev)
    if k:
        starts = spec.cu_num_draft_tokens.to(dev).long() - nd
        src = torch.clamp(starts[:, None] + j[:k], max=max(spec.draft_token_ids.shape[0] - 1, 0))
        within = j[:k] < nd[:, None]
        draft[:, :k] = torch.where(within, spec.draft_token_ids.to(dev).long()[src], -2)
    accepted = torch.cumprod((draft == target).long(), dim=1).sum(dim=1)  # [N] accepted drafts
    return torch.where(j[None, :] <= accepted[:, None], target, -1).to(torch.int32)


def _plain_greedy(sp) -> bool:
    return (sp.temperature == 0.0 and not sp.has_penalties and not sp.logit_bias and sp.allowed_token_ids is None
            and sp.min_tokens == 0 and sp.logprobs is None)


def _checked_argmax(logits: torch.Tensor) -> torch.Tensor:  # [N] int64
    """argmax per row, -1 for invalid rows (a NaN or +inf logit, or all -inf), as the Sampler reports them.

    One pass: the row max propagates NaN and is +inf or -inf exactly on the other invalid
    rows, and its index is argmax's (the first of the largest values).
    """
    top, index = logits.max(dim=-1)
    return index.masked_fill_(~torch.isfinite(top), -1)


def _final_row(row: int, moved) -> int:
    """Where a row added this step sits after the step's moves."""
    for src, dst, _ in moved:
        if src == row:
            row = dst
    return row


_plus_one = (1).__add__  # x -> x + 1 without a Python frame (inside map)


