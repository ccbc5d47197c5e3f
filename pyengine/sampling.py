"""The engine side of sampling: per-row parameters of the persistent batch, then one call to sample.

`BatchSampler` keeps, for every row of the persistent batch, the request's sampling
parameters (host arrays moved to the device when the batch changes) and, once a request
with penalties arrives, the prompt-token mask and output-token counts that penalties
need ([rows, vocab] on the device, updated incrementally after every step). It follows
the batch through the same BatchUpdate that the logits processors get.

`sample()` is the one place that draws tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from specops import rng

from .input_batch import BatchUpdate


class BatchSampler:
    """Per-row sampling state of the persistent batch and the draw.

    Parameters
    ----------
    max_num_reqs : int
    vocab_size : int
    device : torch.device
    seed : int
        Engine seed for requests without one.
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device, seed: int = 0):
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = device
        self.seed = seed
        self.step = 0
        self.params: list = [None] * max_num_reqs
        self.temperature = np.zeros(max_num_reqs, dtype=np.float32)
        self.seeds = np.zeros(max_num_reqs, dtype=np.int64)
        self.has_seed = np.zeros(max_num_reqs, dtype=bool)
        self._dev: dict[str, torch.Tensor] | None = None
        self.prompt_mask: torch.Tensor | None = None  # [rows, vocab] bool, allocated on demand
        self.output_counts: torch.Tensor | None = None  # [rows, vocab] int32
        self._token_lists: list = [None] * max_num_reqs  # (prompt ids, output ids reference)

    # ---- persistent state ---------------------------------------------------------------

    def update_state(self, upd: BatchUpdate | None) -> None:
        if upd is None:
            return
        self._dev = None
        for row in upd.removed:
            self.params[row] = None
            self._token_lists[row] = None
        for row, params, prompt_ids, output_ids in upd.added:
            self.params[row] = params
            self.temperature[row] = params.temperature
            self.has_seed[row] = params.seed is not None
            self.seeds[row] = params.seed if params.seed is not None else 0
            self._token_lists[row] = (prompt_ids, output_ids)
            if params.has_penalties and self.output_counts is None:
                self._alloc_penalty_state()
            if self.output_counts is not None:
                self._fill_penalty_row(row)
        for src, dst, _ in upd.moved:
            for arr in (self.params, self._token_lists):
                arr[dst], arr[src] = arr[src], None
            for arr in (self.temperature, self.seeds, self.has_seed):
                arr[dst] = arr[src]
            if self.output_counts is not None:
                self.prompt_mask[dst] = self.prompt_mask[src]
                self.output_counts[dst] = self.output_counts[src]

    def _alloc_penalty_state(self) -> None:
        shape = (self.max_num_reqs, self.vocab_size)
        self.prompt_mask = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.output_counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
        for row, toks in enumerate(self._token_lists):
            if toks is not None:
                self._fill_penalty_row(row)

    def _fill_penalty_row(self, row: int) -> None:
        prompt_ids, output_ids = self._token_lists[row]
        self.prompt_mask[row].zero_()
        self.prompt_mask[row, torch.tensor(prompt_ids, dtype=torch.int64, device=self.device)] = True
        self.output_counts[row] = torch.bincount(
            torch.tensor(output_ids, dtype=torch.int64, device=self.device),
            minlength=self.vocab_size)[:self.vocab_size].to(torch.int32)

    def _device_arrays(self, num_reqs: int) -> dict[str, torch.Tensor]:
        if self._dev is None:
            to = lambda a: torch.from_numpy(a[:num_reqs].copy()).to(self.device, non_blocking=True)  # noqa: E731
            self._dev = {"temperature": to(self.temperature), "seeds": to(self.seeds), "has_seed": to(self.has_seed)}
        return self._dev

    # ---- the draw -----------------------------------------------------------------------

    def sample(
        self,
        logits: torch.Tensor,  # [N, vocab] fp32
        rows: torch.Tensor,  # [N] int64: persistent-batch row of each logits row
        positions: torch.Tensor,  # [N] int64: sequence position of the token being sampled
        num_reqs: int,
    ) -> torch.Tensor:  # [N] int64
        """Draw one token per logits row (greedy rows take the argmax)."""
        self.step += 1
        dev = self._device_arrays(num_reqs)
        temp = dev["temperature"][rows]
        seeds, pos = rng.row_keys(dev["seeds"][rows], dev["has_seed"][rows], positions, self.seed,
                                  torch.tensor(self.step, dtype=torch.int64, device=logits.device))
        tokens = logits.argmax(dim=-1)
        if bool((self.temperature[:num_reqs] > 0).any()):  # host arrays: no device sync
            probs = torch.softmax(logits / torch.where(temp > 0, temp, 1.0).unsqueeze(1), dim=-1)
            noise = rng.vocab_noise(seeds, pos, rng.STREAM_SAMPLE, logits.shape[1])
            tokens = torch.where(temp > 0, (probs / noise).argmax(dim=-1), tokens)
        if self.output_counts is not None:
            self.output_counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.int32),
                                          accumulate=True)
        return tokens


def compute_logprobs(
    logits: torch.Tensor,  # [N, vocab] fp32, as the model produced them ("raw" logprobs)
    tokens: torch.Tensor,  # [N] int64 sampled tokens
    want: list[int],  # logits rows that asked for logprobs
    num_top: list[int],  # top-n per wanted row
) -> list:
    """Logprob of the sampled token, its rank (1 = most likely) and the top-n alternatives."""
    from .request import Logprob

    if not want:
        return []
    idx = torch.tensor(want, dtype=torch.int64, device=logits.device)
    lp = torch.log_softmax(logits[idx].float(), dim=-1)
    tok = tokens[idx]
    chosen = lp.gather(1, tok.unsqueeze(1)).squeeze(1)
    rank = (lp > chosen.unsqueeze(1)).sum(dim=1) + 1
    k = max(num_top)
    top_v, top_i = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
    out = []
    for j, n in enumerate(num_top):
        top = dict(zip(top_i[j, :n].tolist(), top_v[j, :n].tolist()))
        out.append(Logprob(int(tok[j]), float(chosen[j]), int(rank[j]), top))
    return out
