"""Speculative decoding in the engine, greedy: with the n-gram proposer and with a draft model, every
request's tokens (and text, finish reason, logprobs) equal plain greedy decoding's, across batch
sizes, with chunked prefill, preemption, penalties and the other logits-changing parameters, stop
strings and per-request K; the metrics count what happened; `generate --spec` works."""

import math
import random
import pytest
import torch
from engine_runs import run_all
from model_fixtures import make_tiny_checkpoint

from specops.engine.config import EngineConfig
from specops.engine.llm import LLM
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.loader import load_model
from specops.engine.sampling import _checked_argmax, greedy_verify
from specops.engine.sampling_params import SamplingParams
from specops.spec_decode import build_spec_decode_metadata, parse_output, rejection_sample

_LOADED = {}
_PLAIN = {}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> str:
    """A tiny checkpoint with an untied head: its greedy outputs vary (the tied one repeats its input)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_untied"), tie_word_embeddings=False)


def model(path, noise=0.0, device="cpu", dtype=torch.float32):
    """The checkpoint, optionally with every weight perturbed (a draft that is right ~half the time)."""
    key = (path, noise, device, dtype)
    if key not in _LOADED:
        lm = load_model(path, device=device, dtype=dtype)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in lm.model.parameters():
                p.add_((torch.randn(p.shape, generator=g) * p.float().std().cpu() * noise).to(p.device, p.dtype))
        _LOADED[key] = lm
    return _LOADED[key]


def run(lm, prompts, params, draft=None, proposer=None, on_step=None, **cfg):
    """All requests to the end; returns the outputs in order and the engine (pool checked empty).

    ``proposer`` replaces the engine's (made with spec_method="ngram"): the EAGLE-style one, which
    EngineConfig does not name. ``on_step(engine)`` runs after every step.
    """
    cfg.setdefault("max_model_len", 256)
    if proposer is not None:
        cfg.setdefault("spec_method", "ngram")
    eng = LLMEngine(EngineConfig(**cfg), loaded=lm, draft_loaded=draft)
    if proposer is not None:
        eng.proposer = proposer
        eng.runner.keep_hidden_states = proposer.needs_hidden_states
    params = params if isinstance(params, list) else [params] * len(prompts)
    outs = run_all(eng, prompts, params, on_step)
    if getattr(eng.proposer, "free_blocks", None) is not None:  # the draft pool is empty again too
        assert len(eng.proposer.free_blocks) == eng.proposer.num_blocks and not eng.proposer.states
    return outs, eng


def copy_prompts(n, seed, vocab=384):
    """Prompts that repeat a random phrase (the model's output then repeats parts of its context)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 12))]
        out.append(phrase * rng.randrange(2, 4) + [rng.randrange(3, vocab) for _ in range(rng.randrange(0, 5))])
    return out


GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
SCHEDULES = {  # batch size -> engine settings
    1: {},
    3: dict(max_num_batched_tokens=16, max_num_seqs=3),  # chunked prefill, drafts truncated
    8: dict(num_kv_blocks=20, block_size=8, max_num_batched_tokens=48, max_model_len=96),  # preemption
}
PROPOSERS = {"ngram": None, "draft-self": 0.0, "draft-noisy": 0.1}


@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_greedy_equals_plain(untied, proposer):
    lm = model(untied)
    accepted = rejected = 0
    for batch, cfg in SCHEDULES.items():
        prompts = copy_prompts(batch, seed=batch)
        if batch not in _PLAIN:  # scheduling does not change plain outputs (test_engine_tiny)
            _PLAIN[batch] = run(lm, prompts, GREEDY)[0]
        plain = _PLAIN[batch]
        spec = dict(spec_method="ngram") if PROPOSERS[proposer] is None else dict(spec_method="draft")
        draft = None if PROPOSERS[proposer] is None else model(untied, PROPOSERS[proposer])
        outs, eng = run(lm, prompts, GREEDY, draft=draft, num_spec_tokens=4, **spec, **cfg)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain], (proposer, batch)
        assert [o.text for o in outs] == [o.text for o in plain]
        st = eng.stats()["spec_decoding"]
        accepted += st["num_accepted_tokens"]
        rejected += st["num_draft_tokens"] - st["num_accepted_tokens"]
        if batch == 8:
            assert eng.scheduler.num_preemptions > 0
        assert eng.num_steps < sum(len(o.token_ids) for o in outs)  # some steps emitted several tokens
    assert accepted > 20
    if proposer == "draft-self":
        assert rejected == 0  # the target drafting for itself is always right
    else:
        assert rejected > 20


