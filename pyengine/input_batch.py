"""The persistent input batch: one row per scheduled request, kept across steps.

A request keeps its row for as long as it is scheduled step after step; rows of requests
that left (finished, preempted, or not scheduled this step) are refilled by newcomers,
lowest row first, and any holes left are closed by moving the last rows down. Every
change of a step is collected into one BatchUpdate (removed, then added, then moved) for
the logits processors, which keep per-row state. The block tables live here too, as a
host array updated only where a request gained blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .request import Request

try:  # the specops Sampler's interface, when present
    from specops.sampling.logits_processors.interface import BatchUpdate, MoveDirectionality
except ImportError:  # pragma: no cover - stand-in with the same fields
    import enum

    class MoveDirectionality(enum.Enum):
        UNIDIRECTIONAL = enum.auto()
        SWAP = enum.auto()

    @dataclass(frozen=True)
    class BatchUpdate:
        batch_size: int
        removed: list = field(default_factory=list)
        added: list = field(default_factory=list)
        moved: list = field(default_factory=list)


class InputBatch:
    """Rows of the persistent batch and their block tables.

    Parameters
    ----------
    max_num_reqs : int
        Number of rows.
    max_blocks_per_req : int
        Width of the block table.
    """

    def __init__(self, max_num_reqs: int, max_blocks_per_req: int):
        self.max_num_reqs = max_num_reqs
        self.reqs: list[Request | None] = [None] * max_num_reqs
        self.index: dict[str, int] = {}
        self.num_reqs = 0  # rows [0, num_reqs) are occupied after condense()
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self._removed: list[int] = []
        self._added: list[tuple] = []
        self._moved: list[tuple] = []

    @property
    def req_ids(self) -> list[str]:
        return [r.request_id for r in self.reqs[:self.num_reqs]]

    def update(self, scheduled: list[Request]) -> BatchUpdate | None:
        """Make the rows hold exactly `scheduled`; return the step's BatchUpdate (None if nothing changed).

        Rows are matched by Request object, not by id: a new request that reuses the id of one
        that finished since the last update gets a fresh row (and its processors a fresh state)."""
        keep = {r.request_id: r for r in scheduled}
        for row in range(self.num_reqs):
            req = self.reqs[row]
            if req is not None and keep.get(req.request_id) is not req:
                self._remove(row)
        for req in scheduled:
            if req.request_id not in self.index:
                self._add(req)
        self._condense()
        for row in range(self.num_reqs):
            self._sync_blocks(row)
        return self._take_update()

    def _remove(self, row: int) -> None:
        req = self.reqs[row]
        del self.index[req.request_id]
        self.reqs[row] = None
        self._removed.append(row)

    def _add(self, req: Request) -> int:
        holes = sorted(self._removed_holes())
        row = holes[0] if holes else self.num_reqs
        if row >= self.max_num_reqs:
            raise RuntimeError(f"input batch is full ({self.max_num_reqs} rows)")
        self.reqs[row] = req
        self.index[req.request_id] = row
        self.num_blocks[row] = 0
        self.num_reqs = max(self.num_reqs, row + 1)
        self._added.append((row, req.sampling_params, req.prompt_token_ids, req.output_token_ids))
        return row

    def _removed_holes(self) -> list[int]:
        return [r for r in range(self.num_reqs) if self.reqs[r] is None]

    def _condense(self) -> None:
        """Move the last occupied rows into the holes so that rows [0, num_reqs) are dense."""
        holes = self._removed_holes()
        last = self.num_reqs - 1
        for hole in holes:
            while last > hole and self.reqs[last] is None:
                last -= 1
            if last <= hole:
                break
            req = self.reqs[last]
            self.reqs[hole], self.reqs[last] = req, None
            self.index[req.request_id] = hole
            self.block_table[hole] = self.block_table[last]
            self.num_blocks[hole] = self.num_blocks[last]
            self._moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
            last -= 1
        while self.num_reqs > 0 and self.reqs[self.num_reqs - 1] is None:
            self.num_reqs -= 1

    def _sync_blocks(self, row: int) -> None:
        ids = self.reqs[row].block_ids
        have = int(self.num_blocks[row])
        if len(ids) < have:  # blocks were reset (preemption): rewrite the row
            have = 0
        if len(ids) > have:
            self.block_table[row, have:len(ids)] = ids[have:]
        self.num_blocks[row] = len(ids)

    def _take_update(self) -> BatchUpdate | None:
        if not (self._removed or self._added or self._moved):
            return None
        upd = BatchUpdate(batch_size=self.num_reqs, removed=sorted(self._removed, reverse=True),
                          added=list(self._added), moved=list(self._moved))
        self._removed, self._added, self._moved = [], [], []
        return upd
