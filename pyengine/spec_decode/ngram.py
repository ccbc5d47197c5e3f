"""N-gram prompt lookup: drafts copied from the request's own context.

For a context t[0..L) the proposer looks for an earlier occurrence of its last n tokens,
for n from ``max_n`` down to ``min_n``: the longest n that occurs earlier wins, and among
its occurrences the most recent one (the match ending at the largest index i <= L - 2;
it may overlap the suffix itself). The drafts are the tokens after the match,
t[i+1], t[i+2], ..., at most K of them. When the continuation runs into the end of the
context (a repeat with period P = L - 1 - i < K), ``periodic=True`` (the default) keeps
copying with that period, t[i + 1 + (j mod P)], so a repetitive context still yields K
drafts; ``periodic=False`` stops at the end of the context (fewer drafts). No match of
length ``min_n`` or more: no drafts.

The search is vectorised over the whole batch with numpy: one comparison of every
context position with the request's last token, then the few candidate positions are
extended backwards one token at a time (at most ``max_n - 1`` gathers), and the best
candidate per request is picked with one ``lexsort``. There is no per-token Python loop.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .proposer import DraftBatch, DraftRequest, ProposeContext, Proposer, check_num_spec_tokens


def _check_n(min_n: int, max_n: int) -> None:
    for name, v in (("min_n", min_n), ("max_n", max_n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if min_n > max_n:
        raise ValueError(f"min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")


def ngram_propose(
    token_ids: np.ndarray,  # [num_reqs, width] int, row r valid in [0, num_tokens[r])
    num_tokens: np.ndarray,  # [num_reqs] int
    num_spec_tokens: np.ndarray | int,  # [num_reqs] int or one int: K per request (0 = no drafts)
    min_n: int = 1,
    max_n: int = 3,
    periodic: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt-lookup drafts for a batch of contexts (see the module docstring for the rule).

    Parameters
    ----------
    token_ids : np.ndarray
        [num_reqs, width] integer token ids (>= 0); entries past ``num_tokens[r]`` are ignored.
    num_tokens : np.ndarray
        [num_reqs] context lengths, each <= width.
    num_spec_tokens : np.ndarray or int
        [num_reqs] most drafts per request, or one int for all.
    min_n, max_n : int
        Shortest and longest suffix length to match, 1 <= min_n <= max_n.
    periodic : bool
        Continue a match that runs into the end of the context with its period.

    Returns
    -------
    drafts : np.ndarray
        [num_reqs, max(num_spec_tokens)] int64, drafts of request r in
        ``drafts[r, :num_drafts[r]]``, -1 after.
    num_drafts : np.ndarray
        [num_reqs] int64.

    Examples
    --------
    >>> d, n = ngram_propose(np.array([[5, 6, 7, 8, 5, 6]]), np.array([6]), 3)
    >>> d[0, :n[0]].tolist()
    [7, 8, 5]
    """
    _check_n(min_n, max_n)
    tok = np.asarray(token_ids)
    if tok.ndim != 2 or (tok.size and not np.issubdtype(tok.dtype, np.integer)):
        raise ValueError(f"token_ids must be a 2-D integer array [num_reqs, width], got shape "
                         f"{tok.shape} dtype {tok.dtype}")
    num_reqs, width = tok.shape
    lens = np.asarray(num_tokens).astype(np.int64)
    if lens.shape != (num_reqs,) or (num_reqs and (lens.min() < 0 or lens.max() > width)):
        raise ValueError(f"num_tokens must be {num_reqs} lengths in [0, {width}], got {num_tokens!r}")
    k = check_num_spec_tokens(num_spec_tokens, num_reqs)
    max_k = int(k.max()) if num_reqs else 0
    drafts = np.full((num_reqs, max_k), -1, dtype=np.int64)
    num_drafts = np.zeros(num_reqs, dtype=np.int64)
    active = (k > 0) & (lens >= min_n + 1)
    if not active.any():
        return drafts, num_drafts

    rows_all = np.arange(num_reqs)
    last = tok[rows_all, np.maximum(lens - 1, 0)]
    # Candidate match ends i: t[i] == t[L-1], i <= L - 2.
    rows, cols = np.nonzero(tok == last[:, None])
    keep = active[rows] & (cols < lens[rows] - 1)
    rows, cols = rows[keep], cols[keep]
    if rows.size == 0:
        return drafts, num_drafts
    # Extend each candidate backwards: match length = leading t such that t[i-t] == t[L-1-t].
    length = np.ones(rows.size, dtype=np.int64)
    alive = np.ones(rows.size, dtype=bool)
    row_lens = lens[rows]
    for t in range(1, max_n):
        j = cols - t
        ok = alive & (j >= 0)
        # both indices clamped: where j < 0 (so also where row_lens - 1 - t < 0) ok is False anyway
        same = tok[rows, np.maximum(j, 0)] == tok[rows, np.maximum(row_lens - 1 - t, 0)]
        alive = ok & same
        length += alive
        if not alive.any():   # every candidate stopped: a longer max_n adds nothing
            break
    keep = length >= min_n
    rows, cols, length = rows[keep], cols[keep], length[keep]
    if rows.size == 0:
        return drafts, num_drafts
    # Best per row: longest match, then most recent (largest end index).
    order = np.lexsort((cols, length, rows))
    rows, cols = rows[order], cols[order]
    last_of_row = np.ones(rows.size, dtype=bool)
    last_of_row[:-1] = rows[1:] != rows[:-1]
    r, end = rows[last_of_row], cols[last_of_row]
    start = end + 1
    period = lens[r] - start  # >= 1 tokens between the match and the end of the context
    j = np.arange(max_k)[None, :]
    if periodic:
        n = k[r]
        src = start[:, None] + j % period[:, None]
    else:
        n = np.minimum(k[r], period)
        src = np.minimum(start[:, None] + j, (lens[r] - 1)[:, None])
    vals = tok[r[:, None], src].astype(np.int64)
    drafts[r] = np.where(j < n[:, None], vals, -1)
    num_drafts[r] = n
    return drafts, num_drafts


