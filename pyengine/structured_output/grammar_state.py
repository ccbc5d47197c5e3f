"""GrammarState: one request's position in its grammar (an xgrammar GrammarMatcher).

The engine advances it with the tokens actually emitted (``accept_tokens``), asks for the
allowed next tokens as a bitmask row (``fill_bitmask``), and under speculation validates
drafts without moving (``validate_tokens``) and fills one row per draft position plus the
bonus row (``fill_bitmask_rows``: advance through the drafts, fill, roll back).
"""

from __future__ import annotations

import torch

ALL_ALLOWED = -1  # an int32 word with every bit set


class GrammarState:
    """Per-request grammar matcher with exact rollback.

    Parameters
    ----------
    matcher : xgrammar.GrammarMatcher
        Fresh matcher at the start of the request's grammar.
    """

    def __init__(self, matcher):
        self.matcher = matcher
        self.num_accepted = 0  # tokens the matcher has advanced through (including any stop token)

    def is_terminated(self) -> bool:
        """True once a stop token was accepted: the output is complete."""
        return self.matcher.is_terminated()

    def advance(self, token: int) -> bool:
        """Accept one token; False (state unchanged) when the grammar does not allow it."""
        if token < 0 or self.matcher.is_terminated() or not self.matcher.accept_token(int(token)):
            return False
        self.num_accepted += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        if not 0 <= num_tokens <= self.num_accepted:
            raise ValueError(f"num_tokens must be in [0, {self.num_accepted}], got {num_tokens}")
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self.num_accepted -= num_tokens

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance through ``tokens``; all or nothing: on a rejected token the state is unchanged."""
        for i, t in enumerate(tokens):
            if not self.advance(t):
                self.rollback(i)
                return False
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of ``tokens`` the grammar accepts from here; the state is unchanged."""
        n = 0
        for t in tokens:
            if not self.advance(t):
                break
            n += 1
        self.rollback(n)
        return list(tokens[:n])

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into ``bitmask[row]``.

        bitmask: torch.Tensor,  # [rows, ceil(vocab/32)] int32, CPU

        Returns False (row set to all-allowed) when the grammar is terminated and there is
        nothing to constrain, True when the row is a real constraint.
        """
        if self.matcher.is_terminated():
            bitmask[row].fill_(ALL_ALLOWED)
            return False
        self.matcher.fill_next_token_bitmask(bitmask, row)
        return True

    def fill_bitmask_rows(self, bitmask: torch.Tensor, row: int, drafts: list[int], first: int = 0) -> int:
        """Rows ``row .. row+len(drafts)`` for a speculative step: one per draft position plus the bonus.

        bitmask: torch.Tensor,  # [rows, ceil(vocab/32)] int32, CPU

        Row ``row + j`` holds the tokens allowed after ``drafts[first:j]`` (it is where the
        token following ``drafts[:j]`` is sampled). Rows before ``first`` (reasoning not yet
        over) and rows after an invalid draft or a stop token are set to all-allowed: they are
        never used, because the masked row of the invalid draft rejects it. The state is
        restored before returning.

        Returns
        -------
        int
            The number of constrained rows (they are ``row + first .. row + first + n - 1``).
        """
        k = len(drafts)
        bitmask[row: row + min(first, k + 1)].fill_(ALL_ALLOWED)
        advanced = 0
        n = 0
        j = first
        while j <= k:
            if j > first and not self.advance(drafts[j - 1]):
                break
            if j > first:
                advanced += 1
            if not self.fill_bitmask(bitmask, row + j):
                break
            n += 1
            j += 1
        bitmask[row + first + n: row + k + 1].fill_(ALL_ALLOWED)
        self.rollback(advanced)
        return n

    def reset(self) -> None:
        self.matcher.reset()
        self.num_accepted = 0
