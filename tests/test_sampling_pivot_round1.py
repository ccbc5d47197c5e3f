"""Round 1 of the pivot rounds summed by the collect launch (`pivot_round1_in_collect`).

The collect launch's programs of the pivot rows (mode PIVOT_PENDING) sum round 1's sub-chunk
masses (sampling_select.pivot_collect_program) and the rounds start with round 1's draw. The
sums must be the pivot mass kernel's bit for bit (the same `pivot_sub_chunk_mass`): these tests
compare round 1's masses, as round 1's draw reads them, with the knob on and off, and the tokens,
modes, thresholds and log_norm, and a seeded row's token alone and in a batch. Under the
interpreter every sum is one numpy sum whatever the kernel, so there the masses check which
tokens each sub-chunk holds, the skipped sub-chunks and every row of the launch; the order of
the additions is checked by tests/test_triton_sm90_compile.py (the two sums' layouts) and on
CUDA by the same tests at V = 128256.
"""

import pytest
import torch
from test_sampling_pivot import _args, _pivot_mask, mixed_pivot_batch

from specops.sampling import sample
from specops.triton_kernels import sampling_pivot as sp
from specops.triton_kernels import sampling_select as sel
from specops.triton_kernels.sampling_pivot import PIVOT_ROUNDS
from specops.triton_kernels.sampling_topk_topp import draw_sub_chunk

CUDA = torch.cuda.is_available()
# the collect launch's 2048-token blocks are the rounds' sub-chunks from V = 8193 on; 8200 leaves
# a last sub-chunk of 8 tokens
V = 128256 if CUDA else 8200
PENDING = int(sel.PIVOT_PENDING.value)


class _RoundOneDraw:
    """`_pivot_draw_kernel`, recording (st_i, mass) as round 1's draw reads them (cloned on the
    launching stream, before the draw), and `_pivot_mass_kernel`'s launches."""

    def __init__(self, kernel, seen):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kw):
            if kw["ROUND"] == 1:
                self.seen.append((args[6].clone(), args[8].clone()))
            return self.kernel[grid](*args, **kw)
        return launch


class _Counted:
    def __init__(self, kernel, launched):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        self.launched.append(grid)
        return self.kernel[grid]


def _round_one(monkeypatch, args, **opts):
    """(result, round 1's st_i and mass, mass launches) of one tokens-only call on `args` (`_args`)."""
    seen, launched = [], []
    with monkeypatch.context() as mp:
        mp.setattr(sp, "_pivot_draw_kernel", _RoundOneDraw(sp._pivot_draw_kernel, seen))
        mp.setattr(sp, "_pivot_mass_kernel", _Counted(sp._pivot_mass_kernel, launched))
        res = sample(*args, backend="triton", distribution=False, **opts)
    if CUDA:
        torch.cuda.synchronize()
    (state, mass), = seen
    return res, state, mass, len(launched)


# each picks another collect launch: `_collect_direct_kernel` deciding the direct rows (a batch
# of at most 16 rows), `_collect_kernel` (no spread rows) two programs c a program, and
# `_collect_direct_kernel` with the spread rows' branch
LAUNCHES = [dict(search=True), dict(search=True, direct_in="plan", spread_kmax=0, collect_group=2),
            dict(search=True, direct_in="plan")]