@pytest.fixture
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: Triton rejection kernels, the draft loop on the GPU")
def test_greedy_equals_plain_cuda(untied, no_tf32):
    """fp32 on CUDA: equal tokens, or a first difference at a near-tie (GEMMs of 1 + K rows and of 1 row
    may round differently). Speculation is exercised: every proposer drafts, and the target drafting
    for itself is right by construction (but at near-ties), so most of its drafts are accepted. (How
    many n-gram or noisy drafts a random model accepts is no invariant: 7 n-gram ones at batch 3.)"""
    from specops.engine.model.reference import reference_forward

    lm = model(untied, device="cuda")
    for batch in (3, 8):
        prompts = copy_prompts(batch, seed=batch)
        plain, _ = run(lm, prompts, GREEDY)
        for spec, draft in (("ngram", None), ("draft", model(untied, 0.1, device="cuda")), ("draft", lm)):
            outs, eng = run(lm, prompts, GREEDY, draft=draft, spec_method=spec, **SCHEDULES[batch])
            st = eng.stats()["spec_decoding"]
            assert st["num_draft_tokens"] > 0, (spec, batch, st)
            if draft is lm:
                assert st["num_accepted_tokens"] > st["num_draft_tokens"] // 2, (batch, st)
            for p, a, b in zip(prompts, outs, plain):
                if a.token_ids != b.token_ids:
                    i = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
                    top = reference_forward(lm.model, p + b.token_ids[:i])[-1].topk(2).values
                    assert float(top[0] - top[1]) < 1e-3, (spec, batch, i, float(top[0] - top[1]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: bf16, FlashInfer when installed, Triton kernels")
def test_bf16_cuda_mixed_batch_runs_clean(untied):
    """bf16 target and draft (FlashInfer attention when installed) with greedy, sampled and penalised
    requests: every request finishes without error, drafts are accepted and rejected, pools are empty."""
    lm = model(untied, device="cuda", dtype=torch.bfloat16)
    prompts = copy_prompts(12, seed=5)
    params = [SamplingParams(temperature=[0.0, 0.8, 1.0][i % 3], top_p=[1.0, 0.9][i % 2], top_k=[0, 20][i % 2],
                             repetition_penalty=[1.0, 1.2][i % 2], seed=i if i % 4 else None, max_tokens=24,
                             ignore_eos=True, logprobs=1 if i == 5 else None) for i in range(12)]
    for spec, draft in (("ngram", None), ("draft", model(untied, 0.1, device="cuda", dtype=torch.bfloat16))):
        outs, eng = run(lm, prompts, params, draft=draft, spec_method=spec, **SCHEDULES[8])
        assert all(o.error is None and len(o.token_ids) == 24 for o in outs)
        assert all(0 <= t < 384 for o in outs for t in o.token_ids)
        assert len(outs[5].outputs[0].logprobs) == 24
        st = eng.stats()["spec_decoding"]
        assert 0 < st["num_accepted_tokens"] < st["num_draft_tokens"], st


def test_greedy_with_every_logits_parameter(untied):
    """Penalties count earlier drafts on target rows, never rejected ones; masks, bias, min_tokens, bad words."""
    lm = model(untied)
    rng = random.Random(3)
    prompts = copy_prompts(6, seed=11)
    params = []
    for i in range(6):
        params.append(SamplingParams(
            temperature=0.0, max_tokens=30, ignore_eos=i % 2 == 0,
            repetition_penalty=[1.0, 1.1, 1.5][i % 3], frequency_penalty=[0.0, 0.2][i % 2],
            presence_penalty=[0.0, 0.1, 0.0][i % 3], min_tokens=[0, 5][i % 2],
            logit_bias={rng.randrange(3, 384): 3.0} if i % 2 else None,
            allowed_token_ids=rng.sample(range(3, 384), 60) + [2] if i == 3 else None,
            bad_words=["the", "a"] if i == 4 else None, stop_token_ids=[prompts[i][1]] if i == 5 else None))
    cfg = dict(max_num_batched_tokens=20, max_num_seqs=4, num_kv_blocks=30, block_size=8, max_model_len=112)
    plain, _ = run(lm, prompts, params, **cfg)
    for spec, draft in (("ngram", None), ("draft", model(untied))):
        outs, eng = run(lm, prompts, params, draft=draft, spec_method=spec, num_spec_tokens=3, **cfg)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain], spec
        st = eng.stats()["spec_decoding"]
        # the unpenalised draft model is often right, sometimes not (its drafts ignore penalties)
        assert st["num_accepted_tokens"] > (40 if spec == "draft" else 0), st
        assert spec == "ngram" or st["num_accepted_tokens"] < st["num_draft_tokens"]


def test_stop_strings_logprobs_and_per_request_k(untied):
    lm = model(untied)
    prompts = copy_prompts(4, seed=21)
    plain, _ = run(lm, prompts, GREEDY)
    # Stop strings taken from the middle of each plain output: they end the text inside a spec step.
    params = []
    for o in plain:
        text = o.text
        params.append(SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=2,
                                     stop=[text[len(text) // 2:len(text) // 2 + 3]] if len(text) > 10 else None,
                                     extra_args={"num_spec_tokens": 2}))
    params[0].extra_args = {}  # K = 4 for this one
    params[1].extra_args = {"num_spec_tokens": 0}  # never speculates
    ref, _ = run(lm, prompts, params)
    outs, eng = run(lm, prompts, params, spec_method="ngram", num_spec_tokens=4)
    for a, b in zip(outs, ref):
        ca, cb = a.outputs[0], b.outputs[0]
        assert (ca.token_ids, ca.text, ca.finish_reason, ca.stop_reason) == \
            (cb.token_ids, cb.text, cb.finish_reason, cb.stop_reason)
        assert [lp.token_id for lp in ca.logprobs] == ca.token_ids
        for la, lb in zip(ca.logprobs, cb.logprobs):
            assert la.rank == lb.rank and abs(la.logprob - lb.logprob) < 1e-4
            assert la.top.keys() == lb.top.keys()
        assert ca.cumulative_logprob == pytest.approx(cb.cumulative_logprob, abs=1e-3)
    assert any(o.outputs[0].finish_reason == "stop" for o in outs)
    st = eng.stats()["spec_decoding"]
    assert len(st["drafted_per_pos"]) == 4 and st["drafted_per_pos"][2] < st["drafted_per_pos"][1]
    assert st["num_draft_tokens"] == sum(st["drafted_per_pos"])
    assert st["num_accepted_tokens"] == sum(st["accepted_per_pos"])


def _stop_cases(lm, first: int, step: int):
    """(prompt, i, STOP, piece) for the greedy output's tokens i = first, first + step, ...: x =
    output[i] alone decodes to the stop string `piece` and STOP = output[i + 1] can be a stop
    token id, neither ending the output before i (x a whole character)."""
    prompt = [10, 11, 12, 13, 14]
    ids = run(lm, [prompt], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0][0].outputs[0].token_ids
    for i in range(first, len(ids) - 1, step):
        piece = lm.tokenizer.decode([ids[i]]).strip()
        if ids[i + 1] not in ids[:i + 1] and piece and "\ufffd" not in piece \
                and piece not in lm.tokenizer.decode(ids[:i]):
            yield prompt, i, ids[i + 1], piece


def _spec_outputs_equal_plain(lm, prompt, sp, label):
    ref = run(lm, [prompt], sp)[0][0].outputs[0]
    for k in (1, 2):
        out = run(lm, [prompt], sp, draft=lm, spec_method="draft", num_spec_tokens=k)[0][0].outputs[0]
        assert (out.token_ids, out.text, out.finish_reason, out.stop_reason, len(out.logprobs or [])) == \
            (ref.token_ids, ref.text, ref.finish_reason, ref.stop_reason, len(ref.logprobs or [])), (label, k)
    return ref


def test_stop_string_at_min_tokens_in_a_step_ended_by_a_stop_token(untied):
    # A spec step emitting [x, STOP] (STOP a stop token id, left out of the text) with x the
    # min_tokens-th output token: as in plain decoding, a stop string that x completes is not
    # checked yet (min_tokens), so the text keeps it and STOP ends the request. (The check used
    # to count STOP too, which cut the text at the stop string and reported it as the reason.)
    lm = model(untied)
    cases = 0
    for prompt, i, stop_id, piece in _stop_cases(lm, 2, 1):
        sp = SamplingParams(temperature=0.0, max_tokens=30, min_tokens=i + 1, stop_token_ids=[stop_id], stop=[piece])
        ref = _spec_outputs_equal_plain(lm, prompt, sp, i)
        assert ref.stop_reason == stop_id and ref.text.endswith(piece)
        cases += 1
        if cases == 2:
            break
    assert cases == 2


def test_stop_string_completed_in_a_step_ended_by_a_stop_token(untied):
    # A spec step emitting [x, STOP] where x completes a stop string: plain decoding stops at x and
    # never makes STOP, so neither may the speculative output (it kept STOP's id and logprob).
    # The draft is the target with K = 1, so steps emit [t0], [t1, t2], [t3, t4], ...
    lm = model(untied)
    cases = 0
    for prompt, i, stop_id, piece in _stop_cases(lm, 1, 2):
        sp = SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop_id], stop=[piece], logprobs=0)
        ref = _spec_outputs_equal_plain(lm, prompt, sp, i)
        assert len(ref.token_ids) == i + 1 and ref.stop_reason == piece
        cases += 1
        if cases == 2:
            break
    assert cases >= 1


