"""SamplingMetadata: validation with clear errors, normalisation, short cuts, keys, expand."""

import math
from dataclasses import replace

import pytest
import torch

from specops import rng
from specops.sampling import LogitsRows, SamplingMetadata, inv_temperature

V = 100


def build(n=3, **kw):
    kw.setdefault("vocab_size", V)
    return SamplingMetadata.from_params(kw.pop("temperature", [1.0] * n), **kw)


@pytest.mark.parametrize("kwargs,exc,match", ([
    (dict(temperature=[1.0, -0.5]), ValueError, r"temperature\[1\] must be >= 0"),
    (dict(temperature=[float("nan")]), ValueError, r"temperature\[0\] must be finite"),
    (dict(temperature=["hot"]), TypeError, r"temperature\[0\] must be a real number"),
    (dict(temperature=[1.0, 1e39]), ValueError, r"temperature\[1\] must be <= 3.40"),   # inf in fp32: 1/T = 0
    (dict(repetition_penalties=[1e39, 1.0, 1.0]), ValueError, r"repetition_penalties\[0\] must be <= 3.40"),
    (dict(top_p=[0.0, 1.0, 1.0]), ValueError, r"top_p\[0\] must be in \(0, 1\]"),
    (dict(top_p=[1.0, 1.5, 1.0]), ValueError, r"top_p\[1\] must be in \(0, 1\]"),
    (dict(top_k=[0, -2, 5]), ValueError, r"top_k\[1\] must be >= -1"),
    (dict(top_k=[0, 2.5, 5]), TypeError, r"top_k\[1\] must be an int"),
    (dict(top_k=[True, 0, 0]), TypeError, r"top_k\[0\] must be an int"),
    (dict(min_p=[0.0, 0.0, 1.5]), ValueError, r"min_p\[2\] must be <= 1"),
    (dict(min_p=[-0.1, 0.0, 0.0]), ValueError, r"min_p\[0\] must be >= 0"),
    (dict(top_p=[0.5, 0.5]), ValueError, r"top_p must have one value per row \(3\)"),
    (dict(seeds=[None, 2**63, None]), ValueError, r"seeds\[1\] must be <="),
    (dict(positions=[0, 2**32, 1]), ValueError, r"positions\[1\] must be <="),
    (dict(step=2**63), ValueError, r"step must be <= 9223372036854775807"),   # was torch's bare overflow
    (dict(repetition_penalties=[1.0, 0.0, 1.0]), ValueError, r"repetition_penalties\[1\] must be >= 1.17"),
    (dict(repetition_penalties=[1.0, 1e-40, 1.0]), ValueError, r"repetition_penalties\[1\] must be >= 1.17"),
    (dict(temperature=[1.0, 10**400, 1.0]), ValueError, r"temperature\[1\] must be a finite float, got an int"),
    (dict(frequency_penalties=[0.0, 3.0, 0.0]), ValueError, r"frequency_penalties\[1\] must be <= 2"),
    (dict(presence_penalties=[0.5, 0.0, 0.0]), ValueError, r"prompt_mask .* is required"),
    (dict(allowed_token_ids=[None, [1, V], None]), ValueError, r"allowed_token_ids\[1\] must be <= 99"),
    (dict(allowed_token_ids=[None, [], None]), ValueError, r"allowed_token_ids\[1\] must not be empty"),
    (dict(max_num_logprobs=V + 1), ValueError, r"max_num_logprobs must be <= 100"),
    (dict(vocab_size=0), ValueError, r"vocab_size must be >= 1"),
    (dict(bad_words_token_ids={0: [[1, 2]]}), ValueError, r"output_token_ids"),
    (dict(temperature=1.0), TypeError, r"temperature must be a sequence with one value per row, got float"),
    (dict(top_k=5), TypeError, r"top_k must be a sequence"),
    # a {row: value} dict would give its keys, a set an arbitrary order
    (dict(temperature={0: 0.5, 1: 0.9, 2: 1.0}), TypeError, r"temperature must be a sequence .* got dict"),
    (dict(top_p={0.9, 0.5, 1.0}), TypeError, r"top_p must be a sequence .* got set"),
    (dict(seeds=frozenset([1, 2, 3])), TypeError, r"seeds must be a sequence .* got frozenset"),
    # the penalty state on another device than the metadata's: refused when built, not deep in the Sampler
    (dict(repetition_penalties=[1.2, 1.0, 1.0], prompt_mask=torch.zeros(3, V, dtype=torch.bool, device="meta"),
          output_counts=torch.zeros(3, V, dtype=torch.int32)), ValueError, r"prompt_mask must be on cpu"),
    (dict(repetition_penalties=[1.2, 1.0, 1.0], prompt_mask=torch.zeros(3, V, dtype=torch.bool),
          output_counts=torch.zeros(3, V, dtype=torch.int32, device="meta")), ValueError, r"output_counts must be on cpu"),
] + ([] if torch.cuda.is_available() else [
    (dict(device="cuda"), ValueError, r"device 'cuda': this torch has no CUDA device"),
])))
def test_bad_parameters_are_rejected_with_clear_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        build(**kwargs)


