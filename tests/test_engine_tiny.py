"""The engine end to end on the tiny random checkpoint: greedy tokens equal the reference forward's,
scheduling (chunked prefill, prefix caching, preemption) never changes them, nothing is lost,
aborts free every block, bad requests fail alone."""

import itertools
import random
import threading

import pytest
import torch
from engine_runs import run_all
from model_fixtures import EOS_ID, make_tiny_checkpoint, tiny_checkpoint  # noqa: F401  (fixture)

from specops.engine.config import EngineConfig
from specops.engine.llm import LLM
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.loader import load_model
from specops.engine.model.reference import reference_forward
from specops.engine.sampling_params import SamplingParams

_LOADED = {}


def loaded_model(path, device, dtype=torch.float32):
    key = (path, device, dtype)
    if key not in _LOADED:
        _LOADED[key] = load_model(path, device=device, dtype=dtype)
    return _LOADED[key]


def engine(lm, **kw) -> LLMEngine:
    kw.setdefault("max_model_len", 256)
    return LLMEngine(EngineConfig(**kw), loaded=lm)


def assert_reference_greedy(lm, prompt_ids, out_ids, exact=True, logprobs=None):
    """Teacher-forced: every engine token is the reference argmax after its prefix, which makes the
    engine's sequence the reference's greedy decoding (by induction). One reference forward.
    With the engine's `logprobs` (fp32), each equals the reference's log_softmax there too."""
    seq = list(prompt_ids) + list(out_ids)
    logits = reference_forward(lm.model, seq[:-1])[len(prompt_ids) - 1:]  # row j predicts out_ids[j]
    toks = torch.tensor(out_ids, device=logits.device)
    if logprobs is not None:
        ref = torch.log_softmax(logits.float(), dim=-1).gather(1, toks[:, None]).squeeze(1).tolist()
        tol = 1e-4 if logits.device.type == "cpu" else 2e-3
        assert [lp.logprob for lp in logprobs] == pytest.approx(ref, abs=tol)
    best = logits.max(dim=-1).values
    chosen = logits.gather(1, toks[:, None]).squeeze(1)
    if exact and logits.device.type == "cpu":
        assert torch.equal(logits.argmax(dim=-1), toks), (logits.argmax(dim=-1).tolist(), out_ids)
    elif exact:  # CUDA fp32: GEMM kernels differ between the paged and the reference forward
        assert bool((chosen >= best - 1e-3).all()), (best - chosen).max()
    else:  # bf16 paged vs bf16 reference: near-ties may flip
        assert bool((chosen >= best - 0.5).all()), (best - chosen).max()
        assert float((logits.argmax(dim=-1) == toks).float().mean()) >= 0.9


def mixed_prompts(n, seed, vocab=384, shared=True):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(40)]
    out = []
    for _ in range(n):
        body = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 50))]
        out.append((prefix[:rng.choice([0, 16, 33, 40])] if shared else []) + body)
    return out


GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def test_greedy_matches_reference(tiny_checkpoint, device):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, device)
    prompts = mixed_prompts(6, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=0)
    outs = run_all(engine(lm), prompts, [params] * len(prompts))
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == 20 and o.outputs[0].finish_reason == "length"
        assert_reference_greedy(lm, p, o.token_ids, logprobs=o.outputs[0].logprobs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 + FlashInfer path runs on CUDA")
def test_greedy_matches_reference_bf16_cuda(tiny_checkpoint):  # noqa: F811
    lm = load_model(tiny_checkpoint, device="cuda", dtype=torch.bfloat16)  # FlashInfer when installed
    prompts = mixed_prompts(6, seed=2)
    outs = run_all(engine(lm), prompts, [GREEDY] * len(prompts))
    for p, o in zip(prompts, outs):
        assert_reference_greedy(lm, p, o.token_ids, exact=False)


SCHEDULES = {
    "chunked": dict(max_num_batched_tokens=16, max_num_seqs=3),
    "tiny-kv-preempt": dict(num_kv_blocks=12, block_size=8, max_num_batched_tokens=64, max_model_len=96),
    "no-prefix-cache": dict(enable_prefix_caching=False, max_num_batched_tokens=40),
    "block-size-1": dict(block_size=1, max_num_batched_tokens=33),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_scheduling_does_not_change_outputs(tiny_checkpoint, device, name):  # noqa: F811
    # Token ids and their logprobs: this tiny model's greedy tokens mostly repeat the last prompt
    # token, so ids alone barely depend on the KV cache and the positions (a review planted a
    # position shift by one: ids caught it once in 30 runs); every logprob depends on them.
    lm = loaded_model(tiny_checkpoint, device)
    prompts = mixed_prompts(8, seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)] * len(prompts)
    base = run_all(engine(lm), prompts, params)
    eng = engine(lm, **SCHEDULES[name])
    outs = run_all(eng, prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    for o, b in zip(outs, base):
        got = [lp.logprob for lp in o.outputs[0].logprobs]
        want = [lp.logprob for lp in b.outputs[0].logprobs]
        assert len(got) == 20
        assert got == pytest.approx(want, abs=1e-4), (o.request_id, got, want)
    if name == "tiny-kv-preempt":
        assert eng.scheduler.num_preemptions > 0
    if name == "chunked":
        assert eng.block_manager.num_prefix_hits > 0  # shared prefixes came from the cache


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preempted_request_comes_back_without_chunked_prefill(tiny_checkpoint, prefix_caching):  # noqa: F811
    # whole prompts only (10 tokens, budget 16), but a preempted request's recompute (prompt +
    # output) exceeds the budget: it is recomputed in chunks; it once blocked the queue until
    # "scheduler made no progress" failed every request
    lm = loaded_model(tiny_checkpoint, "cpu")
    prompts = [list(range(3, 13)), list(range(12, 2, -1))]
    base = run_all(engine(lm), prompts, [GREEDY] * 2)
    eng = engine(lm, enable_chunked_prefill=False, max_num_batched_tokens=16, block_size=4, num_kv_blocks=10,
                 max_model_len=40, enable_prefix_caching=prefix_caching)
    outs = run_all(eng, prompts, [GREEDY] * 2)
    assert eng.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]


def test_prefix_cache_hit_reuses_kv(tiny_checkpoint, device):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, device)
    eng = engine(lm, block_size=4)
    prompt = mixed_prompts(1, seed=4, shared=False)[0] + list(range(3, 40))
    first = run_all(eng, [prompt], [GREEDY])[0]
    second = run_all(eng, [prompt], [GREEDY])[0]
    assert second.num_cached_tokens == (len(prompt) - 1) // 4 * 4 > 0
    assert second.token_ids == first.token_ids
    assert_reference_greedy(lm, prompt, second.token_ids)


