"""Rejection sampling kernels against the torch reference, greedy against step-by-step greedy,
seeded repeatability and batch invariance, bad inputs.

On CPU the Triton kernels run under the interpreter at small shapes; CUDA adds full shapes.
"""

import functools
import os

import pytest
import torch

from specops.spec_decode import MAX_SPEC_LEN, rejection_sample, rejection_sample_torch

from test_rejection_statistics import chi2_ok

CUDA = torch.cuda.is_available()

# Triton runs on CPU only under the interpreter (set by conftest when there is no GPU);
# on a CUDA machine these tests run on CUDA alone.
TRITON_DEVICES = (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1" else []) + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=TRITON_DEVICES)
def device(request) -> str:
    return request.param


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_case(num_drafts, vocab, *, device, dtype=torch.float32, draft_probs=False, greedy="mixed",
              temperature=True, target_rows=False, seeded="mixed", invalid=True, gen=None, scale=3.0,
              correct_frac=0.5):
    """A random batch drawn from `gen` (default: torch's global RNG, seeded afresh for every
    test); about `correct_frac` of the drafts are the row's argmax (so that requests get past
    their first position). greedy="mixed": about 40% of the requests are greedy, and among the
    requests with drafts at least one is greedy and one random, so that both paths are compared."""
    dev = dict(device=device, generator=gen)
    counts = torch.tensor(num_drafts, dtype=torch.int64, device=device)
    num_reqs, total = counts.shape[0], int(sum(num_drafts))
    rows = torch.randn(total, vocab, **dev) * scale
    drafts = torch.randint(0, vocab, (total,), **dev)
    hit = torch.rand(total, **dev) < correct_frac
    drafts = torch.where(hit, rows.argmax(1), drafts)
    if invalid and total >= 3:
        drafts[1] = -1
        drafts[total - 2] = vocab + 3
    kw = {}
    if target_rows:   # target rows scattered among other rows of a bigger logits tensor
        n_logits = 2 * total + 1
        perm = torch.randperm(n_logits, **dev)[:total]
        logits = torch.randn(n_logits, vocab, **dev)
        logits[perm] = rows
        kw["target_rows"] = perm
    else:
        logits = rows
    if draft_probs:
        q = torch.softmax(torch.randn(total, vocab, **dev) * scale, dim=1)
        q = (q + torch.softmax(rows, 1)) / 2           # overlap with p so that some drafts are accepted
        kw["draft_probs"] = q.to(dtype)
    if temperature:
        kw["temperature"] = torch.rand(num_reqs, **dev) * 1.5 + 0.3
    if isinstance(greedy, str) and greedy == "mixed":
        is_greedy = torch.rand(num_reqs, **dev) < 0.4
        with_drafts = torch.nonzero(counts > 0)[:, 0]
        if with_drafts.numel() >= 2:     # small batches are otherwise often all greedy or all random
            one_each = with_drafts[torch.randperm(with_drafts.numel(), **dev)[:2]]
            is_greedy[one_each[0]], is_greedy[one_each[1]] = True, False
        kw["is_greedy"] = is_greedy
    else:
        kw["is_greedy"] = greedy
    if seeded != "none":
        kw["seeds"] = torch.randint(-2**62, 2**62, (num_reqs,), **dev)
        kw["has_seed"] = (torch.rand(num_reqs, **dev) < 0.5 if seeded == "mixed"
                          else torch.ones(num_reqs, dtype=torch.bool, device=device))
        kw["positions"] = torch.randint(0, 2**31, (num_reqs,), **dev)
        kw["positions"][0::3] = 2**32 - 2          # draft i >= 2 keys position (p + i) mod 2**32
        kw["positions"][1::3] += 2**35             # a high word: keyed modulo 2**32 too (rng.row_keys)
    kw["step"] = torch.randint(0, 2**40, (1,), **dev)
    kw["engine_seed"] = 2**63 + 12345
    args = (logits.to(dtype), drafts, torch.cumsum(counts, 0), max(num_drafts) if num_reqs else 0,
            torch.randint(0, vocab, (num_reqs,), **dev))
    return args, kw


def check_same(args, kw, **extra):
    got = rejection_sample(*args, backend="triton", **kw, **extra)
    ref_extra = {k: v for k, v in extra.items() if k != "fuse_recover"}  # a kernel-only option
    ref = rejection_sample(*args, backend="torch", **kw, **ref_extra)
    assert got.dtype == torch.int32 and got.shape == ref.shape
    assert torch.equal(got.cpu(), ref.cpu()), f"\n{got}\n{ref}"
    return got


# (vocab, drafts per request): vocab 17 is one chunk, 300 three (the last partial), 1000 four
SMALL = [(17, [2, 0, 3, 1]), (300, [3, 1, 0, 4, 2]), (1000, [1, 2])]


@pytest.mark.parametrize("vocab, drafts", SMALL)
@pytest.mark.parametrize("draft_probs", [False, True])
def test_triton_matches_reference(device, vocab, drafts, draft_probs):
    args, kw = make_case(drafts, vocab, device=device, draft_probs=draft_probs, target_rows=vocab == 300)
    out = check_same(args, kw)
    assert (out[:, 0] >= 0).all()


@pytest.mark.parametrize("draft_probs, fuse", [(False, False), (False, True), (True, False)])
def test_recovered_tokens_match_reference(device, draft_probs, fuse):
    # most rows rejected on flat rows of 3 chunks, so that the chunk race decides often; on
    # every other row the draft holds about half the mass (then its chunk's mass without it
    # matters)
    args, kw = make_case([1] * 48 + [2] * 8, 300, device=device, draft_probs=draft_probs, greedy=False,
                         correct_frac=0.0, scale=0.5, invalid=True)
    logits, drafts = args[0], args[1]
    # the last chunk has 44 tokens: +1 gives it about a third of a flat row's mass, so that on
    # fresh inputs every chunk emits tokens (without it the check below fails about once in 1500)
    logits[:, 256:] += 1.0
    rows = torch.arange(0, drafts.shape[0], 2, device=device)
    ok = (drafts[rows] >= 0) & (drafts[rows] < 300)
    rows = rows[ok]
    logits[rows, drafts[rows]] += 6.0
    out = check_same(args, kw, fuse_recover=fuse)
    assert torch.unique(out[:, 0].long() // 128).numel() == 3   # tokens of every chunk were emitted


def _no_residual_case(num_reqs, vocab, g, device):
    """One draft per request on one row of logits (the draft x = 7 holds about 0.3 of p), with
    draft probs q >= p on every token (q = p (1 + 1e-3), q(x) = 2 p(x)): a rejection (about
    half the rows) leaves max(0, p - q) without mass, which only rounding can do."""
    row = torch.randn(vocab, generator=g) * 0.5
    row[7] += 5.0
    logits = row.repeat(num_reqs, 1)
    p = torch.softmax(row, 0)
    q = p * (1 + 1e-3)
    q[7] = 2 * p[7]
    args = (logits.to(device), torch.full((num_reqs,), 7, device=device),
            torch.arange(1, num_reqs + 1, device=device), 1, torch.zeros(num_reqs, dtype=torch.long, device=device))
    kw = dict(draft_probs=q.repeat(num_reqs, 1).to(device), temperature=torch.ones(num_reqs, device=device),
              seeds=torch.randint(0, 2**40, (num_reqs,), generator=g).to(device),
              has_seed=torch.ones(num_reqs, dtype=torch.bool, device=device),
              positions=torch.zeros(num_reqs, dtype=torch.long, device=device))
    return args, kw, p.double()


def test_recovered_token_is_never_the_draft_when_the_residual_has_no_mass(device):
    # then the token is drawn from p without the rejected draft (the law of n-gram drafts):
    # from p, it was the draft itself with probability p(x), which the engine read as an
    # invalid row; the kernels give the reference's tokens
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    args, kw, _ = _no_residual_case(64, 300, g, device)
    out = check_same(args, kw).cpu()
    rejected = out[:, 1] == -1
    assert rejected.sum() >= 10 and (out[rejected, 0] != 7).all() and (out[~rejected, 0] == 7).all()
    # the law of the recovered token: p without x, renormalised (torch path, many draws)
    args, kw, p = _no_residual_case(20000, 300, g, "cpu")
    out = rejection_sample(*args, backend="torch", **kw)
    rec = out[out[:, 1] == -1, 0].long()
    target = p.clone()
    target[7] = 0.0
    assert rec.numel() > 5000
    assert chi2_ok(torch.bincount(rec, minlength=300), target / target.sum())


# (pass-1 block, sub-chunk, level-2 step) at V = 300 (chunk 128): several blocks per chunk (with
# the prefetching loop when pass 1 reduces in blocks), a block spanning several sub-chunks or
# lying inside one, several steps per sub-chunk
GEOMETRIES = [(32, 32, 16), (32, 64, 32), (64, 16, 16), (128, 32, 16)]


@pytest.mark.parametrize("lanes", [True, False])
@pytest.mark.parametrize("block, sub, race_block", GEOMETRIES)
@pytest.mark.parametrize("draft_probs, fuse", [(False, False), (False, True), (True, False)])
def test_kernel_geometry_gives_the_same_tokens(device, block, sub, race_block, draft_probs, fuse, lanes, monkeypatch):
    import functools

    import specops.spec_decode.rejection as rejection_module
    for name, knobs in [("rejection_sample_pass", dict(block=block, prefetch=not lanes and block < 128, lanes=lanes,
                                                       race_block=race_block, race_warps=4)),
                        ("rejection_recover_pass", dict(race_block=race_block, race_warps=4))]:
        monkeypatch.setattr(rejection_module, name, functools.partial(getattr(rejection_module, name), **knobs))
    args, kw = make_case([1] * 24 + [2] * 4, 300, device=device, draft_probs=draft_probs, greedy="mixed",
                         correct_frac=0.2, scale=0.7)
    check_same(args, kw, sub_chunk=sub, fuse_recover=fuse)


@pytest.mark.parametrize("sub", [16, 32, 64, 128])
@pytest.mark.parametrize("draft_probs, fuse", [(False, False), (False, True), (True, False)])
def test_sub_chunk_sizes_match_reference(device, sub, draft_probs, fuse):
    # from 8 sub-chunks per chunk (16 tokens) to one (the whole chunk: the one-level chunk race);
    # mostly rejected flat rows, so that the sub-chunk race decides often
    args, kw = make_case([1] * 20 + [3] * 4, 300, device=device, draft_probs=draft_probs, greedy="mixed",
                         correct_frac=0.1, scale=0.5)
    out = check_same(args, kw, sub_chunk=sub, fuse_recover=fuse)
    assert (out[:, 0] >= 0).all()


def test_sub_chunk_changes_tokens_not_acceptance(device):
    # another sub-chunk size draws other recovered tokens, from the same decisions
    args, kw = make_case([1] * 40, 300, device=device, greedy=False, correct_frac=0.0, scale=0.5, seeded="all")
    a = rejection_sample(*args, backend="triton", **kw, sub_chunk=32)
    b = rejection_sample(*args, backend="triton", **kw, sub_chunk=128)
    assert torch.equal(a[:, 1] == -1, b[:, 1] == -1)
    assert not torch.equal(a, b)


def test_bad_sub_chunk(device):
    args, kw = make_case([1, 2], 300, device=device)
    for bad in (8, 48, 256):        # below 16, not a power of two, above chunk_size(300) = 128
        for backend in ("triton", "torch"):
            with pytest.raises(ValueError, match="sub_chunk must be"):
                rejection_sample(*args, backend=backend, **kw, sub_chunk=bad)


@pytest.mark.parametrize("fuse", [True, False])
def test_fused_and_second_pass_recovery_agree(device, fuse):
    # without draft probs, the recovered token is raced in pass 1 (fused) or in pass 2
    args, kw = make_case([2, 3, 1], 300, device=device, greedy=False, correct_frac=0.3)
    check_same(args, kw, fuse_recover=fuse)


def _pass1(logits, drafts, counts, is_greedy, **knobs):
    """rejection_sample_pass, unseeded, T = 0.7 unless the knobs give temperature ([num_reqs]) or
    inv_temperature ([T]) and threshold ([T]); target rows = logits rows unless they give
    target_rows ([T]); fuse_race False unless given; (out, Pass1Result)."""
    from specops.triton_kernels.rejection_sample import chunk_size, rejection_sample_pass, sub_chunk_size
    device, vocab = logits.device, logits.shape[1]
    cu = torch.tensor(counts, device=device).cumsum(0)
    out = torch.empty(len(counts), max(counts) + 1, dtype=torch.int32, device=device)
    inv_temperature, threshold = knobs.pop("inv_temperature", None), knobs.pop("threshold", None)
    temperature = knobs.pop("temperature", None if inv_temperature is not None else
                            torch.full((len(counts),), 0.7, device=device))
    res = rejection_sample_pass(
        out, logits, knobs.pop("target_rows", None), drafts, None, cu,
        torch.zeros(len(counts), dtype=torch.int64, device=device),
        temperature, inv_temperature, threshold, is_greedy, None, None, None,
        torch.zeros(1, dtype=torch.int64, device=device), 5, fuse_race=knobs.pop("fuse_race", False),
        chunk=knobs.pop("chunk", chunk_size(vocab)),
        sub_chunk=knobs.pop("sub_chunk", sub_chunk_size(vocab)), **knobs)
    return out, res


@pytest.mark.skipif(not CUDA, reason="a property of the GPU layouts: the interpreter computes both dtypes alike")
@pytest.mark.parametrize("vocab", [20000, 128256])
@pytest.mark.parametrize("greedy", [False, "mixed"])
def test_pass1_partials_do_not_depend_on_the_logits_dtype(vocab, greedy):
    # the same logits as bf16 or fp32: pass 1 loads 4 per thread whatever the dtype (without the
    # runs of 4 in _chunk_stats_lanes, bf16 at V = 128256 takes 8 per thread and another
    # reduction order), so the partials and the tokens are bit for bit the same. (Whether a
    # batch's rows come as model logits or processed fp32 rows also changes how 1/T comes: the
    # next test.)
    g = torch.Generator(device="cuda").manual_seed(3)
    counts = [1, 3, 2]
    total = sum(counts)
    logits = (torch.randn(total, vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
    drafts = torch.randint(0, vocab, (total,), device="cuda", generator=g)
    is_greedy = torch.tensor([True, False, True], device="cuda") if greedy == "mixed" else False
    parts = []
    for rows in (logits, logits.float()):
        out, res = _pass1(rows, drafts, counts, is_greedy)
        parts.append((out, res.part_m, res.part_s, res.part_sub))
    for a, b in zip(*parts):
        assert torch.equal(a, b)


@pytest.mark.skipif(not CUDA, reason="GPU code generation (fma contraction, div.full): the interpreter rounds as torch")
@pytest.mark.parametrize("vocab", [20000, 128256])
@pytest.mark.parametrize("greedy", [False, "mixed"])
def test_pass1_partials_do_not_depend_on_how_temperature_comes(vocab, greedy):
    # a batch whose rows need no processing hands pass 1 the model's logits, target rows and each
    # request's T; a batch with a neighbour that needs processing hands it the gathered rows (fp32
    # once a processor wrote them), each row's 1/T (torch: correctly rounded) and a threshold (-inf
    # on a row without top-k / top-p / min_p). A request's partials and tokens must be the same
    # bits either way (batch invariance): 1/T computed in the kernel as torch does (div_rn: an
    # approximate 1 / T differs from torch's for about 13% of temperatures, so some of these 32
    # do), and x = l * (1/T) rounded before x - max whether a threshold follows or not
    num_reqs = 32
    temperature = (torch.rand(num_reqs, generator=torch.Generator().manual_seed(4)) * 1.9 + 0.1).cuda()
    counts = [1, 3, 2, 1] * (num_reqs // 4)
    total = sum(counts)
    g = torch.Generator(device="cuda").manual_seed(4)
    logits = (torch.randn(total, vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
    drafts = torch.randint(0, vocab, (total,), device="cuda", generator=g)
    is_greedy = torch.tensor([True, False] * (num_reqs // 2), device="cuda") if greedy == "mixed" else False
    rows_of = torch.repeat_interleave(torch.arange(num_reqs, device="cuda"), torch.tensor(counts, device="cuda"))
    for fuse_race in (False, True):
        out_a, res_a = _pass1(logits, drafts, counts, is_greedy, temperature=temperature, fuse_race=fuse_race,
                              target_rows=torch.arange(total, device="cuda"))
        out_b, res_b = _pass1(logits.float(), drafts, counts, is_greedy, fuse_race=fuse_race,
                              inv_temperature=(1.0 / temperature)[rows_of],
                              threshold=torch.full((total,), float("-inf"), device="cuda"))
        for name in ("part_m", "part_s", "part_sub"):
            assert torch.equal(getattr(res_a, name), getattr(res_b, name)), (fuse_race, name)
        assert torch.equal(out_a, out_b), fuse_race


@pytest.mark.parametrize("num_warps", [1, 4])
def test_pass1_argmax_ties_take_the_lowest_token(device, num_warps):
    # integer logits: the row max is tied many times; a greedy row whose draft is wrong emits the
    # lowest token at the max (torch.argmax's first occurrence). V = 2000: chunks of 512, sub-chunks
    # of 256, so with 1 warp (128 lanes) a step holds two rows of lanes: ties inside a step, across
    # steps, across lanes and across chunks
    g = torch.Generator(device=device).manual_seed(1)
    counts = [1] * 12
    logits = torch.randint(0, 4, (12, 2000), device=device, generator=g).float()
    logits[3, :1500] = 0.0                           # the max only in the last (partial) chunk
    logits[4, 1024:] = 5.0                           # the max from the middle of a chunk on
    expected = logits.argmax(1)
    drafts = (expected + 1) % 2000                   # every draft rejected (greedy accepts the argmax only)
    for lanes in (True, False):
        out, _ = _pass1(logits, drafts, counts, True, lanes=lanes, num_warps=num_warps)
        assert torch.equal(out[:, 0].long(), expected), lanes
        out, _ = _pass1(logits, drafts, counts, torch.ones(12, dtype=torch.bool, device=device), lanes=lanes,
                        num_warps=num_warps)
        assert torch.equal(out[:, 0].long(), expected), lanes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(device, dtype):
    args, kw = make_case([3, 2], 300, device=device, dtype=dtype, draft_probs=True, seeded="all")
    check_same(args, kw)


@pytest.mark.parametrize("draft_probs", [False, True])
def test_inv_temperature_and_threshold(device, draft_probs):
    # per-row 1/T (the Sampler's convention, -1 on greedy rows) and a top-k style threshold;
    # one greedy request, nine random ones
    counts = [2, 1, 3, 1, 2, 1, 1, 2, 3, 1]
    n = len(counts)
    greedy = torch.arange(n, device=device) == torch.randint(n, (1,), device=device)
    args, kw = make_case(counts, 300, device=device, draft_probs=draft_probs, temperature=False, greedy=greedy,
                         correct_frac=0.2, scale=1.0)
    logits, cu = args[0], args[2]
    req = torch.repeat_interleave(torch.arange(n, device=device), torch.tensor(counts, device=device))
    inv = (torch.rand(n, device=device) + 0.5)[req]             # 1/T in [0.5, 1.5)
    inv = torch.where(greedy[req], -1.0, inv)
    scaled = logits.float() * torch.where(inv > 0, inv, 1.0)[:, None]
    thr = torch.topk(scaled, 3, dim=1).values[:, -1]            # keep the top 3 of every row
    out = check_same(args, kw, inv_temperature=inv, threshold=thr)
    # power: on these flat rows the top 3 hold little mass, so the threshold changes the tokens
    # (all 9 random requests emit the same tokens without it with probability about 0.1 ** 9):
    # a kernel that ignored it would not match the reference
    without = rejection_sample(*args, backend="torch", **kw, inv_temperature=inv)
    assert not torch.equal(out.cpu(), without.cpu())
    # a random row's emitted token is always in its kept set
    first = (cu - torch.tensor(counts, device=device)).tolist()
    for r in range(n):
        if bool(greedy[r]):
            continue
        for i, tok in enumerate(out[r, :counts[r]].tolist()):
            if tok < 0:
                break
            assert scaled[first[r] + i, tok] >= thr[first[r] + i]


def test_all_greedy_no_temperature_no_seeds(device):
    args, kw = make_case([4, 0, 2], 300, device=device, greedy=True, temperature=False, seeded="none")
    check_same(args, kw)


def test_requests_without_drafts(device):
    # every request has 0 drafts: each output row is [bonus]; max_spec_len 0 gives one column
    logits = torch.zeros(0, 17, device=device)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    bonus = torch.tensor([4, 5, 6], device=device)
    cu = torch.zeros(3, dtype=torch.int64, device=device)
    for backend in ("triton", "torch"):
        out = rejection_sample(logits, empty, cu, 0, bonus, backend=backend)
        assert out.tolist() == [[4], [5], [6]]
        out = rejection_sample(logits, empty, cu, 2, bonus, backend=backend)
        assert out.tolist() == [[4, -1, -1], [5, -1, -1], [6, -1, -1]]
    out = rejection_sample(logits, empty, cu[:0], 0, bonus[:0], backend="triton")
    assert out.shape == (0, 1)
    # with draft probs and random requests the recover pass runs too (it must find no row to
    # draw: every finalize program waits for pass 1, which writes that none is rejected)
    probs = torch.zeros(0, 17, device=device)
    for greedy in (False, torch.tensor([True, False, False], device=device)):
        for backend in ("triton", "torch"):
            out = rejection_sample(logits, empty, cu, 2, bonus, draft_probs=probs, is_greedy=greedy,
                                   temperature=torch.ones(3, device=device), backend=backend)
            assert out.tolist() == [[4, -1, -1], [5, -1, -1], [6, -1, -1]], (greedy, backend)


def test_invalid_drafts_are_rejected(device):
    # p puts almost all its mass on token 2; drafts -1 / V / V + 5 must still be rejected
    logits = torch.full((3, 5), -20.0, device=device)
    logits[:, 2] = 20.0
    drafts = torch.tensor([-1, 5, 2], device=device)
    cu = torch.tensor([1, 2, 3], device=device)
    bonus = torch.tensor([0, 1, 3], device=device)
    for greedy in (True, False):
        for backend in ("triton", "torch"):
            out = rejection_sample(logits, drafts, cu, 1, bonus, is_greedy=greedy, backend=backend)
            assert out.tolist() == [[2, -1], [2, -1], [2, 3]], (greedy, backend)



def _poison(row: torch.Tensor, kind: str) -> None:
    """Make a logits row invalid: a NaN, a +inf, or nothing above -inf."""
    if kind == "nan":
        row[3] = float("nan")
    elif kind == "inf":
        row[row.shape[0] - 1] = float("inf")
    else:
        row.fill_(float("-inf"))


@pytest.mark.parametrize("kind", ["nan", "inf", "all_neg_inf"])
@pytest.mark.parametrize("greedy", [True, False, "mixed"])
@pytest.mark.parametrize("draft_probs", [False, True])
def test_an_invalid_target_row_ends_its_request_there(device, kind, greedy, draft_probs):
    # Every draft is its row's argmax (accepted under greedy, and with probability p(x) >= ~1
    # otherwise); row 1 of request 0 and row 0 of request 1 are invalid. The outputs stop right
    # before them (request 0 keeps its accepted draft 0), -1 there, whatever the backend, the
    # greedy mode and the draft probs; request 2 is untouched.
    vocab = 300
    logits = torch.full((7, vocab), -30.0, device=device)
    drafts = torch.tensor([5, 6, 7, 8, 9, 10, 11], device=device)
    logits[torch.arange(7), drafts] = 30.0
    _poison(logits[1], kind)
    _poison(logits[3], kind)
    cu = torch.tensor([3, 5, 7], device=device)
    bonus = torch.tensor([1, 2, 3], device=device)
    is_greedy = torch.tensor([True, False, True], device=device) if greedy == "mixed" else greedy
    kw = dict(is_greedy=is_greedy, temperature=torch.full((3,), 0.7, device=device))
    if draft_probs:
        kw["draft_probs"] = torch.softmax(logits.nan_to_num(0.0, 0.0, 0.0) * 0 + 1.0, dim=1)   # uniform q
    want = [[5, -1, -1, -1], [-1, -1, -1, -1], [10, 11, 3, -1]]
    for backend in ("triton", "torch"):
        out = rejection_sample(logits, drafts, cu, 3, bonus, backend=backend, **kw)
        assert out.tolist() == want, (backend, out.tolist())


@pytest.mark.parametrize("draft_probs", [False, True])
def test_invalid_rows_match_reference_in_random_batches(device, draft_probs):
    # random batches with invalid rows at random places, a threshold that is NaN on some rows
    # (what the Sampler's threshold pass gives an invalid row) and below the max on the others
    gen = torch.Generator(device=device).manual_seed(7)
    for trial in range(3):
        args, kw = make_case([3, 1, 4, 0, 2, 3], 257, device=device, draft_probs=draft_probs, gen=gen,
                             correct_frac=0.8)
        logits = args[0]
        bad = torch.randperm(logits.shape[0], generator=gen, device=device)[:4]
        for r, kind in zip(bad.tolist(), ["nan", "inf", "all_neg_inf", "nan"]):
            _poison(logits[r], kind)
        thr = torch.full((logits.shape[0],), -4.0, device=device)
        thr[bad[3]] = float("nan")
        inv_t = torch.full((logits.shape[0],), 1.0, device=device)
        kw.pop("temperature")
        out = check_same(args, kw, threshold=thr, inv_temperature=inv_t)
        assert (out == -1).any(), trial


def test_int64_draft_ids_past_int32_are_rejected(device):
    # 2**32 + 2 and -(2**32) + 2 wrap to the likely token 2 in 32 bits; 2**31 to a negative id
    # (the kernels read the int64 ids as they are: no clamp before the launch)
    logits = torch.full((4, 5), -20.0, device=device)
    logits[:, 2] = 20.0
    drafts = torch.tensor([2**32 + 2, -(2**32) + 2, 2**31, 2], dtype=torch.int64, device=device)
    cu = torch.tensor([1, 2, 3, 4], device=device)
    bonus = torch.tensor([0, 1, 3, 4], device=device)
    q = torch.full((4, 5), 0.2, device=device)
    for greedy in (True, False):
        for probs in ((None, q) if not greedy else (None,)):
            for backend in ("triton", "torch"):
                out = rejection_sample(logits, drafts, cu, 1, bonus, is_greedy=greedy, draft_probs=probs,
                                       backend=backend)
                assert out.tolist() == [[2, -1], [2, -1], [2, -1], [2, 4]], (greedy, probs is None, backend)


def test_bonus_ids_outside_the_vocabulary_append_nothing(device):
    # int64 bonus ids were narrowed to int32: 2**32 + 3 and -(2**32) + 4 were emitted as tokens
    # 3 and 4; now an id outside [0, V) appends -1, on a request without drafts too
    logits = torch.full((3, 5), -20.0, device=device)
    logits[:, 2] = 20.0
    drafts = torch.tensor([2, 2, 2], device=device)
    bonus = torch.tensor([2**32 + 3, -(2**32) + 4, 5, 1, -1], device=device)
    cu = torch.tensor([1, 2, 3, 3, 3], device=device)      # the last two requests have no drafts
    for greedy in (True, False):
        for backend in ("triton", "torch"):
            out = rejection_sample(logits, drafts, cu, 1, bonus, is_greedy=greedy, backend=backend)
            assert out.tolist() == [[2, -1], [2, -1], [2, -1], [1, -1], [-1, -1]], (greedy, backend)
    no_drafts = rejection_sample(logits[:0], drafts[:0], torch.zeros(2, dtype=torch.int64, device=device), 0,
                                 bonus[:2], is_greedy=True, backend="torch")
    assert no_drafts.tolist() == [[-1], [-1]]


def test_int64_draft_ids_match_reference(device):
    # ids past 2**31 among ordinary ones, on the sub-chunk race paths (fused, pass 2, draft probs)
    for draft_probs, fuse in [(False, False), (False, True), (True, False)]:
        args, kw = make_case([2, 3, 1, 2], 300, device=device, draft_probs=draft_probs, greedy=False,
                             correct_frac=0.3)
        drafts = args[1].clone()
        drafts[0] = 2**32 + 7          # wraps to 7 in 32 bits
        drafts[4] = -(2**33)
        check_same((args[0], drafts, *args[2:]), kw, fuse_recover=fuse)

# ---- greedy speculation == step-by-step greedy decoding --------------------------------------

class TrigramModel:
    """Logits of the next token from the last two tokens (a random table, no ties)."""

    def __init__(self, vocab, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=g) * 4
        self.vocab = vocab

    def logits(self, seq):
        return self.table[seq[-2], seq[-1]]

    def greedy(self, seq, n):
        seq = list(seq)
        for _ in range(n):
            seq.append(int(self.logits(seq).argmax()))
        return seq


@pytest.mark.parametrize("kind", ["random", "correct", "wrong"])
def test_greedy_speculation_equals_greedy_decoding(device, kind):
    vocab, length = 150, 6
    model = TrigramModel(vocab)
    g = torch.Generator().manual_seed(1)
    starts = [[1, 2], [7, 3], [5, 5], [0, 9]]
    ks = [3, 1, 0, 4]          # per-request draft counts (one request never speculates)
    expected = [model.greedy(s, length) for s in starts]
    seqs = [list(s) for s in starts]
    backends = ["triton", "torch"] if device == "cpu" else ["triton"]
    while min(len(s) for s in seqs) < length + 2:
        drafts, rows, bonus = [], [], []
        for s, k in zip(seqs, ks):
            truth = model.greedy(s, k)[len(s):]
            d = {"random": torch.randint(0, vocab, (k,), generator=g).tolist(),
                 "correct": truth, "wrong": [(t + 1) % vocab for t in truth]}[kind]
            ctx = list(s)
            for t in d:
                rows.append(model.logits(ctx))
                ctx.append(t)
            bonus.append(int(model.logits(ctx).argmax()))
            drafts += d
        args = (torch.stack(rows).to(device), torch.tensor(drafts, dtype=torch.int64, device=device),
                torch.cumsum(torch.tensor(ks), 0).to(device), max(ks), torch.tensor(bonus, device=device))
        outs = [rejection_sample(*args, is_greedy=True, backend=b) for b in backends]
        for o in outs[1:]:
            assert torch.equal(o.cpu(), outs[0].cpu())
        for s, row in zip(seqs, outs[0].tolist()):
            emitted = row[:row.index(-1)] if -1 in row else row
            s += emitted
        if kind == "correct":
            assert all(len(r) - r.count(-1) == k + 1 for r, k in zip(outs[0].tolist(), ks))
        if kind == "wrong":
            assert all(len(r) - r.count(-1) == 1 for r in outs[0].tolist())
    for s, e in zip(seqs, expected):
        n = min(len(s), len(e))
        assert s[:n] == e[:n]


# ---- seeds ------------------------------------------------------------------------------------

def _single_request(vocab, k, seed, position, g, device):
    rows = torch.randn(k, vocab, generator=g) * 2
    q = torch.softmax(torch.randn(k, vocab, generator=g), 1)
    drafts = torch.multinomial(q, 1, generator=g)[:, 0]
    return rows, q, drafts, seed, position


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_seeded_requests_repeat_and_are_batch_invariant(device, backend):
    vocab = 150
    g = torch.Generator().manual_seed(5)
    reqs = [_single_request(vocab, k, s, p, g, device) for k, s, p in
            [(3, 11, 40), (2, 12, 7), (4, 13, 100), (1, 14, 3), (3, 15, 40)]]
    temps = [0.7, 1.0, 1.3, 0.9, 2.0]

    def run(order, seeded_mask, step):
        rows = torch.cat([reqs[i][0] for i in order])
        q = torch.cat([reqs[i][1] for i in order])
        d = torch.cat([reqs[i][2] for i in order])
        counts = torch.tensor([reqs[i][0].shape[0] for i in order])
        return rejection_sample(
            rows.to(device), d.to(device), torch.cumsum(counts, 0).to(device), 4,
            torch.tensor([100 + i for i in order], device=device), draft_probs=q.to(device),
            temperature=torch.tensor([temps[i] for i in order], device=device),
            seeds=torch.tensor([reqs[i][3] for i in order], device=device),
            has_seed=torch.tensor(seeded_mask, device=device),
            positions=torch.tensor([reqs[i][4] for i in order], device=device),
            step=torch.tensor([step], device=device), engine_seed=99, backend=backend).cpu()

    a = run([0, 1, 2, 3, 4], [True, True, False, True, False], step=1)
    b = run([0, 1, 2, 3, 4], [True, True, False, True, False], step=1)
    assert torch.equal(a, b)
    c = run([3, 2, 0], [True, True, True], step=8)         # other neighbours, other rows, other step
    assert torch.equal(c[2], a[0]) and torch.equal(c[0], a[3])
    d = run([1], [True], step=123)
    assert torch.equal(d[0], a[1])


@pytest.mark.parametrize("draft_probs", [False, True])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_seeded_requests_do_not_depend_on_the_batch_max_spec_len(device, backend, draft_probs):
    # the same seeded requests (2, 3 and 1 drafts) verified alone (max_spec_len 3), with a
    # larger max_spec_len for the same batch, and beside a neighbour with more drafts: the
    # kernels' tiles and output width change with max_spec_len, the tokens must not
    vocab = 40
    g = torch.Generator().manual_seed(11)
    reqs = [_single_request(vocab, k, s, p, g, device) for k, s, p in [(2, 21, 5), (3, 22, 60), (1, 23, 9)]]
    other = _single_request(vocab, 7, 99, 0, g, device)
    for rows, _, drafts, _, _ in reqs:
        drafts[:-1] = rows.argmax(1)[:-1]     # likely drafts: requests get past draft 0
    reqs[1][0][torch.arange(3), reqs[1][2]] += 8.0   # request 1: every draft accepted, then its bonus

    def run(batch, max_spec_len):   # bonus token of a request: its seed
        counts = torch.tensor([r[0].shape[0] for r in batch])
        n = len(batch)
        return rejection_sample(
            torch.cat([r[0] for r in batch]).to(device), torch.cat([r[2] for r in batch]).to(device),
            torch.cumsum(counts, 0).to(device), max_spec_len, torch.tensor([r[3] for r in batch], device=device),
            draft_probs=torch.cat([r[1] for r in batch]).to(device) if draft_probs else None,
            temperature=torch.full((n,), 0.9, device=device), seeds=torch.tensor([r[3] for r in batch], device=device),
            has_seed=torch.ones(n, dtype=torch.bool, device=device),
            positions=torch.tensor([r[4] for r in batch], device=device), backend=backend).cpu()

    base = run(reqs, 3)
    assert base[1, 3] == 22 and (base[[0, 2], 1:] == -1).any()   # a bonus token (the seed) and rejections
    for got in (run(reqs, 8), run(reqs, 17)[:, :9], run([other] + reqs, 7)[1:], run(reqs + [other], 7)[:3]):
        assert torch.equal(got[:, :4], base)
        assert (got[:, 4:] == -1).all()


# ---- bad inputs ---------------------------------------------------------------------------------

def test_bad_inputs():
    logits = torch.zeros(3, 10)
    d = torch.tensor([1, 2, 3])
    cu = torch.tensor([2, 3])
    b = torch.tensor([0, 0])
    cases = [
        (dict(logits=torch.zeros(3)), ValueError, "logits must be a"),
        (dict(logits=torch.zeros(3, 10, dtype=torch.int32)), TypeError, "logits must be float32"),
        (dict(max_spec_len=MAX_SPEC_LEN + 1), ValueError, "max_spec_len must be an int in"),
        (dict(max_spec_len=1), ValueError, "max_spec_len=1 is too small for draft_token_ids: it has 3 drafts, "
                                           "more than num_reqs"),
        (dict(draft_token_ids=d.float()), TypeError, "draft_token_ids must have dtype"),
        (dict(cu_num_draft_tokens=cu[:1]), ValueError, "bonus_token_ids must have shape"),
        (dict(logits=torch.zeros(4, 10)), ValueError, "one row per draft"),
        (dict(draft_probs=torch.zeros(3, 9)), ValueError, "draft_probs must have shape"),
        (dict(temperature=torch.ones(2, dtype=torch.float64)), TypeError, "temperature must have dtype"),
        (dict(is_greedy=torch.ones(2)), TypeError, "is_greedy must have dtype"),
        (dict(is_greedy=1), TypeError, "is_greedy must be"),
        (dict(seeds=torch.ones(2, dtype=torch.int64)), ValueError, "seeds needs has_seed"),
        (dict(has_seed=torch.ones(2, dtype=torch.bool)), ValueError, "has_seed was given without seeds"),
        (dict(positions=torch.zeros(2, dtype=torch.int64)), ValueError, "positions was given without seeds"),
        (dict(step=torch.zeros(2, dtype=torch.int64)), ValueError, "step must be"),
        (dict(engine_seed=2**64), ValueError, "engine_seed must be"),
        (dict(backend="cuda"), ValueError, "backend must be"),
        (dict(target_rows=torch.tensor([0, 1])), ValueError, "target_rows must have shape"),
        (dict(logits=torch.zeros(0, 10), target_rows=torch.tensor([0, 1, 2])), ValueError, "logits has no rows"),
    ]
    base = dict(logits=logits, draft_token_ids=d, cu_num_draft_tokens=cu, max_spec_len=2, bonus_token_ids=b)
    for change, exc, match in cases:
        kw = dict(base, **change)
        pos = [kw.pop(k) for k in ("logits", "draft_token_ids", "cu_num_draft_tokens", "max_spec_len",
                                    "bonus_token_ids")]
        with pytest.raises(exc, match=match):
            rejection_sample(*pos, **kw)
        if "backend" not in kw:                    # the reference (public too) checks the same
            with pytest.raises(exc, match=match):
                rejection_sample_torch(*pos, **kw)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("draft_probs", [False, True])
def test_triton_path_stays_in_bounds_on_bad_index_values(device, greedy, draft_probs):
    # The Triton path cannot check cu_num_draft_tokens and target_rows (device values, no host
    # sync), so its kernels clamp them. The logits sit between two guard rows whose argmax is 9;
    # every real row's is the draft token 7 (accepted, greedy or not: p(7) ~ 1 and q uniform).
    # Reading a guard row would reject the draft and emit 9.
    vocab = 300

    def guarded_logits(num_logits):
        big = torch.full((num_logits + 2, vocab), -30.0, device=device)
        big[:, 7] = 30.0
        big[[0, -1], 7] = -30.0
        big[[0, -1], 9] = 30.0
        return big[1:-1]

    def run(logits, cu, max_k, **kw):
        num_reqs, t = cu.shape[0], logits.shape[0] if "target_rows" not in kw else kw["target_rows"].shape[0]
        ids = torch.full((t + 4,), 9, device=device)[2:-2]          # guard ids around the drafts
        ids.fill_(7)
        if draft_probs:
            kw["draft_probs"] = torch.full((t, vocab), 1.0 / vocab, device=device)
        return rejection_sample(logits, ids, cu, max_k, torch.arange(100, 100 + num_reqs, device=device),
                                is_greedy=greedy, temperature=torch.full((num_reqs,), 0.8, device=device),
                                backend="triton", **kw).tolist()

    # target rows outside [0, 4): the row is never read, is invalid and ends its request (-1)
    logits = guarded_logits(4)
    rows = torch.tensor([0, 4, -1, 2**40, 3], device=device)
    assert run(logits, torch.tensor([2, 4, 5], device=device), 2, target_rows=rows) == \
        [[7, -1, -1], [-1, -1, -1], [7, 102, -1]]
    # counts below 0, decreasing, or past T (int64, past 2**31 too) are clamped into [0, T]:
    # request r gets rows [clamp(cu[r-1]), clamp(cu[r])), none when that is empty
    logits = guarded_logits(4)
    cu = torch.tensor([-3, 2, 1, 2**40], device=device)
    assert run(logits, cu, 3) == [[100, -1, -1, -1], [7, 7, 101, -1], [102, -1, -1, -1], [7, 7, 7, 103]]
    assert run(logits, torch.tensor([2, 2**32 + 1], device=device), 3) == [[7, 7, 100, -1], [7, 7, 101, -1]]


def test_torch_path_checks_the_index_values():
    # the torch path reads cu_num_draft_tokens and target_rows back: bad values raise there
    # (the Triton path never reads them back: no host sync)
    logits = torch.zeros(4, 10)
    d = torch.tensor([1, 2, 3])
    b = torch.tensor([0, 0])
    cases = [
        (dict(cu_num_draft_tokens=torch.tensor([-2, 3])), "non-decreasing from a first value >= 0"),
        (dict(cu_num_draft_tokens=torch.tensor([3, 2])), "non-decreasing"),
        (dict(cu_num_draft_tokens=torch.tensor([1, 2])), "must end at the number of drafts"),
        (dict(cu_num_draft_tokens=torch.tensor([0, 3]), max_spec_len=2), "more than max_spec_len=2"),
        (dict(target_rows=torch.tensor([0, 1, 4])), r"target_rows must be rows of logits, in \[0, 4\)"),
        (dict(target_rows=torch.tensor([-1, 1, 2])), "target_rows must be rows of logits"),
    ]
    base = dict(cu_num_draft_tokens=torch.tensor([2, 3]), max_spec_len=3, target_rows=torch.tensor([0, 1, 2]))
    for change, match in cases:
        kw = dict(base, **change)
        for fn in (functools.partial(rejection_sample, backend="torch"), rejection_sample_torch):
            with pytest.raises(ValueError, match=match):
                fn(logits, d, kw["cu_num_draft_tokens"], kw["max_spec_len"], b, target_rows=kw["target_rows"])
    out = rejection_sample(logits, d, base["cu_num_draft_tokens"], 3, b, target_rows=base["target_rows"],
                           backend="torch")
    assert out.shape == (2, 4)


# ---- CUDA: full shapes and graph capture -------------------------------------------------------

@pytest.mark.skipif(not CUDA, reason="full vocabularies run on CUDA only")
@pytest.mark.parametrize("vocab", [128256, 151936])
@pytest.mark.parametrize("batch, k", [(1, 1), (8, 4), (33, 8), (128, 4)])
@pytest.mark.parametrize("draft_probs", [False, True])
def test_full_shapes_cuda(vocab, batch, k, draft_probs):
    g = torch.Generator(device="cuda").manual_seed(batch * k)
    drafts = torch.randint(0, k + 1, (batch,), generator=g, device="cuda").tolist()
    drafts[0] = k
    args, kw = make_case(drafts, vocab, device="cuda", draft_probs=draft_probs, gen=g,
                         target_rows=batch == 8, scale=2.0)
    check_same(args, kw)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need CUDA")
def test_cuda_graph_capture():
    args, kw = make_case([3, 0, 2, 4], 151936, device="cuda", draft_probs=True)
    ref = rejection_sample(*args, **kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rejection_sample(*args, **kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rejection_sample(*args, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    # new inputs in the same buffers: the graph recomputes
    args[0].mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, rejection_sample(*args, **kw))