def test_synthetic_acceptance(untied):
    lm = model(untied)
    prompts = copy_prompts(4, seed=31)
    plain, _ = run(lm, prompts, GREEDY)
    none, _ = run(lm, prompts, GREEDY, spec_method="ngram", spec_synthetic_acceptance=0.0)
    assert [o.token_ids for o in none] == [o.token_ids for o in plain]  # row 0's argmax every step
    _, eng = run(lm, prompts, GREEDY, spec_method="draft", draft=model(untied, 0.4), spec_synthetic_acceptance=1.0)
    st = eng.stats()["spec_decoding"]
    assert st["num_accepted_tokens"] == st["num_draft_tokens"] > 0
    # Draft i is accepted with probability rates[i] (the last rate repeats) given that drafts
    # 0..i-1 were, and the metric counts draft i's acceptances over all drafts that had an i-th
    # token: the reported rate at i is rates[0] * ... * rates[i] = 0.8, 0.4, 0.2, 0.1 here.
    _, eng = run(lm, prompts * 16, SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True),
                 spec_method="draft", draft=model(untied, 0.4), spec_synthetic_acceptance=[0.8, 0.5])
    st = eng.stats()["spec_decoding"]
    drafted, accepted = st["drafted_per_pos"], st["accepted_per_pos"]
    # ~3200 drafts per position: 5 binomial standard errors are <= 0.044, which keeps 0.8 everywhere
    # ([0.8, 0.64, 0.51, 0.41]) and 0.7 everywhere ([0.7, 0.49, 0.34, 0.24]) out
    assert len(drafted) == 4 and min(drafted) >= 2000, drafted
    assert st["per_position_acceptance_rate"] == pytest.approx([a / d for a, d in zip(accepted, drafted)])
    for i, (p, d, a) in enumerate(zip([0.8, 0.4, 0.2, 0.1], drafted, accepted)):
        se = math.sqrt(p * (1 - p) / d)   # each draft token's uniform is its own (request, position)
        assert abs(a / d - p) < 5 * se, (i, a, d, p, se)


