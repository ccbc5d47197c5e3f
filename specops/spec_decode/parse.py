"""Turn the rejection sampler's [batch, K+1] output into per-request token lists."""

from __future__ import annotations

import numbers

import torch

from specops._arg_checks import check_not_meta

PLACEHOLDER_TOKEN_ID = -1
"""Fills the output after each request's last emitted token."""


def parse_output(
    output_token_ids: torch.Tensor,  # [num_reqs, max_spec_len + 1] int32, -1 after the last token
    vocab_size: int | None = None,
) -> list[list[int]]:
    """Per-request lists of emitted tokens (accepted drafts, then a recovered or bonus token).

    This is the host side of a step: it copies the output to the CPU once.

    Parameters
    ----------
    output_token_ids : torch.Tensor
        [num_reqs, max_spec_len + 1] integer tensor from ``rejection_sample`` /
        ``RejectionSampler``.
    vocab_size : int, optional
        When given (an int >= 1), a token outside [0, vocab_size) raises (it would mean
        corrupted output). A token after a row's first -1, or a value below -1, raises
        either way.

    Returns
    -------
    list of list of int
        Each list has between 1 and max_spec_len + 1 tokens (0 only for a row of -1).

    Raises
    ------
    TypeError, ValueError
        On a wrong type, dtype or shape, and on corrupted output (see ``vocab_size``).

    Examples
    --------
    >>> parse_output(torch.tensor([[5, 7, -1], [9, -1, -1]], dtype=torch.int32))
    [[5, 7], [9]]
    """
    if not isinstance(output_token_ids, torch.Tensor):
        raise TypeError(f"output_token_ids must be a torch.Tensor, got {type(output_token_ids).__name__}")
    if output_token_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"output_token_ids must be int32 or int64, got {output_token_ids.dtype}")
    if output_token_ids.dim() != 2:
        raise ValueError(f"output_token_ids must be [num_reqs, max_spec_len + 1], got shape "
                         f"{tuple(output_token_ids.shape)}")
    check_not_meta("output_token_ids", output_token_ids)
    if vocab_size is not None and (not isinstance(vocab_size, numbers.Integral) or isinstance(vocab_size, bool)
                                   or vocab_size < 1):
        raise ValueError(f"vocab_size must be None or an int >= 1, got {vocab_size!r}")
    rows = output_token_ids.cpu().tolist()
    out = []
    for r, row in enumerate(rows):
        n = row.index(PLACEHOLDER_TOKEN_ID) if PLACEHOLDER_TOKEN_ID in row else len(row)
        toks = row[:n]
        if row and min(row) < PLACEHOLDER_TOKEN_ID:
            raise ValueError(f"output_token_ids row {r} holds {min(row)}: tokens are >= 0 and "
                             f"{PLACEHOLDER_TOKEN_ID} is the only placeholder (corrupted output): {row}")
        if any(t != PLACEHOLDER_TOKEN_ID for t in row[n:]):
            raise ValueError(f"output row {r} holds a token after its first {PLACEHOLDER_TOKEN_ID}: {row} "
                             "(corrupted output)")
        if vocab_size is not None and any(t < 0 or t >= vocab_size for t in toks):
            raise ValueError(f"output row {r} holds a token outside [0, {vocab_size}): {toks}")
        out.append(toks)
    return out
