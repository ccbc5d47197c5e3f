"""The shorter steady sampling step gives exactly what the longer one gave: the one-launch
readback packing equals the casts + cat (Triton interpreter on CPU), the transposed readback
unpacks to the same Logprob entries as a per-row reference, logit_bias by one index_add_
equals gather + add + scatter bit for bit, and a steady step that skips building its keys
(because the graph holds them) is only ever told so when the keys really grew by one."""

import random

import pytest
import torch

from specops import rng
from specops.engine.input_batch import InputBatch
from specops.engine.request import Logprob, Request
from specops.engine.readback import pack_readback, pack_readback_torch, unpack_readback
from specops.engine.sampling import BatchSampler
from specops.engine.sampling_params import SamplingParams
from specops.sampling.logits_processors import LogitBiasLogitsProcessor, LogitsRows
from specops.sampling.logits_processors.interface import BatchUpdate
from specops.sampling.logprobs import LogprobsTensors

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (conftest)


def random_lp(n_rows: int, k: int, device, g: torch.Generator) -> tuple[torch.Tensor, LogprobsTensors]:
    tokens = torch.randint(0, 151936, (n_rows,), generator=g)
    ids = torch.randint(0, 151936, (n_rows, k), generator=g)
    vals = torch.randn(n_rows, k, generator=g) * 30
    ranks = torch.randint(1, 151936, (n_rows,), generator=g)
    if n_rows > 2:  # an invalid row, a -inf value, ids near 2**53
        tokens[2], ids[2], vals[2], ranks[2] = -1, -1, float("nan"), -1
        vals[0, -1] = float("-inf")
        ids[1, 0] = 2**53 - 1
    to = lambda t: t.to(device)  # noqa: E731
    return to(tokens), LogprobsTensors(to(ids), to(vals), to(ranks))


@pytest.mark.parametrize("n_rows,k", [(0, 2), (1, 1), (5, 2), (7, 4), (129, 3), (300, 6)])
def test_pack_kernel_equals_torch(n_rows, k):
    from specops.triton_kernels.readback_pack import pack_readback_triton

    g = torch.Generator().manual_seed(n_rows * 10 + k)
    tokens, lp = random_lp(n_rows, k, KERNEL_DEVICE, g)
    want = pack_readback_torch(tokens, lp)
    exact = dict(rtol=0, atol=0, equal_nan=True)
    got = pack_readback_triton(tokens, lp.token_ids, lp.ranks, lp.logprobs)
    assert got.shape == want.shape == (2 * k + 2, n_rows) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, **exact)
    out = torch.full_like(want, 7.0)
    keys = torch.randint(-2**62, 2**62, (2, n_rows), generator=g).to(KERNEL_DEVICE)
    keys_before = keys.clone()
    assert pack_readback_triton(tokens, lp.token_ids, lp.ranks, lp.logprobs, out=out, advance_keys=keys) is out
    torch.testing.assert_close(out, want, **exact)
    assert torch.equal(keys, keys_before + 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_lp", [True, False])
def test_pack_readback_advances_the_keys(device, with_lp):
    """pack_readback's contract on every backend: the packing, and the keys + 1 (with or without logprobs)."""
    tokens, lp = random_lp(6, 3, device, torch.Generator().manual_seed(1))
    keys = torch.arange(12, device=device).reshape(2, 6)
    packed = pack_readback(tokens, lp if with_lp else None, advance_keys=keys)
    assert torch.equal(keys, torch.arange(1, 13, device=device).reshape(2, 6))
    if with_lp:
        torch.testing.assert_close(packed, pack_readback_torch(tokens, lp), rtol=0, atol=0, equal_nan=True)
    else:
        assert packed is None


def test_pack_kernel_checks():
    from specops.triton_kernels.readback_pack import pack_readback_triton

    tokens, lp = random_lp(4, 2, KERNEL_DEVICE, torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="logprobs"):
        pack_readback_triton(tokens, lp.token_ids, lp.ranks, lp.logprobs.double())
    with pytest.raises(ValueError, match="shapes"):
        pack_readback_triton(tokens, lp.token_ids[:3], lp.ranks, lp.logprobs)
    with pytest.raises(ValueError, match="out must be"):
        pack_readback_triton(tokens, lp.token_ids, lp.ranks, lp.logprobs,
                             out=torch.empty(4, 6, dtype=torch.float64, device=KERNEL_DEVICE))


def reference_entries(tokens, lp, num):
    """Per-row Logprob entries straight from the tensors (the pre-packing way)."""
    out = []
    for i, n in enumerate(num):
        if n is None:
            out.append(None)
            continue
        ids, vals = lp.token_ids[i].tolist(), lp.logprobs[i].tolist()
        out.append(Logprob(ids[0], vals[0], int(lp.ranks[i]), dict(zip(ids[1:n + 1], vals[1:n + 1]))))
    return tokens.tolist(), out


def same(a, b) -> bool:  # equality with NaN == NaN
    return a == b or (a != a and b != b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num", [[1] * 9, [0] * 9, [3] * 9, [None, 0, 3, 1, None, 2, 3, 3, 1], [None] * 9])
def test_unpack_equals_reference(device, num):
    k = 4
    tokens, lp = random_lp(9, k, device, torch.Generator().manual_seed(5))
    got_tokens, got = unpack_readback(pack_readback(tokens, lp).cpu().numpy(), num)
    want_tokens, want = reference_entries(tokens.cpu(), LogprobsTensors(*(t.cpu() for t in (
        lp.token_ids, lp.logprobs, lp.ranks))), num)
    assert got_tokens == want_tokens and all(type(t) is int for t in got_tokens)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.token_id, a.rank, list(a.top)) == (b.token_id, b.rank, list(b.top))
            assert type(a.token_id) is int and type(a.rank) is int and type(a.logprob) is float
            assert same(a.logprob, b.logprob) and all(same(a.top[t], v) for t, v in b.top.items())
    if num[0] is not None and num.count(num[0]) == len(num):  # distinct dicts, not one shared
        assert len({id(e.top) for e in got}) == len(got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "row_strided"])
