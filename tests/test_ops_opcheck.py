"""Every compiled op passes torch.library.opcheck (schema, fake, autograd registration, AOT
dispatch), and the ops compose under torch.compile(fullgraph=True) and CUDA-graph capture."""

import pytest
import torch
from torch.library import opcheck

from specops.ops import (
    apply_penalties_,
    apply_penalties_torch,
    apply_repetition_penalties_,
    apply_token_bitmask_,
    apply_token_bitmask_torch,
    token_bincount,
    token_bincount_torch,
    token_bincount_update_,
    token_bincount_update_torch,
)

ops = torch.ops.specops


def cases(device):
    rows, vocab = 3, 70
    logits = lambda dt=torch.float32: torch.randn(rows, vocab, device=device).to(dt)  # noqa: E731
    mask = lambda: torch.rand(rows, vocab, device=device) < 0.3  # noqa: E731
    counts = lambda: torch.randint(0, 3, (rows, vocab), dtype=torch.int32, device=device)  # noqa: E731
    pen = lambda lo: torch.rand(rows, device=device) + lo  # noqa: E731
    bits = lambda n: torch.randint(-(2**31), 2**31 - 1, (n, 3), dtype=torch.int32, device=device)  # noqa: E731
    return {
        "token_bincount": (ops.token_bincount.default, (torch.randint(-1, vocab + 1, (rows, 9), device=device), vocab)),
        "token_bincount_empty": (ops.token_bincount.default, (torch.zeros(0, 4, dtype=torch.int32, device=device), vocab)),
        "token_bincount_update_": (ops.token_bincount_update_.default,
                                   (counts(), torch.tensor([0, 2, 2, 5], device=device), torch.tensor([1, 69, 69, 3], device=device))),
        "apply_penalties_": (ops.apply_penalties_.default, (logits(), mask(), counts(), pen(0.5), pen(0.0), pen(0.0))),
        "apply_penalties_bf16": (ops.apply_penalties_.default, (logits(torch.bfloat16), mask(), counts(), pen(0.5), pen(0.0), pen(0.0))),
        "apply_repetition_penalties_": (ops.apply_repetition_penalties_.default, (logits(torch.float16), mask(), mask(), pen(0.5))),
        "apply_token_bitmask_": (ops.apply_token_bitmask_.default, (logits(), bits(rows), None)),
        "apply_token_bitmask_indices": (ops.apply_token_bitmask_.default,
                                        (logits(torch.bfloat16), bits(rows + 2), torch.tensor([2, 0], device=device))),
    }


@pytest.mark.parametrize("name", list(cases("cpu")))
def test_opcheck(device, name):
    op, args = cases(device)[name]
    opcheck(op, args)


IN_PLACE = {  # op name -> its wrapper; the written tensor is the first argument
    "token_bincount_update_": token_bincount_update_,
    "apply_penalties_": apply_penalties_,
    "apply_repetition_penalties_": lambda *a: apply_repetition_penalties_(*a),
    "apply_token_bitmask_": apply_token_bitmask_,
}


def overlapping(t, how):  # [rows, V] views whose elements share memory
    if how == "expand":
        return t[:1].clone().expand_as(t)
    flat = t.flatten().clone()                                   # rows one element apart
    return flat.as_strided(t.shape, (1, 1))


@pytest.mark.parametrize("how", ["expand", "rows_overlap"])
@pytest.mark.parametrize("direct", [False, True], ids=["wrapper", "torch.ops"])
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_a_written_tensor_whose_elements_share_memory_is_refused(device, name, direct, how):
    """An expanded written tensor, or one whose rows overlap (as_strided), would have its
    shared elements written once per row (and raced on): refused with the argument named, by
    the wrapper and by the C++ check of a direct torch.ops.specops.* call, and left untouched."""
    op, args = cases(device)[name]
    shared = overlapping(args[0], how)
    before = shared.clone()
    call = op if direct else IN_PLACE[name]
    with pytest.raises(ValueError, match=f"{name}: (logits|counts) is written in place, so its elements must not"):
        call(shared, *args[1:])
    assert torch.equal(shared, before)


@pytest.mark.parametrize("direct", [False, True], ids=["wrapper", "torch.ops"])
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_the_written_tensor_gets_a_new_version(device, name, direct):
    """As torch's in-place ops: a tensor autograd saved (here the logits of a loss, written
    through .detach()) makes backward() raise instead of using the written values. The
    version is bumped by the op's ADInplaceOrView kernel, so a direct torch.ops call (which
    bypasses the wrapper) bumps it too."""
    op, args = cases(device)[name]
    call = op if direct else IN_PLACE[name]
    written = args[0]
    version = written._version
    call(written, *args[1:])
    assert written._version == version + 1
    if written.is_floating_point():
        w = torch.randn(written.shape[1], written.shape[1], device=device, requires_grad=True)
        logits = written.float() @ w
        loss = (logits * logits).sum()                               # saves logits
        call(logits.detach().to(written.dtype) if written.dtype != torch.float32 else logits.detach(), *args[1:])
        if written.dtype == torch.float32:
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()


