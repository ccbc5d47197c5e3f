"""Spec-decode metadata builder (seeds/01 3.4 example), output parser, expand kernel."""

import os

import numpy as np
import pytest
import torch

from specops.spec_decode import MAX_SPEC_LEN, build_spec_decode_metadata, parse_output
from specops.triton_kernels.expand import expand_to_draft_rows

# The expand kernel is Triton: on CPU only under the interpreter (set by conftest when
# there is no GPU); on a CUDA machine its tests run on CUDA alone.
TRITON_DEVICES = (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1" else []) + (["cuda"] if torch.cuda.is_available() else [])


def test_worked_example_from_seeds_01():
    input_ids = torch.arange(209, dtype=torch.int64) * 10
    md = build_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209], input_ids=input_ids)
    assert md.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert md.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert md.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert md.max_spec_len == 3 and md.num_reqs == 5 and md.total_draft_tokens == 6
    # request 0 scheduled [last sampled, d1, d2, d3] at 0..3; request 2 [x, d1, d2] at 104..106
    assert md.draft_token_ids.tolist() == [10, 20, 30, 1050, 1060, 2080]
    assert md.draft_token_ids.dtype == torch.int64          # the input ids' dtype
    md = build_spec_decode_metadata([3, 0, 2, 0, 1], [4, 104, 107, 207, 209], input_ids=input_ids.int())
    assert md.draft_token_ids.dtype == torch.int32


def test_draft_ids_outside_int32_are_not_narrowed():
    # 2**32 + 3 would wrap to the token 3 in 32 bits (and be accepted); the builder keeps the id
    # as it is, so that the rejection sampler sees an id outside the vocabulary and rejects it
    ids = torch.tensor([0, 2**32 + 3, 5, -(2**32) + 1, 2**31, 2**63 - 1])
    md = build_spec_decode_metadata([2, 2], [3, 6], input_ids=ids)
    assert md.draft_token_ids.dtype == torch.int64
    assert md.draft_token_ids.tolist() == [2**32 + 3, 5, 2**31, 2**63 - 1]


def _naive(nd, cu):
    logits, target, bonus = [], [], []
    for r, (k, end) in enumerate(zip(nd, cu)):
        first = len(logits)
        logits += list(range(end - k - 1, end))
        target += list(range(first, first + k))
        bonus.append(first + k)
    return logits, target, bonus


@pytest.mark.parametrize("num_reqs", [1, 2, 7, 33])
def test_matches_naive_layout(num_reqs):
    g = np.random.default_rng(num_reqs)
    nd = g.integers(0, 6, size=num_reqs)
    sched = nd + 1 + g.integers(0, 4, size=num_reqs) * (g.random(num_reqs) < 0.3)
    cu = np.cumsum(sched)
    md = build_spec_decode_metadata(torch.tensor(nd), cu.tolist())
    logits, target, bonus = _naive(nd.tolist(), cu.tolist())
    assert md.logits_indices.tolist() == logits
    assert md.target_logits_indices.tolist() == target
    assert md.bonus_logits_indices.tolist() == bonus
    assert md.cu_num_draft_tokens.tolist() == np.cumsum(nd).tolist()
    assert md.max_spec_len == int(nd.max())
    assert md.draft_token_ids is None


def test_empty_batch():
    md = build_spec_decode_metadata([], [])
    assert md.num_reqs == 0 and md.max_spec_len == 0 and md.logits_indices.numel() == 0


@pytest.mark.parametrize("nd, cu, match", [
    ([1, 2], [2], "same length"),
    ([-1], [3], "num_draft_tokens must be >= 0"),
    ([3], [3], "request 0 schedules 3 tokens but has 3 drafts"),
    ([0, 0], [2, 2], "strictly increasing"),
    ([MAX_SPEC_LEN + 1], [MAX_SPEC_LEN + 2], "MAX_SPEC_LEN"),
    ([[1]], [[2]], "one-dimensional"),
    # values int64 cannot hold are named as given, not wrapped (2**63 + 5 is not -2**63 + 5)
    (np.array([2**63 + 5], np.uint64), [2], "num_draft_tokens must hold values that fit in int64, got "
                                             "9223372036854775813"),
    ([2**70], [2], "num_draft_tokens must hold values that fit in int64, got 1180591620717411303424"),
    ([1, 0], [2, 2**64], "cu_num_scheduled_tokens must hold values that fit in int64, got 18446744073709551616"),
])
def test_bad_inputs(nd, cu, match):
    with pytest.raises(ValueError, match=match):
        build_spec_decode_metadata(nd, cu)


def test_bad_types():
    with pytest.raises(TypeError, match="num_draft_tokens must hold integers"):
        build_spec_decode_metadata(torch.tensor([1.0]), [2])
    with pytest.raises(TypeError, match="num_draft_tokens must hold integers, got None"):
        build_spec_decode_metadata([2**70, None], [2, 3])
    with pytest.raises(ValueError, match="input_ids has 3 tokens"):
        build_spec_decode_metadata([1], [4], input_ids=torch.arange(3))
    with pytest.raises(TypeError, match="input_ids must be a torch.Tensor, got list"):
        build_spec_decode_metadata([1], [4], input_ids=[1, 2, 3, 4])
    with pytest.raises(TypeError, match="input_ids must be int32 or int64 token ids, got torch.float32"):
        build_spec_decode_metadata([1], [4], input_ids=torch.zeros(4))
    # input_ids on another device than `device`: a gather with meta indices returned garbage drafts
    with pytest.raises(ValueError, match="input_ids is on the meta device"):
        build_spec_decode_metadata([1, 0], [2, 3], input_ids=torch.tensor([5, 6, 7], device="meta"), device="cpu")
    with pytest.raises(ValueError, match="input_ids is on the meta device"):   # it returned meta tensors
        build_spec_decode_metadata([1, 0], [2, 3], input_ids=torch.tensor([5, 6, 7], device="meta"))
    with pytest.raises(ValueError, match="device must be a device that holds data .* got 'meta'"):
        build_spec_decode_metadata([1, 0], [2, 3], device="meta")
    assert build_spec_decode_metadata([1, 0], [2, 3], input_ids=torch.tensor([5, 6, 7]),
                                      device="cpu").draft_token_ids.tolist() == [6]


