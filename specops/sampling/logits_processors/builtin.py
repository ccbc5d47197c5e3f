"""Built-in logits processors: min_tokens, logit_bias (both change the argmax) and min_p.

min_tokens and logit_bias keep a sparse `{batch index: entry}` dict; min_p keeps a dense
per-index array (like vLLM's built-ins, seeds/01 chapter 2.3). All three read per-row
request indices and histories from `LogitsRows`, so they work on speculative-decoding
rows (several rows per request) as well as on plain rows.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Sequence

import torch

from .interface import BatchUpdate, LogitsProcessor, LogitsRows, MoveDirectionality, process_dict_updates, to_device


_FP32_MAX = float(torch.finfo(torch.float32).max)


def _rows_or_identity(rows: LogitsRows | None, num_rows: int) -> LogitsRows:
    return rows if rows is not None else LogitsRows.identity(num_rows)


def _token_ids(name: str, ids) -> list[int]:
    """A request's list of token ids (None: empty), each an int."""
    if ids is None:
        return []
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    ids = list(ids)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{name} must hold token ids (ints), got {t!r}")
    return [int(t) for t in ids]


def _bias_token(tok, where: str) -> int:
    """A logit_bias key as a token id: an int, or its decimal string (JSON object keys): ASCII
    digits with an optional "-", nothing else (int() would also take "1_0", " 7 " or other
    scripts' digits)."""
    if isinstance(tok, str):
        if re.fullmatch(r"-?[0-9]+", tok):
            return int(tok)
    elif isinstance(tok, numbers.Integral) and not isinstance(tok, bool):
        return int(tok)
    raise ValueError(f"{where}logit_bias token id must be an int (or its decimal string), got {tok!r}")


def _check_added(proc: LogitsProcessor, batch_update: BatchUpdate | None, entry) -> None:
    """`check_update` of a built-in: the indices, then `entry(params, prompt ids, output ids,
    where)` of every added request, which raises on a parameter it refuses."""
    LogitsProcessor.check_update(proc, batch_update)
    if batch_update is not None:
        for i, (_, params, prompt_ids, output_ids) in enumerate(batch_update.added):
            entry(params, prompt_ids, output_ids, f"BatchUpdate.added[{i}] ")


class _SparseStateProcessor(LogitsProcessor):
    """A built-in that changes the argmax and keeps a sparse `{batch index: entry}` dict:
    `_entry(params, prompt ids, output ids, where)` makes a request's entry (None: nothing to
    do for it) and raises on a parameter it refuses; `_cache` (the device tensors built from
    the entries) is reset whenever the entries change."""

    def __init__(self, max_num_reqs: int, vocab_size: int, device="cpu"):
        super().__init__(max_num_reqs, vocab_size, device)
        self.state: dict = {}
        self._cache: tuple | None = None

    def _entry(self, params, prompt_ids, output_ids, where: str = ""):
        raise NotImplementedError

    def is_argmax_invariant(self) -> bool:
        return False

    def is_active(self) -> bool:
        return bool(self.state)

    def check_update(self, batch_update: BatchUpdate | None) -> None:
        """The indices, and every added request's entry."""
        _check_added(self, batch_update, self._entry)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.check_update(batch_update)
        if process_dict_updates(self.state, batch_update, self._entry):
            self._cache = None