def test_normalisation_and_short_cuts():
    md = build(4, temperature=[0.0, 1e-6, 0.5, 1.0], top_k=[-1, 0, V, 7], top_p=[1.0, 1.0, 0.9, 1.0],
               min_p=[0.0] * 4)
    assert md.temperature.tolist() == [0.0, 0.0, 0.5, 1.0]
    assert md.inv_temperature.tolist() == [-1.0, -1.0, 2.0, 1.0]
    assert md.top_k.tolist() == [0, 0, 0, 7] and md.top_k.dtype == torch.int32
    assert md.min_p is None and md.no_penalties
    assert not md.all_greedy and not md.all_random
    off = build(2, temperature=[0.0, 0.0], top_k=[0, -1], top_p=[1.0, 1.0], repetition_penalties=[1.0, 1.0])
    assert off.all_greedy and off.top_k is None and off.top_p is None and off.no_penalties
    assert build(2, temperature=[0.3, 2.0]).all_random
    assert torch.equal(inv_temperature(torch.tensor([0.0, 4.0])), torch.tensor([-1.0, 0.25]))
    # as documented (no value check: no host sync): negative and NaN temperatures are greedy too
    t = torch.tensor([-0.5, float("nan"), 1e-6, float("inf")])
    assert inv_temperature(t).tolist() == [-1.0, -1.0, -1.0, 0.0]


def test_max_filtered_top_k_bounds_the_filters_of_random_rows():
    # the widest top-k of a random row with any filter; a filter without top-k counts as
    # infinity; greedy rows and unfiltered random rows count 0
    assert build(3).max_filtered_top_k == 0
    assert build(3, temperature=[0.0, 1.0, 1.0], top_k=[500, 0, 40], top_p=[0.5, 1.0, 0.9]).max_filtered_top_k == 40
    assert build(2, top_k=[7, V + 3]).max_filtered_top_k == 7          # top_k >= V is off
    assert build(2, top_k=[7, 0], top_p=[1.0, 0.99]).max_filtered_top_k == math.inf
    assert build(2, top_k=[7, 0], min_p=[0.0, 0.1]).max_filtered_top_k == math.inf
    assert build(2, temperature=[0.0, 0.0], top_p=[0.5, 0.5]).max_filtered_top_k == 0
    rows = build(3, top_k=[3, 9, 0]).expand([0, 0, 1])   # a subset of the rows: the bound holds
    assert rows.max_filtered_top_k == 9


def test_max_top_k_with_top_p_is_the_widest_top_k_of_random_top_p_rows():
    p = 0.9
    assert build(3).max_top_k_with_top_p == 0
    assert build(3, top_k=[90, 0, 40]).max_top_k_with_top_p == 0                         # no top-p: no sort
    both = build(3, temperature=[0.0, 1.0, 1.0], top_k=[90, 0, 40], top_p=[p, p, p])
    assert both.max_top_k_with_top_p == 40                                               # greedy rows: no
    assert build(2, top_k=[7, V + 3], top_p=[p, p]).max_top_k_with_top_p == 7           # top_k >= V is off
    assert build(2, top_k=[7, 30], top_p=[p, 1.0]).max_top_k_with_top_p == 7            # top_k alone: no
    rows = build(3, top_k=[3, 9, 0], top_p=[p, p, p], min_p=[0.1, 0.0, 0.0]).expand([0, 0, 1])
    assert rows.top_k_with_top_p_bound() == 9
    assert replace(rows, min_p=None).top_k_with_top_p_bound() == 9                     # min_p plays no part
    assert replace(rows, min_p=None).expand([1]).top_k_with_top_p_bound() == 9
    changed = replace(rows, top_k=rows.top_k.clone())                                   # not its own: unknown
    assert changed.top_k_with_top_p_bound() is None
    assert replace(rows, top_p=rows.top_p.clone()).top_k_with_top_p_bound() is None


