"""Sampling parameters through the engine: greedy rows with every logits-changing parameter on
(allowed tokens, bad words, min_tokens, logit bias, the three penalties) equal a plain reference
that re-applies them to the reference forward's logits step by step, also when the persistent
batch moves rows around and requests are preempted; random rows respect top-k/allowed sets."""

import random

import pytest
import torch
from model_fixtures import EOS_ID, tiny_checkpoint  # noqa: F401  (fixture)

from specops.engine.config import EngineConfig
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.loader import load_model
from specops.engine.model.reference import reference_forward
from specops.engine.sampling_params import SamplingParams

_LOADED = {}


def tiny(path, device="cpu"):
    if (path, device) not in _LOADED:
        _LOADED[path, device] = load_model(path, device=device, dtype=torch.float32)
    return _LOADED[path, device]


def reference_processed_greedy(lm, prompt, out, sp, banned_words):
    """Re-derive each greedy token: reference logits + vLLM's processing order."""
    V = lm.config.vocab_size
    logits_all = reference_forward(lm.model, prompt + out[:-1]).double()
    for j, tok in enumerate(out):
        x = logits_all[len(prompt) - 1 + j].clone()
        hist = out[:j]
        if sp.allowed_token_ids is not None:
            mask = torch.ones(V, dtype=torch.bool)
            mask[sp.allowed_token_ids] = False
            x[mask] = float("-inf")
        for word in banned_words:
            if len(word[:-1]) <= len(hist) and (len(word) == 1 or hist[len(hist) - len(word) + 1:] == word[:-1]):
                x[word[-1]] = float("-inf")
        if j < sp.min_tokens:
            for t in set(lm.tokenizer.eos_token_ids) | set(sp.stop_token_ids or []):
                x[t] = float("-inf")
        for t, b in (sp.logit_bias or {}).items():
            x[t] += b
        counts = torch.bincount(torch.tensor(hist, dtype=torch.int64), minlength=V)[:V].double()
        seen = counts > 0
        pmask = torch.zeros(V, dtype=torch.bool)
        pmask[prompt] = True
        rep = torch.where(pmask | seen, sp.repetition_penalty, 1.0)
        x = torch.where(x > 0, x / rep, x * rep)
        x -= sp.frequency_penalty * counts + sp.presence_penalty * seen.double()
        top2 = torch.topk(x, 2).values
        assert int(x.argmax()) == tok or float(top2[0] - top2[1]) < 1e-4, (j, int(x.argmax()), tok)


def test_processed_greedy_matches_reference(tiny_checkpoint):  # noqa: F811
    lm = tiny(tiny_checkpoint)
    rng = random.Random(11)
    prompts, params = [], []
    for i in range(10):
        prompts.append([rng.randrange(3, 384) for _ in range(rng.randrange(3, 40))])
        params.append(SamplingParams(
            temperature=0.0, max_tokens=rng.randrange(6, 16), ignore_eos=i % 3 == 0,
            repetition_penalty=rng.choice([1.0, 1.3, 2.0]), frequency_penalty=rng.choice([0.0, 0.7, 2.0]),
            presence_penalty=rng.choice([0.0, 1.5]), min_tokens=rng.choice([0, 4]),
            logit_bias={rng.randrange(3, 384): 8.0} if i % 2 else None,
            allowed_token_ids=rng.sample(range(3, 384), 40) + [EOS_ID] if i % 4 == 1 else None,
            bad_words=["the", "a"] if i % 5 == 2 else None, stop_token_ids=[7] if i % 3 == 1 else None))
    # A small budget and pool make rows come and go (moves) and requests get preempted.
    eng = LLMEngine(EngineConfig(max_model_len=112, max_num_batched_tokens=20, max_num_seqs=4, num_kv_blocks=14,
                                 block_size=8), loaded=lm)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert eng.scheduler.num_preemptions > 0
    for rid, p, sp in zip(ids, prompts, params):
        out = done[rid]
        assert out.error is None, out.error
        banned = eng._bad_words(sp)
        reference_processed_greedy(lm, p, out.token_ids, sp, banned)
        if sp.allowed_token_ids is not None:
            assert set(out.token_ids) <= set(sp.allowed_token_ids)
        assert len(out.token_ids) >= min(sp.min_tokens, sp.max_tokens)


def test_random_rows_respect_masks(tiny_checkpoint):  # noqa: F811
    lm = tiny(tiny_checkpoint)
    eng = LLMEngine(EngineConfig(max_model_len=128), loaded=lm)
    allowed = list(range(100, 140))
    sps = [SamplingParams(temperature=10.0, seed=i, max_tokens=30, ignore_eos=True, allowed_token_ids=allowed)
           for i in range(4)]
    sps.append(SamplingParams(temperature=10.0, top_k=1, max_tokens=30, ignore_eos=True))  # top_k=1 is greedy
    prompt = list(range(3, 20))
    ids = [eng.add_request(prompt, sp) for sp in sps]
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    for rid in ids[:4]:
        assert set(done[rid].token_ids) <= set(allowed)
        assert len(set(done[rid].token_ids)) > 5  # genuinely random
    greedy = LLMEngine(EngineConfig(max_model_len=128), loaded=lm)
    gid = greedy.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    while greedy.has_unfinished_requests():
        for o in greedy.step():
            if o.finished:
                assert o.token_ids == done[ids[4]].token_ids


@pytest.mark.parametrize("bad", [dict(top_k=-3), dict(min_p=1.5), dict(repetition_penalty=-1.0)])
def test_bad_sampling_params_fail_alone(tiny_checkpoint, bad):  # noqa: F811
    lm = tiny(tiny_checkpoint)
    eng = LLMEngine(EngineConfig(max_model_len=128), loaded=lm)
    good = eng.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    wrong = eng.add_request([5, 6, 7], SamplingParams(**bad))
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert done[wrong].error is not None and next(iter(bad)) in done[wrong].error
    assert done[good].error is None and len(done[good].token_ids) == 4


def test_plain_greedy_shortcut_agrees_with_sampler(tiny_checkpoint):  # noqa: F811
    from specops.engine.sampling import _checked_argmax
    from specops.sampling.metadata import SamplingMetadata
    from specops.sampling.sampler import Sampler

    x = torch.randn(6, 1000)
    x[1, 7] = float("nan")
    x[2, 3] = float("inf")
    x[3] = float("-inf")
    x[4, :500] = float("-inf")
    md = SamplingMetadata.from_params([0.0] * 6, vocab_size=1000)
    assert torch.equal(_checked_argmax(x.clone()), Sampler()(x.clone(), md).sampled_token_ids)
    # Through the engine: logprobs=0 forces the full Sampler, same greedy tokens.
    lm = tiny(tiny_checkpoint)
    prompts = [list(range(3, 30)), list(range(50, 61))]
    outs = {}
    for lp in (None, 0):
        eng = LLMEngine(EngineConfig(max_model_len=128), loaded=lm)
        ids = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=lp))
               for p in prompts]
        done = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = o.token_ids
        outs[lp] = [done[i] for i in ids]
    assert outs[None] == outs[0]