def test_many_requests_mixed_lengths_none_lost(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    rng = random.Random(5)
    eng = engine(lm, max_num_batched_tokens=48, max_num_seqs=16, num_kv_blocks=40, block_size=8, max_model_len=128)
    prompts = mixed_prompts(60, seed=5)
    want = {}
    done = {}
    step = 0
    while prompts or eng.has_unfinished_requests():
        for _ in range(rng.randrange(0, 4)):  # continuous arrivals
            if prompts:
                sp = SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 12), ignore_eos=rng.random() < 0.5)
                want[eng.add_request(prompts.pop(), sp)] = sp
        for out in eng.step():
            if out.finished:
                assert out.request_id not in done
                done[out.request_id] = out
        eng.scheduler.check()
        step += 1
        assert step < 3000
    assert set(done) == set(want)
    for rid, out in done.items():
        n = len(out.token_ids)
        assert 1 <= n <= want[rid].max_tokens and out.error is None
        assert out.outputs[0].finish_reason == ("length" if n == want[rid].max_tokens else "stop") or \
            out.token_ids[-1] == EOS_ID
    assert eng.scheduler.num_preemptions > 0
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_abort_frees_every_block(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    eng = engine(lm, max_num_batched_tokens=24)
    ids = [eng.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in mixed_prompts(6, seed=6)]
    for _ in range(4):
        eng.step()
    assert eng.block_manager.num_free_blocks < eng.block_manager.num_blocks
    eng.abort_request(ids[0])  # running
    eng.abort_request(ids[5])  # possibly still waiting / mid-prefill
    outs = {o.request_id: o for o in eng.step()}
    for rid in (ids[0], ids[5]):
        assert outs[rid].finished and outs[rid].outputs[0].finish_reason == "abort"
    for rid in ids[1:5]:
        eng.abort_request(rid)
    eng.step()
    eng.scheduler.check()
    assert not eng.has_unfinished_requests()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.abort_request("unknown")  # no-op


def test_bad_requests_fail_alone(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    eng = engine(lm, max_model_len=64)
    good = mixed_prompts(2, seed=7, shared=False)
    bad = [
        ("", GREEDY, "prompt is empty"),
        ([], GREEDY, "prompt is empty"),
        (list(range(3, 70)), GREEDY, "the context holds 64 (max_model_len)"),
        ([5, 9999], GREEDY, "token ids must be in"),
        (3.5, GREEDY, "prompt must be a string"),
        ([5, True], GREEDY, "token ids must be ints, got bool at index 1"),
        ([5, 6.0], GREEDY, "token ids must be ints, got float at index 1"),
        ("hello", SamplingParams(temperature=-1.0), "temperature"),
        ("hello", SamplingParams(top_p=0.0), "top_p"),
        ("hello", SamplingParams(top_k=10**6), "top_k"),
        ("hello", SamplingParams(logit_bias={10**6: 1.0}), "logit_bias"),
        ("hello", SamplingParams(max_tokens=0), "max_tokens"),
        ("hello", SamplingParams(stop=[""]), "stop"),
        ("hello", SamplingParams(n=2, seed=2**63 - 1), "seed"),     # once wedged every step
        ("hello", "not params", "SamplingParams"),
        # each of these once raised out of add_request (OverflowError, the copy's TypeError, the
        # tokenizer's TypeError) instead of failing its request alone
        ("hello", SamplingParams(temperature=10**400), "temperature must be in"),
        ("hello", SamplingParams(top_p=10**400), "top_p"),
        ("hello", SamplingParams(extra_args={"lock": threading.Lock()}), "sampling params cannot be copied"),
        ("hello", SamplingParams(bad_words=["\ud800"]), "bad_words must be valid Unicode"),
        ("ab\ud800c", GREEDY, "prompt must be valid Unicode"),
        ("hello", SamplingParams(repetition_penalty=1e-300), "repetition_penalty"),
        # min_tokens bans the stop tokens, and they were the only allowed ones: failed mid-step
        ("hello", SamplingParams(allowed_token_ids=[EOS_ID], min_tokens=3), "bans every token of allowed_token_ids"),
        ("hello", SamplingParams(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=3, ignore_eos=True),
         "bans every token of allowed_token_ids [7]"),
    ]
    prompts = [good[0]] + [b[0] for b in bad] + [good[1]]
    params = [GREEDY] + [b[1] for b in bad] + [GREEDY]
    outs = run_all(eng, prompts, params)
    for out, (_, params, msg) in zip(outs[1:-1], bad):
        assert out.finished and out.error is not None and msg in out.error, (msg, out.error)
        # one empty sample per requested sample, marked "error" (there were none: outputs[0] raised)
        n = params.n if isinstance(params, SamplingParams) else 1
        assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in out.outputs] == \
            [(i, "", [], "error") for i in range(n)]
    top_k_out = outs[1 + [b[2] for b in bad].index("top_k")]
    assert top_k_out.prompt_token_ids and top_k_out.prompt == "hello"   # refused for its params: ids kept
    ref = run_all(engine(lm, max_model_len=64), good, [GREEDY] * 2)
    assert [outs[0].token_ids, outs[-1].token_ids] == [r.token_ids for r in ref]
    assert outs[0].error is None and outs[-1].error is None


def test_tokenizer_wider_than_the_model_fails_only_its_request(tiny_checkpoint, tmp_path):  # noqa: F811
    """A tokenizer with a token past the model's embedding (an added token, id = vocab size): a text
    prompt holding it fails alone at add time (it raised in the embedding on every later step,
    wedging the batch), and a bad word holding it is left out (the model can never output it)."""
    import json
    import shutil
    path = tmp_path / "wide_tokenizer"
    shutil.copytree(tiny_checkpoint, path)
    tok = json.loads((path / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 384, "content": "<|extra|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": False})
    (path / "tokenizer.json").write_text(json.dumps(tok))
    lm = load_model(str(path), device="cpu", dtype=torch.float32)
    assert lm.model.config.vocab_size == 384 and 384 in lm.tokenizer.encode("hi <|extra|>")
    good = mixed_prompts(2, seed=11, shared=False)
    prompts = [good[0], "hi <|extra|>", "hi", good[1]]
    params = [GREEDY, GREEDY, SamplingParams(temperature=0.0, max_tokens=4, bad_words=["<|extra|>", "x"]), GREEDY]
    outs = run_all(engine(lm, max_model_len=64), prompts, params)
    assert outs[1].error is not None and "outside the model's vocabulary [0, 384)" in outs[1].error, outs[1].error
    assert outs[2].error is None and len(outs[2].token_ids) == 4
    ref = run_all(engine(lm, max_model_len=64), [good[0], "hi", good[1]], [GREEDY, params[2], GREEDY])
    assert [o.token_ids for o in (outs[0], outs[2], outs[3])] == [r.token_ids for r in ref]
    assert all(o.error is None for o in ref)


def test_engine_sizes_past_memory_are_refused_before_allocating(tiny_checkpoint):  # noqa: F811
    """A KV pool or a table far past the memory the engine may take: ValueError naming the option,
    before anything is allocated (they hung building a billion blocks, or died in the allocator)."""
    lm = loaded_model(tiny_checkpoint, "cpu")
    with pytest.raises(ValueError, match="num_kv_blocks=1000000000: the KV cache would take .* GiB"):
        LLMEngine(EngineConfig(max_model_len=64, num_kv_blocks=10**9), loaded=lm)
    with pytest.raises(ValueError, match="num_kv_blocks=100: the KV cache would take .* more than kv_cache_memory"):
        LLMEngine(EngineConfig(max_model_len=64, num_kv_blocks=100, kv_cache_memory=1000), loaded=lm)
    with pytest.raises(ValueError, match="block_size=1000000000: one KV block takes .* bytes, more than the CPU"):
        LLMEngine(EngineConfig(block_size=10**9), loaded=lm)
    with pytest.raises(ValueError, match="max_num_seqs must be at most 65536, got 1000000000"):
        LLMEngine(EngineConfig(max_model_len=64, max_num_seqs=10**9), loaded=lm)
    eng = LLMEngine(EngineConfig(max_model_len=64, num_kv_blocks=8, block_size=8), loaded=lm)   # fits: as before
    assert eng.block_manager.num_blocks == 8


def test_numpy_tuple_and_tensor_token_ids_are_a_prompt(tiny_checkpoint):  # noqa: F811
    """A prompt of numpy ints is one prompt of token ids, as a list of ints (it was a batch of bad prompts)."""
    import numpy as np

    llm = LLM(loaded=loaded_model(tiny_checkpoint, "cpu"), max_model_len=64)
    ids = [5, 6, 7, 8]
    a = llm.generate(ids, GREEDY)
    b = llm.generate(list(np.array(ids, dtype=np.int64)), GREEDY)
    assert len(a) == len(b) == 1 and b[0].error is None and b[0].token_ids == a[0].token_ids
    # a tuple, a 1-D numpy array or tensor of ids is one prompt too (each id was a bad prompt of
    # its own); a 2-D array is a batch of its rows
    for one in (tuple(ids), np.array(ids), torch.tensor(ids)):
        c = llm.generate(one, GREEDY)
        assert len(c) == 1 and c[0].error is None and c[0].token_ids == a[0].token_ids, type(one)
    rows = llm.generate(np.array([ids, ids[::-1]]), GREEDY)
    assert [r.token_ids for r in rows] == [a[0].token_ids, llm.generate(ids[::-1], GREEDY)[0].token_ids]


def test_request_ids_never_clash(tiny_checkpoint):  # noqa: F811
    # the samples of an n > 1 request are "<id>#<i>": a clash with a live id is refused before
    # anything is queued (it once left a half-added request that broke every later step), and
    # automatic ids step over explicit ones (generate() once raised halfway through its prompts)
    eng = engine(loaded_model(tiny_checkpoint, "cpu"), max_model_len=64)
    eng.add_request([5, 6, 7], GREEDY, request_id="a#0")
    with pytest.raises(TypeError, match="request_id must be a str"):   # was a bare "unhashable type"
        eng.add_request([5, 6, 7], GREEDY, request_id=["x"])
    for bad in (5, b"x", 1.5):   # hashable, but not ids: an int id once crashed every request of a step
        with pytest.raises(TypeError, match=f"request_id must be a str \\(or None\\), got {type(bad).__name__}"):
            eng.add_request([5, 6, 7], GREEDY, request_id=bad)
    with pytest.raises(ValueError, match="its sample 'a#0' would clash"):
        eng.add_request([5, 6, 7], SamplingParams(n=2, max_tokens=3), request_id="a")
    eng.add_request([5, 6, 7], SamplingParams(n=2, max_tokens=3), request_id="b")
    with pytest.raises(ValueError, match="'b#1' is already in use"):
        eng.add_request([5, 6, 7], GREEDY, request_id="b#1")
    explicit = [eng.add_request([5, 6], GREEDY, request_id=str(k)) for k in range(12)]
    auto = [eng.add_request([5, 6], GREEDY) for _ in range(3)]
    assert not set(auto) & set(explicit + ["a#0", "b"])
    # an automatic id steps over a free id whose samples are taken (it once raised "already in use"
    # for an id the engine itself had picked)
    eng.add_request([5, 6], GREEDY, request_id="1000#1")
    eng._counter = itertools.count(1000)   # the engine's next automatic id would be "1000"
    auto_n = eng.add_request([5, 6], SamplingParams(n=2, max_tokens=3))
    assert auto_n != "1000"
    # an n far past SamplingParams.MAX_N fails as one bad request, at once (the clash check once
    # listed its n sample ids first)
    huge_n = eng.add_request([5, 6], SamplingParams(n=10**12, max_tokens=3))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert set(done) == {"a#0", "b", *explicit, *auto, "1000#1", auto_n, huge_n}
    assert "n must be" in done.pop(huge_n).error
    assert all(o.error is None for o in done.values())


@pytest.mark.parametrize("how", ["finished", "aborted"])
def test_a_request_id_can_be_reused_once_reported(tiny_checkpoint, how):  # noqa: F811
    # the new "a" must get its own batch row: the runner once kept the row of the old "a" (matched
    # by id), so it ran the old request's tokens (a shape error, or silently wrong tokens when the
    # prompts had the same length) and kept its penalty counts
    lm = loaded_model(tiny_checkpoint, "cpu")
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, repetition_penalty=1.5)
    old, new = list(range(3, 13)), list(range(40, 50))           # the same length
    fresh = run_all(engine(lm), [new], [sp])
    eng = engine(lm)
    eng.add_request(old, sp, request_id="a")
    if how == "finished":
        while eng.has_unfinished_requests():
            eng.step()
    else:
        eng.step()
        eng.abort_request("a")
        assert [o.finished for o in eng.step()] == [True]         # nothing left to run: no model call
    eng.add_request(new, sp, request_id="a")
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            done[out.request_id] = out
    assert done["a"].outputs[0].token_ids == fresh[0].outputs[0].token_ids


