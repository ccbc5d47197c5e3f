"""Reasoning gate: output is unconstrained until an end-of-reasoning marker, then constrained.

A reasoning model writes ``<think> ... </think>`` before its answer; the grammar applies
only to what follows the end marker (a token sequence). The gate tracks, per request,
whether the marker has been emitted, splits a step's emitted tokens into the reasoning
part and the part the grammar must accept, and for a speculative step finds the first
of the 1+K positions that falls after the marker, even when the marker ends inside the
draft window.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningConfig:
    """Engine-wide reasoning markers, as token id sequences.

    Parameters
    ----------
    end_marker : tuple[int, ...]
        Tokens that end the reasoning section (e.g. the ids of ``</think>``).
    start_marker : tuple[int, ...] | None
        Tokens that open it. Only used to read the prompt: when the prompt already has an
        end marker after its last start marker (a chat template that closes an empty
        reasoning block), the output is constrained from its first token.
    """

    end_marker: tuple[int, ...]
    start_marker: tuple[int, ...] | None = None

    def __post_init__(self):
        for name in ("end_marker", "start_marker"):
            m = getattr(self, name)
            if m is None and name == "start_marker":
                continue
            if not isinstance(m, (list, tuple)) or not m or not all(isinstance(t, int) and t >= 0 for t in m):
                raise ValueError(f"{name} must be a non-empty sequence of token ids, got {m!r}")
            object.__setattr__(self, name, tuple(m))

    @classmethod
    def from_text(cls, tokenizer, end: str = "</think>", start: str | None = "<think>") -> "ReasoningConfig":
        """Markers from their text, tokenized without special-token additions."""
        enc = (lambda s: tokenizer.encode(s, add_special_tokens=False))
        return cls(tuple(enc(end)), None if start is None else tuple(enc(start)))


def _find_last(seq: list[int], marker: tuple[int, ...]) -> int:
    """Index just past the last occurrence of ``marker`` in ``seq``, or -1."""
    m = len(marker)
    for i in range(len(seq) - m, -1, -1):
        if tuple(seq[i: i + m]) == marker:
            return i + m
    return -1


class ReasoningGate:
    """One request's reasoning state.

    Parameters
    ----------
    config : ReasoningConfig
    prompt_token_ids : list[int]
        Read once, for an already-closed reasoning block (see ``ReasoningConfig``).
    """

    def __init__(self, config: ReasoningConfig, prompt_token_ids: list[int] = ()):
        self.config = config
        self.ended = False
        self._tail: list[int] = []  # last len(end_marker) - 1 reasoning tokens
        if config.start_marker is not None and prompt_token_ids:
            prompt = list(prompt_token_ids)
            end = _find_last(prompt, config.end_marker)
            start = _find_last(prompt, config.start_marker)
            self.ended = end >= 0 and end - len(config.end_marker) >= start

    def _end_in(self, tokens: list[int]) -> int:
        """Number of leading ``tokens`` up to and including the first completed end marker, or -1."""
        marker = self.config.end_marker
        m = len(marker)
        seq = self._tail + list(tokens)
        off = len(self._tail)
        for i in range(max(m, off + 1), len(seq) + 1):  # marker must end inside ``tokens``
            if tuple(seq[i - m: i]) == marker:
                return i - off
        return -1

    def split(self, tokens: list[int]) -> list[int]:
        """Consume emitted ``tokens``; return those after the end marker (to feed the grammar).

        Before the marker nothing is returned; in the step where the marker completes, the
        tokens following it; afterwards, all of them.
        """
        if self.ended:
            return list(tokens)
        n = self._end_in(tokens)
        if n < 0:
            keep = len(self.config.end_marker) - 1
            self._tail = (self._tail + list(tokens))[-keep:] if keep else []
            return []
        self.ended = True
        self._tail = []
        return list(tokens[n:])

    def first_constrained(self, drafts: list[int]) -> int:
        """First of the 1+K positions of a speculative step that is after the end marker.

        Position j samples the token that follows ``drafts[:j]``; it is constrained when the
        marker is complete in the output so far plus ``drafts[:j]``. Returns 0 when reasoning
        is over, ``len(drafts) + 1`` when the marker does not complete within the window.
        The state is unchanged.
        """
        if self.ended:
            return 0
        n = self._end_in(drafts)
        return len(drafts) + 1 if n < 0 else n
