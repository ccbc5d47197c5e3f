"""The LogitsProcessor interface over a persistent batch.

A persistent batch gives every running request a row index that it keeps from step to
step. A processor keeps per-request state keyed by that index and follows the batch
through one `BatchUpdate` per step, applied in a fixed order: `removed`, then `added`,
then `moved` (seeds/01, chapter 2.3).

Logits rows need not be 1:1 with requests: with speculative decoding one request owns
several rows (one per draft position plus the bonus row). `apply` therefore receives a
`LogitsRows` that says, for every logits row, which persistent-batch index it belongs to,
how many output tokens precede it (committed outputs plus the drafts before it) and which
draft tokens those are. With `rows=None` the rows are the batch indices 0..N-1 and no
drafts precede them.
"""

from __future__ import annotations

import enum
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch


class MoveDirectionality(enum.Enum):
    """How a `moved` entry changes the batch: a one-way move (src is left empty) or a swap."""

    UNIDIRECTIONAL = enum.auto()
    SWAP = enum.auto()


@dataclass(frozen=True)
class BatchUpdate:
    """Changes of the persistent batch since the last step.

    Attributes
    ----------
    batch_size : int
        Number of occupied rows after the update.
    removed : Sequence[int]
        Indices whose requests left the batch.
    added : Sequence[tuple[int, Any, list[int] | None, list[int]]]
        (index, sampling params, prompt token ids, output token ids). The output list is a
        reference to the request's live list: it grows as the request generates, so a
        processor can read its length at every `update_state` without being told.
    moved : Sequence[tuple[int, int, MoveDirectionality]]
        (src, dst, directionality) applied after `removed` and `added`.
    """

    batch_size: int
    removed: Sequence[int] = field(default_factory=list)
    added: Sequence[tuple] = field(default_factory=list)
    moved: Sequence[tuple] = field(default_factory=list)


