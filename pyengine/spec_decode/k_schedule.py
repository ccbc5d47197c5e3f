"""How many drafts to propose: per batch (a batch-size schedule), per request (caps), and a
synthetic-acceptance mode for benchmarks.

Verification is nearly free while a step is memory bound; once batch x (1 + K) tokens pass
the ridge point every extra position costs real time (seeds/01 ch. 3.6), so K falls with
the batch size and reaches 0 where speculation stops paying. Per request, K is capped so
that the step cannot overrun the context (num_computed + 1 + K <= max_model_len, and the
bonus token needs a position too) nor produce drafts beyond ``max_tokens``.
"""

from __future__ import annotations

import numbers
import zlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from specops.rng import random_words, uniform_open

STREAM_SYNTHETIC = 4
"""Philox stream of the synthetic-acceptance uniforms (0-2: Sampler/RejectionSampler, 3: draft sampling)."""


def parse_batch_schedule(spec: str | dict | Sequence | None) -> list[tuple[int, int]] | None:
    """Parse a batch-size schedule into sorted (min_batch_size, K) thresholds.

    Accepts "1:4,16:2,64:0", {1: 4, 16: 2, 64: 0} or [(1, 4), (16, 2), (64, 0)]: batch sizes
    1-15 use K=4, 16-63 use K=2, 64 and more K=0. Batch sizes below the first threshold use
    the first K.
    """
    if spec is None or spec == "":
        return None
    if isinstance(spec, str):
        pairs = [tuple(x.strip() for x in part.split(":")) for part in spec.split(",") if part.strip()]
        # plain ASCII digits only (int() would also take "1_6" as 16, or other scripts' digits)
        if not all(x.isascii() and x.isdigit() for p in pairs for x in p):
            raise ValueError(f"batch schedule must look like '1:4,16:2,64:0', got {spec!r}")
        pairs = [tuple(int(x) for x in p) for p in pairs]
    elif isinstance(spec, dict):
        pairs = list(spec.items())
    else:
        try:
            pairs = [tuple(p) for p in spec]
        except TypeError:
            raise ValueError(f"batch schedule must be (min_batch_size, K) pairs, got {spec!r}") from None
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"batch schedule must be (min_batch_size, K) pairs, got {spec!r}")
    for p in pairs:   # ints only: a float or bool would be truncated or read as 1 silently
        if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in p):
            raise ValueError(f"batch schedule pairs must hold ints, got {p!r} in {spec!r}")
    out = sorted((int(b), int(k)) for b, k in pairs)
    for b, k in out:
        if b < 1 or k < 0:
            raise ValueError(f"batch schedule needs min_batch_size >= 1 and K >= 0, got ({b}, {k})")
    if len({b for b, _ in out}) != len(out):
        raise ValueError(f"batch schedule lists a batch size twice: {spec!r}")
    return out