def test_parse_output():
    out = torch.tensor([[5, 7, -1], [9, -1, -1], [1, 2, 3], [-1, -1, -1]], dtype=torch.int32)
    assert parse_output(out) == [[5, 7], [9], [1, 2, 3], []]
    assert parse_output(out[:0]) == []
    with pytest.raises(ValueError, match="outside"):
        parse_output(out, vocab_size=3)
    with pytest.raises(ValueError, match="num_reqs, max_spec_len"):
        parse_output(out[0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        parse_output([[1, -1]])
    with pytest.raises(TypeError, match="int32 or int64, got torch.float32"):
        parse_output(out.float())
    for bad in (0, "10", 7.5, True):
        with pytest.raises(ValueError, match="vocab_size must be None or an int >= 1"):
            parse_output(out, vocab_size=bad)
    # a token after the first -1 is corrupted output, never dropped silently
    with pytest.raises(ValueError, match="token after its first -1"):
        parse_output(torch.tensor([[5, -1, 7]]), vocab_size=10)
    with pytest.raises(ValueError, match="token after its first -1"):
        parse_output(torch.tensor([[-1, 3, -1]]))
    # a value below -1 is corrupted output too, with or without vocab_size
    for bad in ([[-2, 3, -1]], [[4, -7, -1]], [[4, 3, -2]]):
        with pytest.raises(ValueError, match="output_token_ids row 0 holds -[27]"):
            parse_output(torch.tensor(bad))
        with pytest.raises(ValueError, match="output_token_ids row 0 holds -[27]"):
            parse_output(torch.tensor(bad), vocab_size=10)


def test_metadata_indices_fit_int32():
    md = build_spec_decode_metadata([1], [2**31])
    assert md.logits_indices.tolist() == [2**31 - 2, 2**31 - 1]
    with pytest.raises(ValueError, match="at most at 2\\*\\*31"):
        build_spec_decode_metadata([1], [2**31 + 1])
    with pytest.raises(ValueError, match="at most at 2\\*\\*31"):
        build_spec_decode_metadata([1, 0], [4, 2**40])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32])
@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_expand_kernel_matches_repeat_interleave(device, dtype):
    g = torch.Generator().manual_seed(3)
    counts = torch.randint(0, 5, (37,), generator=g)
    counts[[0, 5, 36]] = 0
    cu = torch.cumsum(counts, 0).to(device)
    values = (torch.randint(-3, 4, (37,), generator=g)).to(dtype).to(device)
    t, k = int(counts.sum()), int(counts.max())
    ref = torch.repeat_interleave(values, counts.to(device))
    assert torch.equal(expand_to_draft_rows(values, cu, t, k), ref)
    within = torch.arange(t, device=device) - torch.repeat_interleave(cu - counts.to(device), counts.to(device))
    assert torch.equal(expand_to_draft_rows(values, cu, t, k, add_index=True), ref + within.to(dtype))
    rep = torch.where(ref == 0, torch.ones_like(ref), ref)
    assert torch.equal(expand_to_draft_rows(values, cu.to(torch.int32), t, k, replace_from=0, replace_to=1), rep)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_expand_kernel_never_writes_outside_its_output(device):
    # counts are device values (not checked: no sync); the kernel clamps them into
    # [0, num_tokens], so negative counts or counts past num_tokens leave the guards alone
    from specops.triton_kernels.expand import _expand_kernel
    for cu, want in (([-2, 2, 9], [2, 2, 3, 3]), ([3, 1, 1], [1, 1, 1, -5]), ([2**40, 5, 6], [1, 1, 1, 1])):
        buf = torch.full((12,), -5, dtype=torch.int64, device=device)
        out = buf[4:8]
        values = torch.tensor([1, 2, 3], device=device)
        _expand_kernel[(3,)](out, values, torch.tensor(cu, device=device), 3, 4, 0, 0,
                             REPLACE=False, ADD_INDEX=False, BLOCK=8, num_warps=1)
        assert buf[:4].tolist() == [-5] * 4 and buf[8:].tolist() == [-5] * 4, cu
        assert out.tolist() == want, cu


def test_expand_kernel_bad_inputs(device):
    v = torch.ones(3, device=device)
    with pytest.raises(ValueError, match="values and cu_num_draft_tokens"):
        expand_to_draft_rows(v, torch.ones(2, dtype=torch.int64, device=device), 3, 1)
    with pytest.raises(TypeError, match="int32 or int64"):
        expand_to_draft_rows(v, torch.ones(3, device=device), 3, 1)
    with pytest.raises(ValueError, match="together"):
        expand_to_draft_rows(v, torch.ones(3, dtype=torch.int64, device=device), 3, 1, replace_from=0)
    assert expand_to_draft_rows(v, torch.zeros(3, dtype=torch.int64, device=device), 0, 0).numel() == 0