def test_sample_options_raise_the_cap_only_for_wide_top_k_with_top_p():
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels.sampling_topk_topp import DEFAULT_CAP, MAX_AUTO_CAP, cap_for_top_k
    assert cap_for_top_k(0) == cap_for_top_k(DEFAULT_CAP) == DEFAULT_CAP
    assert cap_for_top_k(DEFAULT_CAP + 1) == cap_for_top_k(2 * DEFAULT_CAP) == 2 * DEFAULT_CAP
    assert cap_for_top_k(2 * DEFAULT_CAP + 1) == 4 * DEFAULT_CAP
    assert cap_for_top_k(10**6) == MAX_AUTO_CAP
    wide = build(3, vocab_size=20000, top_k=[2000, 0, 40], top_p=[0.95, 0.9, 1.0])
    assert sample_options(wide, wide.min_p) == {"cap": 2048}
    assert sample_options(wide, wide.min_p, {"cap": 64}) == {"cap": 64}                # an explicit cap stands
    assert sample_options(wide, torch.zeros(3)) == {"cap": 2048}                       # a processor's min_p too
    greedy_wide = build(2, vocab_size=20000, temperature=[0.0, 1.0], top_k=[5000, 30], top_p=[0.9, 1.0])
    assert sample_options(greedy_wide, greedy_wide.min_p) == {"search": False}          # greedy rows never sort
    k_only = build(2, vocab_size=20000, top_k=[5000, 30])
    assert sample_options(k_only, k_only.min_p) == {}                                   # top_k alone: no sort


def test_sample_options_leave_out_the_search_only_when_no_row_needs_it():
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels.sampling_topk_topp import DIRECT_TOP_K
    direct = build(2, vocab_size=1000, top_k=[DIRECT_TOP_K, 20], top_p=[0.9, 1.0], min_p=[0.0, 0.1])
    assert sample_options(direct, direct.min_p) == {"search": False}
    assert sample_options(direct, direct.min_p, {"cap": 64}) == {"cap": 64, "search": False}
    assert sample_options(direct, direct.min_p, {"kmax": 16}) == {   # 20 > 16; 128 <= SPREAD_TOP_K: no refine
        "kmax": 16, "direct_beside": False, "refine": False}
    assert sample_options(direct, direct.min_p, {"search": True}) == {"search": True}
    assert sample_options(direct, direct.min_p.clone()) == {}    # min-p from a processor: unknown
    wide = build(2, vocab_size=1000, top_k=[DIRECT_TOP_K + 1, 0])
    assert sample_options(wide, wide.min_p) == {"direct_beside": False, "refine": False}   # no small top-k row
    assert sample_options(wide, wide.min_p, {"select": False}) == {"select": False, "direct_beside": False}
    assert sample_options(build(1, top_p=[0.9]), None) == {}   # top-p without top-k, whatever V
    # the bound describes the tensors it was computed for: expand keeps it, a replaced filter drops it
    rows = direct.expand([1, 1, 0])
    assert rows.filter_bound(rows.min_p) == DIRECT_TOP_K and sample_options(rows, rows.min_p) == {"search": False}
    for name in ("temperature", "inv_temperature", "top_k", "top_p", "min_p"):
        changed = replace(direct, **{name: getattr(direct, name).clone()})
        assert changed.filter_bound(changed.min_p) is None and sample_options(changed, changed.min_p) == {}, name
        expanded = changed.expand([0])
        assert expanded.filter_bound(expanded.min_p) is None
    unknown = build(1)
    unknown.max_filtered_top_k = None
    assert sample_options(unknown, None) == {}


