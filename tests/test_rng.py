"""The counter-based generator: Philox test vectors, kernel == torch mirror, batch invariance."""

import torch
import triton
import triton.language as tl

from specops import rng
from specops.triton_kernels import rng as rng_kernels


def test_philox_known_answers():
    # Random123's published Philox4x32-10 test vectors.
    z = torch.zeros(1, dtype=torch.int64)
    assert [int(w) for w in rng.philox4x32(z, z, z, z, z)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    f = torch.full((1,), 0xFFFFFFFF, dtype=torch.int64)
    key = torch.tensor([-1], dtype=torch.int64)
    assert [int(w) for w in rng.philox4x32(key, f, f, f, f)] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_uniform_and_exponential_moments():
    seeds = torch.tensor([1, 2, 3, 4], dtype=torch.int64)
    pos = torch.tensor([0, 7, 1 << 32, 99], dtype=torch.int64)
    u = rng.vocab_noise(seeds, pos, rng.STREAM_ACCEPT, 50_000, kind="uniform")
    e = rng.vocab_noise(seeds, pos, rng.STREAM_SAMPLE, 50_000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    # 200k draws: standard errors ~0.0006 (uniform mean) and ~0.0022 (exp mean)
    assert abs(float(u.mean()) - 0.5) < 0.004
    assert abs(float(e.mean()) - 1.0) < 0.012
    assert abs(float((e > 2.0).float().mean()) - float(torch.exp(torch.tensor(-2.0)))) < 0.004


def test_row_keys_depend_only_on_seed_and_position():
    a = rng.vocab_noise(torch.tensor([5, 9]), torch.tensor([3, 3]), 0, 100)
    b = rng.vocab_noise(torch.tensor([9, 5, 1]), torch.tensor([3, 3, 8]), 0, 100)
    assert torch.equal(a[0], b[1]) and torch.equal(a[1], b[0])
    assert not torch.equal(a[0], a[1])


def test_vocab_noise_with_no_rows():
    empty = torch.zeros(0, dtype=torch.int64)
    assert rng.vocab_noise(empty, empty, rng.STREAM_SAMPLE, 10).shape == (0, 10)


def test_unseeded_rows_get_distinct_lanes():
    seeds, pos = rng.row_keys(torch.tensor([11, 0, 0]), torch.tensor([True, False, False]),
                              torch.tensor([4, 4, 4]), engine_seed=123, step=torch.tensor(17))
    assert seeds.tolist() == [11, 123, 123]
    assert pos.tolist() == [4, (2 << 32) | 17, (3 << 32) | 17]


@triton.jit
def _rng_kernel(seed_ptr, pos_ptr, words_ptr, u_ptr, e_ptr, STREAM: tl.constexpr, N: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    idx = tl.arange(0, N)
    w0, w1, w2, w3 = rng_kernels.random_words(seed, pos, STREAM, idx)
    base = words_ptr + row * 4 * N + idx * 4
    tl.store(base + 0, w0.to(tl.int64))
    tl.store(base + 1, w1.to(tl.int64))
    tl.store(base + 2, w2.to(tl.int64))
    tl.store(base + 3, w3.to(tl.int64))
    tl.store(u_ptr + row * N + idx, rng_kernels.uniform_open(w0))
    tl.store(e_ptr + row * N + idx, rng_kernels.exponential(w1))


def test_triton_rng_matches_torch_mirror():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 64
    seeds = torch.tensor([0, 12345, -7, 2**40 + 3], dtype=torch.int64, device=device)
    pos = torch.tensor([0, 5, (3 << 32) | 9, 2**31 + 1], dtype=torch.int64, device=device)
    words = torch.full((4, 4 * n), -1, dtype=torch.int64, device=device)
    u = torch.full((4, n), -1.0, device=device)
    e = torch.full((4, n), -1.0, device=device)
    _rng_kernel[(4,)](seeds, pos, words, u, e, STREAM=2, N=n)
    ref = rng.random_words(seeds.view(-1, 1).cpu(), pos.view(-1, 1).cpu(), 2, torch.arange(n).view(1, -1))
    assert torch.equal(words.cpu(), torch.stack(ref, -1).reshape(4, -1))
    assert torch.equal(u.cpu(), rng.uniform_open(ref[0]))
    torch.testing.assert_close(e.cpu(), rng.exponential(ref[1]), rtol=2e-6, atol=2e-7)