def _check_int_in(name: str, v, stop: int | None, what: str) -> None:
    """TypeError / ValueError naming `name` unless v is an int in [0, stop] (`what`: how that
    bound reads, e.g. "[0, 4)"); stop None: no upper bound."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < 0 or (stop is not None and v > stop):
        raise ValueError(f"{name} must be {'>= 0' if stop is None else 'in ' + what}, got {v}")


def _check_index(name: str, v, max_num_reqs: int | None) -> None:
    _check_int_in(name, v, None if max_num_reqs is None else max_num_reqs - 1, f"[0, {max_num_reqs}) (max_num_reqs)")


def _shape_of(entry) -> str:
    return f"{len(entry)} values" if isinstance(entry, (tuple, list)) else type(entry).__name__


def check_batch_update(batch_update: BatchUpdate | None, max_num_reqs: int | None) -> None:
    """Raise TypeError / ValueError naming the field (e.g. "BatchUpdate.added[0] index") when
    `batch_update` is malformed: batch_size not an int in [0, max_num_reqs]; an index of
    `removed`, `added` or `moved` not an int in [0, max_num_reqs) (a negative one would count
    from the end); an `added` entry not (index, params, prompt ids, output ids); a `moved`
    entry not (src, dst, MoveDirectionality). Parameters are the processors' to check
    (`LogitsProcessor.check_update`). None (no change) passes; max_num_reqs None: no upper bound.
    """
    if batch_update is None:
        return
    if not isinstance(batch_update, BatchUpdate):
        raise TypeError(f"batch_update must be a BatchUpdate or None, got {type(batch_update).__name__}")
    _check_int_in("BatchUpdate.batch_size", batch_update.batch_size, max_num_reqs, f"[0, {max_num_reqs}]")
    for i, index in enumerate(batch_update.removed):
        _check_index(f"BatchUpdate.removed[{i}]", index, max_num_reqs)
    for i, entry in enumerate(batch_update.added):
        if not isinstance(entry, (tuple, list)) or len(entry) != 4:
            raise TypeError(f"BatchUpdate.added[{i}] must be (index, params, prompt token ids, output token ids), "
                            f"got {_shape_of(entry)}")
        _check_index(f"BatchUpdate.added[{i}] index", entry[0], max_num_reqs)
    for i, entry in enumerate(batch_update.moved):
        if not isinstance(entry, (tuple, list)) or len(entry) != 3:
            raise TypeError(f"BatchUpdate.moved[{i}] must be (src, dst, MoveDirectionality), got {_shape_of(entry)}")
        _check_index(f"BatchUpdate.moved[{i}] src", entry[0], max_num_reqs)
        _check_index(f"BatchUpdate.moved[{i}] dst", entry[1], max_num_reqs)
        if not isinstance(entry[2], MoveDirectionality):
            raise TypeError(f"BatchUpdate.moved[{i}] direction must be MoveDirectionality.UNIDIRECTIONAL or "
                            f".SWAP, got {entry[2]!r}")


def to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Host values (a list, possibly nested) as a tensor on `device`.

    On CUDA the values go through pinned memory with an asynchronous copy: a copy from
    pageable memory would make the host wait until the device has run everything queued
    before it. (PyTorch's pinned-memory cache does not reuse the buffer before the copy ran.)
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


@dataclass
class LogitsRows:
    """Which request each logits row belongs to, and the history that precedes it.

    Attributes
    ----------
    req_indices : list[int]
        Persistent-batch index of each logits row (host).
    num_output_tokens : list[int]
        Output tokens that precede each row: the request's committed outputs plus the
        draft tokens before this row (host).
    preceding_token_ids : list[list[int]] or None
        The draft tokens before each row (empty lists for plain rows); None when no row
        has any.
    """

    req_indices: list[int]
    num_output_tokens: list[int]
    preceding_token_ids: list[list[int]] | None = None
    _device_index: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.req_indices)

    def req_index_tensor(self, device: torch.device | str) -> torch.Tensor:
        """[num_rows] int64 on `device` (cached)."""
        key = str(device)
        if key not in self._device_index:
            self._device_index[key] = to_device(self.req_indices, torch.int64, device)
        return self._device_index[key]

    @classmethod
    def identity(cls, num_rows: int, num_output_tokens: Sequence[int] | None = None) -> "LogitsRows":
        """Rows 0..num_rows-1 are batch indices 0..num_rows-1, with no drafts before them."""
        outs = list(num_output_tokens) if num_output_tokens is not None else [0] * num_rows
        return cls(list(range(num_rows)), outs, None)


class LogitsProcessor(ABC):
    """A per-request logits transformation with state that follows the persistent batch.

    Subclasses are constructed once per engine with the arguments below and receive every
    step's `BatchUpdate` (or None when the batch did not change) before `apply`.

    Parameters
    ----------
    max_num_reqs : int
        Number of persistent-batch rows.
    vocab_size : int
    device : torch.device or str
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device | str = "cpu"):
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if the processor never changes which token has the largest logit.

        Argmax-invariant processors run after temperature and only matter to random rows;
        the others run before penalties and the greedy argmax.
        """

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch: process `removed`, then `added`, then `moved`."""

    def check_update(self, batch_update: BatchUpdate | None) -> None:
        """Raise (TypeError / ValueError naming the field) if `update_state` would refuse
        `batch_update`, changing nothing. `LogitsProcessors.update_state` calls it on every
        processor before any `update_state`, so that a refused update leaves every processor
        as it was. The default checks the indices and directions (`check_batch_update`,
        against `max_num_reqs`); a processor that refuses some parameters checks them in an
        override that calls this one.
        """
        check_batch_update(batch_update, getattr(self, "max_num_reqs", None))

    @abstractmethod
    def apply(self, logits: torch.Tensor, rows: LogitsRows | None = None) -> torch.Tensor:
        """Transform `logits` ([num_rows, vocab] fp32, in place allowed) and return it."""

    def is_active(self) -> bool:
        """False when no request in the batch uses the processor (lets the Sampler skip it)."""
        return True


def process_dict_updates(state: dict, batch_update: BatchUpdate | None, new_entry) -> bool:
    """Apply removed -> added -> moved to a sparse `{index: entry}` state.

    `new_entry(params, prompt_ids, output_ids)` returns the entry for an added request or
    None when the request does not use the processor. Every entry is made before the state
    changes, so a `new_entry` that raises leaves the state as it was. Returns True if the
    state changed.
    """
    if batch_update is None:
        return False
    added = [(index, new_entry(params, prompt_ids, output_ids))
             for index, params, prompt_ids, output_ids in batch_update.added]
    changed = False
    for index in batch_update.removed:
        changed |= state.pop(index, None) is not None
    for index, entry in added:
        if entry is None:
            changed |= state.pop(index, None) is not None
        else:
            state[index] = entry
            changed = True
    for src, dst, direction in batch_update.moved:
        a = state.pop(src, None)
        b = state.pop(dst, None)
        if a is not None:
            state[dst] = a
        if direction == MoveDirectionality.SWAP and b is not None:
            state[src] = b
        changed |= a is not None or b is not None
    return changed