@dataclass
class KSchedule:
    """Draft counts for one step.

    Parameters
    ----------
    num_spec_tokens : int
        K, the most drafts per request (``--num-spec-tokens``).
    batch_schedule : str, dict, list or None
        Optional batch-size schedule (``parse_batch_schedule``); K is the smaller of
        ``num_spec_tokens`` and the schedule's value for the batch size.

    Examples
    --------
    >>> s = KSchedule(4, "1:4,16:2,64:0")
    >>> [s.k_for_batch(b) for b in (1, 15, 16, 63, 64, 500)]
    [4, 4, 2, 2, 0, 0]
    """

    num_spec_tokens: int
    batch_schedule: object = None
    _thresholds: list[tuple[int, int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        k = self.num_spec_tokens
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"num_spec_tokens must be an int >= 0, got {k!r}")
        self._thresholds = parse_batch_schedule(self.batch_schedule)

    def k_for_batch(self, batch_size: int) -> int:
        """K for a step that decodes ``batch_size`` requests."""
        k = self.num_spec_tokens
        if self._thresholds is not None:
            value = self._thresholds[0][1]
            for b, kk in self._thresholds:
                if batch_size >= b:
                    value = kk
            k = min(k, value)
        return k

    def k_for_requests(self, requests: Sequence, max_model_len: int, batch_size: int | None = None) -> np.ndarray:
        """Per-request K for the requests about to be proposed for ([num_reqs] int64).

        ``batch_size`` defaults to ``len(requests)``. A request may lower its own K with
        ``sampling_params.extra_args["num_spec_tokens"]``. Caps: the next step schedules
        1 + K tokens from position L - 1 and then needs a position for the bonus token,
        so K <= max_model_len - L - 1; and K <= max_tokens - num_output_tokens - 1 since a
        step emits up to K + 1 tokens.
        """
        k = self.k_for_batch(len(requests) if batch_size is None else batch_size)
        out = np.full(len(requests), k, dtype=np.int64)
        for i, req in enumerate(requests):
            sp = req.sampling_params
            extra = getattr(sp, "extra_args", None) or {}
            own = extra.get("num_spec_tokens")
            if own is not None:
                out[i] = min(out[i], int(own))
            out[i] = min(out[i], max_model_len - len(req.all_token_ids) - 1)
            max_tokens = getattr(sp, "max_tokens", None)
            if max_tokens is not None:
                out[i] = min(out[i], max_tokens - len(req.output_token_ids) - 1)
        return np.maximum(out, 0)


def _plain_number(x):
    """A one-element tensor or array as its number; anything else as it is."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    if isinstance(x, (np.ndarray, np.generic)) and x.size == 1:
        return x.item()
    return x


class SyntheticAcceptance:
    """Accept each draft with a given probability, deterministically by seed (benchmarks only).

    Position i of a request's drafts is accepted with probability ``rates[i]`` (one rate
    for all positions when a float), given that positions before it were; the first
    rejection ends the run. The uniform of a draft is keyed by (seed, request id, token
    position), so the outcome does not depend on the batch. This replaces the
    RejectionSampler's decision only: the emitted tokens are the first n drafts followed by
    the target's own token at row n. Outputs are therefore NOT the target model's: use it
    to measure throughput at a fixed acceptance rate, never for quality.

    Parameters
    ----------
    rates : float or sequence of float
        Per-position acceptance probabilities in [0, 1] (the last one repeats).
    seed : int
    """

    def __init__(self, rates: float | Sequence[float], seed: int = 0):
        if isinstance(rates, (np.ndarray, torch.Tensor)):
            rates = rates.tolist()   # a 0-d one gives its number
        if isinstance(rates, (bool, str, bytes)) or not isinstance(rates, (numbers.Real, Sequence)):
            raise ValueError(f"spec_synthetic_acceptance rates must be a probability or a list of them, got {rates!r}")
        r = [rates] if isinstance(rates, numbers.Real) else [_plain_number(x) for x in rates]
        if not r or any(isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0.0 <= x <= 1.0 for x in r):
            raise ValueError(f"spec_synthetic_acceptance rates must be probabilities in [0, 1], got {rates!r}")
        r = [float(x) for x in r]
        self.rates = r
        self.seed = int(seed)

    def _rate_row(self, k: int) -> np.ndarray:
        return np.array([self.rates[min(i, len(self.rates) - 1)] for i in range(k)], dtype=np.float64)

    def num_accepted(
        self,
        request_ids: Sequence[str],
        first_positions: Sequence[int] | np.ndarray,  # [num_reqs] token position of draft 0
        num_draft_tokens: Sequence[int] | np.ndarray,  # [num_reqs]
    ) -> np.ndarray:  # [num_reqs] int64
        """Accepted drafts per request (a prefix of its drafts)."""
        nd = np.asarray(num_draft_tokens, dtype=np.int64)
        pos = np.asarray(first_positions, dtype=np.int64)
        if nd.shape != (len(request_ids),) or pos.shape != nd.shape:
            raise ValueError("request_ids, first_positions and num_draft_tokens must have the same length")
        max_k = int(nd.max()) if nd.size else 0
        if max_k == 0:
            return np.zeros(len(request_ids), dtype=np.int64)
        seeds = torch.tensor([(self.seed * 1_000_003 + zlib.crc32(rid.encode())) & 0x7FFFFFFFFFFFFFFF
                              for rid in request_ids], dtype=torch.int64)
        positions = torch.from_numpy(pos)[:, None] + torch.arange(max_k)[None, :]
        w0, _, _, _ = random_words(seeds[:, None], positions, STREAM_SYNTHETIC, torch.zeros(1, 1, dtype=torch.int64))
        u = uniform_open(w0).double().numpy()  # [num_reqs, max_k]
        accept = (u < self._rate_row(max_k)[None, :]) & (np.arange(max_k)[None, :] < nd[:, None])
        return np.cumprod(accept, axis=1).sum(axis=1).astype(np.int64)

    @staticmethod
    def emit(drafts: Sequence[Sequence[int]], target_tokens: Sequence[Sequence[int]],
             num_accepted: Sequence[int]) -> list[list[int]]:
        """Tokens a request emits: its first n drafts, then the target's token at row n.

        target_tokens[r] holds the target's token at each of the 1 + len(drafts[r]) rows of
        request r (e.g. the argmax of every verified row).
        """
        out = []
        for d, t, n in zip(drafts, target_tokens, num_accepted):
            if len(t) < len(d) + 1 or not 0 <= n <= len(d):
                raise ValueError(f"need len(target_tokens) = len(drafts) + 1 and 0 <= n <= len(drafts), "
                                 f"got {len(t)}, {len(d)}, {n}")
            out.append(list(d[:n]) + [t[n]])
        return out