def test_metrics_log_and_llm_stats(untied, caplog):
    lm = model(untied)
    llm = LLM(loaded=lm, max_model_len=256, spec_method="ngram", num_spec_tokens=3, spec_log_interval_s=1e-6)
    with caplog.at_level("INFO", logger="specops.engine.spec_decode"):
        outs = llm.generate(copy_prompts(3, seed=41), GREEDY)
    assert all(len(o.token_ids) == 32 for o in outs)
    st = llm.stats()["spec_decoding"]
    assert st["num_drafts"] > 0 and 1.0 <= st["mean_acceptance_length"] <= 4.0
    assert st["mean_acceptance_length"] == pytest.approx(1 + st["num_accepted_tokens"] / st["num_drafts"])
    assert any("SpecDecoding metrics: Mean acceptance length" in r.message for r in caplog.records)
    assert LLM(loaded=lm, max_model_len=64).stats()["spec_decoding"] is None


def test_config_errors(untied, tmp_path):
    lm = model(untied)
    with pytest.raises(ValueError, match="--draft-model"):
        LLMEngine(EngineConfig(max_model_len=64, spec_method="draft"), loaded=lm)
    with pytest.raises(ValueError, match="num_spec_tokens"):
        LLMEngine(EngineConfig(max_model_len=64, spec_method="ngram", num_spec_tokens=0), loaded=lm)
    with pytest.raises(ValueError, match="spec_method"):
        LLMEngine(EngineConfig(max_model_len=64, spec_method="eagle"), loaded=lm)
    with pytest.raises(ValueError, match="batch schedule"):
        LLMEngine(EngineConfig(max_model_len=64, spec_method="ngram", spec_batch_schedule="4-2"), loaded=lm)
    other = load_model(make_tiny_checkpoint(tmp_path / "v300", vocab_size=300), device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="vocabulary"):
        LLMEngine(EngineConfig(max_model_len=64, spec_method="draft"), loaded=lm, draft_loaded=other)