def test_min_top_k_turns_off_the_direct_rows_stream_only_without_small_top_k_rows():
    # min_top_k bounds the top_k of the random rows from below: when it is above the direct
    # limit no row can take the direct path, and sample_options forks no stream for them
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels.sampling_topk_topp import DIRECT_TOP_K
    big = DIRECT_TOP_K + 1
    assert build(3, vocab_size=1000, temperature=[0.0, 1.0, 1.0], top_k=[5, big, 300]).min_top_k == big
    assert build(2, vocab_size=1000, top_k=[0, 0]).min_top_k == math.inf
    mixed = build(2, vocab_size=1000, top_k=[big, 40], top_p=[0.9, 0.9])
    assert mixed.min_top_k == 40 and "direct_beside" not in sample_options(mixed, mixed.min_p)
    wide = build(3, vocab_size=1000, top_k=[big, 300, 0], top_p=[0.9, 1.0, 0.8])
    assert sample_options(wide, wide.min_p) == {"direct_beside": False}
    assert sample_options(wide, wide.min_p, {"kmax": 512}) == {"kmax": 512}              # 129 <= 512
    assert sample_options(wide, wide.min_p, {"direct_beside": True}) == {"direct_beside": True}
    rows = wide.expand([1, 1])                               # some of the rows: still a lower bound
    assert rows.min_top_k_bound() == big and sample_options(rows, rows.min_p) == {"direct_beside": False}
    changed = replace(wide, top_k=wide.top_k.clone())       # not its own: unknown
    assert changed.min_top_k_bound() is None and "direct_beside" not in sample_options(changed, changed.min_p)


def test_spread_rows_leave_out_the_refine_and_wide_rows_the_spread():
    # the widest filtered row a spread row (top_k <= SPREAD_TOP_K): the refine launches are left out;
    # every top-k row wider than SPREAD_TOP_K: the collect launch without the spread branch
    from specops.sampling.topk_topp import sample_options
    from specops.triton_kernels.sampling_topk_topp import DIRECT_TOP_K, SPREAD_TOP_K
    spread = build(3, vocab_size=20000, top_k=[SPREAD_TOP_K, 40, 0], top_p=[0.9, 0.95, 1.0], min_p=[0.0, 0.0, 0.1])
    assert sample_options(spread, spread.min_p) == {}                                   # min-p alone: the search
    assert sample_options(spread, spread.min_p, distribution=False) == {"refine": False}   # ... or the pivot
    assert sample_options(spread, spread.min_p, {"spread_kmax": 100}, distribution=False) == {"spread_kmax": 100}
    assert sample_options(spread, spread.min_p, {"refine": True}, distribution=False) == {"refine": True}
    above = build(2, vocab_size=20000, top_k=[SPREAD_TOP_K + 1, 3000], top_p=[0.9, 0.9])
    assert sample_options(above, above.min_p) == {"spread_kmax": 0, "direct_beside": False, "cap": 4096}
    small = build(2, vocab_size=20000, top_k=[DIRECT_TOP_K, 20])
    assert sample_options(small, small.min_p) == {"search": False}                    # no collect launch at all


def test_greedy_short_cuts_describe_their_temperatures_only():
    # all_greedy / all_random hold for the temperature tensors they were computed from: a
    # replaced temperature (or inv_temperature, which the kernels read) turns them off, so
    # the Sampler no longer drops the filters of rows that became random
    from specops.sampling import Sampler
    n = 300
    md = build(n, vocab_size=8, temperature=[0.0] * n, top_p=[0.5] * n, seeds=list(range(n)))
    assert md.greedy_rows_hint() is True and build(2).greedy_rows_hint() is False
    assert build(2, temperature=[0.0, 1.0]).greedy_rows_hint() is None
    assert md.expand([0, 1]).greedy_rows_hint() is True
    ones = torch.ones(n)
    for changed in (replace(md, temperature=ones, inv_temperature=ones), replace(md, inv_temperature=ones)):
        assert changed.greedy_rows_hint() is None and changed.expand([0]).greedy_rows_hint() is None
    logits = torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]).expand(n, 8)   # top-p 0.5 keeps token 0
    changed = replace(md, temperature=ones, inv_temperature=ones)
    assert bool((Sampler(backend="torch")(logits, changed).sampled_token_ids == 0).all())


@pytest.mark.parametrize("index,exc", [([0, 1.5], TypeError), ([0, True], TypeError), ([0, 3], ValueError),
                                       (torch.tensor([0.0, 1.0]), TypeError), (torch.tensor([[0, 1]]), TypeError)])
