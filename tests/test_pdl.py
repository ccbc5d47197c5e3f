"""Programmatic dependent launch (PDL) of the sampling and rejection kernel chains: off on
the CPU and when SPECOPS_PDL=0, on for every chain kernel of a Hopper GPU, and the same
tokens, thresholds and output rows either way, eagerly and replayed from a CUDA graph."""

import pytest
import torch

from specops.sampling import sample
from specops.spec_decode import rejection_sample
from specops.triton_kernels import rejection_recover as rr
from specops.triton_kernels import rejection_sample as rs
from specops.triton_kernels import sampling_common as sc
from specops.triton_kernels import sampling_stats as st
from specops.triton_kernels import sampling_topk_topp as tk

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] >= 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="PDL needs a CUDA device of compute capability >= 9")

SAMPLING_KERNELS = [(st, "_row_stats_kernel"), (tk, "_plan_kernel"), (tk, "_refine_kernel"),
                    (tk, "_refine_combine_kernel"), (tk, "_collect_kernel"), (tk, "_collect_direct_kernel"),
                    (tk, "_direct_rows_kernel"), (tk, "_finish_kernel")]
FIELDS = ("tokens", "threshold", "row_max", "log_norm")   # of a SampleResult
REJECTION_KERNELS = [(rs, "_rejection_sample_kernel"), (rs, "_rejection_finalize_kernel"),
                     (rr, "_residual_mass_kernel"), (rr, "_recover_race_kernel")]


class _RecordingKernel:
    """A Triton kernel whose launches record (name, launch_pdl, PDL)."""

    def __init__(self, kernel, name, log):
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.log.append((self.name, kwargs.get("launch_pdl"), kwargs.get("PDL")))
            return launch(*args, **kwargs)
        return call


def _record(monkeypatch, kernels) -> list:
    log = []
    for module, name in kernels:
        monkeypatch.setattr(module, name, _RecordingKernel(getattr(module, name), name, log))
    return log


def test_pdl_is_off_on_the_cpu_and_when_disabled(monkeypatch):
    monkeypatch.delenv("SPECOPS_PDL", raising=False)
    assert not sc.pdl_enabled(torch.zeros(1))
    assert sc.pdl_kwargs(torch.zeros(1)) == {}   # no launch_pdl keyword at all: older Tritons lack it
    if CUDA:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        assert sc.pdl_enabled(torch.zeros(1, device="cuda")) == HOPPER
        monkeypatch.setenv("SPECOPS_PDL", "0")
        assert not sc.pdl_enabled(torch.zeros(1, device="cuda"))


@pytest.mark.skipif(CUDA, reason="CPU tensors reach the Triton kernels through the interpreter only (CI)")
def test_cpu_launches_go_without_pdl(monkeypatch):
    # under the interpreter no kernel may ask for PDL (gdc_wait has no interpreter form)
    log = _record(monkeypatch, SAMPLING_KERNELS)
    x = torch.randn(3, 500)
    inv = torch.tensor([1.0, 1.25, -1.0])
    k = torch.tensor([0, 20, 0], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 1.0])
    sample(x, inv, k, p, None, torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]), backend="triton", tile=16, cap=64)
    assert log and all(not pdl and not launch for _, launch, pdl in log), log


def test_launch_without_a_filter_is_pass_1_and_the_plan(monkeypatch):
    # no filter tensor: the plan decides every row (greedy, unfiltered draw, an invalid row's -1),
    # so no finish launch follows it; the tokens are the reference's
    monkeypatch.setenv("SPECOPS_PDL", "0")
    log = _record(monkeypatch, SAMPLING_KERNELS)
    dev = "cuda" if CUDA else "cpu"
    if CUDA:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5, 700, generator=g) * 2).to(dev)
    x[3] = float("nan")
    inv = torch.tensor([1.0, 0.5, -1.0, 1.0, 1.3], device=dev)
    seeds, pos = torch.arange(5, device=dev) + 3, torch.arange(5, device=dev) * 2
    kw = {} if CUDA else dict(tile=16, cap=64)
    got = sample(x, inv, None, None, None, seeds, pos, backend="triton", **kw)
    assert [name for name, _, _ in log] == ["_row_stats_kernel", "_plan_kernel"], log
    want = sample(x, inv, None, None, None, seeds, pos, backend="torch")
    assert torch.equal(got.tokens.cpu(), want.tokens.cpu()), (got.tokens, want.tokens)
    assert got.tokens[3].item() == -1


