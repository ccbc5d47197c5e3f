"""Bad inputs of speculative verification: draft ids past int32 from the builder, a spec whose
host counts disagree with itself, bad temperatures (both backends), the MAX_SPEC_LEN limit.

Triton runs on CPU under the interpreter (set by conftest when there is no GPU), at tiny sizes.
"""

import dataclasses
import os

import pytest
import torch

import specops
from specops.sampling import Sampler, SamplingMetadata
from specops.spec_decode import MAX_SPEC_LEN, RejectionSampler, build_spec_decode_metadata, rejection_sample

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
BACKENDS = ["torch"] + (["triton"] if CUDA or os.environ.get("TRITON_INTERPRET") == "1" else [])


def _sampler() -> Sampler:
    return Sampler(backend="auto" if CUDA else "torch")   # bonus rows: not the subject here


# ---- item: the builder keeps draft ids at their width -------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_vocab_draft_from_the_builder_is_rejected(backend):
    # 2**32 + 3 wraps to the target's favourite token 3 in 32 bits; kept at 64 bits it is
    # outside the vocabulary and rejected: one token (the argmax, or a recovered one), no bonus
    logits = torch.full((4, 10), -5.0, device=DEVICE)
    logits[:, 3] = 5.0
    spec = build_spec_decode_metadata([1, 1], [2, 4], input_ids=torch.tensor([0, 2**32 + 3, 0, 3], device=DEVICE))
    assert spec.draft_token_ids.tolist() == [2**32 + 3, 3]
    md = SamplingMetadata.from_params([0.0, 0.0], vocab_size=10, device=DEVICE)
    out = RejectionSampler(_sampler(), backend=backend)(logits, spec, md).output_token_ids
    assert out.tolist() == [[3, -1], [3, 3]]
    md = SamplingMetadata.from_params([0.7, 0.7], vocab_size=10, device=DEVICE, seeds=[1, 2], positions=[4, 4])
    out = RejectionSampler(_sampler(), backend=backend)(logits, spec, md).output_token_ids
    assert out[0, 0] != -1 and out[0, 1] == -1


# ---- item: RejectionSampler checks its spec on the host before any launch -------------------------

class _SpySampler(Sampler):
    def __init__(self):
        super().__init__(backend="torch")
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return super().__call__(*args, **kwargs)

    def process(self, *args, **kwargs):
        self.calls += 1
        return super().process(*args, **kwargs)