def test_greedy_verify_matches_rejection_sample():
    """The plain-greedy shortcut is the RejectionSampler's greedy rule (and a Python loop's)."""
    g = torch.Generator().manual_seed(0)
    for vocab, nd, bad_row in ((17, [3, 0, 5, 1, 7], 5), (1000, [4] * 9, None), (33, [0, 0], 1),
                               (50, [2, 6, 0, 1], 3), (151, [1], None)):
        rows = sum(nd) + len(nd)
        logits = torch.randn(rows, vocab, generator=g)
        if bad_row is not None:
            logits[bad_row, 0] = float("nan")  # an invalid row: _checked_argmax gives -1
        cu_sched = torch.cumsum(torch.tensor(nd) + 1 + 2, 0).tolist()  # 2 extra scheduled tokens each
        top = [int(t) for t in _checked_argmax(logits)]
        drafts, lists, r = [], [], 0
        for n in nd:  # drafts right with probability 0.7
            d = [top[r + j] if top[r + j] >= 0 and torch.rand((), generator=g) < 0.7
                 else int(torch.randint(vocab, (), generator=g)) for j in range(n)]
            drafts += d
            lists.append(d)
            r += n + 1
        spec = build_spec_decode_metadata(nd, cu_sched)
        spec.draft_token_ids = torch.tensor(drafts, dtype=torch.int32)
        ours = greedy_verify(_checked_argmax(logits), spec)
        assert ours.shape == (len(nd), max(nd) + 1) and ours.dtype == torch.int32
        ref = rejection_sample(logits, spec.draft_token_ids, spec.cu_num_draft_tokens, spec.max_spec_len,
                               _checked_argmax(logits)[spec.bonus_logits_indices.long()],
                               target_rows=spec.target_logits_indices, is_greedy=True, backend="torch")
        r = 0
        for i, (n, d) in enumerate(zip(nd, lists)):
            expect = []
            for j in range(n + 1):
                expect.append(top[r + j])
                if j == n or top[r + j] != d[j]:
                    break
            r += n + 1
            row = ours[i].tolist()
            assert row[:len(expect)] == expect and all(t == -1 for t in row[len(expect):]), (row, expect)
            # an invalid row ends the kernels' output there too (nothing emitted at it)
            assert parse_output(ref[i:i + 1])[0] == [t for t in expect if t != -1]


def test_cli_spec_prints_metrics(untied, capsys):
    from specops.cli import main

    base = ["generate", "the cat the cat the cat", "--model", untied, "--max-tokens", "24", "--ignore-eos",
            "--device", "cpu"]
    runs = {}
    for name, extra in (("plain", []), ("ngram", ["--spec", "ngram", "--num-spec-tokens", "3"]),
                        ("draft", ["--spec", "draft", "--draft-model", untied, "--num-spec-tokens", "2"]),
                        ("bad", ["--spec", "draft"])):
        code = main(base + extra)
        runs[name] = (code, *capsys.readouterr())
    for name in ("plain", "ngram", "draft"):
        assert runs[name][0] == 0, runs[name][2]
    assert runs["ngram"][1] == runs["plain"][1] == runs["draft"][1] and runs["plain"][1].strip()
    assert "SpecDecoding metrics" not in runs["plain"][2]
    assert "SpecDecoding metrics: Mean acceptance length" in runs["ngram"][2]
    assert "Per-position acceptance rate" in runs["draft"][2] and "Accepted: " in runs["draft"][2]
    assert runs["bad"][0] == 2 and "--draft-model" in runs["bad"][2]


