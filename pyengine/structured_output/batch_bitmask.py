"""The grammar bitmask of one scheduled batch: built on the CPU, applied to the logits on the device.

``BitmaskBuilder.build`` fills an int32 bitmask ``[num_logits_rows, ceil(V/32)]`` (one row
per logits row, rows in the batch's order, 1+K rows for a request with K drafts) and
lists the rows that carry a constraint. It only touches host memory, so the engine calls
it right after launching the forward and it runs while the GPU computes. The result is
copied to the device (pinned memory, non-blocking) and applied with
``apply_token_bitmask`` (``specops.ops.apply_token_bitmask_``, or a torch implementation
while that op is absent) before sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .backend import bitmask_width
from .grammar_state import ALL_ALLOWED, GrammarState


@dataclass
class BitmaskRequest:
    """One scheduled request's rows of the logits.

    Attributes
    ----------
    grammar : GrammarState | None
        None for a request without structured output (or one that samples nothing this
        step, e.g. a prefill chunk that does not reach the end of its prompt).
    num_rows : int
        Its logits rows this step (1 + number of drafts when it samples).
    drafts : list[int]
        Draft tokens scheduled for it (already validated), ``num_rows - 1`` of them.
    first : int
        First constrained row (the reasoning gate's ``first_constrained``; 0 normally).
    """

    grammar: GrammarState | None
    num_rows: int = 1
    drafts: list[int] = field(default_factory=list)
    first: int = 0


@dataclass
class BatchBitmask:
    """A batch's bitmask on the host and the rows it constrains.

    Attributes
    ----------
    bitmask : torch.Tensor
        [num_rows, ceil(vocab/32)] int32 on the CPU (pinned when CUDA is present); rows
        not in ``indices`` are unspecified. Valid until the builder's next-but-one build.
    indices : list[int] | None
        Constrained rows, ascending; None when every row is constrained.
    """

    bitmask: torch.Tensor
    indices: list[int] | None

    def to(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(bitmask, indices) on ``device``, copied without blocking the host."""
        device = torch.device(device)
        bitmask = self.bitmask.to(device, non_blocking=True)
        if self.indices is None:
            return bitmask, None
        idx = torch.tensor(self.indices, dtype=torch.int32)
        if device.type != "cpu":
            idx = idx.pin_memory() if torch.cuda.is_available() else idx
        return bitmask, idx.to(device, non_blocking=True)


class BitmaskBuilder:
    """Fills batch bitmasks into reusable host buffers.

    Parameters
    ----------
    vocab_size : int
        The logits width.
    max_rows : int
        Initial buffer rows (max_num_seqs * (1 + num_spec_tokens)); grown when a batch needs more.
    pin_memory : bool | None
        Page-locked buffers for asynchronous host-to-device copies; None = when CUDA is present.
    num_threads : int
        Threads xgrammar uses to fill a wave of rows in parallel (1 = fill in this thread).
    parallel_threshold : int
        Use the threaded fill only when a wave has at least this many rows.
    """

    def __init__(self, vocab_size: int, max_rows: int = 256, pin_memory: bool | None = None,
                 num_threads: int = 1, parallel_threshold: int = 64):
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be an int >= 1, got {max_rows!r}")
        self.vocab_size = vocab_size
        self.width = bitmask_width(vocab_size)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.parallel_threshold = parallel_threshold
        self._batch = None
        if num_threads > 1:
            import xgrammar as xgr

            self._batch = xgr.BatchGrammarMatcher(max_threads=num_threads)
        # Two buffers used in turn: the copy of one may still be in flight while the other fills.
        self._buffers = [self._alloc(max_rows), self._alloc(max_rows)]
        self._turn = 0

    def _alloc(self, rows: int) -> torch.Tensor:
        t = torch.empty((rows, self.width), dtype=torch.int32)
        return t.pin_memory() if self.pin_memory else t

    def build(self, requests: list[BitmaskRequest]) -> BatchBitmask | None:
        """The bitmask of a batch whose logits rows are the requests' rows in order.

        Returns None when no row is constrained (nothing to apply). Grammar states are
        left exactly as they were.
        """
        num_rows = 0
        for r in requests:
            if r.grammar is not None and r.num_rows != len(r.drafts) + 1:
                raise ValueError(f"a structured request with {len(r.drafts)} drafts has 1 + {len(r.drafts)} "
                                 f"logits rows, got num_rows={r.num_rows}")
            num_rows += r.num_rows
        self._turn ^= 1
        buf = self._buffers[self._turn]
        if buf.shape[0] < num_rows:
            buf = self._buffers[self._turn] = self._alloc(max(num_rows, 2 * buf.shape[0]))
        bitmask = buf[:num_rows]
        use_waves = self._batch is not None and sum(r.grammar is not None for r in requests) >= self.parallel_threshold
        indices = self._fill_waves(bitmask, requests) if use_waves else self._fill_each(bitmask, requests)
        if not indices:
            return None
        return BatchBitmask(bitmask, None if len(indices) == num_rows else indices)

    @staticmethod
    def _fill_each(bitmask: torch.Tensor, requests: list[BitmaskRequest]) -> list[int]:
        indices: list[int] = []
        row = 0
        for r in requests:
            if r.grammar is not None:
                n = r.grammar.fill_bitmask_rows(bitmask, row, r.drafts, r.first)
                indices.extend(range(row + r.first, row + r.first + n))
            row += r.num_rows
        return indices

    def _fill_waves(self, bitmask: torch.Tensor, requests: list[BitmaskRequest]) -> list[int]:
        """Same rows as ``_fill_each``, filled position by position across requests with xgrammar's threads."""
        live = []  # [grammar, first row, drafts, first, advanced]
        row = 0
        for r in requests:
            if r.grammar is not None:
                bitmask[row: row + r.num_rows].fill_(ALL_ALLOWED)
                if r.first <= len(r.drafts) and not r.grammar.is_terminated():
                    live.append([r.grammar, row, r.drafts, r.first, 0])
            row += r.num_rows
        indices: list[int] = []
        everyone = [e for e in live]
        j = 0
        while live:
            matchers, rows, still = [], [], []
            for e in live:
                g, base, drafts, first, _ = e
                if j < first:
                    still.append(e)
                    continue
                if j > first:
                    if not g.advance(drafts[j - 1]):
                        continue
                    e[4] += 1
                    if g.is_terminated():
                        continue
                matchers.append(g.matcher)
                rows.append(base + j)
                if j < len(drafts):
                    still.append(e)
            if matchers:
                self._batch.batch_fill_next_token_bitmask(matchers, bitmask, rows)
                indices.extend(rows)
            live = still
            j += 1
        for g, _, _, _, advanced in everyone:
            g.rollback(advanced)
        indices.sort()
        return indices


# ---- applying the mask --------------------------------------------------------------------

def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, indices=None) -> None:
    """Reference: in place, ``logits[r, j] = -inf`` where bit j of ``bitmask[r]`` is 0.

    logits: torch.Tensor,   # [rows, vocab] float
    bitmask: torch.Tensor,  # [rows, ceil(vocab/32)] int32, same device
    indices: rows of both to mask (list or int tensor), None = all rows.

    Only the first ``min(vocab, 32 * bitmask.shape[1])`` columns are masked (xgrammar's rule).
    """
    vocab = min(logits.shape[1], bitmask.shape[1] * 32)
    if indices is None:
        rows = torch.arange(min(logits.shape[0], bitmask.shape[0]), device=logits.device)
    else:
        rows = torch.as_tensor(indices, dtype=torch.long, device=logits.device)
    if rows.numel() == 0 or vocab == 0:
        return
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[rows.to(bitmask.device)].unsqueeze(-1) >> shifts) & 1  # [n, W, 32]
    allowed = bits.reshape(rows.numel(), -1)[:, :vocab].to(torch.bool).to(logits.device)
    sub = logits[rows, :vocab]
    logits[rows, :vocab] = sub.masked_fill(~allowed, float("-inf"))