@pytest.mark.parametrize("opts", LAUNCHES)
def test_round_one_in_collect_gives_the_mass_kernels_masses_and_tokens(opts, monkeypatch):
    assert draw_sub_chunk(V) == 2048
    R = 14   # (at most 16 rows: the direct rows decided in the collect launch, LAUNCHES[0])
    logits, md = mixed_pivot_batch(torch.Generator().manual_seed(20261206), R, V)
    paths_off, paths_on = {}, {}
    off, st_off, mass_off, n_off = _round_one(monkeypatch, _args(logits, md), pivot_round1_in_collect=False,
                                              paths=paths_off, **opts)
    on, st_on, mass_on, n_on = _round_one(monkeypatch, _args(logits, md), pivot_round1_in_collect=True,
                                          paths=paths_on, **opts)
    assert (n_off, n_on) == (PIVOT_ROUNDS, PIVOT_ROUNDS - 1)       # round 1's mass launch left out
    pivot = _pivot_mask(md)
    assert torch.equal(st_off[pivot], st_on[pivot])
    pending = st_on[:, 0] == PENDING
    assert bool(pending.any()) and bool((pending <= pivot).all())
    a, b = mass_off[pending], mass_on[pending]
    assert torch.equal(a, b), (a - b).abs().max()                  # bit for bit (-0.0 never stored)
    assert bool((a == 0).any()) and bool((a > 0).any())            # skipped sub-chunks and summed ones
    assert torch.equal(off.tokens, on.tokens)
    assert torch.equal(paths_off["mode"], paths_on["mode"])
    assert bool((paths_on["mode"] == int(sel.PIVOTED.value)).any())


def test_round_one_in_collect_keeps_thresholds_and_batch_invariance(monkeypatch):
    R = 40 if CUDA else 14
    logits, md = mixed_pivot_batch(torch.Generator().manual_seed(7), R, V)
    # with the thresholds no row takes the pivot rounds (none launches), so the knob changes nothing
    launched = []
    with monkeypatch.context() as mp:
        mp.setattr(sp, "_pivot_draw_kernel", _Counted(sp._pivot_draw_kernel, launched))
        mp.setattr(sp, "_pivot_mass_kernel", _Counted(sp._pivot_mass_kernel, launched))
        full = [sample(*_args(logits, md), backend="triton", search=True, pivot_round1_in_collect=on)
                for on in (False, True)]
    assert launched == [], launched
    for f in ("tokens", "threshold", "row_max", "log_norm"):
        x, y = getattr(full[0], f), getattr(full[1], f)
        assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num()), f
    # a seeded pivot row's token: alone with round 1 in its collect launch, in the batch with
    # it and without it, and without a collect launch at all
    batch = {on: sample(*_args(logits, md), backend="triton", distribution=False, search=True,
                        pivot_round1_in_collect=on).tokens for on in (False, True)}
    assert torch.equal(batch[False], batch[True])
    pivot_rows = _pivot_mask(md).nonzero().flatten().tolist()
    for r in pivot_rows[:3] if not CUDA else pivot_rows:
        one = [t[r:r + 1] for t in _args(logits, md)]
        alone, _, _, n = _round_one(monkeypatch, one, search=True, pivot_round1_in_collect=True)
        assert n == PIVOT_ROUNDS - 1 and int(alone.tokens[0]) == int(batch[True][r]), r
        no_collect = sample(*one, backend="triton", distribution=False, search=False).tokens
        assert int(no_collect[0]) == int(batch[True][r]), r


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("R", [300])
def test_cuda_round_one_in_collect_beside_the_search(R, monkeypatch):
    # the default at 300 rows: round 1 in the collect launch, the rounds on their stream forked
    # after it; the same masses and tokens as the rounds' own round 1 (forked after the plan)
    logits, md = mixed_pivot_batch(torch.Generator().manual_seed(R), R, V)
    off, st_off, mass_off, n_off = _round_one(monkeypatch, _args(logits, md), search=True,
                                              pivot_round1_in_collect=False)
    auto, st_on, mass_on, n_on = _round_one(monkeypatch, _args(logits, md), search=True)
    assert (n_off, n_on) == (PIVOT_ROUNDS, PIVOT_ROUNDS - 1)
    pivot = _pivot_mask(md)
    pending = st_on[:, 0] == PENDING
    assert torch.equal(st_off[pivot], st_on[pivot]) and bool(pending.any())
    assert torch.equal(mass_off[pending], mass_on[pending])
    assert torch.equal(off.tokens, auto.tokens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        got = sample(*_args(logits, md), backend="triton", distribution=False, search=True)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got.tokens, off.tokens)