def test_logit_bias_index_add_equals_gather_add_scatter(device, dtype, layout):
    V = 257
    proc = LogitBiasLogitsProcessor(8, V, device)
    sp = lambda b: SamplingParams(logit_bias=b)  # noqa: E731
    proc.update_state(BatchUpdate(4, added=[(0, sp({1: 1.25, 256: -3.0}), [], []), (2, sp({4: -1e-3, 5: 2.0}), [], []),
                                            (3, sp({0: 0.1}), [], [])]))
    g = torch.Generator().manual_seed(2)
    base = (torch.randn(6, V + 3, generator=g) * 10).to(device=device, dtype=dtype)
    for rows in (LogitsRows([0, 1, 2, 3], [0] * 4), LogitsRows([2, 2, 0, 3, 1, 0], [0] * 6)):
        x = base.clone()[:len(rows), :V]  # rows of stride V + 3
        if layout == "contiguous":
            x = x.contiguous()
        want = x.clone()
        for r, index in enumerate(rows.req_indices):  # one rounded addition per (row, token)
            for t, v in zip(*proc.state.get(index, ([], []))):
                want[r, t] = want[r, t] + torch.tensor(v, dtype=dtype, device=device)
        got = proc.apply(x, rows)
        assert got is x and x.is_contiguous() == (layout == "contiguous")
        assert torch.equal(got, want)
        assert (proc._cache[1].dim() == 1) == (layout == "contiguous" and dtype == torch.float32)  # index_add_ path


