"""apply_token_bitmask_ against its torch reference and against xgrammar itself (CPU always, CUDA when present)."""

import warnings

import pytest
import torch

from specops.ops import apply_token_bitmask_, apply_token_bitmask_torch, unpack_bitmask

try:
    import xgrammar
except ImportError:  # the xgrammar comparisons skip; the reference comparisons still run
    xgrammar = None

needs_xgrammar = pytest.mark.skipif(xgrammar is None, reason="xgrammar not installed")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (rows, vocab): every awkward batch and vocab at least once, each with every dtype.
SHAPES = [(0, 128256), (1, 151936), (1, 128256), (5, 50021), (7, 32000), (1023, 17), (1024, 64), (1025, 33)]
CUDA_SHAPES = [(1024, 128256), (1025, 151936), (1023, 50021)]


def words(vocab):
    return (vocab + 31) // 32


def random_bitmask(rows, n_words, device):
    """Rows mixing all-allowed words, all-disallowed words, sparse and dense random words."""
    rnd = torch.randint(-(2**31), 2**31 - 1, (rows, n_words), dtype=torch.int32, device=device)
    sparse = rnd & torch.randint(-(2**31), 2**31 - 1, (rows, n_words), dtype=torch.int32, device=device)
    kind = torch.randint(0, 4, (rows, n_words), device=device)
    out = torch.where(kind == 0, torch.full_like(rnd, -1), rnd)
    out = torch.where(kind == 1, torch.zeros_like(rnd), out)
    return torch.where(kind == 2, sparse, out)


