"""Torch mirror of triton_kernels/rng.py, and the per-row seed/position convention.

`philox4x32`, `random_words` and `uniform_open` reproduce the Triton kernels' integer
words and uniforms bit for bit; `exponential` matches to float32 rounding of `log`.

Per-row keys: every sampled row carries `seeds` (int64) and `positions` (int64).
A seeded request uses its own seed and its token position (< 2^32), so its draws
are batch invariant. An unseeded row uses the engine seed, the engine's step counter
as the low 32 bits of the position and (row + 1) as the high 32 bits, so unseeded rows
of one step never share noise and nothing is read back to the host.
"""

import torch

STREAM_SAMPLE = 0
STREAM_ACCEPT = 1
STREAM_RECOVER = 2
STREAM_RECOVER_CHUNK = 5   # sub-chunk noise of the recovered-token draw (3, 4: pyengine's draft / synthetic streams)
SUB_STREAM = 1 << 16       # the Sampler's sub-chunk noise of a draw on stream s is on stream s + SUB_STREAM
# top-p by pivot rejection (specops.triton_kernels.sampling_pivot): the redraw of round i >= 1
# of a draw on stream s is on stream s + i * PIVOT_STREAM (its sub-chunk noise + SUB_STREAM)
PIVOT_STREAM = 1 << 17

_M32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul_hi_lo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    prod = a * b  # int64 wraps modulo 2^64: the bit pattern of the 64-bit product survives
    return (prod >> 32) & _M32, prod & _M32


def philox4x32(seed: torch.Tensor, c0, c1, c2, c3, n_rounds: int = 10):
    """Philox4x32 with key `seed` (int64 tensor) and uint32 counters held in int64 tensors."""
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    for _ in range(n_rounds):
        hi_b, lo_b = _mul_hi_lo(c2, _ROUND_B)
        hi_a, lo_a = _mul_hi_lo(c0, _ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _M32
        k1 = (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def random_words(seed: torch.Tensor, position: torch.Tensor, stream: int, index: torch.Tensor):
    """Four uint32 words (as int64) per element; all arguments broadcast against each other.

    seed, position: int64, e.g. [rows, 1]; index: int64, e.g. [1, n] (vocabulary index // 4).
    """
    seed, position, index = torch.broadcast_tensors(
        seed.to(torch.int64), position.to(torch.int64), index.to(torch.int64))
    c0 = index & _M32
    c1 = position & _M32
    c2 = torch.full_like(c0, stream)
    c3 = (position >> 32) & _M32
    return philox4x32(seed, c0, c1, c2, c3)


def uniform_open(word: torch.Tensor) -> torch.Tensor:
    """uint32 words (int64 tensor) -> float32 uniforms on (0, 1), as the kernels compute them."""
    return ((word >> 9).to(torch.float32) + 0.5) * 1.1920928955078125e-07


def exponential(word: torch.Tensor) -> torch.Tensor:
    """uint32 words (int64 tensor) -> float32 Exp(1) draws, as the kernels compute them."""
    v = (word.to(torch.float32) + 0.5) * 2.3283064365386963e-10
    series = v * (1.0 + v * (0.5 + v * (0.3333333432674408 + v * 0.25)))
    tail = -torch.log(torch.clamp(1.0 - v, min=2.9802322387695312e-08))
    return torch.where(v < 0.0078125, series, tail)


def vocab_noise(seeds: torch.Tensor, positions: torch.Tensor, stream: int, vocab_size: int,
                kind: str = "exponential") -> torch.Tensor:
    """Noise for every (row, token): [rows, vocab_size] float32.

    seeds, positions: [rows] int64. Token t uses word t % 4 of the call with index t // 4.
    ``kind``: "exponential" (Exp(1) draws) or "uniform" (on (0, 1)).
    """
    if kind not in ("exponential", "uniform"):
        raise ValueError(f"kind must be 'exponential' or 'uniform', got {kind!r}")
    rows = seeds.shape[0]
    index = torch.arange((vocab_size + 3) // 4, device=seeds.device)
    words = random_words(seeds.view(-1, 1), positions.view(-1, 1), stream, index.view(1, -1))
    words = torch.stack(words, dim=-1).reshape(rows, 4 * index.numel())[:, :vocab_size]
    return exponential(words) if kind == "exponential" else uniform_open(words)


def row_keys(request_seeds: torch.Tensor, has_seed: torch.Tensor, token_positions: torch.Tensor,
             engine_seed: int, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (seeds, positions) following the convention above; no host sync.

    request_seeds: [rows] int64; has_seed: [rows] bool; token_positions: [rows] int64;
    step: [] int64 device tensor (the engine's step counter).
    """
    rows = request_seeds.shape[0]
    lane = torch.arange(1, rows + 1, device=request_seeds.device, dtype=torch.int64)
    unseeded_pos = (lane << 32) | (step.to(torch.int64) & _M32)
    seeds = torch.where(has_seed, request_seeds, torch.full_like(request_seeds, engine_seed))
    # a seeded row's position modulo 2**32: its high word stays 0, never an unseeded row's lane
    positions = torch.where(has_seed, token_positions & _M32, unseeded_pos)
    return seeds, positions
