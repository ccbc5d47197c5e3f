"""A step's tokens and logprobs from the device to the host in one copy.

`pack_readback` packs the sampled tokens and their logprobs (ids, ranks, values) into one
float64 tensor (one Triton launch on CUDA: triton_kernels/readback_pack.py, part of the
steady step's CUDA graph), and `unpack_readback` turns the host copy into the tokens and
the requests' Logprob entries with one list conversion per field.
"""

from __future__ import annotations

import numpy as np
import torch

from specops.sampling.logits_processors.interface import to_device
from specops.sampling.logprobs import LogprobsTensors

from .request import Logprob


def pack_readback(
    tokens: torch.Tensor,  # [N] int64
    lp: LogprobsTensors | None,  # token_ids [N, k] int64, ranks [N] int64, logprobs [N, k] fp32
    advance_keys: torch.Tensor | None = None,  # [2, N] int64: incremented by one in place
) -> torch.Tensor | None:  # [2k + 2, N] float64: token, token_ids.T, rank, logprobs.T (None without lp)
    """A step's tokens and logprobs in one float64 tensor, for one device-to-host copy.

    One field per row of the result, so that the host turns each into a list with one `tolist`.
    float64 holds the ids and ranks exactly (they are below 2**53) and the fp32 logprobs
    exactly. On CUDA one Triton launch writes it (specops.triton_kernels.readback_pack: in a
    captured steady step it is part of the graph); elsewhere `pack_readback_torch`, the same values.
    `advance_keys` (a steady step's keys, read by the draw before) get their + 1 in that launch.
    """
    if lp is None:
        if advance_keys is not None:
            advance_keys.add_(1)
        return None
    if tokens.is_cuda:
        from specops.triton_kernels.readback_pack import pack_readback_triton
        return pack_readback_triton(tokens, lp.token_ids, lp.ranks, lp.logprobs, advance_keys=advance_keys)
    if advance_keys is not None:
        advance_keys.add_(1)
    return pack_readback_torch(tokens, lp)


def pack_readback_torch(tokens: torch.Tensor, lp: LogprobsTensors) -> torch.Tensor:  # [2k + 2, N] float64
    """The reference of `pack_readback`: casts and a cat."""
    return torch.cat([tokens.unsqueeze(0).double(), lp.token_ids.T.double(), lp.ranks.unsqueeze(0).double(),
                      lp.logprobs.T.double()])


def unpack_readback(packed: np.ndarray,  # [2k + 2, N] float64 on the host, from pack_readback
                    num_logprobs: list[int | None]) -> tuple[list[int], list[Logprob | None]]:
    """Tokens and Logprob entries (None where a row wants none) of a packed readback.

    The ids and ranks become Python ints in one conversion, the logprobs Python floats in
    another, one list per field; when every row wants the same number of top logprobs the
    entries are built by `map` over those lists, without a Python loop over the rows.
    """
    k = (packed.shape[0] - 2) // 2
    ints = packed[:k + 2].astype(np.int64).tolist()  # token, k ids, rank: [k + 2][N]
    vals = packed[k + 2:].tolist()  # k logprobs: [k][N]
    tokens, sampled_ids, ranks, sampled_lp = ints[0], ints[1], ints[k + 1], vals[0]
    n = num_logprobs[0] if num_logprobs else None
    if n is not None and num_logprobs.count(n) == len(num_logprobs):  # the same n on every row
        if n == 1:
            tops = [{t: v} for t, v in zip(ints[2], vals[1])]
        elif n == 0:
            tops = [{} for _ in tokens]
        else:
            tops = list(map(dict, map(zip, zip(*ints[2:n + 2]), zip(*vals[1:n + 1]))))
        return tokens, list(map(Logprob, sampled_ids, sampled_lp, ranks, tops))
    entries = [None if m is None else
               Logprob(sampled_ids[i], sampled_lp[i], ranks[i],
                       {ints[j + 2][i]: vals[j + 1][i] for j in range(m)})
               for i, m in enumerate(num_logprobs)]
    return tokens, entries


def to_logprobs(lp: LogprobsTensors, want: list[int], num_top: list[int]) -> list[Logprob]:
    """Per-row Logprob entries (sampled token, its logprob and rank, top-n) for rows `want`,
    in one device-to-host copy (no gather when every row wants them)."""
    if want != list(range(lp.token_ids.shape[0])):
        idx = to_device(want, torch.int64, lp.token_ids.device)
        lp = LogprobsTensors(lp.token_ids[idx], lp.logprobs[idx], lp.ranks[idx])
    packed = pack_readback(lp.token_ids[:, 0], lp)
    return unpack_readback(packed.cpu().numpy(), num_top)[1]