def test_failed_grammar_of_an_n_sample_request_gives_one_output_per_step(tiny_checkpoint):  # noqa: F811
    # both samples of an n = 2 structured request fail to compile (both known at the same poll):
    # the step reports the request once, final, with both samples failed (it was reported twice
    # in one step, a non-final output then the final one)
    from specops.engine.structured_output import StructuredOutputManager, StructuredOutputOptions

    lm = loaded_model(tiny_checkpoint, "cpu")

    class FailingBackend:
        vocab_size = lm.config.vocab_size

        def compile(self, options):
            raise RuntimeError("injected compiler failure")

    eng = engine(lm, max_model_len=64)
    eng.set_structured_output_manager(StructuredOutputManager(backend=FailingBackend()))
    sp = SamplingParams(n=2, max_tokens=3, structured_outputs=StructuredOutputOptions(regex="a+"))
    eng.add_request([5, 6, 7], sp, request_id="s")
    for sample in ("s#0", "s#1"):              # both compiles failed before the first step polls them
        eng.structured.wait(sample, timeout=10.0)
    reports = []
    for _ in range(10_000):
        if not eng.has_unfinished_requests():
            break
        step = eng.step()
        assert len(step) == len({o.request_id for o in step}), "a request reported twice in one step"
        reports += step
    assert [o.finished for o in reports] == [True]
    assert [c.finish_reason for c in reports[-1].outputs] == ["error", "error"]
    assert "injected compiler failure" in reports[-1].error
    eng.shutdown()