# ---- the default model (SmolLM2-135M-Instruct) ---------------------------------------------------

TEXT = ("The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips. "
        "Every evening the keeper climbed the steps to light the lamp.")
CODE = "def area(w, h):\n    if w < 0 or h < 0:\n        raise ValueError('negative')\n    return w * h\n"
TASKS = [f"Repeat the following text exactly:\n\n{TEXT}", f"Rename `area` to `rect_area`:\n\n{CODE}",
         "Count from 1 to 20, separated by commas.", f"Repeat this twice: {TEXT[:60]}"]


def default_model():
    from specops.engine.model.loader import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    if "default" not in _LOADED:
        _LOADED["default"] = load_model(None, device="cpu", dtype=torch.float32)
    return _LOADED["default"]


def chat_prompts(lm, n):
    tok = lm.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": TASKS[i % len(TASKS)]}]))
            for i in range(n)]


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_default_model_greedy_equals_plain(batch):
    lm = default_model()
    prompts = chat_prompts(lm, batch)
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    plain, _ = run(lm, prompts, sp, max_model_len=512)
    cfg = {1: dict(max_model_len=512),
           3: dict(max_model_len=512, max_num_batched_tokens=40),  # chunked prefill
           8: dict(max_model_len=160, num_kv_blocks=28, block_size=8, max_num_batched_tokens=96)}[batch]  # preempts (the repeated prompts share their blocks)
    runs = [("ngram", None)] if batch != 3 else [("ngram", None), ("draft", lm)]  # the target drafting for itself
    for spec, draft in runs:
        outs, eng = run(lm, prompts, sp, draft=draft, spec_method=spec, num_spec_tokens=4, **cfg)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain], spec
        assert [o.text for o in outs] == [o.text for o in plain]
        st = eng.stats()["spec_decoding"]
        assert st["mean_acceptance_length"] > (1.5 if spec == "ngram" else 4.5), st
        if batch == 8:
            assert eng.scheduler.num_preemptions > 0


@pytest.mark.parametrize("proposer", ["ngram", "draft-self"])
def test_a_reused_request_id_starts_with_no_proposer_state(untied, proposer):
    """Abort "a", then a step that returns before its propose call (as one does while another
    request's grammar compiles, simulated here), add a new "a": the proposer must not draft
    from the old request's context (n-gram: its cached tokens; draft model: its KV). The old
    code kept both, so the new "a" drafted from stale tokens."""
    lm = model(untied)
    draft = model(untied, PROPOSERS[proposer]) if proposer != "ngram" else None
    eng = LLMEngine(EngineConfig(max_model_len=256, spec_method="ngram" if draft is None else "draft",
                                 num_spec_tokens=4), loaded=lm, draft_loaded=draft)
    freed = []
    free = eng.proposer.free
    eng.proposer.free = lambda rid: (freed.append(rid), free(rid))[1]
    old, new = copy_prompts(2, seed=7)
    new = new * 6                              # longer than the old context: a stale prefix would be kept
    eng.add_request(old, GREEDY, request_id="a")
    for _ in range(3):
        eng.step()
    eng.abort_request("a")
    propose, eng._propose = eng._propose, lambda: None
    eng.step()
    eng._propose = propose
    assert freed == []
    eng.add_request(new, GREEDY, request_id="a")
    assert freed == ["a"]
    outs = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            outs[out.request_id] = out
        if proposer == "ngram" and "a" in eng.proposer._ctx.len:
            n = eng.proposer._ctx.len["a"]
            assert eng.proposer._ctx.buf["a"][:n].tolist() == eng.scheduler.running[0].all_token_ids[:n]
    plain = run(lm, [new], GREEDY)[0][0]
    assert outs["a"].outputs[0].token_ids == plain.outputs[0].token_ids


def test_a_bad_per_request_k_fails_only_its_request(untied):
    """extra_args["num_spec_tokens"] of "two" was read only when proposing: int("two") raised in
    every step, for every request, for good. It is refused when the request arrives."""
    lm = model(untied)
    eng = LLMEngine(EngineConfig(max_model_len=256, spec_method="ngram", num_spec_tokens=4), loaded=lm)
    good = eng.add_request(copy_prompts(1, seed=3)[0], GREEDY)
    bad = eng.add_request([5, 6, 7], SamplingParams(max_tokens=4, extra_args={"num_spec_tokens": "two"}))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert "num_spec_tokens" in done[bad].error
    assert done[good].error is None and len(done[good].outputs[0].token_ids) == GREEDY.max_tokens