def ngram_propose_naive(tokens: Sequence[int], k: int, min_n: int = 1, max_n: int = 3,
                        periodic: bool = True) -> list[int]:
    """The rule of ``ngram_propose`` for one context, in plain Python (the test reference)."""
    _check_n(min_n, max_n)
    tokens = list(tokens)
    n_tok = len(tokens)
    if k <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n_tok < n + 1:
            continue
        suffix = tokens[n_tok - n:]
        for i in range(n_tok - 2, n - 2, -1):  # i: last index of the match, most recent first
            if tokens[i - n + 1:i + 1] == suffix:
                out = []
                for j in range(k):
                    p = i + 1 + j
                    if p < n_tok:
                        out.append(tokens[p])
                    elif periodic:
                        out.append(out[j - (n_tok - i - 1)])
                    else:
                        break
                return out
    return []


class _Contexts:
    """Per-request numpy copies of the committed tokens, grown by appending new tokens only."""

    def __init__(self) -> None:
        self.buf: dict[str, np.ndarray] = {}
        self.len: dict[str, int] = {}

    def get(self, rid: str, tokens: list[int]) -> tuple[np.ndarray, int]:
        n = len(tokens)
        buf = self.buf.get(rid)
        have = self.len.get(rid, 0)
        if buf is None or have > n:
            buf, have = np.empty(max(2 * n, 64), dtype=np.int32), 0
        if n > buf.shape[0]:
            grown = np.empty(2 * n, dtype=np.int32)
            grown[:have] = buf[:have]
            buf = grown
        if n > have:
            buf[have:n] = tokens[have:n]
        self.buf[rid], self.len[rid] = buf, n
        return buf, n

    def drop(self, rid: str) -> None:
        self.buf.pop(rid, None)
        self.len.pop(rid, None)


class NgramProposer(Proposer):
    """Prompt-lookup drafts (``--spec ngram``).

    Parameters
    ----------
    min_n, max_n : int
        Suffix lengths to match, longest first (defaults 1 and 3: on the default model and
        copy-heavy prompts this gives about 4 tokens per step at K=4, see MODEL-NOTES).
    periodic : bool
        Continue a match that runs into the end of the context with its period.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> req = NS(request_id="a", all_token_ids=[1, 2, 3, 4, 1, 2], sampling_params=None)
    >>> NgramProposer().propose([req], 2).token_ids
    [[3, 4]]
    """

    method = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 3, periodic: bool = True):
        _check_n(min_n, max_n)
        self.min_n, self.max_n, self.periodic = min_n, max_n, periodic
        self._ctx = _Contexts()

    def propose(self, requests: Sequence[DraftRequest], num_spec_tokens, context: ProposeContext | None = None
                ) -> DraftBatch:
        k = check_num_spec_tokens(num_spec_tokens, len(requests))
        ids = [r.request_id for r in requests]
        if not requests or not k.any():
            return DraftBatch(ids, [[] for _ in requests])
        bufs = [self._ctx.get(r.request_id, r.all_token_ids) if kk > 0 else (None, 0)
                for r, kk in zip(requests, k.tolist())]
        lens = np.array([n for _, n in bufs], dtype=np.int64)
        width = max(int(lens.max()), 1)
        tok = np.full((len(requests), width), -1, dtype=np.int32)  # -1: never a token
        for row, (buf, n) in enumerate(bufs):
            if n:
                tok[row, :n] = buf[:n]
        drafts, num = ngram_propose(tok, lens, k, self.min_n, self.max_n, self.periodic)
        return DraftBatch(ids, [drafts[i, :n].tolist() for i, n in enumerate(num.tolist())])

    def free(self, request_id: str) -> None:
        self._ctx.drop(request_id)