def test_structured_output_without_xgrammar_fails_only_that_request(tiny_checkpoint, monkeypatch):  # noqa: F811
    # an install without the optional xgrammar: a structured request raised ModuleNotFoundError
    # out of add_request (generate() then left the requests queued before it in the engine); it
    # now fails alone, named, and the plain request beside it runs
    import sys

    from specops.engine.structured_output import StructuredOutputOptions

    monkeypatch.setitem(sys.modules, "xgrammar", None)          # what `import xgrammar` sees when absent
    eng = engine(loaded_model(tiny_checkpoint, "cpu"), max_model_len=64)
    eng.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3), request_id="plain")
    for rid, kw in (("regex", dict(regex="a+")), ("json", dict(json_object=True))):   # failing in validate / the manager
        eng.add_request([5, 6, 7], SamplingParams(max_tokens=3, structured_outputs=StructuredOutputOptions(**kw)),
                        request_id=rid)
    finals = {}
    for _ in range(1000):
        if not eng.has_unfinished_requests():
            break
        finals.update({o.request_id: o for o in eng.step() if o.finished})
    assert finals["plain"].error is None and len(finals["plain"].outputs[0].token_ids) == 3
    for rid in ("regex", "json"):
        assert "structured output needs the xgrammar package" in finals[rid].error
    eng.shutdown()


