"""RejectionSampler end to end: every sampling parameter at every draft position.

- greedy speculation with penalties, logit_bias, min_tokens and bad_words emits exactly the
  tokens of step-by-step greedy decoding through the Sampler;
- random speculation with temperature, top-k, top-p, min_p, logit_bias and penalties emits
  sequences whose law is the processed target law (exact, by enumeration in float64);
- seeded requests are batch invariant; the Triton kernels (interpreter on CPU) agree with
  the torch path; bad inputs.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from specops.sampling import (BatchUpdate, LogitsProcessor, LogitsProcessors, LogitsRows, Sampler, SamplingMetadata,
                              build_logits_processors)
from specops.spec_decode import build_spec_decode_metadata
from specops.spec_decode.rejection_sampler import RejectionSampler

from test_rejection_statistics import chi2_ok

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
BACKENDS = ["torch"] + (["triton"] if CUDA else [])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def params(**kw):
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, repetition_penalty=1.0,
                frequency_penalty=0.0, presence_penalty=0.0, min_tokens=0, logit_bias=None,
                stop_token_ids=None, ignore_eos=False, bad_words=None)
    base.update(kw)
    return SimpleNamespace(**base)


class Batch:
    """Requests with prompts and live output lists, their processors and per-step metadata."""

    def __init__(self, reqs, prompts, vocab, eos, device=DEVICE, engine_seed=7):
        self.reqs, self.prompts, self.vocab, self.eos, self.device = reqs, prompts, vocab, eos, device
        self.outputs = [[] for _ in reqs]
        self.engine_seed = engine_seed
        self.procs = build_logits_processors(len(reqs), vocab, device, eos_token_ids=[eos], use_entry_points=False)
        self.procs.update_state(BatchUpdate(len(reqs), added=[
            (i, r, p, out) for i, (r, p, out) in enumerate(zip(reqs, prompts, self.outputs))]))

    def metadata(self, step):
        n, V = len(self.reqs), self.vocab
        prompt_mask = torch.zeros(n, V, dtype=torch.bool)
        counts = torch.zeros(n, V, dtype=torch.int32)
        for i, (p, o) in enumerate(zip(self.prompts, self.outputs)):
            prompt_mask[i, p] = True
            if o:
                counts[i].index_add_(0, torch.tensor(o), torch.ones(len(o), dtype=torch.int32))
        g = lambda name: [getattr(r, name) for r in self.reqs]  # noqa: E731
        bad = {i: r.bad_words for i, r in enumerate(self.reqs) if r.bad_words}
        return SamplingMetadata.from_params(
            g("temperature"), vocab_size=V, device=self.device, top_k=g("top_k"), top_p=g("top_p"),
            min_p=g("min_p"), seeds=g("seed"),
            positions=[len(p) + len(o) for p, o in zip(self.prompts, self.outputs)],
            engine_seed=self.engine_seed, step=step, repetition_penalties=g("repetition_penalty"),
            frequency_penalties=g("frequency_penalty"), presence_penalties=g("presence_penalty"),
            prompt_mask=prompt_mask.to(self.device), output_counts=counts.to(self.device),
            bad_words_token_ids=bad or None,
            output_token_ids=[list(o) for o in self.outputs] if bad else None,
            logitsprocs=self.procs, rows=LogitsRows(list(range(n)), [len(o) for o in self.outputs]))


def spec_step(batch, model_logits, drafts, step, sampler, draft_probs=None):
    """One speculative step: rows [target..., bonus] per request from the model, then verify."""
    counts = [len(d) for d in drafts]
    rows = []
    for s, p, d in zip(batch.outputs, batch.prompts, drafts):
        ctx = list(p) + list(s)
        for t in d:
            rows.append(model_logits(ctx))
            ctx = ctx + [t]
        rows.append(model_logits(ctx))
    sched = [c + 1 for c in counts]
    spec = build_spec_decode_metadata(counts, torch.cumsum(torch.tensor(sched), 0), device=batch.device)
    logits = torch.stack(rows).to(batch.device)      # per request [targets..., bonus]: spec's layout
    flat = torch.tensor([t for d in drafts for t in d], dtype=torch.int64, device=batch.device)
    out = sampler(logits, spec, batch.metadata(step), draft_token_ids=flat, draft_probs=draft_probs,
                  draft_token_lists=[list(d) for d in drafts])
    return out


# ---- greedy: speculation == step-by-step greedy through the Sampler ----------------------------

class Trigram:
    def __init__(self, vocab, seed=0, scale=2.0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=g) * scale

    def __call__(self, ctx):
        return self.table[ctx[-2], ctx[-1]]


def greedy_reqs():
    return [params(temperature=0.0, frequency_penalty=0.8, presence_penalty=0.5, repetition_penalty=1.4),
            params(temperature=0.0, logit_bias={3: 2.5, 7: -1.0}, min_tokens=4),
            params(temperature=0.0, bad_words=[[5, 6], [9]], repetition_penalty=2.0),
            params(temperature=0.0, min_tokens=2, frequency_penalty=1.5)]


@pytest.mark.parametrize("kind", ["random", "correct", "wrong"])
def test_greedy_speculation_with_processing_equals_greedy(kind):
    vocab, eos, length = 12, 0, 8
    model = Trigram(vocab, seed=4)
    model.table[:, :, eos] += 2.5          # EOS is often the argmax: min_tokens has work to do
    prompts = [[1, 2], [3, 4], [5, 6], [2, 9]]
    ks = [3, 2, 0, 4]
    # step by step through the Sampler
    ref = Batch(greedy_reqs(), prompts, vocab, eos)
    for step in range(length):
        md = ref.metadata(step)
        logits = torch.stack([model(p + o) for p, o in zip(prompts, ref.outputs)]).to(DEVICE)
        toks = Sampler()(logits, md).sampled_token_ids.tolist()
        for o, t in zip(ref.outputs, toks):
            o.append(t)
    # speculative
    spec = Batch(greedy_reqs(), prompts, vocab, eos)
    g = torch.Generator().manual_seed(2)
    step = 0
    while min(len(o) for o in spec.outputs) < length:
        drafts = []
        for o, p, k, r in zip(spec.outputs, prompts, ks, range(4)):
            truth = ref.outputs[r][len(o):len(o) + k]
            truth += [0] * (k - len(truth))
            drafts.append({"random": torch.randint(0, vocab, (k,), generator=g).tolist(), "correct": truth,
                           "wrong": [(t + 1) % vocab for t in truth]}[kind])
        out = spec_step(spec, model, drafts, step, RejectionSampler()).output_token_ids
        for o, row, k in zip(spec.outputs, out.tolist(), ks):
            emitted = row[:row.index(-1)] if -1 in row else row
            if kind == "correct" and len(o) + k < length:
                assert len(emitted) == k + 1
            if kind == "wrong":
                assert len(emitted) == 1
            o += emitted
        step += 1
    for o, e in zip(spec.outputs, ref.outputs):
        assert o[:length] == e[:length]


@pytest.mark.parametrize("kind", ["correct", "tempting"])
def test_greedy_bad_words_completed_by_an_earlier_draft(kind):
    # bad_words [5, 6]: a target row whose earlier draft is 5 must ban 6 (the model's favourite
    # after 5), so that speculation emits exactly step-by-step greedy decoding. "correct"
    # drafts are the greedy continuation; "tempting" ones propose the banned 6 after each 5.
    vocab, eos, length = 12, 0, 10
    model = Trigram(vocab, seed=6)
    model.table[:, :, 5] += 3.0            # 5 is often the argmax...
    model.table[:, 5, 6] += 20.0           # ...and 6 always follows it, unless banned
    reqs = lambda: [params(temperature=0.0, bad_words=[[5, 6], [9]]), params(temperature=0.0)]  # noqa: E731
    prompts, ks = [[1, 2], [3, 4]], [4, 2]
    ref = Batch(reqs(), prompts, vocab, eos)
    for step in range(length + max(ks)):
        logits = torch.stack([model(p + o) for p, o in zip(prompts, ref.outputs)]).to(DEVICE)
        for o, t in zip(ref.outputs, Sampler()(logits, ref.metadata(step)).sampled_token_ids.tolist()):
            o.append(t)
    spec = Batch(reqs(), prompts, vocab, eos)
    exercised, step = 0, 0
    while min(len(o) for o in spec.outputs) < length:
        drafts = []
        for r, (o, k) in enumerate(zip(spec.outputs, ks)):
            d = ref.outputs[r][len(o):len(o) + k]
            if kind == "tempting":
                d = [6 if i and d[i - 1] == 5 else t for i, t in enumerate(d)]
            drafts.append(d)
        # a target row after a draft 5 whose unprocessed argmax is the banned 6
        ctx = prompts[0] + spec.outputs[0]
        exercised += sum(drafts[0][i - 1] == 5 and int(model(ctx + drafts[0][:i]).argmax()) == 6
                         for i in range(1, len(drafts[0])))
        out = spec_step(spec, model, drafts, step, RejectionSampler()).output_token_ids
        for o, row in zip(spec.outputs, out.tolist()):
            o += row[:row.index(-1)] if -1 in row else row
        step += 1
    assert exercised > 0
    for o, e in zip(spec.outputs, ref.outputs):
        assert o[:length] == e[:length]
    assert 5 in ref.outputs[0][:length] and all(a != 5 or b != 6 for a, b in zip(ref.outputs[0], ref.outputs[0][1:]))


# ---- random: the law of emitted sequences is the processed target law --------------------------

def processed_probs(logits, prompt, hist, r, vocab, eos):
    """Exact float64 processed distribution of the next token (Sampler conventions)."""
    x = logits.double().clone()
    if len(hist) < r.min_tokens:
        x[eos] = -math.inf
    for t, b in (r.logit_bias or {}).items():
        x[t] += b
    counts = torch.bincount(torch.tensor(hist, dtype=torch.long), minlength=vocab).double()
    seen = (counts > 0) | torch.isin(torch.arange(vocab), torch.tensor(prompt))
    rep = torch.where(seen, r.repetition_penalty, 1.0)
    x = torch.where(x > 0, x / rep, x * rep)
    x = x - r.frequency_penalty * counts - r.presence_penalty * (counts > 0).double()
    x = x / r.temperature
    keep = x > -math.inf
    if r.min_p > 0:
        keep &= x >= x.max() + math.log(r.min_p)
    if 0 < r.top_k < vocab:
        kth = torch.sort(torch.where(keep, x, -math.inf), descending=True).values[r.top_k - 1]
        keep &= x >= kth
    if r.top_p < 1:
        e = torch.where(keep, torch.exp(x - x.max()), 0.0)
        above = torch.stack([e[x > x[i]].sum() for i in range(vocab)])
        keep &= above < r.top_p * e.sum()
    p = torch.where(keep, torch.exp(x - x.max()), 0.0)
    return p / p.sum()


class Bigram:
    def __init__(self, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.target = torch.randn(vocab, vocab, generator=g) * 1.2
        self.draft = torch.randn(vocab, vocab, generator=g) * 1.2

    def __call__(self, ctx):
        return self.target[ctx[-1]]


def sequence_law(model, r, vocab, eos, r_last=None):
    """Exact law of the first 3 tokens after the prompt [1], as [vocab ** 3] (index a * V * V + b * V + c);
    the third token is processed with r_last (default r)."""
    r_last = r_last or r
    law = torch.zeros(vocab, vocab, vocab, dtype=torch.float64)
    p0 = processed_probs(model([1]), [1], [], r, vocab, eos)
    for a in range(vocab):
        p1 = processed_probs(model([1, a]), [1], [a], r, vocab, eos)
        for b in range(vocab):
            law[a, b] = p0[a] * p1[b] * processed_probs(model([1, a, b]), [1], [a, b], r_last, vocab, eos)
    return law.flatten()


# "top_k": top-k, top-p and min_p together (top-k 4 already removes what min_p 0.04 would);
# "min_p": min_p alone, high enough to cut tokens that every other setting keeps
CUTS = {"top_k": dict(top_k=4, top_p=0.92, min_p=0.04), "min_p": dict(min_p=0.15)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs, seeded, cut", [(True, True, "top_k"), (False, False, "top_k"),
                                                     (True, False, "min_p")])
def test_sequences_follow_processed_target(backend, with_probs, seeded, cut):
    vocab, eos, length, n, k = 6, 5, 3, 12000, 2
    model = Bigram(vocab, seed=21)
    r = params(temperature=0.9, frequency_penalty=0.6, presence_penalty=0.3, repetition_penalty=1.3,
               logit_bias={2: 0.8}, min_tokens=2, **CUTS[cut])
    # fresh draws on every run: request seeds, engine seed (unseeded rows) and drafts from the global RNG
    first_seed, engine_seed = torch.randint(0, 2**31, (2,)).tolist()
    reqs = [params(**dict(vars(r), seed=(first_seed + i if seeded else None))) for i in range(n)]
    batch = Batch(reqs, [[1]] * n, vocab, eos, engine_seed=engine_seed)
    q = torch.softmax(model.draft.double(), 1)
    sampler = RejectionSampler(backend=backend)
    step = 0
    while min(len(o) for o in batch.outputs) < length:
        last = torch.tensor([([1] + o)[-1] for o in batch.outputs])
        cols, ctx = [], last
        for _ in range(k):
            d = torch.multinomial(q[ctx].float(), 1)[:, 0] if with_probs else torch.argmax(q[ctx], 1)
            cols.append(d)
            ctx = d
        drafts = torch.stack(cols, 1)
        prev = torch.cat([last[:, None], drafts[:, :-1]], 1).flatten()
        probs = q[prev].float().to(DEVICE) if with_probs else None
        out = spec_step(batch, model, drafts.tolist(), step, sampler, draft_probs=probs).output_token_ids
        for o, row in zip(batch.outputs, out.tolist()):
            o += row[:row.index(-1)] if -1 in row else row
        step += 1
    idx = torch.tensor([o[0] * vocab * vocab + o[1] * vocab + o[2] for o in batch.outputs])
    counts = torch.bincount(idx, minlength=vocab ** 3)
    exact = sequence_law(model, r, vocab, eos)
    assert chi2_ok(counts, exact)
    # power: the law that ignores the earlier drafts in the penalties (counts of the output only)
    plain = params(**dict(vars(r), frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0))
    assert not chi2_ok(counts, sequence_law(model, r, vocab, eos, r_last=plain))
    if cut == "min_p":
        # power: min_p cuts much of the law (total variation 0.31 from the law without it), so a
        # sampler or verifier that ignored it would fail
        without = sequence_law(model, params(**dict(vars(r), min_p=0.0)), vocab, eos)
        assert (exact - without).abs().sum() / 2 > 0.2
        assert not chi2_ok(counts, without)


# ---- seeds, backends, bad inputs -----------------------------------------------------------------

def _mixed_reqs(seed_of_first):
    return [params(temperature=0.8, top_k=5, seed=seed_of_first, frequency_penalty=0.4, logit_bias={1: 1.0}),
            params(temperature=0.0, repetition_penalty=1.5),
            params(temperature=1.2, top_p=0.8, min_p=0.1, seed=77)]


def test_seeded_request_is_batch_invariant():
    vocab = 50
    model = Trigram(vocab, seed=9, scale=1.0)
    prompts = [[1, 2], [4, 4], [7, 3]]
    drafts = [[3, 8, 1], [5], [2, 2]]
    a = Batch(_mixed_reqs(123), prompts, vocab, eos=0)
    out_a = spec_step(a, model, drafts, 3, RejectionSampler()).output_token_ids
    # the same request 0 after a different neighbour, at another row and step
    b = Batch([_mixed_reqs(123)[2], params(temperature=0.5, top_k=3), _mixed_reqs(123)[0]],
              [prompts[2], [9, 9], prompts[0]], vocab, eos=0)
    out_b = spec_step(b, model, [drafts[2], [1, 1, 1], drafts[0]], 11, RejectionSampler()).output_token_ids
    assert torch.equal(out_a[0], out_b[2])
    assert torch.equal(out_a[2, :3], out_b[0, :3])
    # and it repeats exactly
    a2 = Batch(_mixed_reqs(123), prompts, vocab, eos=0)
    assert torch.equal(spec_step(a2, model, drafts, 3, RejectionSampler()).output_token_ids, out_a)


def test_triton_kernels_agree_with_torch_through_the_sampler():
    vocab = 200
    model = Trigram(vocab, seed=10, scale=1.5)
    prompts = [[1, 2], [4, 4], [7, 3]]
    drafts = [[3, 8, 1], [5], []]
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, vocab, generator=g), 1).to(DEVICE)
    outs = []
    for backend in ("triton", "torch"):
        batch = Batch(_mixed_reqs(5), prompts, vocab, eos=0)
        sampler = Sampler(backend="auto" if CUDA else "torch")   # the same Sampler for both kernels
        outs.append(spec_step(batch, model, drafts, 1, RejectionSampler(sampler, backend=backend),
                              draft_probs=probs))
    assert torch.equal(outs[0].output_token_ids.cpu(), outs[1].output_token_ids.cpu())
    assert torch.equal(outs[0].bonus.sampled_token_ids, outs[1].bonus.sampled_token_ids)


def test_temperature_only_fast_path_matches_kernel_call():
    # no processing: the kernels read target rows in place; same tokens as the explicit op
    from specops.spec_decode import rejection_sample
    vocab = 64
    spec = build_spec_decode_metadata([2, 0, 3], [3, 4, 8], device=DEVICE)
    md = SamplingMetadata.from_params([0.7, 1.0, 0.0], vocab_size=vocab, device=DEVICE, seeds=[3, None, 4],
                                      positions=[10, 20, 30], engine_seed=5, step=2)
    logits = torch.randn(8, vocab, device=DEVICE)
    drafts = torch.tensor([1, 2, 3, 4, 5], device=DEVICE)
    out = RejectionSampler()(logits, spec, md, draft_token_ids=drafts)
    direct = rejection_sample(logits, drafts, spec.cu_num_draft_tokens, 3, out.bonus.sampled_token_ids,
                              target_rows=spec.target_logits_indices, temperature=md.temperature,
                              is_greedy=md.temperature == 0, seeds=md.request_seeds, has_seed=md.has_seed,
                              positions=md.token_positions, step=md.step, engine_seed=5)
    assert torch.equal(out.output_token_ids, direct)
    # the bonus tokens are the Sampler's draws at positions + K
    bonus_md = md.expand([0, 1, 2], position_offsets=[2, 0, 3])
    assert torch.equal(out.bonus.sampled_token_ids,
                       Sampler()(logits[spec.bonus_logits_indices.long()], bonus_md).sampled_token_ids)
    # every request with K = 2 drafts: the bonus rows are read in place (a strided view)
    spec = build_spec_decode_metadata([2, 2, 2], [3, 6, 9], device=DEVICE)
    logits = torch.randn(9, vocab, device=DEVICE)
    out = RejectionSampler()(logits, spec, md, draft_token_ids=torch.tensor([1, 2, 3, 4, 5, 6], device=DEVICE))
    bonus_md = md.expand([0, 1, 2], position_offsets=[2, 2, 2])
    assert torch.equal(out.bonus.sampled_token_ids,
                       Sampler()(logits[spec.bonus_logits_indices.long()], bonus_md).sampled_token_ids)


class HistoryBan(LogitsProcessor):
    """Custom processor: bans token (len(history) + sum(drafts before the row)) % vocab, and
    records the rows it was shown."""

    def __init__(self, max_num_reqs, vocab_size, device="cpu"):
        super().__init__(max_num_reqs, vocab_size, device)
        self.seen = []

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        pass

    def apply(self, logits, rows=None):
        self.seen.append(rows)
        for r in range(logits.shape[0]):
            pre = rows.preceding_token_ids[r] if rows.preceding_token_ids else []
            logits[r, (rows.num_output_tokens[r] + sum(pre)) % self.vocab_size] = float("-inf")
        return logits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_custom_processor_and_allowed_tokens_see_every_row(temperature):
    vocab = 16
    logits = torch.zeros(8, vocab, device=DEVICE)
    logits[:, 3] = 5.0                       # the favourite token, unless banned
    spec = build_spec_decode_metadata([3, 0, 2], [4, 5, 8], device=DEVICE)
    procs = LogitsProcessors([HistoryBan(13, vocab, DEVICE)])
    md = SamplingMetadata.from_params([temperature] * 3, vocab_size=vocab, device=DEVICE, seeds=[1, 2, 3],
                                      positions=[5, 6, 7], allowed_token_ids=[None, None, [3, 4, 9]],
                                      logitsprocs=procs, rows=LogitsRows([10, 11, 12], [1, 3, 0]))
    drafts = [[3, 3, 3], [], [9, 3]]
    out = RejectionSampler()(logits, spec, md, draft_token_ids=torch.tensor([3, 3, 3, 9, 3], device=DEVICE),
                             draft_token_lists=drafts)
    # bonus rows first (output length + K, all K drafts before them), then the target rows
    bonus_rows, target_rows = procs.all[0].seen
    assert bonus_rows.req_indices == [10, 11, 12] and bonus_rows.num_output_tokens == [4, 3, 2]
    assert bonus_rows.preceding_token_ids == drafts
    assert target_rows.req_indices == [10, 10, 10, 12, 12]
    assert target_rows.num_output_tokens == [1, 2, 3, 0, 1]
    assert target_rows.preceding_token_ids == [[], [3], [3, 3], [], [9]]
    toks = [row[:row.index(-1)] if -1 in row else row for row in out.output_token_ids.tolist()]
    # request 1's bonus row bans 3 (3 outputs, no drafts); request 2 only has {3, 4, 9}
    assert toks[1][0] != 3 and all(t in (3, 4, 9) for t in toks[2])
    if temperature == 0.0:
        # request 0: bans 1, 5, 9 on its target rows and 13 on its bonus row: all drafts accepted;
        # request 1: 3 banned, every other logit 0: token 0; request 2: draft 9 != argmax 3
        assert toks == [[3, 3, 3, 3], [0], [3]]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_min_p_in_metadata_needs_no_rows(backend):
    # min_p given as a metadata tensor (no processors, no LogitsRows: the plain Sampler's API)
    # is accepted and gives the tokens of the same min_p through the engine's processor with
    # rows, over 12 steps of seeds; without min_p some token differs (the test has power)
    vocab = 50
    spec = build_spec_decode_metadata([2, 1, 0], [3, 5, 6], device=DEVICE)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, vocab, generator=g).to(DEVICE)
    drafts = torch.tensor([4, 9, 17], device=DEVICE)
    temps, min_ps, positions = [0.7, 1.3, 1.0], [0.3, 0.0, 0.4], [10, 4, 7]
    rs = RejectionSampler(Sampler(backend="auto" if CUDA else "torch"), backend=backend)
    procs = build_logits_processors(3, vocab, DEVICE, eos_token_ids=[0], use_entry_points=False)
    procs.update_state(BatchUpdate(3, added=[(i, params(temperature=t, min_p=m), [1], [])
                                             for i, (t, m) in enumerate(zip(temps, min_ps))]))
    outs = {"plain": [], "procs": [], "none": []}
    for step in range(12):
        seeds = [step, 100 + step, None]
        kw = dict(vocab_size=vocab, device=DEVICE, seeds=seeds, positions=positions, step=step)
        mds = {"plain": SamplingMetadata.from_params(temps, min_p=min_ps, **kw),
               "procs": SamplingMetadata.from_params(temps, logitsprocs=procs, rows=LogitsRows([0, 1, 2], [0, 0, 0]),
                                                     **kw),
               "none": SamplingMetadata.from_params(temps, **kw)}
        for name, md in mds.items():
            out = rs(logits.clone(), spec, md, draft_token_ids=drafts)
            outs[name].append(torch.cat([out.output_token_ids.flatten(), out.bonus.sampled_token_ids.flatten()]).cpu())
    plain, procs_, none = (torch.stack(outs[n]) for n in ("plain", "procs", "none"))
    assert torch.equal(plain, procs_)
    assert not torch.equal(plain, none)


def test_bad_inputs():
    spec = build_spec_decode_metadata([2, 0], [3, 4])
    md = SamplingMetadata.from_params([0.5, 0.5], vocab_size=10)
    rs = RejectionSampler()
    d = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="logits must be"):
        rs(torch.zeros(3, 10), spec, md, draft_token_ids=d)
    with pytest.raises(ValueError, match="metadata has 1 rows"):
        rs(torch.zeros(4, 10), spec, SamplingMetadata.from_params([0.5], vocab_size=10), draft_token_ids=d)
    with pytest.raises(ValueError, match="draft_token_ids is required"):
        rs(torch.zeros(4, 10), spec, md)
    with pytest.raises(ValueError, match="draft_token_ids must have shape"):
        rs(torch.zeros(4, 10), spec, md, draft_token_ids=torch.tensor([1]))
    with pytest.raises(ValueError, match="backend must be"):
        RejectionSampler(backend="cuda")
    procs = build_logits_processors(2, 10, eos_token_ids=[0], use_entry_points=False)
    procs.update_state(BatchUpdate(2, added=[(0, params(logit_bias={1: 1.0}), [1], [])]))
    md = SamplingMetadata.from_params([0.5, 0.5], vocab_size=10, logitsprocs=procs)
    with pytest.raises(ValueError, match="metadata.rows"):
        rs(torch.zeros(4, 10), spec, md, draft_token_ids=d)
