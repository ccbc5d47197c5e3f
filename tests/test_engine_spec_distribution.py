"""Speculative decoding at temperature > 0 leaves the output distribution unchanged.

A random Llama model with a 16-token vocabulary samples many short continuations of one prompt
(its own greedy output, so that it tends to repeat its context) with and without speculation
(n-gram drafts, verified against one-hot q; drafts of a perturbed copy of the model, verified
with their probabilities), with temperature only and with top-k/top-p/min-p and the three
penalties (whose counts must include the earlier drafts of the same step, and never rejected ones).
Two-sample chi-square tests compare the token counts at every output position, the pairs of
consecutive positions, and the number of distinct tokens per continuation (where penalties show).
Each test rejects at p < ALPHA = 1e-5; over the 4 x 12 tests a correct engine fails with
probability < 5e-4 (the draws are seeded: a run that passes always passes). Power checks: the same
tests reject a sampler at temperature x1.15, an engine whose penalty counts include rejected
drafts, a verifier whose target rows ignore the earlier drafts' penalty counts, and one whose
target rows ignore min_p.
"""

import pytest
import torch

from specops.engine.config import EngineConfig
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.hf_loader import hf_to_state_dict
from specops.engine.model.llama import LlamaForCausalLM
from specops.engine.model.loader import LoadedModel
from specops.engine.model.random_checkpoint import random_hf_tensors, tiny_config
from specops.engine.sampling_params import SamplingParams
from specops.sampling.logits_processors.interface import LogitsProcessor, process_dict_updates

VOCAB = 16
EOS = 2
N = 4000  # continuations per run
LEN = 6  # tokens per continuation
ALPHA = 1e-5
SEED_PROMPT = [3, 7, 5, 3, 7, 5, 3, 7]
TEMPERATURE = 1.5
# min_p 0.1 cuts tokens that top-k and top-p keep (test_min_p_cuts_what_top_k_and_top_p_keep)
PROCESSED = dict(top_k=8, top_p=0.9, min_p=0.1, repetition_penalty=1.5, frequency_penalty=0.8,
                 presence_penalty=0.8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class IdTokenizer:
    """Token ids as text (" 3 7 5"): all the engine needs for prompts given as ids."""

    def __init__(self, vocab: int):
        self.vocab_size = vocab
        self.eos_token_ids = [EOS]

    def encode(self, text):
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" {i}" for i in ids)

    def id_to_token(self, i):
        return str(i)


_MODELS = {}


def small_model(noise: float = 0.0, device: str = "cpu") -> LoadedModel:
    """The target (noise 0), or a copy with every weight perturbed (a draft that is right about half the time)."""
    if (noise, device) not in _MODELS:
        config = tiny_config(vocab_size=VOCAB, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32,
                             intermediate_size=128, tie_word_embeddings=False)
        tensors = random_hf_tensors(config, torch.float32, seed=0)
        g = torch.Generator().manual_seed(5)
        for t in tensors.values():
            t += torch.randn(t.shape, generator=g) * t.std() * noise
        sd = hf_to_state_dict(config, tensors, "<random>")
        model = LlamaForCausalLM.from_state_dict(config, sd, device=device, dtype=torch.float32)
        _MODELS[noise, device] = LoadedModel(model=model, tokenizer=IdTokenizer(VOCAB), config=config, path="<random>")
    return _MODELS[noise, device]