def test_generate_leaves_nothing_queued_when_a_later_prompt_fails_to_add(tiny_checkpoint, monkeypatch):  # noqa: F811
    # generate() adds its prompts one by one: when a later add_request raised, the requests added
    # before it stayed queued, ran in the next call and were never reported
    llm = LLM(loaded=loaded_model(tiny_checkpoint, "cpu"), max_model_len=64)
    add, calls = llm.engine.add_request, []

    def failing_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected")
        return add(*args, **kwargs)

    monkeypatch.setattr(llm.engine, "add_request", failing_third)
    with pytest.raises(RuntimeError, match="injected"):
        llm.generate([[5, 6], [7, 8], [9, 10]], SamplingParams(temperature=0, max_tokens=2))
    finals = []
    for _ in range(100):                       # the two requests added first end aborted, not run
        if not llm.engine.has_unfinished_requests():
            break
        finals += [o for o in llm.engine.step() if o.finished]
    assert len(finals) == 2 and all(c.finish_reason == "abort" for o in finals for c in o.outputs)
    monkeypatch.undo()
    assert len(llm.generate([[5, 6]], SamplingParams(temperature=0, max_tokens=2))) == 1
    llm.engine.shutdown()


def test_bos_adding_tokenizer_gives_one_bos_and_working_bad_words(tiny_checkpoint, tmp_path):  # noqa: F811
    # a Llama-3-style tokenizer.json (its post-processor adds BOS) with a chat template that writes
    # its own BOS: the chat prompt had two BOS, and every bad word was encoded as [BOS, word...],
    # a sequence that never occurs in an output, so no bad word was ever banned
    import json
    import shutil

    d = tmp_path / "bos"
    shutil.copytree(tiny_checkpoint, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}
    tj["post_processor"] = {"type": "TemplateProcessing",
                            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["bos_token"] = "<|im_start|>"
    tc["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    llm = LLM(model=str(d), max_model_len=64)
    tok = llm.tokenizer
    assert tok.encode("hello")[:1] == [1] and tok.encode("hello")[1:2] != [1]     # BOS added to plain text
    out = llm.generate([llm.chat_prompt("hello")], GREEDY)[0]
    assert out.prompt_token_ids[:2] != [1, 1] and out.prompt_token_ids[:1] == [1]
    first = out.outputs[0].token_ids[0]
    word = tok.decode([first])
    assert tok.encode(word, add_special_tokens=False) == [first]
    banned = llm.generate([llm.chat_prompt("hello")],
                          SamplingParams(temperature=0.0, max_tokens=GREEDY.max_tokens, bad_words=[word]))[0]
    assert first not in banned.outputs[0].token_ids


def test_min_tokens_lets_a_stop_string_count_only_after_them(tiny_checkpoint):  # noqa: F811
    # as in vLLM, a stop string counts when it ends in the text of token min_tokens + 1 or later
    # (as EOS and stop tokens may come at token min_tokens + 1 at the earliest); it counted from
    # token min_tokens, so min_tokens=1 was min_tokens=0
    eng = engine(loaded_model(tiny_checkpoint, "cpu"))
    prompt = eng.tokenizer.encode("The capital of")
    [plain] = run_all(eng, [prompt], [GREEDY])
    word = eng.tokenizer.decode(plain.outputs[0].token_ids[:1])
    assert word.strip() and eng.tokenizer.decode(plain.outputs[0].token_ids[:4]) == word * 4  # it repeats
    for m in (0, 1, 2):
        sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop=[word.strip()], min_tokens=m)
        [out] = run_all(engine(loaded_model(tiny_checkpoint, "cpu")), [prompt], [sp])
        assert len(out.outputs[0].token_ids) == m + 1 and out.outputs[0].stop_reason == word.strip()
        assert out.outputs[0].finish_reason == "stop"


def test_stop_string_on_the_last_allowed_token_reports_stop(tiny_checkpoint):  # noqa: F811
    # a stop string completed by the max_tokens-th token: finish_reason "stop" (as vLLM), not "length"
    eng = engine(loaded_model(tiny_checkpoint, "cpu"), max_model_len=64)
    free = run_all(eng, [[5, 6, 7]], [SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)])[0]
    text = free.outputs[0].text
    assert free.outputs[0].finish_reason == "length" and text, text
    sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, stop=[text])
    out = run_all(engine(loaded_model(tiny_checkpoint, "cpu"), max_model_len=64), [[5, 6, 7]], [sp])[0]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason, out.outputs[0].text) == ("stop", text, "")