def test_logit_bias_takes_one_index_add_on_contiguous_logits():
    """One op on the logits (index_add_) per step: no gather, add and scatter."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    proc = LogitBiasLogitsProcessor(4, 50, "cpu")
    proc.update_state(BatchUpdate(2, added=[(0, SamplingParams(logit_bias={3: 1.0, 7: -1.0}), [], [])]))
    x = torch.zeros(2, 50)
    proc.apply(x, LogitsRows([0, 1], [0, 0]))  # builds the cached index
    with Ops() as ops:
        proc.apply(x, LogitsRows([0, 1], [0, 0]))
    assert [n for n in ops.names if n not in ("view.default",)] == ["index_add_.default"], ops.names
    assert x[0, 3] == 2.0 and x[0, 7] == -2.0 and int((x != 0).sum()) == 2


def steady_batch(n: int, V: int = 300):
    sampler = BatchSampler(8, V, "cpu", seed=11, eos_token_ids=[2])
    batch = InputBatch(8, 4)
    r = random.Random(0)
    reqs = [Request(f"r{i}", [r.randrange(V) for _ in range(4)],
                    SamplingParams(temperature=0.9, top_k=30, seed=i if i % 2 else None, logit_bias={5: 1.0},
                                   repetition_penalty=1.1, logprobs=1))
            for i in range(n)]
    sampler.update_state(batch.update(reqs), batch.reqs[:batch.num_reqs])
    return sampler


def test_keys_advanced_only_when_the_keys_grew_by_one():
    """Whenever `_keys_advanced` says so, this step's keys are the last steady step's plus one
    (what a replayed graph holds); jumps, other steps in between and a wrapping counter are not."""
    sampler = steady_batch(4)
    sampler._batch_metadata()
    pos = [10, 20, 30, 40]
    last = None
    seen = []
    for step in range(12):
        if step == 5:
            pos = [p + 3 for p in pos]  # a skipped position
        elif step == 8:
            sampler._host_step = (1 << 32) - 1  # the next step's low 32 bits wrap to 0
            last = None
        else:
            pos = [p + 1 for p in pos]
        if step == 3:
            sampler._next_positions = None  # what a non-steady step or verify leaves
        adv = sampler._keys_advanced(pos)
        keys = sampler._steady_keys(pos)
        if adv:
            assert keys == [[k + 1 for k in row] for row in last], step
        seen.append(adv)
        last = keys
        sampler._advance()
    assert seen == [False, True, True, False, True, False, True, True, False, False, True, True], seen
    assert sampler._host_step & rng._M32 == 3


class EmulatedGraph:
    """A CPU stand-in of SteadyStepGraph with its contract: after the first call with a key the
    keys live in the 'graph', the body adds one to them, and they are reloaded only when not advanced."""

    def __init__(self):
        self.enabled, self.keys, self.key, self.replays, self.loads = True, None, None, 0, 0

    def input_buffer(self, shape, dtype):
        return None

    def reset(self):
        self.key = None

    def run(self, key, logits, keys_host, body, advanced=False):
        if key is None:
            self.reset()
            return None
        if key != self.key or not advanced:
            self.keys = torch.tensor(keys_host() if callable(keys_host) else keys_host)
            self.loads += 1
        self.key = key
        out = body(logits, self.keys)
        self.replays += 1
        return out


def test_steady_steps_with_held_keys_sample_what_eager_samples():
    """The engine's steady host path (keys built only when the graph does not hold them, LogitsRows
    only on demand, cached num_logprobs) draws the same tokens and logprobs as the general path."""
    V, n = 300, 5
    torch.manual_seed(0)
    runs = []
    for emulate in (False, True):
        sampler = steady_batch(n, V)
        if emulate:
            sampler.graph = EmulatedGraph()
        pos = [7 + 2 * i for i in range(n)]
        steps = []
        for step in range(9):
            pos = [p + (2 if step == 4 else 1) for p in pos]
            logits = torch.randn(n, V, generator=torch.Generator().manual_seed(step))
            if step == 6:  # a step over other rows in between: drops the graph and the held keys
                toks, entries = sampler.sample_to_host(logits[[0, 2]].clone(), [0, 2], [pos[0], pos[2]])
                assert len(toks) == 2 and [len(e.top) for e in entries] == [1, 1]  # the requests' logprobs=1
                steps.append((toks, entries))
                continue
            steps.append(sampler.sample_to_host(logits.clone(), list(range(n)), pos))
        runs.append((steps, sampler))
    (eager, _), (held, s) = runs
    assert s.graph.replays == 8 and s.graph.loads == 3  # first step, the jump, after the other rows
    assert repr(held) == repr(eager)
