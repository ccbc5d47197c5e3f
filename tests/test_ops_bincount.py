"""token_bincount / token_bincount_update_ against their torch references (CPU always, CUDA when present)."""

import pytest
import numpy as np
import torch

from specops.ops import token_bincount, token_bincount_torch, token_bincount_update_, token_bincount_update_torch

# (num_reqs, max_len, vocab): every awkward batch and vocab at least once; the big
# products only where they stay cheap on CPU.
SHAPES = [
    (0, 5, 17), (1, 0, 32000), (1, 3000, 151936), (3, 200, 128256), (6, 64, 32000),
    (5, 300, 50021), (1023, 7, 17), (1024, 16, 1000), (1025, 33, 17),
]
CUDA_SHAPES = [(1024, 256, 128256), (1025, 100, 151936)]


def random_ids(rows, max_len, vocab, dtype, device):
    """Valid ids mixed with padding (-1, vocab) and far out-of-range values; repeats are common."""
    ids = torch.randint(0, vocab, (rows, max_len), device=device)
    pad = torch.rand(rows, max_len, device=device)
    ids = torch.where(pad < 0.1, torch.full_like(ids, -1), ids)
    ids = torch.where((pad >= 0.1) & (pad < 0.15), torch.full_like(ids, vocab), ids)
    ids = torch.where((pad >= 0.15) & (pad < 0.17), torch.full_like(ids, -(2**31) + 5), ids)
    ids = torch.where((pad >= 0.17) & (pad < 0.2), ids % 7, ids)  # repeats
    return ids.to(dtype)