def test_expand_refuses_bad_row_indices(index, exc):
    with pytest.raises(exc, match="row_req_index"):
        build(3).expand(index)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_row_tensors_start_16_byte_aligned_at_any_batch(n):
    # Triton specialises kernels on 16-byte pointer alignment: rows that are views of one
    # [k, n] host copy would start misaligned when n % 4 != 0 and compile a second variant
    md = build(n, top_k=[5] * n, top_p=[0.9] * n, min_p=[0.1] * n, repetition_penalties=[1.2] * n,
               frequency_penalties=[0.1] * n, presence_penalties=[0.1] * n,
               prompt_mask=torch.zeros(n, V, dtype=torch.bool), output_counts=torch.zeros(n, V, dtype=torch.int32))
    for name in ("temperature", "inv_temperature", "top_k", "top_p", "min_p", "repetition_penalties",
                 "frequency_penalties", "presence_penalties", "seeds", "positions", "request_seeds", "has_seed",
                 "token_positions"):
        t = getattr(md, name)
        assert t.shape == (n,) and t.is_contiguous() and t.data_ptr() % 16 == 0, name
    assert md.top_p.tolist() == pytest.approx([0.9] * n) and md.top_k.tolist() == [5] * n


def test_keys_follow_the_rng_convention():
    md = build(3, seeds=[7, None, -5], positions=[10, 11, 12], engine_seed=99, step=4)
    seeds, pos = rng.row_keys(torch.tensor([7, 0, -5]), torch.tensor([True, False, True]),
                              torch.tensor([10, 11, 12]), 99, torch.tensor(4))
    assert torch.equal(md.seeds, seeds) and torch.equal(md.positions, pos)
    assert md.seeds.tolist() == [7, 99, -5] and md.positions[0] == 10 and md.positions[1] == (2 << 32) | 4
    # the engine seed in [-2^63, 2^64), as torch.manual_seed and rejection_sample take it
    assert build(3, seeds=[7, None, -5], engine_seed=2**64 - 99).seeds.tolist() == [7, -99, -5]
    with pytest.raises(ValueError, match=r"engine_seed must be an int in \[-2\^63, 2\^64\), got 18446744073709551616"):
        build(1, engine_seed=2**64)


def test_penalty_state_and_allowed_mask():
    pm = torch.zeros(2, V, dtype=torch.bool)
    oc = torch.zeros(2, V, dtype=torch.int32)
    md = build(2, repetition_penalties=[1.2, 1.0], prompt_mask=pm, output_counts=oc,
               allowed_token_ids=[[3, 4], None])
    assert not md.no_penalties and md.presence_penalties.tolist() == [0.0, 0.0]
    assert md.prompt_mask is pm and md.output_counts is oc
    assert md.allowed_token_mask[0].nonzero().flatten().tolist() == [3, 4] and bool(md.allowed_token_mask[1].all())
    with pytest.raises(ValueError, match=r"output_counts must be \[2, 100\] torch.int32"):
        build(2, repetition_penalties=[1.2, 1.0], prompt_mask=pm, output_counts=oc.long())


def test_from_sampling_params():
    class P:  # a SamplingParams look-alike
        def __init__(self, **kw):
            self.__dict__.update(dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None,
                                      repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                                      allowed_token_ids=None, logprobs=None) | kw)

    md = SamplingMetadata.from_sampling_params([P(temperature=0.0), P(top_k=5, seed=3, logprobs=2)],
                                               vocab_size=V, positions=[4, 9])
    assert md.top_k.tolist() == [0, 5] and md.max_num_logprobs == 2 and md.seeds[1] == 3
    with pytest.raises(ValueError, match=r"top_p\[0\]"):
        SamplingMetadata.from_sampling_params([P(top_p=2.0)], vocab_size=V)


