"""Block accounting under speculative decoding: after every step of a run with many accepted and
rejected drafts (greedy and sampled requests, chunked prefill, preemption, prefix-cache hits), the
KV cache of every running request at its committed positions equals the K/V of a from-scratch
reference forward over its committed tokens (the rejected drafts' K/V never stays where a committed
token's belongs), the prefix cache registers committed tokens only, the draft model's own cache
mirrors its committed tokens too, and when every request has finished no block of either pool is
left allocated."""

import random

import pytest
import torch
import torch.nn.functional as F
from model_fixtures import make_tiny_checkpoint

import specops.engine.model.reference as reference
from specops.engine.config import EngineConfig
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.loader import load_model
from specops.engine.sampling_params import SamplingParams


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The untied tiny target, and a perturbed copy as draft (right about half the time)."""
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_untied_kv"), tie_word_embeddings=False)
    target = load_model(path, device="cpu", dtype=torch.float32)
    draft = load_model(path, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.1)
    return target, draft


class _CaptureSDPA:
    """Stands in for torch.nn.functional inside the reference forward and keeps each layer's K/V."""

    def __init__(self):
        self.kv = []

    def __getattr__(self, name):
        return getattr(F, name)

    def scaled_dot_product_attention(self, q, k, v, **kwargs):
        self.kv.append((k, v))
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def reference_kv(model, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (K, V) [len(tokens), num_kv_heads, head_dim] of the plain full-sequence reference forward."""
    capture = _CaptureSDPA()
    saved = reference.F
    reference.F = capture
    try:
        reference.reference_forward(model, tokens)
    finally:
        reference.F = saved
    c = model.config
    group = c.num_heads // c.num_kv_heads
    # the reference repeats each K/V head `group` times along the head dimension: keep one of each
    return [(k.transpose(0, 1)[:, ::group], v.transpose(0, 1)[:, ::group]) for k, v in capture.kv]


def cached_kv(kv_caches, block_ids: list[int], block_size: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (K, V) [n, num_kv_heads, head_dim] at positions 0..n-1 of a block table."""
    pos = torch.arange(n)
    blocks = torch.tensor(block_ids, dtype=torch.int64)[pos // block_size]
    return [(cache[0, blocks, pos % block_size], cache[1, blocks, pos % block_size]) for cache in kv_caches]


def assert_same_kv(got, want, what, num_layers):
    assert len(got) == len(want) == num_layers, (what, len(got), len(want), num_layers)
    for layer, ((k, v), (rk, rv)) in enumerate(zip(got, want)):
        assert torch.allclose(k, rk, atol=2e-4, rtol=1e-3), (what, layer, (k - rk).abs().max())
        assert torch.allclose(v, rv, atol=2e-4, rtol=1e-3), (what, layer, (v - rv).abs().max())


def check_step(eng, draft_model) -> int:
    """Compare every running request's committed KV with the reference; returns positions checked."""
    bm = eng.block_manager
    checked = 0
    for req in eng.scheduler.running:
        n = req.num_computed_tokens
        assert n <= req.num_tokens
        if n == 0:
            continue
        want = reference_kv(eng.model, req.all_token_ids[:n])
        assert_same_kv(cached_kv(eng.runner.kv_caches, req.block_ids, bm.block_size, n), want, req.request_id,
                       eng.model.config.num_layers)
        checked += n
        for i in range(req.num_hashed_blocks):  # registered blocks hold committed tokens
            assert (i + 1) * bm.block_size <= n
            key = bm.blocks[req.block_ids[i]].key
            assert key is None or list(key[1]) == req.all_token_ids[i * bm.block_size:(i + 1) * bm.block_size]
        state = getattr(eng.proposer, "states", {}).get(req.request_id)
        if state is not None and state.num_computed > 0:  # the draft model's cache of the same request
            m = state.num_computed
            k, v = eng.proposer.committed_kv(req.request_id, layer=0).unbind(0)
            rk, rv = reference_kv(draft_model, req.all_token_ids[:m])[0]
            assert_same_kv([(k, v)], [(rk, rv)], f"draft {req.request_id}", 1)   # layer 0 only
    return checked


@pytest.mark.parametrize("spec", ["ngram", "draft"])
def test_committed_kv_equals_reference_and_nothing_leaks(models, spec):
    target, draft = models
    rng = random.Random(7)
    shared = [rng.randrange(3, 384) for _ in range(16)]
    prompts, params = [], []
    for i in range(16):
        phrase = [rng.randrange(3, 384) for _ in range(rng.randrange(3, 8))]
        prompts.append((shared if i % 2 else []) + phrase * 3)
        params.append(SamplingParams(temperature=0.0 if i % 3 else 1.0, seed=i, max_tokens=rng.randrange(24, 48),
                                     ignore_eos=True))
    eng = LLMEngine(EngineConfig(max_model_len=160, block_size=4, num_kv_blocks=56, max_num_seqs=6,
                                 max_num_batched_tokens=32, spec_method=spec, num_spec_tokens=4),
                    loaded=target, draft_loaded=draft if spec == "draft" else None)
    for p, sp in zip(prompts, params):
        eng.add_request(p, sp)
    checked = 0
    while eng.has_unfinished_requests():
        eng.step()
        eng.scheduler.check()
        checked += check_step(eng, draft.model)
    st = eng.stats()["spec_decoding"]
    assert st["num_accepted_tokens"] > 40 and st["num_draft_tokens"] - st["num_accepted_tokens"] > 40, st
    assert eng.scheduler.num_preemptions > 0 and eng.block_manager.num_prefix_hits > 0
    assert checked > 1000
    # nothing leaks: both pools are whole again, every registered block is free and cached only
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_cnt == 0 for b in bm.blocks)
    bm.check([])
    if spec == "draft":
        assert len(eng.proposer.free_blocks) == eng.proposer.num_blocks and not eng.proposer.states