@pytest.mark.parametrize("name", [n for n in cases("cpu") if n.startswith("apply_")])   # the ones with float args
def test_a_direct_call_refuses_a_tensor_that_requires_grad(device, name):
    """No op has a backward: a direct torch.ops call on an argument that requires grad raises
    (its Autograd kernel) instead of silently dropping the gradient or, on a leaf, writing
    it; under torch.no_grad() the same call runs."""
    op, args = cases(device)[name]
    grad_at = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point())
    leaf = args[grad_at].detach().clone().requires_grad_(True)
    before = leaf.detach().clone()
    bad = list(args)
    bad[grad_at] = leaf
    with pytest.raises(ValueError, match=f"specops::{op.name().split('::')[1]}: \\w+ requires grad, but the op has no backward"):
        op(*bad)
    assert torch.equal(leaf.detach(), before)
    with torch.no_grad():
        op(*bad)


@pytest.mark.parametrize("direct", [False, True], ids=["wrapper", "torch.ops"])
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_an_inference_tensor_is_refused_outside_inference_mode(device, name, direct):
    """A tensor made under torch.inference_mode() cannot be written in place outside it (its
    version cannot be bumped): refused, named and untouched, instead of written and then
    refused by torch's version bump. Inside inference mode the same call runs."""
    op, args = cases(device)[name]
    with torch.inference_mode():
        written = args[0].clone()
    before = written.clone()
    call = op if direct else IN_PLACE[name]
    with pytest.raises(ValueError, match=f"{name}: (logits|counts) is an inference tensor"):
        call(written, *args[1:])
    assert torch.equal(written, before)
    with torch.inference_mode():
        call(written, *args[1:])


def test_direct_calls_whose_check_names_a_number_raise(device):
    """The C++ checks whose message holds a number (a length, a width, vocab_size) raise a
    ValueError with it on every device. With the GPU machine's torch build they killed the
    process (SIGSEGV) while streaming the number into the message."""
    i64 = dict(dtype=torch.int64, device=device)
    f32 = dict(device=device)
    bad = [
        (lambda: ops.token_bincount(torch.zeros(1, 3, **i64), -1), r"vocab_size must be in \[0, \d+\], got -1"),
        (lambda: ops.token_bincount(torch.zeros(3, **i64), 4), "token_ids must be 2-D, got shape \\[3\\]"),
        (lambda: ops.token_bincount_update_(torch.zeros(2, 3, dtype=torch.int32, device=device), torch.zeros(2, **i64),
                                            torch.zeros(1, **i64)),
         "req_indices and token_ids must have the same length, got 2 and 1"),
        (lambda: ops.apply_token_bitmask_(torch.zeros(3, 8, **f32), torch.zeros(2, 1, dtype=torch.int32, device=device),
                                          None), r"bitmask must have one row per logits row \(3\), got 2"),
    ]
    for call, words in bad:
        with pytest.raises(ValueError, match=words):
            call()


def test_a_vocabulary_wider_than_max_vocab_is_refused(device):
    """The CUDA kernels keep in-row offsets in int32, so every op refuses more than MAX_VOCAB
    columns, on every device, in the wrapper and in a direct torch.ops call, with the argument
    named (before, CUDA failed at launch with 'invalid argument' and CPU took them, so counts
    token_bincount made on CPU could not be penalised on CUDA). Rows of width MAX_VOCAB + 1
    cost nothing here: the tensors have 0 rows."""
    from specops.ops._checks import MAX_VOCAB
    wide = MAX_VOCAB + 1
    logits = torch.empty(0, wide, device=device)
    counts = torch.empty(0, wide, dtype=torch.int32, device=device)
    mask = torch.empty(0, wide, dtype=torch.bool, device=device)
    rows = torch.empty(0, device=device)
    ids = torch.empty(0, dtype=torch.int64, device=device)
    calls = {
        "token_bincount": (lambda: token_bincount(ids.view(0, 0), wide), lambda: ops.token_bincount(ids.view(0, 0), wide),
                           f"vocab_size must be in \\[0, {MAX_VOCAB}\\], got {wide}"),
        "token_bincount_update_": (lambda: token_bincount_update_(counts, ids, ids),
                                   lambda: ops.token_bincount_update_(counts, ids, ids), "counts must have at most"),
        "apply_penalties_": (lambda: apply_penalties_(logits, mask, counts, rows, rows, rows),
                             lambda: ops.apply_penalties_(logits, mask, counts, rows, rows, rows), "logits must have at most"),
        "apply_repetition_penalties_": (lambda: apply_repetition_penalties_(logits, mask, mask, rows),
                                        lambda: ops.apply_repetition_penalties_(logits, mask, mask, rows),
                                        "logits must have at most"),
        "apply_token_bitmask_": (lambda: apply_token_bitmask_(logits, torch.empty(0, 1, dtype=torch.int32, device=device)),
                                 lambda: ops.apply_token_bitmask_(logits, torch.empty(0, 1, dtype=torch.int32, device=device),
                                                                  None), "logits must have at most"),
    }
    for name, (wrapper, direct, words) in calls.items():
        for call in (wrapper, direct):
            with pytest.raises(ValueError, match=f"{name}: {words}"):
                call()
    assert token_bincount(ids.view(0, 0), MAX_VOCAB).shape == (0, MAX_VOCAB)


