"""apply_penalties_ / apply_repetition_penalties_ against their torch references (CPU always, CUDA when present)."""

import pytest
import torch

from specops.ops import (
    apply_penalties_,
    apply_penalties_torch,
    apply_repetition_penalties_,
    apply_repetition_penalties_torch,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (rows, vocab): every awkward batch and vocab at least once, each with every dtype.
SHAPES = [(0, 128256), (1, 151936), (1, 128256), (5, 50021), (7, 32000), (1023, 17), (1024, 64), (1025, 33)]
CUDA_SHAPES = [(1024, 128256), (1025, 151936), (1023, 50021)]


# Bit for bit (up to the sign of zero) in every dtype: the ops compute exactly the reference's
# float32 operations (penalty_math.h: no fused multiply-add, correctly rounded division) and
# round once to the logits' dtype, as the reference's copy_ does.
EXACT = dict(rtol=0.0, atol=0.0)


def make_inputs(rows, vocab, dtype, device):
    logits = (torch.randn(rows, vocab, device=device) * 4).to(dtype)
    if rows > 0 and vocab > 4:  # special values survive as the reference says
        logits[0, :4] = torch.tensor([float("-inf"), float("inf"), float("nan"), 0.0])
    prompt_mask = torch.rand(rows, vocab, device=device) < 0.2
    counts = torch.randint(0, 4, (rows, vocab), device=device, dtype=torch.int32)
    counts = torch.where(torch.rand(rows, vocab, device=device) < 0.7, torch.zeros_like(counts), counts)
    kind = torch.randint(0, 4, (rows,), device=device)  # 0: all neutral, 1: repetition only, else all three
    kind[:1] = 2  # row 0 (the only row of the single-row shapes) always has all three penalties
    rep = torch.where(kind == 0, 1.0, torch.rand(rows, device=device) * 1.5 + 0.5)
    freq = torch.where(kind <= 1, 0.0, torch.randn(rows, device=device))
    pres = torch.where(kind <= 1, 0.0, torch.randn(rows, device=device))
    return logits, prompt_mask, counts, rep, freq, pres


@pytest.mark.parametrize("shape", SHAPES + CUDA_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_penalties_match_reference(device, shape, dtype):
    if shape in CUDA_SHAPES and device == "cpu":
        pytest.skip("large shape: CUDA only")
    logits, prompt_mask, counts, rep, freq, pres = make_inputs(*shape, dtype, device)
    expected = logits.clone()
    apply_penalties_torch(expected, prompt_mask, counts, rep, freq, pres)
    apply_penalties_(logits, prompt_mask, counts, rep, freq, pres)
    torch.testing.assert_close(logits, expected, equal_nan=True, **EXACT)


@pytest.mark.parametrize("shape", SHAPES + CUDA_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_repetition_matches_reference(device, shape, dtype):
    if shape in CUDA_SHAPES and device == "cpu":
        pytest.skip("large shape: CUDA only")
    logits, prompt_mask, counts, rep, _, _ = make_inputs(*shape, dtype, device)
    output_mask = counts > 0
    expected = logits.clone()
    apply_repetition_penalties_torch(expected, prompt_mask, output_mask, rep)
    apply_repetition_penalties_(logits, prompt_mask, output_mask, rep)
    torch.testing.assert_close(logits, expected, equal_nan=True, **EXACT)


def test_known_answer(device):
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0, 3.0]], device=device)
    prompt = torch.tensor([[True, True, False, False, False, False]], device=device)
    counts = torch.tensor([[0, 0, 2, 1, 0, 0]], device=device, dtype=torch.int32)
    one = lambda v: torch.tensor([v], device=device)  # noqa: E731
    apply_penalties_(logits, prompt, counts, one(2.0), one(0.5), one(0.25))
    # rep: 2/2, -2*2, 2/2, -2*2; freq: -0.5*count; presence: -0.25 where count > 0
    assert logits.tolist() == [[1.0, -4.0, 1.0 - 1.0 - 0.25, -4.0 - 0.5 - 0.25, 1.0, 3.0]]


def test_order_matters_like_vllm(device):
    """Repetition is applied before frequency/presence: (x / r) - f, not (x - f) / r."""
    logits = torch.tensor([[3.0]], device=device)
    apply_penalties_(logits, torch.tensor([[False]], device=device), torch.tensor([[1]], device=device, dtype=torch.int32),
                     torch.tensor([3.0], device=device), torch.tensor([1.0], device=device), torch.tensor([0.0], device=device))
    assert logits.item() == 0.0


