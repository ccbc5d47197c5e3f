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
    end_variants : tuple[tuple[int, ...], ...]
        Other token sequences that also end it: the marker's text cut into other pieces, as
        a tokenizer that splits it writes it after some characters (`from_text` finds them).
    """

    end_marker: tuple[int, ...]
    start_marker: tuple[int, ...] | None = None
    end_variants: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        for name in ("end_marker", "start_marker"):
            m = getattr(self, name)
            if m is None and name == "start_marker":
                continue
            object.__setattr__(self, name, _token_ids(name, m))
        if not isinstance(self.end_variants, (list, tuple)):
            raise ValueError(f"end_variants must be a sequence of token id sequences, got {self.end_variants!r}")
        variants = [_token_ids(f"end_variants[{i}]", v) for i, v in enumerate(self.end_variants)]
        object.__setattr__(self, "end_variants", tuple(v for v in dict.fromkeys(variants) if v != self.end_marker))

    @property
    def end_markers(self) -> tuple[tuple[int, ...], ...]:
        """The end marker and its variants."""
        return (self.end_marker,) + self.end_variants

    @classmethod
    def from_text(cls, tokenizer, end: str = "</think>", start: str | None = "<think>") -> "ReasoningConfig":
        """Markers from their text, tokenized without special-token additions. A marker that
        the tokenizer splits into pieces can be written with other pieces after some
        characters (SmolLM2: "</think>" is "</" "think" ">", but " </think>" is " </" "think"
        ">"): each such writing after a space, newline or punctuation is a variant, cut to
        the shortest run of tokens that still holds the whole marker."""
        enc = (lambda s: list(tokenizer.encode(s, add_special_tokens=False)))
        variants = []
        for before in _MARKER_CONTEXTS:
            ids = enc(before + end)
            cut = next((k for k in range(len(ids) - 1, -1, -1) if end in tokenizer.decode(ids[k:])), None)
            if cut is not None:
                variants.append(tuple(ids[cut:]))
        return cls(tuple(enc(end)), None if start is None else tuple(enc(start)), tuple(variants))


# Characters a model may write just before an end marker (see ReasoningConfig.from_text).
_MARKER_CONTEXTS = (" ", "\n", "\n\n", ".", ",", ":", ";", "!", "?", ")", "]", "}", ">", "\"", "'", "*", "`", "-")


def _token_ids(name: str, m) -> tuple[int, ...]:
    if not isinstance(m, (list, tuple)) or not m or not all(isinstance(t, int) and t >= 0 for t in m):
        raise ValueError(f"{name} must be a non-empty sequence of token ids, got {m!r}")
    return tuple(m)


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
        self._markers = config.end_markers
        self._keep = max(len(m) for m in self._markers) - 1
        self._tail: list[int] = []  # the last reasoning tokens, as many as a marker may still need
        if config.start_marker is not None and prompt_token_ids:
            prompt = list(prompt_token_ids)
            start = _find_last(prompt, config.start_marker)
            # the latest end marker (any variant) and where it starts
            ends = [(e, e - len(m)) for m in self._markers if (e := _find_last(prompt, m)) >= 0]
            end, end_start = max(ends) if ends else (-1, -1)
            self.ended = end >= 0 and end_start >= start

    def _end_in(self, tokens: list[int]) -> int:
        """Number of leading ``tokens`` up to and including the first completed end marker
        (or variant), or -1."""
        seq = self._tail + list(tokens)
        off = len(self._tail)
        for i in range(off + 1, len(seq) + 1):  # a marker must end inside ``tokens``
            if any(i >= len(m) and tuple(seq[i - len(m): i]) == m for m in self._markers):
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
            self._tail = (self._tail + list(tokens))[-self._keep:] if self._keep else []
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