def _mixed_rows(B: int, V: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, V, device="cuda", generator=g) * 2
    x.scatter_add_(1, torch.randint(0, V, (B, 32), device="cuda", generator=g),
                   6 + 6 * torch.rand(B, 32, device="cuda", generator=g))
    mix = [(0.8, 40, 0.95, 0.0), (1.0, 0, 0.9, 0.0), (0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.05),
           (1.0, 0, 1.0, 0.0), (0.6, 20, 0.8, 0.02), (1.0, 500, 0.95, 0.0)]
    rows = [mix[i % len(mix)] for i in range(B)]
    inv = torch.tensor([1 / t if t > 0 else -1.0 for t, *_ in rows], device="cuda")
    k = torch.tensor([r[1] for r in rows], dtype=torch.int32, device="cuda")
    p = torch.tensor([r[2] for r in rows], device="cuda")
    mp = torch.tensor([r[3] for r in rows], device="cuda")
    seeds = torch.arange(B, device="cuda") * 13 + 5
    pos = torch.arange(B, device="cuda") * 3 + 100
    return x.to(dtype), inv, k, p, mp, seeds, pos


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 8, 37])
def test_sampling_chain_is_the_same_with_and_without_pdl(monkeypatch, B, dtype):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = _mixed_rows(B, 128256, dtype, seed=B)
    log = _record(monkeypatch, SAMPLING_KERNELS)
    monkeypatch.setenv("SPECOPS_PDL", "1")
    with_pdl = sample(*args, backend="triton")
    names = {name for name, _, _ in log}
    # MIX rows with top-p and min-p need the bracket search: refine and collect run too (the
    # collect launch that also decides the small top-k rows up to DEFER_ROWS rows, else the plain one)
    assert {"_row_stats_kernel", "_plan_kernel", "_refine_kernel", "_refine_combine_kernel",
            "_finish_kernel"} <= names, names
    assert names & {"_collect_kernel", "_collect_direct_kernel"}, names
    # the small top-k rows on a side stream (DIRECT_BESIDE) where the launch has the search:
    # their kernel follows an event wait and goes plain; the finish of their fallback rows
    # follows it on that stream, the main finish the collect launch (SIDE_FINISH: the join
    # comes after it), both with PDL
    plain = [name for name, launch, pdl in log if not (launch is True and pdl is True)]
    assert plain == (["_direct_rows_kernel"] if "_direct_rows_kernel" in names else []), log
    if "_direct_rows_kernel" in names:
        assert [name for name, _, _ in log].count("_finish_kernel") == 2, log
    log.clear()
    monkeypatch.setenv("SPECOPS_PDL", "0")
    without = sample(*args, backend="triton")
    assert log and all(not launch and not pdl for _, launch, pdl in log), log
    for field in FIELDS:
        assert torch.equal(getattr(with_pdl, field), getattr(without, field)), field

    # captured with PDL and replayed: the same again
    monkeypatch.setenv("SPECOPS_PDL", "1")
    sample(*args, backend="triton")   # compiled outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = sample(*args, backend="triton")
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for field in FIELDS:
        assert torch.equal(getattr(captured, field), getattr(without, field)), field