def test_infinite_presence_penalty_leaves_unseen_tokens_alone(device):
    # presence applies where count > 0 only: an inf penalty makes seen tokens -inf, never
    # unseen ones NaN (inf * 0), in the op and in its reference alike
    _, prompt_mask, counts, rep, freq, pres = make_inputs(2, 64, torch.float32, device)
    counts[:, ::2] = 0
    counts[:, 1::2] = 1
    pres.fill_(float("inf"))
    logits = torch.randn(2, 64, device=device)
    expected = logits.clone()
    apply_penalties_torch(expected, prompt_mask, counts, rep, freq.zero_(), pres)
    apply_penalties_(logits, prompt_mask, counts, rep, freq, pres)
    assert not logits.isnan().any() and torch.isneginf(logits[:, 1::2]).all()
    torch.testing.assert_close(logits, expected, **EXACT)


def test_neutral_rows_untouched_and_strided(device):
    rows, vocab = 6, 1000
    buf = torch.randn(rows, vocab + 24, device=device)
    logits = buf[:, :vocab]  # strided rows
    before = buf.clone()
    _, prompt_mask, counts, rep, freq, pres = make_inputs(rows, vocab, torch.float32, device)
    rep[::2], freq[::2], pres[::2] = 1.0, 0.0, 0.0
    expected = logits.clone()
    apply_penalties_torch(expected, prompt_mask, counts, rep, freq, pres)
    apply_penalties_(logits, prompt_mask, counts, rep, freq, pres)
    torch.testing.assert_close(logits, expected, **EXACT)
    assert torch.equal(buf[::2], before[::2])  # neutral rows, bit for bit
    assert torch.equal(buf[:, vocab:], before[:, vocab:])  # padding past the view untouched


def _args(device, rows=2, vocab=8, **override):
    a = dict(logits=torch.zeros(rows, vocab, device=device), prompt_mask=torch.zeros(rows, vocab, dtype=torch.bool, device=device),
             output_counts=torch.zeros(rows, vocab, dtype=torch.int32, device=device),
             repetition_penalties=torch.ones(rows, device=device), frequency_penalties=torch.zeros(rows, device=device),
             presence_penalties=torch.zeros(rows, device=device))
    a.update({k: v(device) for k, v in override.items()})
    return a


