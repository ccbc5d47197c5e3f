"""Counter-based randomness shared by every specops sampling kernel.

One Philox4x32-10 call maps a 64-bit key and a 128-bit counter to four uint32 words.
specops keys it by the request's seed and builds the counter from

    c0 = index     (vocabulary index // 4, or 0 for per-row draws; the 4 words
                    of one call serve 4 consecutive vocabulary entries)
    c1 = position  low 32 bits  (token position in the request's sequence)
    c2 = stream    (STREAM_SAMPLE, STREAM_ACCEPT, STREAM_RECOVER, STREAM_RECOVER_CHUNK, ...)
    c3 = position  high 32 bits (0 for seeded requests; the Sampler puts a per-row lane
                    there for unseeded rows, see specops.rng)

so a seeded request's noise depends only on (seed, position, stream, index): never on
its row, its batch or its neighbours. Everything is passed as device tensors, so a
kernel using it needs no host sync and replays inside a CUDA graph.

specops/rng.py mirrors these functions in plain torch, bit for bit for the integer
words and the uniforms, so references and tests can reproduce the kernels' draws.
"""

import triton
import triton.language as tl

STREAM_SAMPLE = tl.constexpr(0)   # exponential noise of the Sampler (and bonus tokens)
STREAM_ACCEPT = tl.constexpr(1)   # per-draft-position acceptance uniforms (rejection sampling)
STREAM_RECOVER = tl.constexpr(2)  # exponential noise for recovered tokens (rejection sampling)
# level-1 noise of the recovered-token draw (rejection sampling): sub-chunk k of the row
# (tokens [k * SUB, (k + 1) * SUB), SUB = sub_chunk_size(V)) uses word k % 4 of index k // 4.
# Streams 3 and 4 are taken by pyengine (STREAM_DRAFT, STREAM_SYNTHETIC).
STREAM_RECOVER_CHUNK = tl.constexpr(5)
# the sampler's draw on stream s picks a sub-chunk of the row with the noise of stream
# s + SUB_STREAM (sub-chunk k: word k % 4 of index k // 4), then a token inside it (stream s)
SUB_STREAM = tl.constexpr(1 << 16)
# top-p by pivot rejection (sampling_pivot.py): round i >= 1 of a draw on stream s redraws on
# stream s + i * PIVOT_STREAM (its sub-chunk noise on that + SUB_STREAM); a row still rejected
# after the last round takes the exact search on stream s + PIVOT_ROUNDS * PIVOT_STREAM
PIVOT_STREAM = tl.constexpr(1 << 17)


@triton.jit
def philox4x32(seed, c0, c1, c2, c3, N_ROUNDS: tl.constexpr = 10):
    """Philox4x32 of key `seed` (int64) and counter (c0, c1, c2, c3) (uint32) -> 4 x uint32."""
    seed = seed.to(tl.uint64, bitcast=True)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    for _ in tl.static_range(N_ROUNDS):
        _c0 = c0
        _c2 = c2
        c0 = tl.umulhi(_c2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.umulhi(_c0, 0xD2511F53) ^ c3 ^ k1
        c1 = _c2 * 0xCD9E8D57
        c3 = _c0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def random_words(seed, position, stream, index):
    """Four uint32 words for counter (index, position, stream); `seed`, `position` int64 scalars."""
    position = position.to(tl.uint64, bitcast=True)
    c0 = index.to(tl.uint32)
    c1 = (position & 0xFFFFFFFF).to(tl.uint32) + c0 * 0
    c2 = (c0 * 0 + stream).to(tl.uint32)
    c3 = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32) + c0 * 0
    return philox4x32(seed, c0, c1, c2, c3)


@triton.jit
def uniform_open(word):
    """uint32 -> float32 uniform on the open interval (0, 1): ((w >> 9) + 0.5) / 2^23, exact."""
    return ((word >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def exponential(word):
    """uint32 -> float32 Exp(1) draw, -log(1 - v) with v = (w + 0.5) / 2^32.

    Small draws (which decide whether rare tokens win an argmax of p / E) keep a
    resolution of 2^-32 through a series for log1p; large ones are capped near 17.3.
    """
    v = (word.to(tl.float32) + 0.5) * 2.3283064365386963e-10
    series = v * (1.0 + v * (0.5 + v * (0.3333333432674408 + v * 0.25)))
    tail = -tl.log(tl.maximum(1.0 - v, 2.9802322387695312e-08))
    return tl.where(v < 0.0078125, series, tail)