@needs_hopper
@pytest.mark.parametrize("B", [1, 37])
def test_pivot_chain_is_the_same_with_and_without_pdl(monkeypatch, B):
    # the tokens-only draw (top-p alone by pivot rejection): its round kernels launch with PDL
    # like the rest of the chain, and give the same tokens eagerly and replayed from a graph.
    # With the rounds on their own stream (pivot_beside, the default) the launches that
    # follow an event wait rather than a kernel of their stream go plain: the first mass
    # launch on the side stream and the small top-k rows' kernel on theirs (DIRECT_BESIDE);
    # the finish launches of the side streams and the main finish (before the join,
    # SIDE_FINISH) follow a kernel of their stream.
    from specops.triton_kernels import sampling_pivot as sp
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = _mixed_rows(B, 128256, torch.float32, seed=B + 1)
    log = _record(monkeypatch, SAMPLING_KERNELS + [(sp, "_pivot_mass_kernel"), (sp, "_pivot_draw_kernel")])
    monkeypatch.setenv("SPECOPS_PDL", "1")
    serial = sample(*args, backend="triton", distribution=False, pivot_beside=False, direct_in="plan")
    assert {"_pivot_mass_kernel", "_pivot_draw_kernel"} <= {name for name, _, _ in log}
    assert all(launch is True and pdl is True for _, launch, pdl in log), log
    log.clear()
    with_pdl = sample(*args, backend="triton", distribution=False, pivot_beside=True)
    plain = [name for name, launch, pdl in log if not (launch is True and pdl is True)]
    direct = ["_direct_rows_kernel"] if "_direct_rows_kernel" in {name for name, _, _ in log} else []
    assert plain == direct + ["_pivot_mass_kernel"], log
    assert [name for name, _, _ in log].count("_finish_kernel") == 2 + len(direct), log
    assert [name for name, _, _ in log].count("_pivot_mass_kernel") > 1, log   # later rounds: PDL
    assert torch.equal(with_pdl.tokens, serial.tokens)
    monkeypatch.setenv("SPECOPS_PDL", "0")
    without = sample(*args, backend="triton", distribution=False)
    assert torch.equal(with_pdl.tokens, without.tokens)
    monkeypatch.setenv("SPECOPS_PDL", "1")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = sample(*args, backend="triton", distribution=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.tokens, without.tokens)


def _rejection_case(num_reqs: int, K: int, V: int, draft_probs: bool, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = dict(device="cuda", generator=g)
    total = num_reqs * K
    logits = torch.randn(total, V, **dev) * 3
    drafts = torch.where(torch.rand(total, **dev) < 0.6, logits.argmax(1), torch.randint(0, V, (total,), **dev))
    kw = dict(temperature=torch.rand(num_reqs, **dev) + 0.5, is_greedy=torch.rand(num_reqs, **dev) < 0.3,
              seeds=torch.randint(0, 2**62, (num_reqs,), **dev), has_seed=torch.rand(num_reqs, **dev) < 0.5,
              positions=torch.randint(0, 2**31, (num_reqs,), **dev), step=torch.tensor([7], device="cuda"),
              engine_seed=99)
    if draft_probs:
        kw["draft_probs"] = (torch.softmax(torch.randn(total, V, **dev) * 3, 1) + torch.softmax(logits, 1)) / 2
    cu = torch.arange(1, num_reqs + 1, device="cuda") * K
    return (logits, drafts, cu, K, torch.randint(0, V, (num_reqs,), **dev)), kw


@needs_hopper
@pytest.mark.parametrize("draft_probs", [False, True])
def test_rejection_chain_is_the_same_with_and_without_pdl(monkeypatch, draft_probs):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args, kw = _rejection_case(24, 3, 128256, draft_probs, seed=int(draft_probs))
    log = _record(monkeypatch, REJECTION_KERNELS)
    monkeypatch.setenv("SPECOPS_PDL", "1")
    with_pdl = rejection_sample(*args, backend="triton", **kw)
    names = {name for name, _, _ in log}
    assert {"_rejection_sample_kernel", "_rejection_finalize_kernel"} <= names, names
    if draft_probs:
        assert {"_residual_mass_kernel", "_recover_race_kernel"} <= names, names
    assert all(launch is True and pdl is True for _, launch, pdl in log), log
    log.clear()
    monkeypatch.setenv("SPECOPS_PDL", "0")
    without = rejection_sample(*args, backend="triton", **kw)
    assert log and all(not launch and not pdl for _, launch, pdl in log), log
    assert torch.equal(with_pdl, without)
    assert torch.equal(with_pdl, rejection_sample(*args, backend="torch", **kw))