_OP = None


def _compiled_op():
    global _OP
    if _OP is None:
        try:
            from specops.ops import apply_token_bitmask_ as op
        except ImportError:
            op = None
        if op is None:
            try:
                import specops  # noqa: F401  (registers torch.ops.specops.*)

                op = torch.ops.specops.apply_token_bitmask_
            except (ImportError, AttributeError, RuntimeError):
                op = False
        _OP = op
    return _OP or None


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """Mask ``logits`` in place with the grammar bitmask (specops op, torch fallback).

    logits: torch.Tensor,   # [rows, vocab] fp32/bf16/fp16
    bitmask: torch.Tensor,  # [rows, ceil(vocab/32)] int32, on logits.device
    indices: torch.Tensor | None,  # [n] int32/int64 rows to mask, on logits.device; None = all
    """
    op = _compiled_op()
    if op is not None:
        op(logits, bitmask, indices)
    else:
        apply_token_bitmask_torch(logits, bitmask, indices)


def apply_batch_bitmask(logits: torch.Tensor, batch: BatchBitmask | None) -> None:
    """Copy ``batch`` to the logits' device and mask ``logits`` in place (no-op for None).

    logits: torch.Tensor,  # [num_logits_rows, vocab]; row order as given to ``BitmaskBuilder.build``
    """
    if batch is None:
        return
    if batch.bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"the bitmask has {batch.bitmask.shape[0]} rows but logits has {logits.shape[0]}")
    bitmask, indices = batch.to(logits.device)
    apply_token_bitmask(logits, bitmask, indices)