class MinTokensLogitsProcessor(_SparseStateProcessor):
    """Ban stop tokens (EOS and the request's stop_token_ids) until min_tokens were generated.

    Parameters
    ----------
    max_num_reqs, vocab_size, device
        See `LogitsProcessor`.
    eos_token_ids : Sequence[int]
        The model's end-of-sequence token ids (banned unless the request ignores EOS).
    """

    state: dict[int, tuple[int, list[int], list[int]]]  # index -> (min, outputs ref, stop ids)
    _cache: tuple | None  # (key, [2, n] row and token index on the device); reset by updates

    def __init__(self, max_num_reqs: int, vocab_size: int, device="cpu", eos_token_ids: Sequence[int] = ()):
        super().__init__(max_num_reqs, vocab_size, device)
        self.eos_token_ids = [int(t) for t in eos_token_ids]

    def _entry(self, params, prompt_ids, output_ids, where: str = ""):
        min_tokens = getattr(params, "min_tokens", 0) or 0
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, numbers.Integral) or min_tokens < 0:
            raise ValueError(f"{where}min_tokens must be an int >= 0, got {min_tokens!r}")
        if output_ids is not None and not isinstance(output_ids, (list, tuple)):
            raise TypeError(f"{where}output token ids must be the request's (live) list, "
                            f"got {type(output_ids).__name__}")
        stop = set(_token_ids(f"{where}stop_token_ids", getattr(params, "stop_token_ids", None)))
        stop |= set(_token_ids(f"{where}all_stop_token_ids", getattr(params, "all_stop_token_ids", None)))
        if min_tokens == 0:
            return None
        if not getattr(params, "ignore_eos", False):
            stop |= set(self.eos_token_ids)
        stop = sorted(t for t in stop if 0 <= t < self.vocab_size)
        if not stop:
            return None
        allowed = getattr(params, "allowed_token_ids", None)
        if (allowed and len(output_ids or ()) < min_tokens
                and all(isinstance(t, numbers.Integral) and t in stop for t in allowed)):
            # every allowed token banned: each step until min_tokens would have nothing to sample
            raise ValueError(f"{where}min_tokens={min_tokens} bans every token of allowed_token_ids "
                             f"{sorted(set(allowed))[:5]}: they are all stop tokens (EOS or stop_token_ids)")
        return (int(min_tokens), output_ids if output_ids is not None else [], stop)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        super().update_state(batch_update)
        # Requests that reached min_tokens need nothing more (their output list is live).
        for index in [i for i, (n, out, _) in self.state.items() if len(out) >= n]:
            del self.state[index]

    def banned_rows(self, rows: LogitsRows | None, num_rows: int) -> list[tuple[int, list[int]]]:
        """(logits row, stop ids) of the rows still below their minimum this step."""
        if not self.state:
            return []
        explicit = rows is not None
        rows = _rows_or_identity(rows, num_rows)
        banned = []
        for r, index in enumerate(rows.req_indices):
            entry = self.state.get(index)
            if entry is not None:
                min_tokens, outputs, stop = entry
                if (rows.num_output_tokens[r] if explicit else len(outputs)) < min_tokens:
                    banned.append((r, stop))
        return banned

    def apply(self, logits: torch.Tensor, rows: LogitsRows | None = None) -> torch.Tensor:
        if not self.state:
            return logits
        banned = self.banned_rows(rows, logits.shape[0])
        rows = _rows_or_identity(rows, logits.shape[0])
        if banned:
            # The banned pairs change only when a row reaches its minimum or the batch changes.
            key = (tuple(r for r, _ in banned), tuple(rows.req_indices[r] for r, _ in banned), logits.device)
            if self._cache is None or self._cache[0] != key:
                r_idx = [r for r, stop in banned for _ in stop]
                t_idx = [t for _, stop in banned for t in stop]
                self._cache = (key, to_device([r_idx, t_idx], torch.int64, logits.device))
            index = self._cache[1]
            logits[index[0], index[1]] = float("-inf")
        return logits


class LogitBiasLogitsProcessor(_SparseStateProcessor):
    """Add the request's `logit_bias` {token id: bias} to its rows."""

    state: dict[int, tuple[list[int], list[float]]]  # index -> (token ids, biases)
    _cache: tuple | None  # (key, [2, n] row and token index, [n] biases); reset by updates

    def _entry(self, params, prompt_ids, output_ids, where: str = ""):
        bias = getattr(params, "logit_bias", None)
        if not bias:
            return None
        if not isinstance(bias, Mapping):
            raise TypeError(f"{where}logit_bias must be a dict {{token id: bias}}, got {type(bias).__name__}")
        merged: dict[int, float] = {}  # keys that name the same id ("5" and 5) add up
        for tok, val in bias.items():
            tok = _bias_token(tok, where)
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"{where}logit_bias token id must be in [0, {self.vocab_size}), got {tok}")
            try:
                val = float(val)
            except (TypeError, ValueError):
                raise ValueError(f"{where}logit_bias values must be real numbers, got {val!r} for token {tok}") \
                    from None
            if not math.isfinite(val):
                raise ValueError(f"{where}logit_bias values must be finite, got {val} for token {tok}")
            merged[tok] = merged.get(tok, 0.0) + val
        for tok, val in merged.items():
            if not abs(val) <= _FP32_MAX:
                raise ValueError(f"{where}logit_bias for token {tok} must fit in float32 "
                                 f"(|bias| <= {_FP32_MAX:.4g}), got {val}")
        return (list(merged), list(merged.values()))

    def apply(self, logits: torch.Tensor, rows: LogitsRows | None = None) -> torch.Tensor:
        if not self.state:
            return logits
        rows = _rows_or_identity(rows, logits.shape[0])
        # The (row, token, bias) triples depend on the rows' requests only: built once per batch.
        # fp32 only: a CUDA atomic add in bf16/fp16 need not round like torch's add (fp32, then once more)
        flat = logits.is_contiguous() and logits.dtype == torch.float32
        key = (tuple(rows.req_indices), logits.device, logits.dtype, logits.shape[1] if flat else None)
        if self._cache is None or self._cache[0] != key:
            r_idx: list[int] = []
            t_idx: list[int] = []
            vals: list[float] = []
            for r, index in enumerate(rows.req_indices):
                entry = self.state.get(index)
                if entry is not None:
                    r_idx += [r] * len(entry[0])
                    t_idx += entry[0]
                    vals += entry[1]
            dev = logits.device
            if not r_idx:
                index = None
            elif flat:  # element r * V + t of the flattened logits
                width = logits.shape[1]
                index = to_device([r * width + t for r, t in zip(r_idx, t_idx)], torch.int64, dev)
            else:
                index = to_device([r_idx, t_idx], torch.int64, dev)
            self._cache = (key, index, to_device(vals, logits.dtype, dev))
        _, index, vals = self._cache
        if index is None:
            return logits
        # Every (row, token) pair occurs once, so each element gets exactly one addition, rounded
        # once: the same values as gather + add + scatter. Contiguous fp32 logits (the Sampler's)
        # take one index_add_ (one kernel) instead of those three.
        if index.dim() == 1:
            logits.view(-1).index_add_(0, index, vals)
        else:
            logits.index_put_((index[0], index[1]), logits[index[0], index[1]] + vals)
        return logits