@pytest.mark.parametrize("shape", SHAPES + CUDA_SHAPES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_bincount_matches_reference(device, shape, dtype):
    if shape in CUDA_SHAPES and device == "cpu":
        pytest.skip("large shape: CUDA only")
    rows, max_len, vocab = shape
    ids = random_ids(rows, max_len, vocab, dtype, device)
    counts = token_bincount(ids, vocab)
    assert counts.dtype == torch.int32 and counts.shape == (rows, vocab) and counts.device == ids.device
    assert torch.equal(counts, token_bincount_torch(ids, vocab))
    valid = ((ids >= 0) & (ids < vocab)).sum(dim=1, dtype=torch.int32)
    assert torch.equal(counts.sum(dim=1, dtype=torch.int32), valid)  # nothing lost, nothing extra


def test_bincount_strided_rows(device):
    buf = random_ids(9, 40, 300, torch.int64, device)
    ids = buf[::2, 3:30]  # strided rows, contiguous last dim
    assert torch.equal(token_bincount(ids, 300), token_bincount_torch(ids, 300))


def test_bincount_known_answer(device):
    ids = torch.tensor([[3, 1, 3, -1, 4], [0, 0, 0, 0, 5]], device=device)
    assert token_bincount(ids, 4).tolist() == [[0, 1, 0, 2], [4, 0, 0, 0]]
    assert token_bincount(ids, 0).shape == (2, 0)


@pytest.mark.parametrize("rows,vocab,n", [(1, 17, 1), (4, 32000, 0), (7, 50021, 300), (1025, 17, 5000), (3, 151936, 64)])
@pytest.mark.parametrize("req_dtype,tok_dtype", [(torch.int32, torch.int32), (torch.int64, torch.int32), (torch.int32, torch.int64)])
def test_update_matches_reference(device, rows, vocab, n, req_dtype, tok_dtype):
    counts = torch.randint(0, 3, (rows, vocab), dtype=torch.int32, device=device)
    req = torch.randint(-1, rows + 1, (n,), device=device)  # -1 and rows are out of range
    tok = torch.randint(-1, vocab + 1, (n,), device=device)
    dup = torch.rand(n, device=device) < 0.3
    req = torch.where(dup, torch.zeros_like(req), req)  # many duplicated pairs
    tok = torch.where(dup, torch.full_like(tok, vocab - 1), tok)
    expected = counts.clone()
    token_bincount_update_torch(expected, req.to(req_dtype), tok.to(tok_dtype))
    token_bincount_update_(counts, req.to(req_dtype), tok.to(tok_dtype))
    assert torch.equal(counts, expected)


def test_update_equals_rebuild(device):
    """Counting a history once, then adding steps of accepted tokens, equals a rebuild."""
    rows, vocab, steps = 5, 1000, 6
    history = random_ids(rows, 50, vocab, torch.int64, device)
    counts = token_bincount(history, vocab)
    for _ in range(steps):
        new = torch.randint(-1, vocab, (rows, 3), device=device)  # -1: rejected draft slots
        token_bincount_update_(counts, torch.arange(rows, device=device).repeat_interleave(3), new.flatten())
        history = torch.cat([history, new], dim=1)
    assert torch.equal(counts, token_bincount(history, vocab))


def test_update_strided_counts(device):
    buf = torch.zeros(4, 64, dtype=torch.int32, device=device)
    counts = buf[:, :50]
    token_bincount_update_(counts, torch.tensor([0, 3, 3], device=device), torch.tensor([49, 0, 0], device=device))
    assert buf.sum().item() == 3 and counts[0, 49].item() == 1 and counts[3, 0].item() == 2
    assert buf[:, 50:].sum().item() == 0  # nothing written past the view


BAD = [
    (lambda d: token_bincount(torch.zeros(2, 3, device=d), 10), TypeError, "token_ids must be int32 or int64"),
    (lambda d: token_bincount(torch.zeros(3, dtype=torch.int64, device=d), 10), ValueError, "token_ids must be 2-D"),
    (lambda d: token_bincount(torch.zeros(3, 4, dtype=torch.int64, device=d).t(), 10), ValueError, "contiguous last"),
    (lambda d: token_bincount(torch.zeros(2, 3, dtype=torch.int64, device=d), -1), ValueError,
     r"vocab_size must be in \[0, 2146435071\], got -1"),
    # past int64 too: a clear ValueError, not torch's storage-size or argument-type RuntimeError
    (lambda d: token_bincount(torch.zeros(2, 3, dtype=torch.int64, device=d), 2**62), ValueError,
     r"vocab_size must be in \[0, 2146435071\]"),
    (lambda d: token_bincount(torch.zeros(2, 3, dtype=torch.int64, device=d), 2**63), ValueError,
     r"vocab_size must be in \[0, 2146435071\]"),
    (lambda d: token_bincount(torch.zeros(2, 3, dtype=torch.int64, device=d), 2.0), TypeError, "vocab_size must be an int"),
    (lambda d: token_bincount_update_(torch.zeros(2, 3, dtype=torch.int64, device=d), torch.zeros(1, dtype=torch.int64, device=d),
                                      torch.zeros(1, dtype=torch.int64, device=d)), TypeError, "counts must be int32"),
    (lambda d: token_bincount_update_(torch.zeros(2, 3, dtype=torch.int32, device=d), torch.zeros(2, dtype=torch.int64, device=d),
                                      torch.zeros(1, dtype=torch.int64, device=d)), ValueError, "token_ids must have shape (2,)"),
    (lambda d: token_bincount_update_(torch.zeros(2, 3, dtype=torch.int32, device=d), torch.zeros(1, device=d),
                                      torch.zeros(1, dtype=torch.int64, device=d)), TypeError, "req_indices must be int32 or int64"),
    (lambda d: token_bincount_update_(torch.zeros(2, 3, dtype=torch.int32, device=d), torch.zeros(1, 1, dtype=torch.int64, device=d),
                                      torch.zeros(1, dtype=torch.int64, device=d)), ValueError, "req_indices must be 1-D"),
    (lambda d: token_bincount_update_(torch.zeros(1, 3, dtype=torch.int32, device=d).expand(2, 3),
                                      torch.tensor([0, 1], device=d), torch.tensor([1, 1], device=d)),
     ValueError, "counts is written in place, so its elements must not share memory"),
    # an input that is a view of counts: the update would read indices it already wrote
    (lambda d: (lambda c: token_bincount_update_(c, c[0, :2], torch.tensor([1, 2], device=d)))(
        torch.zeros(2, 4, dtype=torch.int32, device=d)), ValueError, "req_indices shares memory with counts"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_inputs(device, case):
    fn, exc, msg = BAD[case]
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
        fn(device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_device_mismatch():
    with pytest.raises(ValueError, match="must be on cuda"):
        token_bincount_update_(torch.zeros(2, 3, dtype=torch.int32, device="cuda"), torch.zeros(1, dtype=torch.int64),
                               torch.zeros(1, dtype=torch.int64))


def test_vocab_size_takes_numpy_ints(device):
    """vocab_size goes through operator.index: numpy ints work, floats and bools are refused."""
    ids = torch.tensor([[1, 2, 2]], device=device)
    assert token_bincount(ids, np.int64(4)).tolist() == [[0, 1, 2, 0]]
    for bad in (4.0, True):
        with pytest.raises(TypeError, match="vocab_size must be an int"):
            token_bincount(ids, bad)