def _spec_cases():
    spec = build_spec_decode_metadata([3, 0], [4, 5], device=DEVICE)
    r = dataclasses.replace
    return [
        (r(spec, max_spec_len=2), ValueError, r"spec.num_draft_tokens\[0\] = 3 exceeds spec.max_spec_len = 2"),
        (r(spec, max_spec_len=MAX_SPEC_LEN + 1), ValueError, r"spec.max_spec_len must be an int in \[0, 128\]"),
        (r(spec, max_spec_len=3.0), ValueError, "spec.max_spec_len must be an int"),
        (r(spec, num_draft_tokens=[3, 0, 0]), ValueError, r"spec.cu_num_draft_tokens must have shape \[3\]"),
        (r(spec, num_draft_tokens=[4, -1]), ValueError, "spec.num_draft_tokens must be a list of ints >= 0"),
        (r(spec, bonus_logits_indices=spec.bonus_logits_indices[:1]), ValueError,
         r"spec.bonus_logits_indices must have shape \[2\]"),
        (r(spec, target_logits_indices=spec.target_logits_indices.float()), TypeError,
         "spec.target_logits_indices must be int32 or int64"),
        (dataclasses.asdict(spec), TypeError, "spec must be a SpecDecodeMetadata .*got dict"),
        (None, TypeError, "spec must be a SpecDecodeMetadata .*got NoneType"),
    ] + ([(r(spec, cu_num_draft_tokens=torch.tensor([2, 3])), ValueError, "cumulative sum")] if not CUDA else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("penalties", [False, True])
def test_bad_spec_raises_before_any_launch(backend, penalties):
    # the over-long request ([3, 0] drafts, max_spec_len 2) would be verified on its first 2
    # drafts by the kernels and get the bonus token after them; the torch path raised, but only
    # after the bonus rows were sampled
    kw = dict(frequency_penalties=[0.5, 0.5], output_counts=torch.zeros(2, 10, dtype=torch.int32, device=DEVICE),
              prompt_mask=torch.zeros(2, 10, dtype=torch.bool, device=DEVICE)) if penalties else {}
    md = SamplingMetadata.from_params([0.0, 0.8], vocab_size=10, device=DEVICE, **kw)
    logits = torch.zeros(5, 10, device=DEVICE)
    drafts = torch.tensor([1, 2, 3], device=DEVICE)
    for spec, exc, match in _spec_cases():
        spy = _SpySampler()
        with pytest.raises(exc, match=match):
            RejectionSampler(spy, backend=backend)(logits, spec, md, draft_token_ids=drafts)
        assert spy.calls == 0, match
    spec = build_spec_decode_metadata([3, 0], [4, 5], device=DEVICE)
    for bad_md, name in ((None, "NoneType"), ({"temperature": [0.0, 0.8]}, "dict")):
        with pytest.raises(TypeError, match=f"metadata must be a SamplingMetadata, got {name}"):
            RejectionSampler(_SpySampler(), backend=backend)(logits, spec, bad_md, draft_token_ids=drafts)
    for bad_logits in (logits.tolist(), None):            # no tensor: a TypeError naming the type
        with pytest.raises(TypeError, match=f"logits must be a torch.Tensor .* got {type(bad_logits).__name__}"):
            RejectionSampler(_SpySampler(), backend=backend)(bad_logits, spec, md, draft_token_ids=drafts)
        with pytest.raises(TypeError, match=f"logits must be a torch.Tensor .* got {type(bad_logits).__name__}"):
            rejection_sample(bad_logits, drafts, spec.cu_num_draft_tokens, 3, torch.zeros(2, dtype=torch.long,
                             device=DEVICE), backend=backend)
    # the valid spec goes through
    out = RejectionSampler(_sampler(), backend=backend)(logits, spec, md, draft_token_ids=drafts)
    assert out.output_token_ids.shape == (2, 4)


# ---- item: a bad temperature gives invalid rows on both backends -----------------------------------

@pytest.mark.parametrize("bad", [-1.0, -0.0, 0.0, float("nan"), float("inf"), -float("inf")])
def test_bad_temperature_of_a_random_request_gives_invalid_rows(bad):
    # request 0 (random, bad T) and 2 (greedy, bad T ignored) beside a good request 1
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(6, 10, generator=g) * 2).to(DEVICE)
    drafts = logits.argmax(1)
    cu = torch.tensor([2, 4, 6], device=DEVICE)
    bonus = torch.tensor([7, 8, 9], device=DEVICE)
    temperature = torch.tensor([bad, 0.8, bad], device=DEVICE)
    kw = dict(is_greedy=torch.tensor([False, False, True], device=DEVICE), seeds=torch.tensor([1, 2, 3], device=DEVICE),
              has_seed=torch.ones(3, dtype=torch.bool, device=DEVICE),
              positions=torch.zeros(3, dtype=torch.int64, device=DEVICE))
    outs = []
    for backend in BACKENDS:
        outs.append(rejection_sample(logits, drafts, cu, 2, bonus, temperature=temperature, backend=backend,
                                     **kw).cpu())
        inv = (1.0 / temperature).repeat_interleave(2)       # the same through inv_temperature
        outs.append(rejection_sample(logits, drafts, cu, 2, bonus, inv_temperature=inv, backend=backend,
                                     **kw).cpu())
    for out in outs:
        assert out[0].tolist() == [-1, -1, -1]
        assert out[1, 0] != -1
        assert out[2].tolist() == drafts[4:].tolist() + [9]       # greedy: argmax drafts, bonus
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_temperature_rows_are_invalid_at_any_vocab(backend):
    # V = 64 is a multiple of chunk_size(64): no padding past V turns a bad scale into NaN there,
    # so the kernels' own guard (_row_scale) is what makes the row invalid
    logits = (torch.randn(2, 64) * 2).to(DEVICE)
    drafts = logits.argmax(1)
    for bad in (-1.0, -0.5, float("inf"), -float("inf")):
        out = rejection_sample(logits, drafts, torch.tensor([1, 2], device=DEVICE), 1,
                               torch.tensor([5, 6], device=DEVICE),
                               temperature=torch.tensor([bad, 1.0], device=DEVICE), backend=backend)
        assert out[0].tolist() == [-1, -1] and out[1, 0] != -1


# ---- item: the documented maximum K ----------------------------------------------------------------

def test_max_spec_len_is_exported_and_enforced():
    from specops.engine.config import EngineConfig
    assert specops.MAX_SPEC_LEN == MAX_SPEC_LEN == 128
    assert "MAX_SPEC_LEN" in specops.__all__
    with pytest.raises(ValueError, match="MAX_SPEC_LEN"):
        build_spec_decode_metadata([MAX_SPEC_LEN + 1], [MAX_SPEC_LEN + 2])
    build_spec_decode_metadata([MAX_SPEC_LEN], [MAX_SPEC_LEN + 1])
    cfg = EngineConfig(spec_method="ngram", num_spec_tokens=MAX_SPEC_LEN + 1)
    with pytest.raises(ValueError, match=r"num_spec_tokens must be an int in \[1, 128\] \(MAX_SPEC_LEN\)"):
        cfg.validate()


def test_rejection_sampler_checks_its_sampler_when_built():
    for bad in ("x", Sampler, object()):
        with pytest.raises(TypeError, match="sampler must be a specops Sampler or None, got"):
            RejectionSampler(bad)
    assert RejectionSampler(None, backend="torch").sampler.backend == "torch"