def test_stop_token_is_in_the_token_ids_not_the_text(tiny_checkpoint):  # noqa: F811
    # as SamplingParams documents (and vLLM does): the stop token that ends a request is in
    # token_ids, its text only with include_stop_str_in_output
    lm = loaded_model(tiny_checkpoint, "cpu")
    first = run_all(engine(lm, max_model_len=64), [[5, 6, 7]], [SamplingParams(temperature=0.0, max_tokens=1)])[0]
    tok, text = first.outputs[0].token_ids[0], first.outputs[0].text
    assert text, "the test needs a first token with text"
    outs = run_all(engine(lm, max_model_len=64), [[5, 6, 7]] * 2,
                   [SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=[tok], include_stop_str_in_output=inc)
                    for inc in (False, True)])
    got = [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
           for o in outs]
    assert got == [([tok], "", "stop", tok), ([tok], text, "stop", tok)]


def test_stream_deltas_add_up(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    llm = LLM(loaded=lm, max_model_len=256)
    sp = SamplingParams(temperature=10.0, seed=3, max_tokens=40, ignore_eos=True)
    full = llm.generate("the quick brown fox", sp)[0]
    assert full.text == lm.tokenizer.decode(full.token_ids)
    outs = list(llm.stream("the quick brown fox", sp))
    assert "".join(o.outputs[0].delta_text for o in outs) == full.text
    assert sum(len(o.outputs[0].delta_token_ids) for o in outs) == 40
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]


def test_request_keeps_its_own_sampling_params(tiny_checkpoint):  # noqa: F811
    # changing the SamplingParams object after add_request (reusing it, say) changes neither the
    # request already queued nor lets a value past the checks
    lm = loaded_model(tiny_checkpoint, "cpu")
    eng = engine(lm, max_model_len=64)
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, stop_token_ids=[])
    rid = eng.add_request([5, 6, 7], sp)
    sp.max_tokens, sp.temperature = 10**6, -1.0
    sp.stop_token_ids.append(1)
    done = {}
    while eng.has_unfinished_requests():
        done.update({o.request_id: o for o in eng.step() if o.finished})
    assert done[rid].error is None and len(done[rid].outputs[0].token_ids) == 4