def sector_bitmask(rows, n_words, device):
    """Words built from 8- or 16-bit pieces (one fp32 / 16-bit 32-byte sector of logits), each
    piece all allowed, all disallowed or random, mixed with whole random words."""
    def pieces(width):
        kind = torch.randint(0, 3, (rows, n_words, 32 // width), device=device)
        rnd = torch.randint(0, 2**width, (rows, n_words, 32 // width), device=device)
        piece = torch.where(kind == 0, 2**width - 1, torch.where(kind == 1, 0, rnd))
        shifts = torch.arange(0, 32, width, device=device)
        word = (piece << shifts).sum(-1)  # int64, < 2**32
        return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    which = torch.randint(0, 3, (rows, n_words), device=device)
    return torch.where(which == 0, pieces(8), torch.where(which == 1, pieces(16), random_bitmask(rows, n_words, device)))


def xgrammar_apply(logits, bitmask, indices=None):
    backend = "cpu" if logits.device.type == "cpu" else "torch_native"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xgrammar warns when the bitmask is narrower than logits
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, indices=indices, backend=backend)


@pytest.mark.parametrize("shape", SHAPES + CUDA_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(device, shape, dtype):
    if shape in CUDA_SHAPES and device == "cpu":
        pytest.skip("large shape: CUDA only")
    rows, vocab = shape
    logits = torch.randn(rows, vocab, device=device).to(dtype)
    bitmask = random_bitmask(rows, words(vocab), device)
    expected = logits.clone()
    apply_token_bitmask_torch(expected, bitmask)
    apply_token_bitmask_(logits, bitmask)
    assert torch.equal(logits, expected)
    if rows:
        allowed = unpack_bitmask(bitmask, vocab)
        assert torch.isneginf(logits[~allowed]).all()


INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
# (rows, cols, pad, offset, words). pad: None for contiguous rows, else the row stride is cols
# rounded up to 16 bytes plus `pad` bytes; offset: bytes before row 0. The CUDA kernel works on
# 32-byte sectors of 16-byte aligned rows (read-select-write for mixed sectors, -inf stores for
# fully disallowed ones) and one logit at a time elsewhere: every way a row can meet a sector.
LAYOUTS = [
    (5, 1000, None, 0, 32),   # vocab not a multiple of 32; bits past it are ignored
    (4, 1001, 0, 0, 32),      # aligned strided rows, vocab not a multiple of 8: cut last chunk
    (4, 1004, 0, 0, 32),      # vocab a multiple of 4, not 8: last fp32 chunk's sector partner is past the row
    (6, 1024, None, 16, 32),  # rows start mid-sector
    (6, 1024, 16, 0, 32),     # row stride 16 mod 32 bytes: rows alternate between both
    (3, 1024, None, 4, 32),   # rows not 16-byte aligned: one logit at a time
    (3, 50021, None, 0, 1564),  # odd stride: one logit at a time
    (1, 50021, None, 0, 1564),  # ... unless there is a single row (its stride is never used)
    (300, 37, 0, 16, 2),      # many short rows starting mid-sector: every sector kind at a row end
    (9, 320, 64, 0, 8),       # logits wider than the bitmask, strided rows
    # Enough rows for the unrolled CUDA path (8 chunks per thread) on a large GPU:
    (300, 5000, None, 16, 157),  # rows start mid-sector, several unrolled blocks per row
    (300, 4097, 0, 0, 129),      # rows alternate between both sector phases; cut last chunk
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_indices", [False, True])
def test_sector_layouts(device, layout, dtype, with_indices):
    """Bit-exact against the reference, NaN payloads kept, nothing outside the masked columns touched."""
    rows, cols, pad, offset, n_words = layout
    esz = torch.empty(0, dtype=dtype).element_size()
    stride = cols if pad is None else (-(-cols * esz // 16) * 16 + pad) // esz
    first = offset // esz
    buf = torch.randn(first + rows * stride + 64, device=device).to(dtype)
    ints = buf.view(INT_VIEW[dtype])
    ints[::97] = 0x7FC12345 if esz == 4 else 0x7FC1  # NaNs with a payload
    logits = buf[first:first + rows * stride].view(rows, stride)[:, :cols]
    bitmask = sector_bitmask(rows, n_words, device)
    indices = torch.randint(-1, rows + 1, (rows + 3,), device=device) if with_indices else None
    expected = buf.clone()
    apply_token_bitmask_torch(expected[first:first + rows * stride].view(rows, stride)[:, :cols], bitmask, indices)
    apply_token_bitmask_(logits, bitmask, indices)
    assert torch.equal(ints, expected.view(INT_VIEW[dtype]))


@needs_xgrammar
@pytest.mark.parametrize("shape", [(1, 128256), (5, 50021), (7, 32000), (1025, 17)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_xgrammar(device, shape, dtype):
    rows, vocab = shape
    logits = torch.randn(rows, vocab, device=device).to(dtype)
    bitmask = random_bitmask(rows, words(vocab), device)
    expected = logits.clone()
    xgrammar_apply(expected, bitmask)
    apply_token_bitmask_(logits, bitmask)
    assert torch.equal(logits, expected)


@needs_xgrammar
@pytest.mark.parametrize("cols,bitmask_words", [(32064, 1000), (32000, 1002), (100, 5), (17, 1), (1000, 3)])
def test_width_mismatch_matches_xgrammar(device, cols, bitmask_words):
    """Logits wider than the bitmask keep their trailing columns; bits past the logits are ignored."""
    logits = torch.randn(4, cols, device=device)
    bitmask = torch.zeros(4, bitmask_words, dtype=torch.int32, device=device)  # everything disallowed
    bitmask[1] = random_bitmask(1, bitmask_words, device)
    expected = logits.clone()
    xgrammar_apply(expected, bitmask)
    before = logits.clone()
    apply_token_bitmask_(logits, bitmask)
    assert torch.equal(logits, expected)
    covered = min(cols, 32 * bitmask_words)
    assert torch.equal(logits[:, covered:], before[:, covered:])
    assert torch.isneginf(logits[0, :covered]).all()


@needs_xgrammar
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_indices_match_xgrammar(device, index_dtype):
    """indices[i] names a row of both logits and bitmask, as in xgrammar."""
    rows, vocab = 9, 50021
    logits = torch.randn(rows, vocab, device=device, dtype=torch.bfloat16)
    bitmask = random_bitmask(rows, words(vocab), device)
    indices = [7, 0, 3, 3]  # a duplicate too
    original = logits.clone()
    expected = logits.clone()
    xgrammar_apply(expected, bitmask, indices)
    apply_token_bitmask_(logits, bitmask, torch.tensor(indices, dtype=index_dtype, device=device))
    assert torch.equal(logits, expected)
    untouched = [r for r in range(rows) if r not in indices]
    assert torch.equal(logits[untouched], original[untouched])     # rows not named: not written
    assert not torch.equal(logits[indices], original[indices])


@pytest.mark.parametrize("logits_rows,bitmask_rows", [(6, 6), (6, 9), (9, 6), (1025, 1025)])
def test_indices_out_of_range_skipped(device, logits_rows, bitmask_rows):
    vocab = 1000
    logits = torch.randn(logits_rows, vocab, device=device)
    original = logits.clone()
    bitmask = random_bitmask(bitmask_rows, words(vocab), device)
    valid = min(logits_rows, bitmask_rows)
    indices = torch.randint(-3, max(logits_rows, bitmask_rows) + 3, (2 * logits_rows,), device=device)
    expected = logits.clone()
    apply_token_bitmask_torch(expected, bitmask, indices)
    apply_token_bitmask_(logits, bitmask, indices)
    assert torch.equal(logits, expected)
    named = sorted({r for r in indices.tolist() if 0 <= r < valid})  # the rows that must change
    by_rule = original.clone()
    by_rule[named] = original[named].masked_fill(~unpack_bitmask(bitmask[named], vocab), float("-inf"))
    assert torch.equal(logits, by_rule)


def test_sequence_indices_and_empty_indices(device):
    logits = torch.zeros(3, 40, device=device)
    bitmask = torch.zeros(3, 2, dtype=torch.int32, device=device)
    apply_token_bitmask_(logits, bitmask, torch.empty(0, dtype=torch.int64, device=device))
    assert not torch.isneginf(logits).any()
    apply_token_bitmask_(logits, bitmask, [2])
    assert torch.isneginf(logits[2]).all() and not torch.isneginf(logits[:2]).any()
    # a list may hold numpy ints and values that name no row (skipped, as in a tensor: -2**40
    # no longer stops the int32 conversion)
    import numpy as np
    logits = torch.zeros(3, 40, device=device)
    apply_token_bitmask_(logits, bitmask, [np.int64(1), -2**40, 2**40, 5])
    assert torch.isneginf(logits[1]).all() and not torch.isneginf(logits[[0, 2]]).any()


def test_strided_rows_and_special_values(device):
    buf = torch.randn(5, 1100, device=device)
    buf[0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    logits = buf[:, :1024]
    before = buf.clone()
    bitmask = random_bitmask(5, 32, device)
    bitmask[0, 0] = 0
    expected = logits.clone()
    apply_token_bitmask_torch(expected, bitmask)
    apply_token_bitmask_(logits, bitmask)
    assert torch.equal(logits.nan_to_num(), expected.nan_to_num())
    assert torch.isneginf(logits[0, :3]).all()  # NaN and +inf are masked like any logit
    assert torch.equal(buf[:, 1024:], before[:, 1024:])


def test_known_answer(device):
    logits = torch.zeros(2, 35, device=device)
    bitmask = torch.tensor([[0b0101, 0b110], [-1, 0]], dtype=torch.int32, device=device)
    apply_token_bitmask_(logits, bitmask)
    allowed = [[j in (0, 2, 33, 34) for j in range(35)], [j < 32 for j in range(35)]]
    assert (logits == 0).tolist() == allowed


BAD = [
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, dtype=torch.int32, device=d), torch.zeros(2, 1, dtype=torch.int32, device=d)),
     TypeError, "logits must be float32, bfloat16 or float16"),
    (lambda d: apply_token_bitmask_(torch.zeros(8, device=d), torch.zeros(1, dtype=torch.int32, device=d)), ValueError, "logits must be 2-D"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(2, 1, dtype=torch.int64, device=d)), TypeError, "bitmask must be int32"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(3, 1, dtype=torch.int32, device=d)),
     ValueError, "without indices, bitmask must have one row per logits row"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 64, device=d), torch.zeros(2, 4, dtype=torch.int32, device=d)[:, ::2]),
     ValueError, "bitmask must have a contiguous last dimension"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(2, 1, dtype=torch.int32, device=d), torch.zeros(2, device=d)),
     TypeError, "indices must be int32 or int64"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(2, 1, dtype=torch.int32, device=d),
                                    torch.zeros(2, 1, dtype=torch.int64, device=d)), ValueError, "indices must be 1-D"),
    (lambda d: apply_token_bitmask_(torch.zeros(1, 8, device=d).expand(2, 8), torch.zeros(2, 1, dtype=torch.int32, device=d)),
     ValueError, "logits is written in place, so its elements must not share memory"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d, requires_grad=True).exp(),
                                    torch.zeros(2, 1, dtype=torch.int32, device=d)), ValueError, "must not require grad"),
    # a list of indices: ints only (0.9 was truncated to row 0), True is not a row
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(2, 1, dtype=torch.int32, device=d), [0.9]),
     TypeError, "indices must hold ints, got 0.9"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(2, 1, dtype=torch.int32, device=d), [True]),
     TypeError, "indices must hold ints, got True"),
    (lambda d: apply_token_bitmask_(torch.zeros(2, 8, device=d), torch.zeros(2, 1, dtype=torch.int32, device=d), 0),
     TypeError, "indices must be a tensor or a sequence of ints, got int"),   # was "'int' object is not iterable"
    # a bitmask that is a view of the logits (as int32): read while they are written
    (lambda d: (lambda lg: apply_token_bitmask_(lg, lg[:, :1].view(torch.int32)))(torch.zeros(2, 8, device=d)),
     ValueError, "bitmask shares memory with logits"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_inputs(device, case):
    fn, exc, msg = BAD[case]
    with pytest.raises(exc, match=msg):
        fn(device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_mismatch():
    with pytest.raises(ValueError, match="bitmask must be on cuda"):
        apply_token_bitmask_(torch.zeros(2, 8, device="cuda"), torch.zeros(2, 1, dtype=torch.int32))