def structured(**kw):
    from specops.engine.structured_output import StructuredOutputOptions

    return StructuredOutputOptions(**kw)


class OracleProposer:
    """Drafts a known continuation (what a perfect draft model would propose)."""

    method, needs_hidden_states, num_lookahead_tokens = "oracle", False, 0

    def __init__(self, target: list[int], k: int):
        self.target, self.k = target, k

    def propose(self, requests, num_spec_tokens, context=None):
        from specops.engine.spec_decode.proposer import DraftBatch

        n = [len(r.output_token_ids) for r in requests]
        return DraftBatch([r.request_id for r in requests], [self.target[i:i + self.k] for i in n])

    def free(self, request_id):
        pass


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_structured_output_ends_where_its_grammar_ends_under_speculation(untied, ignore_eos):
    """Drafts that run past the grammar's end (its stop token accepted, then more drafts and the
    bonus token): the output stops at the end, as plain decoding does. With ignore_eos the tokens
    after it used to be kept, the grammar rejected them and the request failed."""
    lm = model(untied)
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=ignore_eos,
                        structured_outputs=structured(choice=["Paris", "Rome"]))
    plain = run(lm, ["The capital of France is"], sp)[0][0]
    assert plain.error is None and plain.outputs[0].finish_reason == "stop"
    tokens = plain.outputs[0].token_ids
    spec = run(lm, ["The capital of France is"], sp, proposer=OracleProposer(tokens + [5, 6, 7, 8], 8))[0][0]
    assert spec.error is None
    assert spec.outputs[0].token_ids == tokens and spec.outputs[0].finish_reason == "stop"
    assert spec.outputs[0].text == plain.outputs[0].text


def test_structured_output_keeps_the_law_with_draft_probabilities(untied):
    """A draft the grammar forbids must still be verified (its masked row rejects it, and the
    token there comes from the residual max(0, p - q)). Cutting it off before verification drew
    that token from p: with q = 0.3 on 'a' (allowed) and 0.7 on 'c' (forbidden), P(2nd = 'a')
    went from 0.42 (plain) to 0.58. Two-sample test of that proportion, seeded requests (the
    result is fixed; the threshold of 5 standard errors has p < 1e-6 for a correct engine)."""
    from specops.engine.spec_decode.proposer import DraftBatch

    lm = model(untied)
    vocab = lm.config.vocab_size
    a, b, c = 67, 68, 69                                   # 'a' 'b' 'c' in the tiny tokenizer

    class QDraft:
        method, needs_hidden_states, num_lookahead_tokens = "draft", False, 0

        def __init__(self):
            self.g = torch.Generator().manual_seed(0)

        def propose(self, requests, num_spec_tokens, context=None):
            q = torch.zeros(vocab)
            q[a], q[c] = 0.3, 0.7
            toks = [[int(torch.multinomial(q, 1, generator=self.g))] if k > 0 else []
                    for k in num_spec_tokens]
            return DraftBatch([r.request_id for r in requests], toks, q.repeat(len(requests), 1, 1))

        def free(self, request_id):
            pass

    n = 1600
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=4, logit_bias={b: 5.8},
                             structured_outputs=structured(regex="[ab]{2}")) for i in range(n)]
    prompts = ["The capital of France is"] * n
    texts = {}
    for name, proposer in (("plain", None), ("spec", QDraft())):
        cfg = dict(max_model_len=64, max_num_seqs=64)
        if proposer is not None:
            cfg["num_spec_tokens"] = 1
        outs = run(lm, prompts, params, proposer=proposer, **cfg)[0]
        assert all(o.error is None for o in outs)
        texts[name] = [o.outputs[0].text for o in outs]
    assert {t for t in texts["plain"]} <= {"aa", "ab", "ba", "bb"} and texts["plain"].count("ba") > 100
    share = {k: sum(t == "ba" for t in v) / sum(t[0] == "b" for t in v) for k, v in texts.items()}
    m = (sum(t[0] == "b" for t in texts["plain"]) + sum(t[0] == "b" for t in texts["spec"])) / 2
    se = (2 * share["plain"] * (1 - share["plain"]) / m) ** 0.5
    assert abs(share["spec"] - share["plain"]) < 5 * se, (share, se)