BAD = [
    (dict(logits=lambda d: torch.zeros(2, 8, dtype=torch.float64, device=d)), TypeError, "logits must be float32, bfloat16 or float16"),
    (dict(logits=lambda d: torch.zeros(2, 8, 1, device=d)), ValueError, "logits must be 2-D"),
    (dict(logits=lambda d: torch.zeros(8, 2, device=d).t()), ValueError, "logits must have a contiguous last dimension"),
    (dict(prompt_mask=lambda d: torch.zeros(2, 8, dtype=torch.uint8, device=d)), TypeError, "prompt_mask must be bool"),
    (dict(prompt_mask=lambda d: torch.zeros(2, 7, dtype=torch.bool, device=d)), ValueError, r"prompt_mask must have shape \(2, 8\)"),
    (dict(output_counts=lambda d: torch.zeros(2, 8, dtype=torch.int64, device=d)), TypeError, "output_counts must be int32"),
    (dict(output_counts=lambda d: torch.zeros(3, 8, dtype=torch.int32, device=d)), ValueError, r"output_counts must have shape \(2, 8\)"),
    (dict(repetition_penalties=lambda d: torch.ones(2, dtype=torch.float16, device=d)), TypeError, "repetition_penalties must be float32"),
    (dict(frequency_penalties=lambda d: torch.ones(3, device=d)), ValueError, r"frequency_penalties must have shape \(2,\)"),
    (dict(presence_penalties=lambda d: torch.ones(4, device=d)[::2]), ValueError, "presence_penalties must have a contiguous"),
    (dict(presence_penalties=lambda d: [0.0, 0.0]), TypeError, "presence_penalties must be a torch.Tensor"),
    (dict(logits=lambda d: torch.zeros(2, 8, device=d).to_sparse()), TypeError, "logits must be a dense"),
    (dict(prompt_mask=lambda d: torch.zeros(2, 8, dtype=torch.bool, device=d).to_sparse()), TypeError,
     "prompt_mask must be a dense"),
    # written in place: rows sharing memory (they would add up their writes) or tracked by autograd
    (dict(logits=lambda d: torch.zeros(1, 8, device=d).expand(2, 8)), ValueError, "logits is written in place, so its"),
    (dict(logits=lambda d: torch.zeros(2, 8, device=d, requires_grad=True) * 1.0), ValueError,
     "logits is written in place without a backward"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_inputs(device, case):
    override, exc, msg = BAD[case]
    with pytest.raises(exc, match=msg):
        apply_penalties_(**_args(device, **override))


def test_bad_inputs_repetition(device):
    a = _args(device)
    with pytest.raises(TypeError, match="output_mask must be bool"):
        apply_repetition_penalties_(a["logits"], a["prompt_mask"], a["output_counts"], a["repetition_penalties"])
    with pytest.raises(ValueError, match=r"repetition_penalties must have shape \(2,\)"):
        apply_repetition_penalties_(a["logits"], a["prompt_mask"], a["prompt_mask"], torch.ones(1, device=device))
    shared = torch.full((1, 8), -1.0, device=device).expand(2, 8)
    with pytest.raises(ValueError, match="logits is written in place, so its elements must not share memory"):
        apply_repetition_penalties_(shared, a["prompt_mask"] | True, a["prompt_mask"], torch.full((2,), 2.0, device=device))
    assert (shared == -1.0).all()                                   # refused before anything was written


def test_an_input_sharing_memory_with_the_logits_is_refused(device):
    """A penalty vector that is a view of the logits (same dtype) would be read after the op
    wrote it (row 1 read row 0's penalised values) and raced by CPU threads: refused before
    anything is written, as torch's own in-place ops refuse it. Views of one buffer that do
    not overlap are fine."""
    a = _args(device)
    logits = torch.arange(16, dtype=torch.float32, device=device).reshape(2, 8)
    before = logits.clone()
    with pytest.raises(ValueError, match="frequency_penalties shares memory with logits"):
        apply_penalties_(logits, a["prompt_mask"], a["output_counts"] + 1, a["repetition_penalties"], logits[0, :2],
                         a["presence_penalties"])
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="repetition_penalties shares memory with logits"):
        apply_repetition_penalties_(logits, a["prompt_mask"], a["prompt_mask"], logits[1, 6:])
    buf = torch.zeros(20, device=device)
    apply_penalties_(buf[:16].view(2, 8), a["prompt_mask"], a["output_counts"] + 1, a["repetition_penalties"],
                     buf[16:18], buf[18:])                          # disjoint: accepted


def test_inputs_in_the_gaps_between_strided_logits_rows_are_accepted(device):
    """Penalty vectors stored in the spare columns of a staging buffer whose first V columns
    are the logits (row stride > V) share no element with them: accepted and read as given
    (they were refused, the check compared whole byte ranges). One that reaches into the next
    row's logits is still refused."""
    a = _args(device)
    buf = torch.zeros(2, 8 + 4, device=device)
    logits = buf[:, :8]
    logits.copy_(torch.arange(16, dtype=torch.float32, device=device).reshape(2, 8) - 3)
    frequency, presence = buf[0, 8:10], buf[1, 8:10]
    frequency.fill_(0.5)
    presence.fill_(0.25)
    expected = logits.clone()
    apply_penalties_torch(expected, a["prompt_mask"], a["output_counts"] + 1, a["repetition_penalties"],
                          frequency.clone(), presence.clone())
    apply_penalties_(logits, a["prompt_mask"], a["output_counts"] + 1, a["repetition_penalties"], frequency, presence)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="presence_penalties shares memory with logits"):
        apply_penalties_(logits, a["prompt_mask"], a["output_counts"] + 1, a["repetition_penalties"], frequency,
                         buf.view(-1)[11:13])                        # the last spare column and logits[1, 0]
    one_row = buf.view(-1).as_strided((1, 8), (0, 1))                # a row stride of 0: no gaps at all
    with pytest.raises(ValueError, match="repetition_penalties shares memory with logits"):
        apply_repetition_penalties_(one_row, a["prompt_mask"][:1], a["prompt_mask"][:1], buf.view(-1)[2:3])


def test_direct_op_call_is_checked_too(device):
    """torch.ops.specops.* called without the wrapper still refuses bad shapes (no out-of-bounds access)."""
    a = _args(device)
    a["output_counts"] = torch.zeros(2, 4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="output_counts must have shape"):
        torch.ops.specops.apply_penalties_(*a.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_mismatch():
    a = _args("cuda", prompt_mask=lambda d: torch.zeros(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="prompt_mask must be on cuda"):
        apply_penalties_(**a)


def test_the_samplers_reference_is_the_ops_reference(device):
    # specops.sampling.apply_penalties_torch (the Sampler's torch path) is the op's reference:
    # an infinite presence penalty leaves unseen tokens untouched in both (inf * 0 was NaN)
    from specops.sampling import apply_penalties_torch as sampling_reference
    logits = torch.tensor([[1.0, 2.0, -1.0]], device=device)
    args = (torch.zeros(1, 3, dtype=torch.bool, device=device), torch.tensor([[1, 0, 0]], dtype=torch.int32, device=device),
            torch.ones(1, device=device), torch.zeros(1, device=device), torch.full((1,), float("inf"), device=device))
    a, b, c = logits.clone(), logits.clone(), logits.clone()
    sampling_reference(a, *args)
    apply_penalties_torch(b, *args)
    apply_penalties_(c, *args)
    want = torch.tensor([[float("-inf"), 2.0, -1.0]], device=device)
    assert torch.equal(a, want) and torch.equal(b, want) and torch.equal(c, want)