def step(ids, counts, req, tok, logits, prompt_mask, rep, freq, pres, bitmask, indices):
    """One decode step's worth of the ops, as an engine would chain them."""
    built = token_bincount(ids, logits.shape[1])
    token_bincount_update_(counts, req, tok)
    apply_penalties_(logits, prompt_mask, counts, rep, freq, pres)
    apply_token_bitmask_(logits, bitmask, indices)
    return built


def step_torch(ids, counts, req, tok, logits, prompt_mask, rep, freq, pres, bitmask, indices):
    built = token_bincount_torch(ids, logits.shape[1])
    token_bincount_update_torch(counts, req, tok)
    apply_penalties_torch(logits, prompt_mask, counts, rep, freq, pres)
    apply_token_bitmask_torch(logits, bitmask, indices)
    return built


def step_inputs(device, rows=4, vocab=96):
    return [torch.randint(-1, vocab, (rows, 11), device=device), torch.randint(0, 2, (rows, vocab), dtype=torch.int32, device=device),
            torch.tensor([0, 3, 3], device=device), torch.tensor([5, 7, 7], device=device), torch.randn(rows, vocab, device=device),
            torch.rand(rows, vocab, device=device) < 0.2, torch.rand(rows, device=device) + 0.5, torch.rand(rows, device=device),
            torch.rand(rows, device=device), torch.randint(-(2**31), 2**31 - 1, (rows, 3), dtype=torch.int32, device=device),
            torch.tensor([3, 1], device=device)]


def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    inputs = step_inputs(device)
    expected = [x.clone() for x in inputs]
    built_ref = step_torch(*expected)
    got = [x.clone() for x in inputs]
    built = compiled(*got)
    assert torch.equal(built, built_ref)
    for a, b in zip(got, expected):  # counts and logits mutated in place like the reference
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay():
    """Captured once, replayed on fresh inputs copied into the same buffers: no host sync inside."""
    static = step_inputs("cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*[x.clone() for x in static])  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        built = step(*static)
    for _ in range(2):
        fresh = step_inputs("cuda")
        for s, f in zip(static, fresh):
            s.copy_(f)
        expected = [x.clone() for x in fresh]
        built_ref = step_torch(*expected)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(built, built_ref)
        for a, b in zip(static, expected):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_fake_kernels_check_their_arguments_as_the_wrappers_do():
    # a direct torch.ops call on meta tensors (what torch.compile traces with) got an output of a
    # made-up shape: a 3-D float token_ids gave a [3, 7] histogram
    meta = dict(device="meta")
    f32, i32 = torch.float32, torch.int32
    bad = [
        (ops.token_bincount, (torch.empty(3, 4, 5, **meta), 7), TypeError, "token_ids must be int32 or int64"),
        (ops.token_bincount, (torch.empty(3, 4, dtype=torch.int64, **meta), -1), ValueError, "vocab_size must be in"),
        (ops.token_bincount_update_, (torch.empty(3, 8, dtype=i32, **meta), torch.empty(2, dtype=torch.int64, **meta),
                                      torch.empty(3, dtype=torch.int64, **meta)), ValueError, "token_ids must have shape"),
        (ops.apply_penalties_, (torch.empty(3, 8, **meta), torch.empty(3, 8, dtype=torch.bool, **meta),
                                torch.empty(3, 8, dtype=i32, **meta), torch.empty(3, **meta), torch.empty(2, **meta),
                                torch.empty(3, **meta)), ValueError, "frequency_penalties must have shape"),
        (ops.apply_repetition_penalties_, (torch.empty(3, 8, **meta), torch.empty(3, 8, dtype=torch.bool, **meta),
                                           torch.empty(3, 9, dtype=torch.bool, **meta), torch.empty(3, **meta)),
         ValueError, "output_mask must have shape"),
        (ops.apply_token_bitmask_, (torch.empty(3, 8, **meta), torch.empty(2, 1, dtype=i32, **meta), None),
         ValueError, "without indices, bitmask must have one row per logits row"),
        (ops.apply_token_bitmask_, (torch.empty(3, 8, dtype=torch.int64, **meta), torch.empty(3, 1, dtype=i32, **meta),
                                    None), TypeError, "logits must be float32"),
    ]
    for op, args, exc, words in bad:
        with pytest.raises(exc, match=words):
            op(*args)
    assert ops.token_bincount(torch.empty(3, 4, dtype=torch.int64, **meta), 7).shape == (3, 7)
    ops.apply_token_bitmask_(torch.empty(3, 8, dtype=f32, **meta), torch.empty(3, 1, dtype=i32, **meta), None)
