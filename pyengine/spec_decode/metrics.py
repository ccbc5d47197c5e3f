"""Speculative-decoding metrics: counts per step, a periodic log line, a snapshot and a summary.

Counted per verified request-step ("a draft" = one request verifying >= 1 draft tokens):

- ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``;
- per position i: ``drafted_per_pos[i]`` (drafts that had an i-th token) and
  ``accepted_per_pos[i]`` (drafts whose i-th token was accepted);
- mean acceptance length = 1 + accepted / drafts: tokens emitted per verifying step,
  the bonus (or recovered) token included, as vLLM reports it;
- per-position acceptance rate = accepted_per_pos / drafted_per_pos (equal to vLLM's
  accepted_per_pos / num_drafts when every draft has K tokens).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

logger = logging.getLogger("specops.engine.spec_decode")


@dataclass
class SpecDecodingStats:
    """Counts over some steps; ``observe`` adds one step, ``merge`` adds another Stats."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)

    def _grow(self, k: int) -> None:
        if k > len(self.drafted_per_pos):
            extra = k - len(self.drafted_per_pos)
            self.drafted_per_pos += [0] * extra
            self.accepted_per_pos += [0] * extra

    def observe(self, num_draft_tokens: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Add one step: per verifying request, its verified drafts and how many were accepted.

        Requests with 0 drafts are ignored. ``num_accepted`` = emitted tokens - 1 for a
        request that verified drafts.
        """
        if len(num_draft_tokens) != len(num_accepted):
            raise ValueError(f"num_draft_tokens and num_accepted must have the same length, got "
                             f"{len(num_draft_tokens)} and {len(num_accepted)}")
        for nd, na in zip(num_draft_tokens, num_accepted):
            nd, na = int(nd), int(na)
            if nd == 0:
                continue
            if not 0 <= na <= nd:
                raise ValueError(f"accepted tokens must be in [0, drafts], got {na} of {nd}")
            self._grow(nd)
            self.num_drafts += 1
            self.num_draft_tokens += nd
            self.num_accepted_tokens += na
            for i in range(nd):
                self.drafted_per_pos[i] += 1
            for i in range(na):
                self.accepted_per_pos[i] += 1

    def merge(self, other: "SpecDecodingStats") -> None:
        self._grow(len(other.drafted_per_pos))
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for i, (d, a) in enumerate(zip(other.drafted_per_pos, other.accepted_per_pos)):
            self.drafted_per_pos[i] += d
            self.accepted_per_pos[i] += a

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts (tokens per verifying step, bonus included); 0 with no drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_pos, self.drafted_per_pos)]

    def as_dict(self) -> dict:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "drafted_per_pos": list(self.drafted_per_pos),
            "accepted_per_pos": list(self.accepted_per_pos),
            "per_position_acceptance_rate": self.per_position_acceptance_rate,
        }


def count_accepted(num_draft_tokens: Sequence[int], emitted: Sequence[Sequence[int]]) -> list[int]:
    """Accepted drafts per request from the parsed verifier output (emitted tokens - 1)."""
    return [max(len(e) - 1, 0) if nd else 0 for nd, e in zip(num_draft_tokens, emitted)]


def format_line(stats: SpecDecodingStats, elapsed_s: float | None = None) -> str:
    """One log line in vLLM's wording, throughputs when the interval is known."""
    parts = [f"Mean acceptance length: {stats.mean_acceptance_length:.2f}"]
    if elapsed_s and elapsed_s > 0:
        parts.append(f"Accepted throughput: {stats.num_accepted_tokens / elapsed_s:.2f} tokens/s")
        parts.append(f"Drafted throughput: {stats.num_draft_tokens / elapsed_s:.2f} tokens/s")
    parts.append(f"Accepted: {stats.num_accepted_tokens} tokens")
    parts.append(f"Drafted: {stats.num_draft_tokens} tokens")
    rates = ", ".join(f"{r:.3f}" for r in stats.per_position_acceptance_rate)
    parts.append(f"Per-position acceptance rate: {rates or '-'}")
    parts.append(f"Avg Draft acceptance rate: {100.0 * stats.acceptance_rate:.1f}%")
    return "SpecDecoding metrics: " + ", ".join(parts)


class SpecDecodingMetrics:
    """Cumulative stats plus an interval for the periodic log line.

    Parameters
    ----------
    log_interval_s : float or None
        Seconds between log lines of ``maybe_log``; None never logs.
    clock : callable
        Seconds (tests pass a fake clock).
    """

    def __init__(self, log_interval_s: float | None = 5.0, clock=time.monotonic):
        self.log_interval_s = log_interval_s
        self.clock = clock
        self.total = SpecDecodingStats()
        self.interval = SpecDecodingStats()
        self._start = self._last_log = clock()

    def record(self, num_draft_tokens: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Add one step's verification (see ``SpecDecodingStats.observe``)."""
        step = SpecDecodingStats()
        step.observe(num_draft_tokens, num_accepted)
        self.total.merge(step)
        self.interval.merge(step)

    def maybe_log(self) -> str | None:
        """Log (INFO) and return the interval's line when log_interval_s has passed, else None."""
        if self.log_interval_s is None:
            return None
        now = self.clock()
        elapsed = now - self._last_log
        if elapsed < self.log_interval_s or self.interval.num_drafts == 0:
            return None
        line = format_line(self.interval, elapsed)
        logger.info(line)
        self.interval = SpecDecodingStats()
        self._last_log = now
        return line

    def snapshot(self) -> dict:
        """Cumulative counts and rates (for the Python API's stats)."""
        d = self.total.as_dict()
        d["elapsed_s"] = self.clock() - self._start
        return d

    def summary(self) -> str:
        """The cumulative line, as ``generate`` prints it at the end."""
        return format_line(self.total, self.clock() - self._start)