def test_a_draft_model_draw_that_fails_ends_that_requests_drafts_only(untied):
    """A draft whose logits turn NaN for one request (a NaN in the draft's embedding row of a token only
    that request's prompt holds): its draw is -1, which used to go into the next draft forward and into
    the target's input ids and fail every request's step. Now that request's drafts end before it, and
    both requests decode to the end (greedy: plain decoding's tokens; sampled: no error)."""
    import copy

    from specops.engine.model.loader import LoadedModel

    lm, good = model(untied), model(untied, 0.1)
    poison = 383
    bad = LoadedModel(model=copy.deepcopy(good.model), tokenizer=good.tokenizer, config=good.config, path="<nan>")
    with torch.no_grad():
        bad.model.embed_tokens.weight[poison] = float("nan")
    prompts = [[t for t in p if t != poison] for p in copy_prompts(2, seed=5)]
    prompts[1] = prompts[1] + [poison]
    for k in (3, 1):
        sampled = SamplingParams(temperature=0.8, seed=1, max_tokens=12, ignore_eos=True)
        outs, eng = run(lm, prompts, sampled, draft=bad, spec_method="draft", num_spec_tokens=k)
        assert [o.error for o in outs] == [None, None] and all(len(o.outputs[0].token_ids) == 12 for o in outs)
        greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        outs, _ = run(lm, prompts, greedy, draft=bad, spec_method="draft", num_spec_tokens=k)
        plain, _ = run(lm, prompts, greedy)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]


def test_a_proposers_drafts_are_cut_to_k_and_to_the_vocabulary(untied):
    """Whatever a proposer returns (a custom one: more drafts than the K it was asked for, an id outside
    the vocabulary), the engine schedules at most K drafts and none from the first bad id on; it used to
    fail every request's step (a ValueError past MAX_SPEC_LEN, an IndexError in the embedding)."""
    from specops.engine.spec_decode import DraftBatch, Proposer

    class Unruly(Proposer):
        method = "unruly"
        needs_hidden_states = False

        def __init__(self, drafts):
            self.drafts, self.seen = drafts, []

        def propose(self, requests, num_spec_tokens, context=None):
            return DraftBatch([r.request_id for r in requests], [list(self.drafts) for _ in requests])

    lm = model(untied)
    prompts = copy_prompts(2, seed=1)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain, _ = run(lm, prompts, greedy)
    for drafts, most in (([5] * 200, 4), ([7, 384, 7], 1), ([-1, 5], 0)):
        scheduled = []
        outs, eng = run(lm, prompts, greedy, proposer=Unruly(drafts), num_spec_tokens=4,
                        on_step=lambda e: scheduled.extend(len(r.spec_token_ids) for r in e.scheduler.running))
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
        assert scheduled and max(scheduled) == most, (drafts, scheduled)


@pytest.mark.parametrize("spec", ["ngram", "draft"])
def test_a_prompt_chunk_one_token_short_gets_no_drafts(untied, spec):
    """A prompt chunk that stops one token before the prompt's end leaves the request with the token
    counts of pure decode but no output yet: it is not drafted for (the proposer's contract: every
    prompt token computed, the last sampled token committed). A seeded sampled request's tokens then
    do not depend on where its prompt was cut (its first token was verified against drafts)."""
    lm = model(untied)
    prompt = copy_prompts(1, seed=3)[0][:16]
    sp = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=1234)
    draft = model(untied, 0.1) if spec == "draft" else None
    outs = {}
    for budget in (16, 15):
        eng = LLMEngine(EngineConfig(max_model_len=128, max_num_batched_tokens=budget, spec_method=spec,
                                     num_spec_tokens=3), loaded=lm, draft_loaded=draft)
        eng.add_request(prompt, sp)
        eng.step()
        req = eng.scheduler.running[0]
        if budget == 15:    # the chunk stopped one short of the prompt's 16 tokens
            assert (req.num_computed_tokens, req.num_output_tokens, req.spec_token_ids) == (15, 0, [])
        while eng.has_unfinished_requests():
            for out in eng.step():
                outs[budget] = out.outputs[0].token_ids
    assert len(prompt) == 16 and outs[16] == outs[15] and len(outs[16]) == 6