# ---- the host copy of the drafts, and a history row without bad words ----------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_token_lists_are_checked_before_any_launch(backend):
    spec = build_spec_decode_metadata([3, 0], [4, 5], device=DEVICE)
    md = SamplingMetadata.from_params([0.0, 0.8], vocab_size=10, device=DEVICE, bad_words_token_ids={0: [[1, 2]]},
                                      output_token_ids=[[7], [8]])
    logits = torch.zeros(5, 10, device=DEVICE)
    drafts = torch.tensor([1, 2, 3], device=DEVICE)
    for lists, exc, match in (([[1, "x", 3], []], TypeError, r"draft_token_lists\[0\]\[1\] must be an int"),
                              ([[1, 2], []], ValueError, r"draft_token_lists\[0\] must be a list of "
                                                         r"num_draft_tokens\[0\] = 3 drafts, got 2"),
                              ([[1, 2, 3]], ValueError, r"one list of drafts per request \(2\)")):
        spy = _SpySampler()
        with pytest.raises(exc, match=match):
            RejectionSampler(spy, backend=backend)(logits, spec, md, draft_token_ids=drafts, draft_token_lists=lists)
        assert spy.calls == 0, match


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_history_row_without_bad_words_may_be_none(backend):
    # only rows with bad words need a history; request 1 (none) gives None
    spec = build_spec_decode_metadata([2, 1], [3, 5], device=DEVICE)
    md = SamplingMetadata.from_params([0.0, 0.0], vocab_size=10, device=DEVICE, bad_words_token_ids={0: [[1, 2]]},
                                      output_token_ids=[[7], None])
    logits = torch.zeros(5, 10, device=DEVICE)
    logits[:, 2] = 5.0                      # rows: request 0's two target rows and bonus, request 1's
    logits[:, 4] = 4.0                      # target row and bonus
    logits[0, 1] = 6.0
    drafts = torch.tensor([1, 2, 2], device=DEVICE)
    out = RejectionSampler(_sampler(), backend=backend)(logits, spec, md, draft_token_ids=drafts)
    # request 0: draft 1 is row 0's argmax (accepted); after it 2 is banned, so row 1 emits 4;
    # request 1: its draft 2 is the argmax, then the bonus row's argmax 2
    assert out.output_token_ids.tolist() == [[1, 4, -1], [2, 2, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_seed_must_be_an_int_not_a_bool(backend):
    # True passed as engine seed 1 (a bool is an int to isinstance)
    drafts, cu = torch.tensor([1, 2], device=DEVICE), torch.tensor([1, 2], device=DEVICE)
    args = (torch.zeros(2, 10, device=DEVICE), drafts, cu, 1, torch.zeros(2, dtype=torch.long, device=DEVICE))
    kw = dict(is_greedy=False, temperature=torch.ones(2, device=DEVICE), backend=backend)
    with pytest.raises(TypeError, match=r"engine_seed must be an int, got bool"):
        rejection_sample(*args, engine_seed=True, **kw)
    assert rejection_sample(*args, engine_seed=1, **kw).shape == (2, 2)


# ---- item: empty inputs whose last stride is not 1 ----------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_inputs_with_any_strides_give_the_empty_result(backend):
    # torch calls every empty tensor contiguous, so .contiguous() kept strides (1, 0) and the
    # Triton launchers' unit-stride asserts failed bare; the compiled ops advised .contiguous()
    from specops.sampling import compute_logprobs
    V = 8
    empty = (torch.randn(V, 0, device=DEVICE).t() * 3)          # [0, V], strides (1, 0)
    assert empty.shape == (0, V) and empty.stride(1) != 1
    none = torch.zeros(0, dtype=torch.long, device=DEVICE)
    out = rejection_sample(empty, none, torch.tensor([0, 0], device=DEVICE), 2, torch.tensor([3, 5], device=DEVICE),
                           backend=backend)
    assert out.tolist() == [[3, -1, -1], [5, -1, -1]]
    out = rejection_sample(torch.zeros(0, V, device=DEVICE), none, torch.tensor([0], device=DEVICE), 1,
                           torch.tensor([3], device=DEVICE), draft_probs=empty, backend=backend)
    assert out.tolist() == [[3, -1]]
    lp = compute_logprobs("raw_logprobs", 2, none, raw_logits=empty, backend=backend)
    assert tuple(lp.token_ids.shape) == (0, 3)
    md = SamplingMetadata.from_params([], vocab_size=V, max_num_logprobs=2, device=DEVICE)
    res = Sampler(backend=backend, logprobs_mode="processed_logprobs")(empty, md)
    assert tuple(res.sampled_token_ids.shape) == (0,)
    ids = torch.zeros(0, 6, dtype=torch.long, device=DEVICE)[:, ::2]
    assert specops.token_bincount(ids, V).shape == (0, V)
    assert specops.token_bincount(ids.contiguous(), V).shape == (0, V)
    assert torch.ops.specops.token_bincount(ids, V).shape == (0, V)     # the C++ check, called directly