def test_expand_gathers_rows_and_gives_fresh_keys():
    pm = torch.rand(2, V) < 0.1
    oc = torch.randint(0, 3, (2, V), dtype=torch.int32)
    md = build(2, temperature=[0.5, 1.0], top_k=[3, 0], seeds=[11, None], positions=[100, 50], engine_seed=1, step=9,
               repetition_penalties=[1.5, 1.0], prompt_mask=pm, output_counts=oc,
               bad_words_token_ids={1: [[5, 6]]}, output_token_ids=[[1], [2]])
    ex = md.expand([0, 0, 0, 1, 1], position_offsets=[0, 1, 2, 0, 1],
                   output_token_ids=[[1], [1, 7], [1, 7, 8], [2], [2, 5]])
    assert ex.num_rows == 5
    assert ex.temperature.tolist() == [0.5, 0.5, 0.5, 1.0, 1.0] and ex.top_k.tolist() == [3, 3, 3, 0, 0]
    assert ex.positions[:3].tolist() == [100, 101, 102] and ex.seeds[:3].tolist() == [11, 11, 11]
    assert ex.seeds[3:].tolist() == [1, 1]
    assert len(set(ex.positions[3:].tolist())) == 2       # unseeded rows: distinct lanes
    assert torch.equal(ex.output_counts[2], oc[0]) and torch.equal(ex.prompt_mask[4], pm[1])
    assert ex.bad_words_token_ids == {3: [[5, 6]], 4: [[5, 6]]}
    with pytest.raises(ValueError, match="row_req_index values"):
        md.expand([0, 2])
    with pytest.raises(ValueError, match="output_token_ids"):
        md.expand([0, 1])
    # one history and one LogitsRows entry per new row (a short one would shift the processors' rows)
    with pytest.raises(ValueError, match="one list per new row"):
        md.expand([0, 0, 1], output_token_ids=[[1], [2]])
    with pytest.raises(ValueError, match="rows must describe 3 new rows"):
        md.expand([0, 0, 1], output_token_ids=[[1], [1], [2]], rows=LogitsRows([0, 1], [0, 0]))
    with pytest.raises(ValueError, match="host row_req_index"):
        md.expand(torch.tensor([1, 0]), output_token_ids=[[2], [1]])


def test_sampler_refuses_logits_of_another_vocab_width():
    # the rows were checked against vocab_size (top_k, allowed ids, penalty state): logits of
    # another width would be sampled with filters that no longer mean what they said
    from specops.sampling import Sampler
    md = SamplingMetadata.from_params([0.8, 0.0], vocab_size=64, top_k=[10, 0])
    assert md.vocab_size == 64 and md.expand([1, 0]).vocab_size == 64
    with pytest.raises(ValueError, match="128 columns but the metadata was built for vocab_size=64"):
        Sampler(backend="torch")(torch.randn(2, 128), md)
    assert Sampler(backend="torch")(torch.randn(2, 64), md).sampled_token_ids.shape == (2,)


def test_triton_backend_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    from specops.sampling.topk_topp import resolve_backend
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="backend='triton' on CPU needs TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.device("cpu"))
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="backend must be 'auto', 'triton' or 'torch'"):
        resolve_backend("cuda", torch.device("cpu"))


def test_per_row_logprobs_and_step_are_checked():
    # only the batch's largest logprobs was checked: a row's -5 or 2.5 passed silently, and a
    # step tensor of any shape or dtype broadcast the keys into the wrong shape
    from types import SimpleNamespace
    rows = lambda *lps: [SimpleNamespace(logprobs=x) for x in lps]   # noqa: E731
    for lps, exc, words in (((-5, 3), ValueError, "logprobs of row 0 must be >= 0"),
                            ((None, 2.5), TypeError, "logprobs of row 1 must be an int"),
                            ((1, V + 1), ValueError, f"logprobs of row 1 must be <= {V}")):
        with pytest.raises(exc, match=words):
            SamplingMetadata.from_sampling_params(rows(*lps), vocab_size=V)
    assert SamplingMetadata.from_sampling_params(rows(None, 3, 1), vocab_size=V).max_num_logprobs == 3
    for step in (torch.tensor([[1], [2]]), torch.tensor(2.7), torch.tensor([3, 4, 5]), torch.tensor(True)):
        with pytest.raises(ValueError, match="step must be an int or an integer tensor with one element"):
            build(step=step)
    for step in (torch.tensor(5), torch.tensor([5], dtype=torch.int32), 5):
        assert build(step=step).step.shape == ()


def test_numpy_scalars_are_taken_like_python_numbers():
    # np.float32 is not a Python float (np.float64 is): temperature / top_p / min_p / penalties
    # given as numpy float32 were refused while numpy ints for top_k were taken
    np = pytest.importorskip("numpy")
    md = SamplingMetadata.from_params(np.array([0.7, 0.5], dtype=np.float32), vocab_size=V,
                                      top_p=[np.float32(0.9), np.float16(1.0)], min_p=[np.float32(0.1), 0.0],
                                      top_k=np.array([2, 0], dtype=np.int32))
    torch.testing.assert_close(md.temperature, torch.tensor([0.7, 0.5]))
    torch.testing.assert_close(md.top_p, torch.tensor([0.9, 1.0]))
    with pytest.raises(TypeError, match=r"temperature\[0\] must be a real number"):
        SamplingMetadata.from_params([np.bool_(True)], vocab_size=V)