class MinPLogitsProcessor(LogitsProcessor):
    """Drop tokens whose probability is below min_p times the most likely token's.

    Argmax invariant: runs on temperature-scaled logits of random rows. The Sampler fuses
    it into the top-k/top-p kernel through `row_min_p` instead of calling `apply`.
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device="cpu"):
        super().__init__(max_num_reqs, vocab_size, device)
        self.min_p = torch.zeros(max_num_reqs, dtype=torch.float32)  # host, dense by batch index
        self._device_min_p: torch.Tensor | None = None
        self.num_active = 0

    def is_argmax_invariant(self) -> bool:
        return True

    def is_active(self) -> bool:
        return self.num_active > 0

    @staticmethod
    def _value(params, prompt_ids=None, output_ids=None, where: str = "") -> float:
        value = getattr(params, "min_p", 0.0) or 0.0
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{where}min_p must be in [0, 1], got {value!r}")
        return float(value)

    def check_update(self, batch_update: BatchUpdate | None) -> None:
        """The indices, and every added request's min_p."""
        _check_added(self, batch_update, self._value)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.check_update(batch_update)
        if batch_update is None:
            return
        added = [(index, self._value(params)) for index, params, _, _ in batch_update.added]
        for index in batch_update.removed:
            self.min_p[index] = 0.0
        for index, value in added:
            self.min_p[index] = value
        for src, dst, direction in batch_update.moved:
            a, b = float(self.min_p[src]), float(self.min_p[dst])
            self.min_p[dst] = a
            self.min_p[src] = b if direction == MoveDirectionality.SWAP else 0.0
        self.num_active = int((self.min_p > 0).sum())
        self._device_min_p = None

    def row_min_p(self, rows: LogitsRows | None, num_rows: int, device) -> torch.Tensor | None:
        """[num_rows] fp32 min_p of every logits row, or None when no request uses min_p."""
        if self.num_active == 0:
            return None
        if self._device_min_p is None or self._device_min_p.device != torch.device(device):
            self._device_min_p = to_device(self.min_p.tolist(), torch.float32, device)   # no wait on the GPU
        if rows is None and num_rows > self.max_num_reqs:
            # identity rows past the batch: a slice of max_num_reqs values would broadcast over them
            raise ValueError(f"MinPLogitsProcessor: rows is None (row i is batch index i) but there are "
                             f"{num_rows} rows and max_num_reqs={self.max_num_reqs}: give rows (LogitsRows)")
        if rows is None or rows.req_indices == list(range(num_rows)):
            return self._device_min_p[:num_rows]
        return self._device_min_p.index_select(0, rows.req_index_tensor(device))

    def apply(self, logits: torch.Tensor, rows: LogitsRows | None = None) -> torch.Tensor:
        min_p = self.row_min_p(rows, logits.shape[0], logits.device)
        if min_p is None:
            return logits
        return apply_min_p_(logits, min_p)


def apply_min_p_(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens with logit < max + log(min_p) (i.e. prob < min_p * max prob), in place.

    logits: [N, V] fp32 temperature-scaled; min_p: [N] fp32 (0 = off).
    """
    top = logits.max(dim=-1, keepdim=True).values
    cut = top + torch.log(min_p.to(logits.dtype)).unsqueeze(1)  # log(0) = -inf: nothing dropped
    return logits.masked_fill_(logits < cut, float("-inf"))
