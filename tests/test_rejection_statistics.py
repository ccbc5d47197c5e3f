"""Rejection sampling preserves the target distribution (exact probabilities in float64).

Many independent requests go through one call (distinct seeds or lanes), and the
empirical frequencies are compared with the exact target by a chi-square test whose
false-failure probability is ~3e-7 (z = 5); each test also checks that the same samples
reject a subtly wrong distribution, so the test has power. The torch path runs
everywhere; the Triton kernels run here on CUDA (on CPU they are compared with the torch
path token by token in test_rejection_kernels.py).
"""

import math

import pytest
import torch

from specops.spec_decode import rejection_sample

BACKENDS = ["torch"] + (["triton"] if torch.cuda.is_available() else [])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def chi2_ok(counts: torch.Tensor, probs: torch.Tensor, z: float = 5.0) -> bool:
    """Chi-square goodness of fit at one-sided normal quantile z (Wilson-Hilferty);
    cells expecting fewer than 5 samples are pooled."""
    counts, probs = counts.double().flatten().cpu(), probs.double().flatten().cpu()
    n = float(counts.sum())
    expected = probs * n
    if (counts[probs == 0] > 0).any():
        return False                       # a token of probability 0 was emitted
    keep = expected >= 5
    obs = torch.cat([counts[keep], counts[~keep & (probs > 0)].sum().reshape(1)])
    exp = torch.cat([expected[keep], expected[~keep & (probs > 0)].sum().reshape(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    df = obs.numel() - 1
    stat = float(((obs - exp) ** 2 / exp).sum())
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < limit


def run(backend, logits, drafts, k, n, bonus, **kw):
    cu = torch.arange(1, n + 1, device=DEVICE) * k
    return rejection_sample(logits, drafts, cu, k, bonus, backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs", [False, True])
def test_first_token_follows_target(backend, with_probs):
    vocab, k, n, temp = 40, 3, 20000, 0.8
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(vocab, generator=g) * 2
    p = torch.softmax(logits.double() / temp, 0)
    q = torch.softmax(torch.randn(vocab, generator=g).double() * 2, 0)
    rows = logits.repeat(n * k, 1).to(DEVICE)
    if with_probs:
        drafts = torch.multinomial(q.float(), n * k, replacement=True, generator=g)
        kw = dict(draft_probs=q.float().repeat(n * k, 1).to(DEVICE))
    else:
        drafts = torch.full((n * k,), int(torch.argmax(p * (1 - p))), dtype=torch.int64)   # one fixed guess
        kw = {}
    bonus = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    out = run(backend, rows, drafts.to(DEVICE), k, n, bonus, temperature=torch.full((n,), temp, device=DEVICE),
              seeds=torch.arange(n, device=DEVICE) * 7919, has_seed=torch.ones(n, dtype=torch.bool, device=DEVICE),
              positions=torch.full((n,), 5, dtype=torch.int64, device=DEVICE), **kw)
    first = torch.bincount(out[:, 0].long().cpu(), minlength=vocab)
    assert chi2_ok(first, p)
    # power: recovering from p itself instead of the residual would be visibly wrong
    if with_probs:
        accept = torch.minimum(p, q)           # P(draft x proposed and accepted) = min(p, q)
        wrong = accept + (1 - accept.sum()) * p
    else:
        x = int(drafts[0])
        wrong = (1 - p[x]) * p
        wrong[x] += p[x]
    assert not chi2_ok(first, wrong)


class Bigram:
    """p(next | last) for the target and q(next | last) for the draft, both random tables."""

    def __init__(self, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.target = torch.randn(vocab, vocab, generator=g) * 1.5
        self.draft = torch.randn(vocab, vocab, generator=g) * 1.5
        self.vocab = vocab

    def p(self, temp):
        return torch.softmax(self.target.double() / temp, 1)

    def q(self):
        return torch.softmax(self.draft.double(), 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k, with_probs, seeded", [(2, True, True), (3, False, False), (3, True, False),
                                                   (2, False, True)])
def test_emitted_sequences_follow_target(backend, k, with_probs, seeded):
    """Decode L tokens by repeated speculative steps; the sequence law is the target's."""
    vocab, length, n, temp = 4, 3, 20000, 1.3
    model = Bigram(vocab, seed=k * 10 + with_probs)
    p, q = model.p(temp), model.q()
    g = torch.Generator().manual_seed(3)
    seqs = [[0] for _ in range(n)]
    step = 0
    while min(len(s) for s in seqs) <= length:
        last = torch.tensor([s[-1] for s in seqs])
        drafts, ctx = [], last
        for _ in range(k):
            d = (torch.multinomial(q[ctx].float(), 1, generator=g)[:, 0] if with_probs
                 else torch.argmax(q[ctx], 1))            # n-gram style: a deterministic guess
            drafts.append(d)
            ctx = d
        drafts = torch.stack(drafts, 1)                    # [n, k]
        prev = torch.cat([last[:, None], drafts[:, :-1]], 1)
        rows = model.target[prev.flatten()]
        bonus = torch.multinomial(p[drafts[:, -1]].float(), 1, generator=g)[:, 0]
        kw = dict(temperature=torch.full((n,), temp, device=DEVICE), step=torch.tensor([step], device=DEVICE),
                  engine_seed=1234)
        if with_probs:
            kw["draft_probs"] = q[prev.flatten()].float().to(DEVICE)
        if seeded:
            kw.update(seeds=torch.arange(n, device=DEVICE) + 10**6,
                      has_seed=torch.ones(n, dtype=torch.bool, device=DEVICE),
                      positions=torch.tensor([len(s) for s in seqs], device=DEVICE))
        out = run(backend, rows.to(DEVICE), drafts.flatten().to(DEVICE), k, n, bonus.to(DEVICE), **kw)
        for s, row in zip(seqs, out.tolist()):
            s += row[:row.index(-1)] if -1 in row else row
        step += 1
    idx = torch.tensor([s[1] * vocab * vocab + s[2] * vocab + s[3] for s in seqs])
    counts = torch.bincount(idx, minlength=vocab ** 3)
    exact = (p[0][:, None, None] * p[:, :, None] * p[None, :, :]).flatten()   # p(a|0) p(b|a) p(c|b)
    assert chi2_ok(counts, exact)
    # power: the same sequences are far from the draft-free law at temperature 1
    p1 = model.p(1.0)
    assert not chi2_ok(counts, (p1[0][:, None, None] * p1[:, :, None] * p1[None, :, :]).flatten())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("sub", [None, 16, 128])
def test_recovered_token_follows_residual_over_chunks(backend, with_probs, sub):
    """The recovered token (a race over the sub-chunks of the row, then over the tokens of
    one sub-chunk) follows the residual exactly, at V = 300: 3 chunks of chunk_size(300) = 128
    tokens, sub-chunks of sub_chunk_size(300) = 64 (5 of them, the last one partial), 16
    (19) or 128 (3: the one-level chunk race)."""
    from specops.triton_kernels.rejection_sample import chunk_size, sub_chunk_size

    vocab, n, x = 300, 40000, 5
    chunk = chunk_size(vocab)
    assert (vocab + chunk - 1) // chunk == 3
    sub_size = sub_chunk_size(vocab) if sub is None else sub
    num_subs = (vocab + sub_size - 1) // sub_size
    assert sub is not None or num_subs == 5
    g = torch.Generator().manual_seed(21)
    logits = torch.randn(vocab, generator=g)
    logits[x] = 6.0                       # the draft holds about half of the mass of chunk 0 (and its sub-chunks)
    p = torch.softmax(logits.double(), 0)
    in_chunk = torch.arange(vocab) // chunk
    if with_probs:
        q = torch.softmax(torch.randn(vocab, generator=g).double() + 3.0 * (in_chunk == 1), 0)
        drafts = torch.multinomial(q.float(), n, replacement=True, generator=g)
        residual = torch.clamp(p - q, min=0.0)
        kw = dict(draft_probs=q.float().repeat(n, 1).to(DEVICE))
    else:
        drafts = torch.full((n,), x, dtype=torch.int64)
        residual = p.clone()
        residual[x] = 0.0
        kw = {}
    residual /= residual.sum()
    bonus = torch.zeros(n, dtype=torch.int64, device=DEVICE)   # an accepted row: [draft, 0]
    out = run(backend, logits.repeat(n, 1).to(DEVICE), drafts.to(DEVICE), 1, n, bonus,
              seeds=torch.arange(n, device=DEVICE) * 104729 + 3,
              has_seed=torch.ones(n, dtype=torch.bool, device=DEVICE),
              positions=torch.full((n,), 17, dtype=torch.int64, device=DEVICE), sub_chunk=sub, **kw).cpu()
    rejected = out[:, 1] == -1                        # K = 1: [recovered, -1] or [draft, bonus]
    assert int(rejected.sum()) > 10000
    counts = torch.bincount(out[rejected, 0].long(), minlength=vocab)
    assert chi2_ok(counts, residual)
    # power: the right tokens within each sub-chunk, but sub-chunks weighted by a wrong mass
    # (p's own masses: with x left in, without draft probs; ignoring q, with them)
    in_sub = torch.arange(vocab) // sub_size
    sub_w = torch.zeros(num_subs, dtype=torch.float64).index_add_(0, in_sub, p)
    sub_r = torch.zeros(num_subs, dtype=torch.float64).index_add_(0, in_sub, residual)
    wrong = torch.where(sub_r[in_sub] > 0, residual / sub_r[in_sub], 0.0) * (sub_w / sub_w.sum())[in_sub]
    wrong /= wrong.sum()
    assert not chi2_ok(counts, wrong)