def prompt() -> list[int]:
    """SEED_PROMPT and the target's greedy continuation: patterns that the model tends to repeat."""
    if "prompt" not in _MODELS:
        eng = LLMEngine(EngineConfig(max_model_len=64), loaded=small_model())
        eng.add_request(SEED_PROMPT, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
        out = None
        while eng.has_unfinished_requests():
            out = eng.step() or out
        _MODELS["prompt"] = SEED_PROMPT + out[0].token_ids
    return _MODELS["prompt"]


_SAMPLES = {}


def samples(name: str, temperature: float = TEMPERATURE, processed: bool = False, spec: str | None = None,
            seeded: bool = True, cache: bool = True, device: str = "cpu") -> torch.Tensor:  # [N, LEN] int64
    """N continuations of prompt() (request i seeded with i, or unseeded), LEN tokens each."""
    if cache and f"{name}@{device}" in _SAMPLES:
        return _SAMPLES[f"{name}@{device}"]
    cfg = dict(max_model_len=64, max_num_seqs=256, max_num_batched_tokens=4096, seed=7)
    draft = None
    if spec is not None:
        cfg.update(spec_method=spec, num_spec_tokens=3)
        draft = small_model(0.2, device) if spec == "draft" else None
    eng = LLMEngine(EngineConfig(**cfg), loaded=small_model(0.0, device), draft_loaded=draft)
    extra = PROCESSED if processed else {}
    ids = [eng.add_request(prompt(), SamplingParams(temperature=temperature, max_tokens=LEN, ignore_eos=True,
                                                  seed=i if seeded else None, **extra)) for i in range(N)]
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    if spec is not None:  # real speculation: drafts both accepted and rejected
        st = eng.stats()["spec_decoding"]
        assert st["num_accepted_tokens"] > N / 2 and st["num_draft_tokens"] - st["num_accepted_tokens"] > N / 2, st
    out = torch.tensor([done[i] for i in ids])
    name = f"{name}@{device}"
    if cache:
        _SAMPLES[name] = out
    return out


def chi2_two_sample(a: torch.Tensor, b: torch.Tensor, min_count: int = 10) -> float:
    """p-value of the two-sample chi-square test that category samples a and b share one distribution.

    Categories with fewer than min_count observations in both samples together are pooled.
    """
    n = int(max(a.max(), b.max())) + 1
    ca = torch.bincount(a, minlength=n).double()
    cb = torch.bincount(b, minlength=n).double()
    rare = (ca + cb) < min_count
    ca = torch.cat([ca[~rare], ca[rare].sum().reshape(1)])
    cb = torch.cat([cb[~rare], cb[rare].sum().reshape(1)])
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    na, nb = ca.sum(), cb.sum()
    stat = (((ca * (nb / na).sqrt() - cb * (na / nb).sqrt()) ** 2) / (ca + cb)).sum()
    df = ca.numel() - 1
    if df < 1:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def p_values(a: torch.Tensor, b: torch.Tensor) -> list[float]:  # a, b: [n, LEN] samples
    """One test per position, per pair of consecutive positions (joint categories), and on the
    number of distinct tokens of each continuation."""
    ps = [chi2_two_sample(a[:, j], b[:, j]) for j in range(LEN)]
    ps += [chi2_two_sample(a[:, j] * VOCAB + a[:, j + 1], b[:, j] * VOCAB + b[:, j + 1]) for j in range(LEN - 1)]
    distinct = [torch.tensor([len(set(row)) for row in x.tolist()]) for x in (a, b)]
    ps.append(chi2_two_sample(*distinct))
    return ps


def test_the_model_is_a_fair_testbed():
    """Position 1's distribution is spread out (not near one-hot): drafts are rejected often enough."""
    x = samples("plain")
    freq = torch.bincount(x[:, 1], minlength=VOCAB).double() / N
    assert freq.max() < 0.7 and int((freq > 0.02).sum()) >= 4, freq


@pytest.mark.parametrize("spec,processed,seeded", [
    ("ngram", False, False),  # unseeded rows: (engine seed, step, lane) noise
    ("draft", False, True),  # probabilistic verification with the draft's distributions
    ("ngram", True, True),  # top-k/top-p/min-p thresholds and penalties on every target row
    ("draft", True, True),
])
def test_spec_distribution_matches_plain(spec, processed, seeded):
    base = samples("plain-processed" if processed else "plain", processed=processed)
    got = samples(f"{spec}-{processed}-{seeded}", processed=processed, spec=spec, seeded=seeded)
    ps = p_values(got, base)
    assert min(ps) > ALPHA, [f"{p:.2e}" for p in ps]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: Triton sampling and rejection kernels")
@pytest.mark.parametrize("spec,processed", [("ngram", False), ("draft", True)])
def test_spec_distribution_matches_plain_cuda(spec, processed):
    base = samples("plain-processed" if processed else "plain", processed=processed, device="cuda")
    got = samples(f"{spec}-{processed}", processed=processed, spec=spec, device="cuda")
    ps = p_values(got, base)
    assert min(ps) > ALPHA, [f"{p:.2e}" for p in ps]


def test_min_p_cuts_what_top_k_and_top_p_keep():
    """At the first output position PROCESSED's min_p removes tokens of clear mass that top-k and
    top-p alone keep (exact float64 law of the target's logits), so the processed runs test it."""
    from specops.engine.model.reference import reference_forward
    from test_rejection_sampler import params, processed_probs

    logits = reference_forward(small_model().model, prompt())[-1]
    law = {m: processed_probs(logits, prompt(), [], params(temperature=TEMPERATURE, **dict(PROCESSED, min_p=m)),
                              VOCAB, EOS) for m in (PROCESSED["min_p"], 0.0)}
    cut = (law[0.0] > 0) & (law[PROCESSED["min_p"]] == 0)
    assert float(law[0.0][cut].sum()) > 0.05, law


def test_power_a_verifier_without_min_p_is_caught(monkeypatch):
    """A verifier whose target rows ignore min_p (top-k and top-p only) fails the test."""
    from specops.spec_decode import rejection_sampler

    threshold_pass = rejection_sampler.sample_with_thresholds

    def without_min_p(logits, inv_temperature, top_k, top_p, min_p, *args, **kw):
        return threshold_pass(logits, inv_temperature, top_k, top_p, None, *args, **kw)

    monkeypatch.setattr(rejection_sampler, "sample_with_thresholds", without_min_p)
    bad = samples("no-min-p-ngram", processed=True, spec="ngram", cache=False)
    assert min(p_values(bad, samples("plain-processed", processed=True))) < ALPHA


def test_power_a_slightly_hotter_sampler_is_caught():
    assert min(p_values(samples("plain-hot", temperature=TEMPERATURE * 1.15), samples("plain"))) < ALPHA


def test_power_rejected_drafts_in_penalty_counts_are_caught(monkeypatch):
    """An engine that also counts the rejected drafts of each step in the penalties fails the test."""
    from specops.engine import sampling
    from specops.ops import token_bincount_update_

    verify = sampling.BatchSampler.verify

    def leaky_verify(self, logits, spec, rows, positions, drafts, draft_probs=None):
        out = verify(self, logits, spec, rows, positions, drafts, draft_probs)
        idx, toks = [], []
        for r, d, e in zip(rows, drafts, out.tolist()):
            n = sum(t >= 0 for t in e)
            idx += [r] * (len(d) - (n - 1))
            toks += d[n - 1:]
        if toks and self.output_counts is not None:
            token_bincount_update_(self.output_counts, torch.tensor(idx), torch.tensor(toks))
        return out

    monkeypatch.setattr(sampling.BatchSampler, "verify", leaky_verify)
    bad = samples("leaky-ngram", processed=True, spec="ngram", cache=False)
    assert min(p_values(bad, samples("plain-processed", processed=True))) < ALPHA


def test_power_target_rows_without_earlier_drafts_are_caught(monkeypatch):
    """A verifier whose target rows do not count the earlier drafts in the penalties fails the test."""
    from specops.spec_decode.rejection_sampler import RejectionSampler

    if "_count_drafts" not in vars(RejectionSampler):
        pytest.skip("RejectionSampler._count_drafts is gone: nothing to break")
    monkeypatch.setattr(RejectionSampler, "_count_drafts", staticmethod(lambda *args: None))
    bad = samples("forgetful-draft", processed=True, spec="draft", cache=False)
    assert min(p_values(bad, samples("plain-processed", processed=True))) < ALPHA


class NanAfter(LogitsProcessor):
    """Custom processor: a NaN in every row of a request with extra_args["nan_after"] = n once n
    output tokens (committed + earlier drafts) precede the row: the model 'fails' there."""

    def __init__(self, max_num_reqs, vocab_size, device="cpu"):
        super().__init__(max_num_reqs, vocab_size, device)
        self.limits = {}

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        process_dict_updates(self.limits, batch_update, lambda params, prompt, out: params.extra_args.get("nan_after"))

    def apply(self, logits, rows=None):
        for r in range(logits.shape[0]):
            limit = self.limits.get(rows.req_indices[r])
            if limit is not None and rows.num_output_tokens[r] >= limit:
                logits[r, 1] = float("nan")
        return logits


@pytest.mark.parametrize("spec", [None, "ngram", "draft"])
def test_nan_logits_at_a_draft_fail_only_that_request(spec):
    """A request whose target rows turn NaN from its 3rd output token on fails with the tokens
    before it kept; its seeded neighbours' tokens are those of a run without it (random rows,
    so the RejectionSampler's kernels, not the greedy shortcut, verify the drafts)."""
    cfg = dict(max_model_len=64, seed=7, logits_processors=[NanAfter])
    if spec is not None:
        cfg.update(spec_method=spec, num_spec_tokens=3)
    draft = small_model(0.2) if spec == "draft" else None

    def run(poisoned: bool) -> dict:
        eng = LLMEngine(EngineConfig(**cfg), loaded=small_model(), draft_loaded=draft)
        ids = [eng.add_request(prompt(), SamplingParams(temperature=1.0, max_tokens=LEN + 4, ignore_eos=True, seed=i))
               for i in range(3)]
        if poisoned:
            ids.append(eng.add_request(prompt(), SamplingParams(temperature=1.0, max_tokens=LEN + 4, ignore_eos=True,
                                                                seed=9, extra_args={"nan_after": 2})))
        done = {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = out
        assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
        return [done[i] for i in ids]

    clean, mixed = run(False), run(True)
    assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in clean] and all(o.error is None for o in mixed[:3])
    bad = mixed[3]
    assert bad.error is not None and "NaN" in bad.error and bad.outputs[0].finish_reason == "error"
    assert len(bad.token_ids) == 2, bad.token_ids


class RefuseOddScale(LogitsProcessor):
    """Custom processor whose `check_update` refuses a request with extra_args["scale"] <= 0."""

    def __init__(self, max_num_reqs, vocab_size, device="cpu"):
        super().__init__(max_num_reqs, vocab_size, device)
        self.scales = {}

    @staticmethod
    def _scale(params, prompt, out):
        scale = params.extra_args.get("scale")
        if scale is not None and not scale > 0:
            raise KeyError(f"scale must be > 0, got {scale}")   # any exception type, as a custom one may raise
        return scale

    def is_argmax_invariant(self):
        return True

    def check_update(self, batch_update):
        super().check_update(batch_update)
        for _, params, prompt, out in (batch_update.added if batch_update is not None else []):
            self._scale(params, prompt, out)

    def update_state(self, batch_update):
        process_dict_updates(self.scales, batch_update, self._scale)

    def apply(self, logits, rows=None):
        return logits


def test_a_request_a_custom_processor_refuses_fails_alone_on_arrival():
    # before, the refusal came from the step that added the request to the batch: every request
    # of that step failed, and every later step too
    eng = LLMEngine(EngineConfig(max_model_len=64, logits_processors=[RefuseOddScale]), loaded=small_model())
    good = [eng.add_request(prompt(), SamplingParams(max_tokens=4, ignore_eos=True, extra_args={"scale": 2.0}))
            for _ in range(2)]
    bad = eng.add_request(prompt(), SamplingParams(max_tokens=4, ignore_eos=True, extra_args={"scale": -1.0}))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert all(done[i].error is None and len(done[i].token_ids) == 4 for i in good)
    assert "RefuseOddScale refused the request" in done[bad].error and "scale must be > 0" in done[bad].error
    assert done[bad].token_ids == []


@pytest.mark.parametrize("field, value, words", [
    ("seed", 2**64, r"seed must be an int in \[-2\^63, 2\^64\), got 18446744073709551616"),
    ("seed", None, "seed must be an int"),
    ("gpu_memory_utilization", "0.5", "gpu_memory_utilization must be a real number"),
    ("enable_prefix_caching", "no", "enable_prefix_caching must be a bool"),
    ("enable_chunked_prefill", "false", "enable_chunked_prefill must be a bool, got 'false'"),   # was on
    ("device", "tpu", r"device must be 'cpu', 'cuda' or 'cuda:N' \(None: automatic\), got 'tpu'"),
    # LLM(device="cuda") on a CPU-only torch loaded the model, then failed inside torch
    ("device", "cuda:99", r"device 'cuda:99': this (torch has no CUDA device|machine has \d CUDA device)"),
    ("structured_compile_timeout_s", True, r"structured_compile_timeout_s must be > 0 \(seconds\), got True"),
    ("spec_log_interval_s", "5", "spec_log_interval_s must be a real number")])
def test_engine_config_refuses_bad_fields_by_name(field, value, words):
    # a bad seed was taken, then every step failed with "engine_seed must be ..."
    with pytest.raises((TypeError, ValueError), match=words):
        EngineConfig(**{field: value}).validate()


@pytest.mark.parametrize("rates, words", [
    ("1", "must be a probability or a list of them, got '1'"),    # was a list of the string's characters
    ("0.5", "must be a probability or a list of them, got '0.5'"),
    (True, "must be a probability or a list of them, got True"),  # was a rate of 1.0
    ([0.5, "0.9"], r"must be probabilities in \[0, 1\], got \[0.5, '0.9'\]"),
    ([[0.5]], r"must be probabilities in \[0, 1\]")])
def test_synthetic_acceptance_rates_are_refused_by_name(rates, words):
    with pytest.raises(ValueError, match="spec_synthetic_acceptance rates " + words):
        EngineConfig(spec_method="ngram", spec_synthetic_acceptance=rates).validate()
    import numpy as np
    for ok in (np.float32(0.5), torch.tensor([0.5, 0.7]), [torch.tensor(0.5)], np.array([0.2, 0.3])):
        assert EngineConfig(spec_method="ngram", spec_synthetic_acceptance=ok).validate() is None
