"""Defects found by the session-73 review of the public API (each test failed before its fix)."""

from types import SimpleNamespace

import pytest
import torch

import specops
from specops import BatchUpdate, Sampler, SamplingMetadata, build_logits_processors
from specops.sampling.logits_processors.builtin import MinPLogitsProcessor
from specops.spec_decode import build_spec_decode_metadata


def _min_p_procs(max_num_reqs: int, vocab: int, min_p: float):
    procs = build_logits_processors(max_num_reqs, vocab, use_entry_points=False)
    procs.update_state(BatchUpdate(batch_size=1, added=[(0, SimpleNamespace(min_p=min_p), None, [])]))
    return procs


@pytest.mark.parametrize("max_num_reqs", [1, 2])
def test_sampler_refuses_identity_rows_past_max_num_reqs(max_num_reqs):
    # metadata.rows None means logits row i is batch index i; with 3 rows and a min_p processor of
    # max_num_reqs=1, its [1] min_p broadcast over every row: request 0's min_p=1 silently cut rows
    # 1 and 2 down to their max (with max_num_reqs=2 it failed in the draw, naming min_p's shape)
    V = 8
    procs = _min_p_procs(max_num_reqs, V, 1.0)
    md = SamplingMetadata.from_params([1.0] * 3, vocab_size=V, seeds=[1, 2, 3], min_p=[0.001] * 3,
                                      logitsprocs=procs)
    logits = torch.zeros(3, V)
    logits[:, 5] = 0.5
    before = logits.clone()
    with pytest.raises(ValueError, match=rf"metadata.rows is None.*3 rows.*MinPLogitsProcessor holds "
                                         rf"max_num_reqs={max_num_reqs}"):
        Sampler(backend="torch")(logits, md)
    assert torch.equal(logits, before)


def test_sampler_identity_rows_within_max_num_reqs_still_work():
    V = 8
    procs = _min_p_procs(3, V, 1.0)   # request 0 only keeps its max; rows 1 and 2 have no min_p
    logits = torch.zeros(3, V)
    logits[:, 5] = 0.5
    seen = set()
    for pos in range(40):
        md = SamplingMetadata.from_params([1.0] * 3, vocab_size=V, seeds=[1, 2, 3], positions=[pos] * 3,
                                          logitsprocs=procs)
        tokens = Sampler(backend="torch")(logits.clone(), md).sampled_token_ids
        assert tokens[0].item() == 5
        seen.add(tokens[1].item())
    assert len(seen) > 1


def test_min_p_processor_refuses_identity_rows_past_max_num_reqs():
    proc = MinPLogitsProcessor(1, 4)
    proc.update_state(BatchUpdate(batch_size=1, added=[(0, SimpleNamespace(min_p=0.5), None, [])]))
    with pytest.raises(ValueError, match="rows is None .* 3 rows and max_num_reqs=1"):
        proc.row_min_p(None, 3, "cpu")
    with pytest.raises(ValueError, match="max_num_reqs=1"):
        proc.apply(torch.zeros(3, 4))
    assert proc.row_min_p(None, 1, "cpu").tolist() == [0.5]


@pytest.mark.parametrize("device", ["mps", "xpu", "hpu"] + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"]))
def test_builders_name_a_device_they_cannot_use(device):
    # torch's own errors (RuntimeError "PyTorch is not linked with support for mps devices",
    # AssertionError "Torch not compiled with XPU enabled", RuntimeError "Cannot access
    # accelerator device") named neither the argument nor the device
    with pytest.raises(ValueError, match=rf"device (must be a cpu or cuda device|'{device}': this torch has no CUDA)"):
        build_spec_decode_metadata([1], [2], device=device)
    with pytest.raises(ValueError, match=rf"device (must be a cpu or cuda device|'{device}': this torch has no CUDA)"):
        SamplingMetadata.from_params([1.0], vocab_size=5, device=device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_builders_name_a_cuda_index_past_the_last_device():
    bad = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=rf"device '{bad}': this machine has \d+ CUDA device"):
        build_spec_decode_metadata([1], [2], device=bad)
    with pytest.raises(ValueError, match=rf"device '{bad}': this machine has \d+ CUDA device"):
        SamplingMetadata.from_params([1.0], vocab_size=5, device=bad)


def test_builders_still_take_cpu():
    assert build_spec_decode_metadata([1], [2], device="cpu").cu_num_draft_tokens.device.type == "cpu"
    assert SamplingMetadata.from_params([1.0], vocab_size=5, device=torch.device("cpu")).device.type == "cpu"
    assert specops.MAX_SPEC_LEN == 128


def test_rows_made_for_a_larger_vocabulary_are_normalised_or_refused():
    """from_rows trusted RowParams checked against another vocabulary: a top_k past this one
    (off, by the convention of from_params) and an allowed token past it (refused by name)
    failed later, inside torch, with an index error."""
    from specops.engine.sampling_params import SamplingParams
    from specops.sampling.metadata import RowParams
    big_k = RowParams.from_sampling_params(SamplingParams(temperature=1.0, top_k=50), 100)
    md = specops.SamplingMetadata.from_rows([big_k], vocab_size=20)
    assert md.top_k is None
    logits = torch.randn(1, 20)
    assert 0 <= int(specops.Sampler(backend="torch")(logits, md).sampled_token_ids[0]) < 20
    far = RowParams.from_sampling_params(SamplingParams(temperature=1.0, allowed_token_ids=[3, 60]), 100)
    with pytest.raises(ValueError, match=r"allowed_token_ids of row 1: token id 60 is outside the vocabulary"):
        specops.SamplingMetadata.from_rows([big_k, far], vocab_size=20)