def test_interleaved_streams_and_generate_lose_no_output(tiny_checkpoint):  # noqa: F811
    # one engine, several consumers: a step run by one of them keeps the others' outputs for
    # them (closing a stream early once dropped another stream's final output: it hung)
    lm = loaded_model(tiny_checkpoint, "cpu")
    llm = LLM(loaded=lm, max_model_len=256)
    long, short = (SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (30, 3))
    want = [o.token_ids for o in llm.generate(["hello", "world", "again"], [short] * 3)]
    g1, g2 = llm.stream("hello", long), llm.stream("world", short)
    first = [next(g1), next(g2)]
    g1.close()                                          # aborts its request and runs one step
    outs = first[1:] + list(g2)
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == want[1]
    g3 = llm.stream("hello", short)
    got3 = [next(g3)]
    mid = llm.generate("again", short)[0]               # runs the steps g3 is waiting on too
    got3 += list(g3)
    assert mid.outputs[0].token_ids == want[2] and got3[-1].outputs[0].token_ids == want[0]
    assert [o.finished for o in got3] == [False] * (len(got3) - 1) + [True]
    assert not llm.engine.has_unfinished_requests() and not llm._inbox and not llm._waited


def test_seeded_sampling_is_batch_invariant(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    prompt = mixed_prompts(1, seed=8, shared=False)[0]
    sp = SamplingParams(temperature=10.0, seed=1234, max_tokens=16, ignore_eos=True)
    alone = run_all(engine(lm), [prompt], [sp])[0].token_ids
    others = mixed_prompts(5, seed=9)
    mixed = run_all(engine(lm, max_num_batched_tokens=20), others[:2] + [prompt] + others[2:],
                    [SamplingParams(temperature=0.7, max_tokens=10)] * 2 + [sp] + [GREEDY] * 3)
    assert mixed[2].token_ids == alone
    other_seed = run_all(engine(lm), [prompt], [SamplingParams(temperature=10.0, seed=99, max_tokens=16,
                                                               ignore_eos=True)])[0].token_ids
    assert other_seed != alone


def test_engine_seed_takes_torch_manual_seeds_range(tiny_checkpoint):  # noqa: F811
    # the engine seed of unseeded requests is taken in [-2^63, 2^64) as torch.manual_seed takes it
    # (rejection_sample did, the config refused >= 2^63): 2^64 - 3 keys the noise as -3 does
    lm = loaded_model(tiny_checkpoint, "cpu")
    prompts = mixed_prompts(3, seed=12, shared=False)
    sp = SamplingParams(temperature=10.0, max_tokens=12, ignore_eos=True)
    wide = [o.token_ids for o in run_all(engine(lm, seed=2**64 - 3), prompts, [sp] * 3)]
    assert wide == [o.token_ids for o in run_all(engine(lm, seed=-3), prompts, [sp] * 3)]
    assert wide != [o.token_ids for o in run_all(engine(lm, seed=5), prompts, [sp] * 3)]


def test_n_samples_and_logprobs(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    prompt = mixed_prompts(1, seed=10, shared=False)[0]
    out = run_all(engine(lm), [prompt], [SamplingParams(n=3, temperature=10.0, seed=5, max_tokens=8,
                                                        ignore_eos=True, logprobs=3)])[0]
    assert len(out.outputs) == 3 and all(len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    c = out.outputs[0]
    ref = torch.log_softmax(reference_forward(lm.model, prompt + c.token_ids[:-1]).double(), dim=-1)
    for j, lp in enumerate(c.logprobs):
        row = ref[len(prompt) - 1 + j]
        assert lp.token_id == c.token_ids[j]
        assert abs(lp.logprob - float(row[lp.token_id])) < 1e-4
        assert lp.rank == int((row > row[lp.token_id] + 1e-6).sum()) + 1
        assert len(lp.top) == 3 and max(lp.top.values()) == pytest.approx(float(row.max()), abs=1e-4)
    assert c.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in c.logprobs))


def test_unknown_and_malformed_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nope"))
    bad = make_tiny_checkpoint(tmp_path / "bad")
    import json
    cfg = json.loads((tmp_path / "bad" / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "bad" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_size"):
        LLM(bad, device="cpu")


def test_engine_config_errors(tiny_checkpoint):  # noqa: F811
    lm = loaded_model(tiny_checkpoint, "cpu")
    with pytest.raises(ValueError, match="max_model_len"):
        engine(lm, max_model_len=10**6)
    with pytest.raises(ValueError, match="KV cache holds"):
        engine(lm, num_kv_blocks=2, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine(lm, max_num_seqs=0)
    # an empty start marker made every structured request's add_request raise AttributeError
    with pytest.raises(ValueError, match="reasoning_start must be None or a non-empty string"):
        engine(lm, reasoning_end="</think>", reasoning_start="")
    eng = engine(lm)
    eng.add_request("hi", GREEDY, request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("hi", GREEDY, request_id="x")


def test_a_generate_call_that_raises_leaves_no_request_running(tiny_checkpoint):  # noqa: F811
    # a custom processor whose apply raises for one request: generate raises, and its requests
    # stayed in the batch, so every later call raised the same error (the engine wedged)
    from specops.sampling import LogitsProcessor
    from specops.sampling.logits_processors import process_dict_updates

    class RaisesForBoom(LogitsProcessor):
        """Raises in apply while a request with extra_args["boom"] is in the batch."""

        def __init__(self, max_num_reqs, vocab_size, device="cpu"):
            super().__init__(max_num_reqs, vocab_size, device)
            self.boom = {}   # batch index -> True, for the requests asking for it

        def is_argmax_invariant(self):
            return False

        def update_state(self, batch_update):
            process_dict_updates(self.boom, batch_update, lambda params, prompt, out:
                                 True if (params.extra_args or {}).get("boom") else None)

        def apply(self, logits, rows=None):
            if self.boom:
                raise RuntimeError("boom from a custom processor")
            return logits

    llm = LLM(loaded=loaded_model(tiny_checkpoint, "cpu"), max_model_len=64, logits_processors=[RaisesForBoom])
    with pytest.raises(RuntimeError, match="boom from a custom processor"):
        llm.generate(["hello", "world"], [SamplingParams(max_tokens=4, extra_args={"boom": True}), GREEDY])
    out = llm.generate(["again"], GREEDY)[0]
    assert out.error is None and len(out.outputs[0].token_ids) > 0
    assert not llm.engine.has_unfinished_requests()


def test_as_completed_yields_each_prompt_once_and_a_break_aborts_the_rest(tiny_checkpoint):  # noqa: F811
    """LLM.as_completed: (prompt index, final output) for every prompt, the outputs generate() gives in
    prompt order; leaving the loop early aborts the requests still running."""
    llm = LLM(loaded=loaded_model(tiny_checkpoint, "cpu"), max_model_len=64)
    prompts = ["hello", [5, 6, 7], "", "world"]       # "" fails alone (an empty prompt)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 1, 3, 12)]
    got = list(llm.as_completed(prompts, params))
    assert sorted(i for i, _ in got) == [0, 1, 2, 3] and all(out.finished for _, out in got)
    assert [i for i, _ in got][-1] == 3                                  # the longest one ends last
    by_index = dict(got)
    assert by_index[2].error is not None
    ref = llm.generate(prompts, params)
    assert [by_index[i].token_ids for i in range(4)] == [out.token_ids for out in ref]
    stream = llm.as_completed(["a", "b"], [SamplingParams(max_tokens=1, temperature=0.0),
                                           SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)])
    first, out = next(stream)
    assert first == 0 and out.finished and llm.engine.has_unfinished_requests()
    stream.close()                                                       # the caller stops here
    assert not llm.engine.scheduler.has_unfinished_requests()            # "b" aborted (reported next step)
    assert llm.generate("again", GREEDY)[0].error is None and not llm.engine.has_unfinished_requests()
    # a tuple of ints is one prompt for both (it was three bad ones): generate normalises the prompts once
    assert len(llm.generate((5, 6, 7), GREEDY)) == 1 == len(list(llm.as_completed((5, 6, 7), GREEDY)))


def test_samples_of_one_prompt_compute_it_once(tiny_checkpoint):  # noqa: F811
    """n = 8 samples of a 100-token prompt (and the same prompt sent again): the first computes the
    prompt, the others wait a step and take its full blocks from the prefix cache (they each used to
    compute the whole prompt in the first step and hold a copy of its KV). The tokens are those of
    an engine without prefix caching (seeded samples: batch invariant)."""
    lm = loaded_model(tiny_checkpoint, "cpu")
    prompt = [3 + (i * 7) % 300 for i in range(100)]
    params = SamplingParams(temperature=0.8, seed=1, n=8, max_tokens=4, ignore_eos=True)
    again = SamplingParams(temperature=0.8, seed=2, max_tokens=4, ignore_eos=True)

    def run(prefix_caching):
        eng = engine(lm, max_model_len=128, block_size=16, max_num_batched_tokens=2048,
                     enable_prefix_caching=prefix_caching)
        ids = [eng.add_request(prompt, params), eng.add_request(prompt, again)]
        most_blocks, outs = 0, {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    outs[out.request_id] = [c.token_ids for c in out.outputs]
            most_blocks = max(most_blocks, eng.block_manager.num_blocks - eng.block_manager.num_free_blocks)
        assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
        return [outs[i] for i in ids], most_blocks, eng.stats()

    shared, blocks_shared, stats = run(True)
    alone, blocks_alone, _ = run(False)
    assert shared == alone
    # 9 samples: one copy of the prompt's 6 full blocks, then each sample's own 2 blocks (its last 4
    # prompt tokens and 4 outputs) against 9 x 7 blocks without the cache
    assert blocks_shared <= 6 + 9 * 2 and blocks_alone == 9 * 7, (blocks_shared, blocks_alone)
    assert stats["prefix_hit_rate"] >= 8 * 96 / (9 * 100) - 1e-9
