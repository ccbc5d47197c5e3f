"""The Proposer interface: where draft tokens come from.

A proposer runs after a step's tokens are committed and returns, for each running
request, up to K draft tokens that the next step verifies (seeds/01 ch. 3, seeds/02).
Proposers differ in what they read:

- n-gram prompt lookup (ngram.py): the request's committed token ids only;
- a draft model (draft_model.py): the committed token ids, its own KV cache, and the
  request's temperature/seed when it samples; it also returns its draft distributions
  for probabilistic verification;
- EAGLE/MTP-style heads (eagle.py): the target's final-normed hidden states of the step
  just run (``TargetHiddenStates`` in ``ProposeContext.hidden``); such a proposer sets
  ``needs_hidden_states = True``, and only then does the model runner keep them.

Requests are duck-typed on the engine's ``Request``: ``request_id``, ``all_token_ids``
(prompt + accepted outputs, the committed tokens) and ``sampling_params`` (``temperature``,
``seed``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch


class DraftRequest(Protocol):
    """What a proposer reads from a request (the engine's Request satisfies it)."""

    request_id: str
    all_token_ids: list[int]
    sampling_params: object  # .temperature (float), .seed (int or None)


@dataclass
class TargetHiddenStates:
    """The target model's hidden states from the step just run, for EAGLE/MTP-style proposers.

    They are the final-normed hidden states (the LM head's input, what ``model.forward``
    returns). Row i of ``hidden_states`` is the step's scheduled token i; the step's requests
    are listed in its order. Request r's committed rows are ``first_row[r]`` to
    ``first_row[r] + num_rows[r]``, at positions from ``first_position[r]`` on: its prefill
    chunk, or its last sampled token followed by the drafts it accepted (the rows of rejected
    drafts are left out). Its last committed row is the hidden state of its last token whose
    KV is computed (position ``len(all_token_ids) - 2`` once a token was sampled), the feature
    that predicted the token just sampled.

    The host metadata comes from values the runner already read back (the accepted counts),
    so building this costs no device sync; the runner builds it only for a proposer with
    ``needs_hidden_states``.
    """

    hidden_states: torch.Tensor  # [num_scheduled_tokens, hidden] model dtype
    request_ids: list[str]
    first_row: np.ndarray  # [num_reqs] int64
    num_rows: np.ndarray  # [num_reqs] int64, >= 1
    first_position: np.ndarray  # [num_reqs] int64
    _index: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._index = {rid: i for i, rid in enumerate(self.request_ids)}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._index

    def rows(self, request_id: str) -> tuple[int, torch.Tensor]:  # (position, [n, hidden])
        """The committed rows of one request (a view) and the position of the first."""
        i = self._index[request_id]
        start = int(self.first_row[i])
        return int(self.first_position[i]), self.hidden_states[start:start + int(self.num_rows[i])]

    def last(self, request_ids: Sequence[str]) -> torch.Tensor:  # [len(request_ids), hidden]
        """Each request's last committed row, gathered on the device (KeyError for a request not in the step)."""
        idx = [self._index[rid] for rid in request_ids]
        rows = (self.first_row + self.num_rows - 1)[np.asarray(idx, dtype=np.int64)]
        dev = self.hidden_states.device
        return self.hidden_states.index_select(0, torch.from_numpy(rows).to(dev, non_blocking=True))


@dataclass
class ProposeContext:
    """Per-step extras for proposers that need more than token ids.

    Attributes
    ----------
    step : int
        The engine's step counter (keys the noise of unseeded requests).
    hidden : TargetHiddenStates or None
        The target's hidden states of the step just verified; given only to a proposer
        with ``needs_hidden_states`` (None otherwise).
    """

    step: int = 0
    hidden: TargetHiddenStates | None = None


@dataclass
class DraftBatch:
    """The drafts of one step, in the order of the requests given to ``propose``.

    Attributes
    ----------
    request_ids : list[str]
    token_ids : list[list[int]]
        Per request, its drafts (possibly fewer than asked, possibly none). This is what
        the scheduler stores in ``request.spec_token_ids``.
    probs : torch.Tensor or None
        [num_prob_rows, max_k, vocab] fp32 draft distributions (a draft model that samples):
        row r, column i is the distribution that draft i of request ``prob_request_ids[r]``
        was drawn from. None when the proposer has none (n-gram: verification uses
        q = one-hot).
    prob_request_ids : list[str] or None
        The request of each row of ``probs``; None means ``request_ids``.
    """

    request_ids: list[str]
    token_ids: list[list[int]]
    probs: torch.Tensor | None = None
    prob_request_ids: list[str] | None = None
    _row: dict[str, int] = field(default_factory=dict, repr=False)
    _drafts: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if len(self.request_ids) != len(self.token_ids):
            raise ValueError(f"request_ids and token_ids must have the same length, got "
                             f"{len(self.request_ids)} and {len(self.token_ids)}")
        rows = self.request_ids if self.prob_request_ids is None else self.prob_request_ids
        if self.probs is not None and self.probs.shape[0] != len(rows):
            raise ValueError(f"probs has {self.probs.shape[0]} rows for {len(rows)} requests")
        self._row = {rid: i for i, rid in enumerate(rows)}
        self._drafts = dict(zip(self.request_ids, self.token_ids))

    @property
    def num_draft_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    def as_dict(self) -> dict[str, list[int]]:
        """request id -> drafts, for ``Scheduler.update_draft_token_ids``."""
        return dict(zip(self.request_ids, self.token_ids))

    def gather_probs(
        self,
        request_ids: Sequence[str],
        num_draft_tokens: Sequence[int],
    ) -> torch.Tensor | None:  # [sum(num_draft_tokens), vocab] fp32
        """Draft distributions in the verification order of the next step.

        The next step may list the requests in another order and may verify fewer drafts
        than were proposed (the scheduler truncates them when the token budget is short).

        Parameters
        ----------
        request_ids : sequence of str
            The requests of the verifying step, in its order.
        num_draft_tokens : sequence of int
            Drafts verified per request (a prefix of what was proposed).

        Returns
        -------
        torch.Tensor or None
            [sum(num_draft_tokens), vocab], the rows of ``probs`` for those drafts, or None
            when this batch has no probabilities.
        """
        if self.probs is None:
            return None
        if len(request_ids) != len(num_draft_tokens):
            raise ValueError(f"request_ids and num_draft_tokens must have the same length, got "
                             f"{len(request_ids)} and {len(num_draft_tokens)}")
        max_k = self.probs.shape[1]
        index = []
        for rid, n in zip(request_ids, num_draft_tokens):
            if n == 0:
                continue
            row = self._row.get(rid)
            proposed = len(self._drafts.get(rid, ()))
            if row is None or n > proposed:
                raise ValueError(f"request {rid!r}: {n} drafts to verify but {proposed} were proposed"
                                 + ("" if row is not None else " (with no draft probabilities)"))
            index.extend(range(row * max_k, row * max_k + n))
        flat = self.probs.view(-1, self.probs.shape[-1])
        idx = torch.from_numpy(np.asarray(index, dtype=np.int64)).to(flat.device, non_blocking=True)
        return flat.index_select(0, idx)


class Proposer(ABC):
    """Makes draft tokens for a batch of requests.

    Attributes
    ----------
    method : str
        "ngram", "draft", ... (the ``--spec`` value).
    needs_hidden_states : bool
        Whether ``propose`` needs ``ProposeContext.hidden`` (the target's hidden states); the
        runner keeps them only when it does.
    num_lookahead_tokens : int
        Target KV slots the scheduler reserves per request beyond the scheduled tokens
        (0 unless the proposer writes into the target's cache, as EAGLE/MTP heads sharing
        the target's block table would).
    """

    method: str = ""
    needs_hidden_states: bool = False
    num_lookahead_tokens: int = 0

    @abstractmethod
    def propose(
        self,
        requests: Sequence[DraftRequest],
        num_spec_tokens: Sequence[int] | np.ndarray,
        context: ProposeContext | None = None,
    ) -> DraftBatch:
        """Drafts for each request: at most ``num_spec_tokens[i]`` for request i (0 = none).

        Requests must be in pure decode: all their prompt tokens computed, their last
        sampled token committed to ``all_token_ids``.
        """

    def free(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """Forget a request's state (finished, aborted or preempted). Default: nothing kept."""


def check_num_spec_tokens(num_spec_tokens, num_reqs: int) -> np.ndarray:  # [num_reqs] int64
    """Validate per-request draft counts (an int broadcasts) and return them as an int64 array."""
    if isinstance(num_spec_tokens, (int, np.integer)) and not isinstance(num_spec_tokens, bool):
        k = np.full(num_reqs, int(num_spec_tokens), dtype=np.int64)
    else:
        k = np.asarray(num_spec_tokens)
        if k.shape != (num_reqs,) or (k.size and not np.issubdtype(k.dtype, np.integer)):
            raise ValueError(f"num_spec_tokens must be an int or {num_reqs} ints (one per request), "
                             f"got {num_spec_tokens!r}")
        k = k.astype(np.int64)
    if k.size and k.min() < 0:
        raise ValueError(f"num_spec_tokens must be >= 0, got {k.tolist()}")
    return k


def verifiable_drafts(drafts: Sequence[int], max_drafts: int, vocab_size: int) -> list[int]:
    """The drafts a step can verify: at most ``max_drafts`` of them, up to (not including) the
    first id outside [0, vocab_size) (a draw that failed, -1, or a proposer's bad id): what
    follows it was drafted after a token the request will never have."""
    out = []
    for t in list(drafts)[:max(0, int(max_drafts))]:
        if not 0 <= int(t) < vocab_size:
            break
        out.append(int(t))
    return out
