"""The engine side of sampling: the persistent batch's sampling state, and the one call that draws.

`BatchSampler` follows the persistent batch through its BatchUpdates: it feeds them to the
logits processors (min_tokens, logit_bias, min_p and any custom ones), rebuilds the
batch's `SamplingMetadata` when the batch changed, and keeps the penalty state that
penalties need: a prompt-token mask and output-token counts per row ([rows, vocab] on
the device, allocated when the first request with penalties arrives, updated after
every step with `specops.ops.token_bincount_update_`, so the cost of a step does not
grow with the length of the outputs).

Each step, `sample` gathers the metadata of the rows that sample (`expand`: rows that
are mid-prompt have no logits) and runs the specops pipeline: allowed tokens, bad words,
the non-argmax-invariant processors, penalties, then temperature/min-p/top-k/top-p and the
counter-based draw (`specops.sampling.sample`). Seeded rows are keyed by (seed, token
position), so their draws do not depend on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specops import rng
from specops.ops import apply_penalties_, token_bincount_update_
from specops.sampling import SamplingMetadata
from specops.sampling import sample as specops_sample
from specops.sampling.logits_processors import LogitsRows, MinPLogitsProcessor, build_logits_processors
from specops.sampling.sampler_torch import apply_allowed_token_mask_, apply_bad_words_

from .input_batch import BatchUpdate
from .request import Logprob, Request


def sampler_name() -> str:
    """Which sampling path the engine uses (reported by benchmarks)."""
    return "specops.sampling.sample"


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
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device, seed: int = 0,
                 eos_token_ids: list[int] = (), logits_processors: list = ()):
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.seed = seed
        self.procs = build_logits_processors(max_num_reqs, vocab_size, self.device, custom=logits_processors,
                                             eos_token_ids=eos_token_ids)
        # min_p is applied by the fused draw from the metadata; the other processors run here.
        self._before_penalties = self.procs.non_argmax_invariant
        self._after_temperature = [p for p in self.procs.argmax_invariant if not isinstance(p, MinPLogitsProcessor)]
        self.step = torch.zeros((), dtype=torch.int64, device=self.device)  # read by the metadata's row keys
        self.prompt_mask: torch.Tensor | None = None  # [rows, vocab] bool
        self.output_counts: torch.Tensor | None = None  # [rows, vocab] int32
        self._md: SamplingMetadata | None = None
        self._reqs: list[Request] = []

    # ---- following the batch ------------------------------------------------------------

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
        self.prompt_mask[row, torch.tensor(req.prompt_token_ids, dtype=torch.int64).to(dev)] = True
        counts = torch.bincount(torch.tensor(req.output_token_ids, dtype=torch.int64), minlength=self.vocab_size)
        self.output_counts[row] = counts[:self.vocab_size].to(dev, torch.int32)

    def _batch_metadata(self) -> SamplingMetadata:
        if self._md is None:
            reqs = self._reqs
            n = len(reqs)
            pen = self.output_counts is not None and any(r.sampling_params.has_penalties for r in reqs)
            bad = {i: r.banned_words for i, r in enumerate(reqs) if r.banned_words}
            self._md = SamplingMetadata.from_sampling_params(
                [r.sampling_params for r in reqs], vocab_size=self.vocab_size, device=self.device,
                engine_seed=self.seed, step=self.step,
                prompt_mask=self.prompt_mask[:n] if pen else None,
                output_counts=self.output_counts[:n] if pen else None,
                bad_words_token_ids=bad or None,
                output_token_ids=[r.output_token_ids for r in reqs] if bad else None,
                logitsprocs=self.procs)
        return self._md

    # ---- the draw -----------------------------------------------------------------------

    def sample(
        self,
        logits: torch.Tensor,  # [N, vocab] fp32 raw logits of the sampling rows (modified in place)
        rows: list[int],  # persistent-batch row of each logits row
        positions: list[int],  # sequence position of the token each row samples
    ) -> torch.Tensor:  # [N] int64, -1 where the logits were invalid (NaN, +inf, all -inf)
        """Run the sampling pipeline on the rows that sample this step and draw one token each."""
        reqs = [self._reqs[r] for r in rows]
        batch_md = self._batch_metadata()
        lrows = LogitsRows(list(rows), [len(r.output_token_ids) for r in reqs])
        history = [r.output_token_ids for r in reqs] if batch_md.bad_words_token_ids else None
        if len(rows) == len(self._reqs) and rows == list(range(len(rows))):
            # Every row samples (steady decoding): only the generator keys change.
            pos = torch.tensor(positions, dtype=torch.int64).to(self.device)
            seeds, keys = rng.row_keys(batch_md.request_seeds, batch_md.has_seed, pos, self.seed, self.step)
            md = replace(batch_md, seeds=seeds, positions=keys, token_positions=pos, rows=lrows,
                         output_token_ids=history)
        else:
            md = batch_md.expand(rows, position_offsets=positions, rows=lrows, output_token_ids=history)
        x = logits.float()
        apply_allowed_token_mask_(x, md.allowed_token_mask)
        apply_bad_words_(x, md.bad_words_token_ids, md.output_token_ids)
        for proc in self._before_penalties:
            x = proc.apply(x, md.rows)
        if md.repetition_penalties is not None:
            apply_penalties_(x, md.prompt_mask, md.output_counts, md.repetition_penalties,
                             md.frequency_penalties, md.presence_penalties)
        for proc in self._after_temperature:  # argmax-invariant custom processors
            x = proc.apply(x, md.rows)
        tokens = specops_sample(x, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds,
                                md.positions).tokens
        if self.output_counts is not None:
            token_bincount_update_(self.output_counts, md.rows.req_index_tensor(self.device), tokens)
        self.step += 1
        return tokens


def _final_row(row: int, moved) -> int:
    """Where a row added this step sits after the step's moves."""
    for src, dst, _ in moved:
        if src == row:
            row = dst
    return row


def compute_logprobs(
    logits: torch.Tensor,  # [M, vocab] fp32 raw logits of the rows that want logprobs (vLLM's "raw_logprobs")
    tokens: torch.Tensor,  # [M] int64 sampled tokens (-1 for invalid rows)
    num_top: list[int],  # top-n per row
) -> list[Logprob]:
    """Logprob of the sampled token, its rank (1 = most likely) and the top-n alternatives."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    tok = tokens.clamp(min=0)
    chosen = lp.gather(1, tok.unsqueeze(1)).squeeze(1)
    rank = (lp > chosen.unsqueeze(1)).sum(dim=1) + 1
    k = max(num_top)
    top_v, top_i = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
    top_v, top_i, chosen, rank, tok = top_v.tolist(), top_i.tolist(), chosen.tolist(), rank.tolist(), tok.tolist()
    return [Logprob(tok[j], chosen[j], rank[j], dict(zip(top_i[j][:n], top_v[j][:n]))) for j, n in enumerate(num_top)]
