"""Malformed inputs are refused where they are given, with errors that name them.

- bad_words_token_ids / output_token_ids: checked when the metadata is built (from_params,
  from_rows, expand), not left to crash in the Sampler after it wrote the caller's logits.
- compute_logprobs: int logits and a bool num_logprobs.
- BatchUpdate: indices, directions and parameters checked before any processor changes.
- Sampler: stream and kernel_options checked when built; metadata and logitsprocs types.
"""

from types import SimpleNamespace

import pytest
import torch

from specops.sampling import (BatchUpdate, MoveDirectionality, Sampler, SamplingMetadata, build_logits_processors)
from specops.sampling.logits_processors import (LogitBiasLogitsProcessor, MinPLogitsProcessor, MinTokensLogitsProcessor,
                                                check_batch_update)
from specops.sampling.logprobs import compute_logprobs, compute_processed_logprobs
from specops.sampling.metadata import RowParams

V = 6


def P(**kw):
    """Request parameters as the processors read them (SamplingParams attributes)."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, min_tokens=0, logit_bias=None,
                stop_token_ids=None, ignore_eos=False)
    return SimpleNamespace(**(base | kw))


# ---- bad words and their history --------------------------------------------------------------

@pytest.mark.parametrize("bad,history,exc,words", [
    ({0: [[3, 4]]}, [None], TypeError, r"output_token_ids\[0\] must be a list of token ids"),
    ({0: [5]}, [[]], TypeError, r"bad_words_token_ids\[0\]\[0\] must be a list of token ids, got int"),
    ([[5]], [[]], TypeError, r"bad_words_token_ids must be a dict"),
    ({0: 5}, [[]], TypeError, r"bad_words_token_ids\[0\] must be a list of token id lists, got int"),
    ({0: [[5], []]}, [[]], ValueError, r"bad_words_token_ids\[0\]\[1\] must not be empty"),
    ({0: [[5], [1, V]]}, [[]], ValueError, rf"bad_words_token_ids\[0\]\[1\]\[1\] must be <= {V - 1}, got {V}"),
    ({0: [[1, "a"]]}, [[]], TypeError, r"bad_words_token_ids\[0\]\[0\]\[1\] must be an int"),
    ({1: [[5]]}, [[]], ValueError, r"bad_words_token_ids row must be <= 0, got 1"),
    ({0: [[1, 2, 5]]}, [[1, "x", 2]], TypeError, r"output_token_ids\[0\]\[1\] must be an int, got str"),
    ({0: [[5]]}, 7, TypeError, r"output_token_ids must be a list with one list of token ids per row, got int"),
    ({0: [[5]]}, [[], []], ValueError, r"output_token_ids must have one list per row \(1\), got 2"),
])
def test_malformed_bad_words_are_refused_when_built(bad, history, exc, words):
    # they crashed in the Sampler (TypeError: object of type 'NoneType' has no len(), int has no
    # len, AttributeError on a list), after it had written the allowed-token mask into the logits
    with pytest.raises(exc, match=words):
        SamplingMetadata.from_params([1.0], vocab_size=V, seeds=[1], allowed_token_ids=[[1, 2]],
                                     bad_words_token_ids=bad, output_token_ids=history)
    with pytest.raises(exc, match=words):
        SamplingMetadata.from_rows([RowParams(temperature=1.0)], vocab_size=V, bad_words_token_ids=bad,
                                   output_token_ids=history)


def test_only_the_history_bad_words_read_is_checked():
    # of a row with bad words, the last len(word) - 1 ids; other rows' histories are not read
    md = SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, bad_words_token_ids={0: [[1, 2, 5]]},
                                      output_token_ids=[["not read", 1, 2], None])
    logits = torch.zeros(2, V)
    Sampler(backend="torch")(logits, md)
    assert logits[0, 5] == -torch.inf and bool((logits[0, :5] == 0).all()) and bool((logits[1] == 0).all())


def test_expand_checks_the_history_of_its_rows():
    md = SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, bad_words_token_ids={1: [[4, 5]]},
                                      output_token_ids=[[1], [2]])
    with pytest.raises(TypeError, match=r"output_token_ids\[2\] must be a list of token ids"):
        md.expand([0, 0, 1], output_token_ids=[[1], [1], 4])
    with pytest.raises(TypeError, match=r"output_token_ids\[1\]\[0\] must be an int"):
        md.expand([0, 1], output_token_ids=[[1], [2.0]])
    assert md.expand([0, 1], output_token_ids=[None, [4]]).bad_words_token_ids == {1: [[4, 5]]}


def test_a_malformed_history_is_refused_before_the_sampler_writes_the_logits():
    # the metadata refuses it when built, so no Sampler ever sees it (before, the Sampler wrote
    # the allowed-token mask into the caller's logits, then failed on the history)
    good = dict(vocab_size=V, seeds=[1], allowed_token_ids=[[1, 2]], bad_words_token_ids={0: [[3, 4]]})
    with pytest.raises(TypeError, match=r"output_token_ids\[0\] must be a list of token ids"):
        SamplingMetadata.from_params([1.0], output_token_ids=[None], **good)
    logits = torch.arange(float(V))[None]
    Sampler(backend="torch")(logits, SamplingMetadata.from_params([1.0], output_token_ids=[[3]], **good))
    assert logits[0, 4] == -torch.inf and logits[0, 3] == -torch.inf and logits[0, 1] == 1.0


# ---- compute_logprobs -------------------------------------------------------------------------

def test_logprobs_refuse_integer_logits_and_a_bool_count():
    x, tok = torch.randn(2, 8), torch.tensor([1, 2])
    for dtype in (torch.int64, torch.float64):
        with pytest.raises(TypeError, match=f"raw_logits must be fp32, bf16 or fp16, got {dtype}"):
            compute_logprobs("raw_logprobs", 1, tok, raw_logits=x.to(dtype), backend="torch")
    with pytest.raises(ValueError, match=r"num_logprobs must be an int in \[0, 8\], got True"):
        compute_logprobs("raw_logprobs", True, tok, raw_logits=x, backend="torch")
    md = SamplingMetadata.from_params([1.0, 1.0], vocab_size=8, seeds=[1, 2], max_num_logprobs=1)
    out = Sampler(logprobs_mode="processed_logprobs", backend="torch")(x.clone(), md)
    inv_t, res = torch.ones(2), out.result
    with pytest.raises(TypeError, match="processed_logits must be fp32, bf16 or fp16, got torch.int64"):
        compute_logprobs("processed_logprobs", 1, tok, processed_logits=x.long(), inv_temperature=inv_t, result=res)
    for backend in ("torch", "triton"):
        with pytest.raises(TypeError, match="processed_logits must be fp32, bf16 or fp16, got torch.int64"):
            compute_processed_logprobs("processed_logprobs", 1, tok, x.long(), inv_t, res, backend=backend)
        with pytest.raises(ValueError, match=r"num_logprobs must be an int in \[0, 8\], got False"):
            compute_processed_logprobs("processed_logprobs", False, tok, x, inv_t, res, backend=backend)


def test_arguments_the_public_helpers_used_to_pass_on_unchecked():
    # each failed later, deep inside torch or a kernel, with an error that named nothing
    from specops import parse_output, rng, sample
    from specops.triton_kernels.expand import expand_to_draft_rows
    tok = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"raw_logits must have at least one column .* got shape \(2, 0\)"):
        compute_logprobs("raw_logprobs", 0, tok, raw_logits=torch.zeros(2, 0), backend="torch")
    with pytest.raises(TypeError, match=r"allowed_token_ids\[1\] must be a list of token ids \(or None\), got int"):
        SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, allowed_token_ids=[[1], 5])
    with pytest.raises(ValueError, match="max_num_reqs must be >= 0, got -1"):
        build_logits_processors(-1, V, use_entry_points=False)
    with pytest.raises(ValueError, match="device must be a torch.device or a device string"):
        build_logits_processors(2, V, device="gpu0", use_entry_points=False)
    cu = torch.tensor([2, 5])
    with pytest.raises(TypeError, match="num_tokens must be an int, got Tensor"):
        expand_to_draft_rows(torch.tensor([1, 2]), cu, torch.tensor(5), 3)
    with pytest.raises(TypeError, match="max_spec_len must be an int, got NoneType"):
        expand_to_draft_rows(torch.tensor([1, 2]), cu, 5, None)
    with pytest.raises(TypeError, match=r"values must be a torch.Tensor \[num_reqs\], got list"):
        expand_to_draft_rows([1, 2], cu, 5, 3)
    with pytest.raises(ValueError, match="kind must be 'exponential' or 'uniform', got 'exp'"):
        rng.vocab_noise(torch.tensor([1]), torch.tensor([0]), 0, 6, kind="exp")
    meta = lambda t: t.to("meta")  # noqa: E731
    with pytest.raises(ValueError, match="logits is on the meta device"):
        sample(meta(torch.zeros(2, V)), meta(torch.ones(2)), seeds=meta(tok), positions=meta(tok), backend="torch")
    with pytest.raises(ValueError, match="output_token_ids is on the meta device"):
        parse_output(torch.zeros(1, 2, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="step is on the meta device"):
        SamplingMetadata.from_params([1.0], vocab_size=V, step=torch.tensor(3, device="meta"))
    with pytest.raises(ValueError, match="device must be a device that holds data .* got 'meta'"):
        SamplingMetadata.from_params([1.0], vocab_size=V, device="meta")


# ---- BatchUpdate ------------------------------------------------------------------------------

def states(procs):
    return (procs.get(MinPLogitsProcessor).min_p.tolist(), dict(procs.get(LogitBiasLogitsProcessor).state),
            dict(procs.get(MinTokensLogitsProcessor).state))


@pytest.mark.parametrize("update,exc,words", [
    (BatchUpdate(1, added=[(-1, P(min_p=0.5), [], [])]), ValueError,
     r"BatchUpdate.added\[0\] index must be in \[0, 4\) \(max_num_reqs\), got -1"),    # set row 3
    (BatchUpdate(1, added=[(7, P(min_p=0.5), [], [])]), ValueError, r"BatchUpdate.added\[0\] index must be in"),
    (BatchUpdate(1, added=[(0, P(logit_bias={1: 1.0}), [], []), (1, P(min_p=1.5), [], [])]), ValueError,
     r"BatchUpdate.added\[1\] min_p must be in \[0, 1\], got 1.5"),          # logit_bias was updated
    (BatchUpdate(1, moved=[(0, 1, "swap")]), TypeError,
     r"BatchUpdate.moved\[0\] direction must be MoveDirectionality"),        # taken as one-way
    (BatchUpdate(1, added=[(0, P(min_tokens="x"), [], [])]), ValueError,
     r"BatchUpdate.added\[0\] min_tokens must be an int >= 0, got 'x'"),     # int(): invalid literal
    (BatchUpdate(1, added=[(0, P(min_p=0.1, logit_bias={"x": 1.0}), [], [])]), ValueError,
     r"BatchUpdate.added\[0\] logit_bias token id must be an int"),
    (BatchUpdate(1, added=[(0, P(logit_bias={"1_0": 1.0}), [], [])]), ValueError,
     r"logit_bias token id must be an int \(or its decimal string\), got '1_0'"),   # int() reads 10
    (BatchUpdate(1, added=[(0, P(logit_bias={" 7 ": 1.0}), [], [])]), ValueError,
     r"logit_bias token id must be an int \(or its decimal string\), got ' 7 '"),
    (BatchUpdate(1, added=[(0, P(min_tokens=2, stop_token_ids=["a"]), [], [])]), TypeError,
     r"BatchUpdate.added\[0\] stop_token_ids must hold token ids"),
    (BatchUpdate(1, removed=[4]), ValueError, r"BatchUpdate.removed\[0\] must be in \[0, 4\)"),
    (BatchUpdate(1, moved=[(0, 4, MoveDirectionality.SWAP)]), ValueError, r"BatchUpdate.moved\[0\] dst"),
    (BatchUpdate(5), ValueError, r"BatchUpdate.batch_size must be in \[0, 4\], got 5"),
    (BatchUpdate(1, added=[(0, P())]), TypeError, r"BatchUpdate.added\[0\] must be \(index, params"),
])
def test_a_refused_batch_update_changes_no_processor(update, exc, words):
    procs = build_logits_processors(4, V, use_entry_points=False, eos_token_ids=[0])
    procs.update_state(BatchUpdate(2, added=[(0, P(min_p=0.2, logit_bias={2: 1.0}), [], []),
                                             (1, P(min_p=0.3, min_tokens=2), [], [])]))
    before = states(procs)
    with pytest.raises(exc, match=words):
        procs.update_state(update)
    assert states(procs) == before


def test_each_built_in_checks_an_update_before_it_changes():
    minp, bias = MinPLogitsProcessor(4, V), LogitBiasLogitsProcessor(4, V)
    for proc in (minp, bias):
        proc.update_state(BatchUpdate(1, added=[(0, P(min_p=0.2, logit_bias={2: 1.0}), [], [])]))
        with pytest.raises(ValueError, match=r"BatchUpdate.added\[0\] index must be in \[0, 4\)"):
            proc.update_state(BatchUpdate(1, removed=[0], added=[(-1, P(min_p=0.5, logit_bias={3: 1.0}), [], [])]))
    # a bad parameter after a good one: the good one is not taken either
    with pytest.raises(ValueError, match=r"BatchUpdate.added\[1\] min_p must be in \[0, 1\], got nan"):
        minp.update_state(BatchUpdate(2, removed=[0], added=[(1, P(min_p=0.5), [], []),
                                                             (2, P(min_p=float("nan")), [], [])]))
    with pytest.raises(ValueError, match=r"BatchUpdate.added\[1\] logit_bias values must be finite"):
        bias.update_state(BatchUpdate(2, removed=[0], added=[(1, P(logit_bias={1: 1.0}), [], []),
                                                             (2, P(logit_bias={1: float("inf")}), [], [])]))
    assert minp.min_p.tolist() == [pytest.approx(0.2), 0.0, 0.0, 0.0] and bias.state == {0: ([2], [1.0])}


def test_a_good_batch_update_still_follows_the_batch():
    procs = build_logits_processors(4, V, use_entry_points=False)
    procs.update_state(BatchUpdate(2, added=[(0, P(min_p=0.2, logit_bias={"2": 1.0, 2: 0.5}), [], []),
                                             (3, P(min_p=0.3), [], [])],
                                   moved=[(3, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    assert states(procs)[:2] == ([pytest.approx(0.2), pytest.approx(0.3), 0.0, 0.0], {0: ([2], [1.5])})


# ---- Sampler ----------------------------------------------------------------------------------

def test_sampler_checks_stream_and_kernel_options_when_built():
    for stream in (-1, 2**16, 1.0, True):
        with pytest.raises(ValueError, match=r"stream must be an int in \[0, 2\*\*16\)"):
            Sampler(stream=stream)
    for backend in ("torch", "auto", "triton"):
        for opts in ({"bogus": 1}, {"cpa": 64, "tile": 16}):
            with pytest.raises(ValueError, match=r"kernel_options has unknown keys \['(bogus|cpa)'\]"):
                Sampler(backend=backend, kernel_options=opts)
    with pytest.raises(TypeError, match="kernel_options must be a dict or None, got list"):
        Sampler(kernel_options=[("tile", 16)])
    from specops.sampling.sampler import kernel_option_names
    assert {"cap", "tile", "num_chunks", "blocks_per_program", "search", "pivot"} <= kernel_option_names()
    Sampler(backend="triton", kernel_options=dict(tile=16, cap=64, num_chunks=2, pivot=False))


def test_kernel_option_names_survive_a_wrapper_patched_over_the_launcher(monkeypatch):
    """The names come from the launcher's own signature, not from whatever is bound to its name
    when first asked: a recorder patched over it (*args, **kwargs) once made them [] for the
    rest of the process (a cached read), and every later kernel option was refused."""
    from specops.sampling.sampler import kernel_option_names
    from specops.triton_kernels import sampling_topk_topp as tk
    launch = tk.sample_top_k_top_p_triton
    monkeypatch.setattr(tk, "sample_top_k_top_p_triton", lambda *args, **kwargs: launch(*args, **kwargs))
    assert {"cap", "tile", "pivot", "search"} <= kernel_option_names()
    Sampler(backend="triton", kernel_options=dict(tile=16, cap=64))
    monkeypatch.undo()
    assert {"cap", "tile", "pivot", "search"} <= kernel_option_names()


def test_sampler_checks_kernel_option_values_and_backend_before_writing_the_logits(monkeypatch):
    """A kernel option's bad value is refused when the Sampler is built, and one that depends
    on the vocabulary (tile wider than the draw's sub-chunk) or a Triton backend on CPU
    without the interpreter at the call, before allowed_token_ids writes the caller's logits
    (both used to raise only after that write)."""
    for opts, words in (({"cap": 1000}, "cap must be a power of two >= 16, got 1000"),
                        ({"tile": 24}, "tile must be a power of two >= 4, got 24"),
                        ({"direct_in": "side"}, "direct_in must be")):
        with pytest.raises(ValueError, match=f"kernel_options: {words}"):
            Sampler(backend="triton", kernel_options=opts)
    for device in ["cuda"] if torch.cuda.is_available() else ["cpu"]:   # CPU: under the interpreter (conftest)
        md = SamplingMetadata.from_params([0.0, 1.0], vocab_size=V, seeds=[None, 1], device=device,
                                          allowed_token_ids=[[1, 2], None])
        logits = torch.randn(2, V, device=device)
        before = logits.clone()
        with pytest.raises(ValueError, match=r"kernel_options: tile must be at most the draw's sub-chunk"):
            Sampler(backend="triton", kernel_options={"tile": 2**20})(logits, md)
        assert torch.equal(logits, before)
    md = SamplingMetadata.from_params([0.0, 1.0], vocab_size=V, seeds=[None, 1], allowed_token_ids=[[1, 2], None])
    logits = torch.randn(2, V)
    before = logits.clone()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"backend='triton' on CPU needs TRITON_INTERPRET=1"):
        Sampler(backend="triton")(logits, md)
    assert torch.equal(logits, before)


def test_sample_refuses_unknown_kernel_options_on_every_backend():
    from specops.sampling import sample
    logits, inv_t = torch.randn(2, V), torch.tensor([1.0, 2.0])
    seeds, positions = torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64)
    for backend in ("torch", "auto"):   # the torch path ignores the knobs, so a typo must not pass there
        with pytest.raises(TypeError, match=r"sample\(\) got unknown keyword arguments \['capp'\]"):
            sample(logits, inv_t, seeds=seeds, positions=positions, backend=backend, capp=64)
    out = sample(logits, inv_t, seeds=seeds, positions=positions, backend="torch", cap=64)
    assert torch.equal(out.tokens, sample(logits, inv_t, seeds=seeds, positions=positions, backend="torch").tokens)


def test_sampler_and_metadata_check_their_argument_types():
    with pytest.raises(TypeError, match="metadata must be a SamplingMetadata"):
        Sampler(backend="torch")(torch.zeros(1, V), None)
    procs = build_logits_processors(1, V, use_entry_points=False)
    with pytest.raises(TypeError, match="logitsprocs must be a LogitsProcessors .* got list"):
        SamplingMetadata.from_params([1.0], vocab_size=V, logitsprocs=list(procs.all))
    with pytest.raises(TypeError, match="logitsprocs must be a LogitsProcessors"):
        SamplingMetadata.from_rows([RowParams(temperature=1.0)], vocab_size=V, logitsprocs=procs.all[0])
    assert SamplingMetadata.from_params([1.0], vocab_size=V, logitsprocs=procs).logitsprocs is procs


def test_logits_processors_built_for_another_vocabulary_are_refused():
    # a logit bias on token V + 2 of processors built for V + 4 tokens was added, by flat index,
    # to token 2 of the next row; now the metadata refuses them before anything is written
    from types import SimpleNamespace
    procs = build_logits_processors(2, V + 4, use_entry_points=False)
    procs.update_state(BatchUpdate(batch_size=2, added=[(0, SimpleNamespace(logit_bias={V + 2: 50.0}), [], []),
                                                         (1, SimpleNamespace(), [], [])]))
    with pytest.raises(ValueError, match=rf"logitsprocs: \w+ was built for vocab_size {V + 4}, the metadata's "
                                         rf"vocab_size is {V}"):
        SamplingMetadata.from_params([0.0, 0.0], vocab_size=V, logitsprocs=procs)


def test_logits_rows_are_checked_when_the_metadata_is_built():
    # a request index past the processors' max_num_reqs failed inside the Sampler, after the
    # logit bias of another row had been added to the caller's logits
    from specops.sampling import LogitsRows
    procs = build_logits_processors(4, V, use_entry_points=False)
    procs.update_state(BatchUpdate(batch_size=2, added=[(0, P(logit_bias={3: 100.0}), None, []),
                                                         (1, P(min_p=0.2), None, [])]))
    build = lambda rows: SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, logitsprocs=procs,  # noqa: E731
                                                      rows=rows)
    with pytest.raises(ValueError, match=r"rows.req_indices\[1\] must be <= 3, got 9"):
        build(LogitsRows([0, 9], [0, 0]))
    with pytest.raises(ValueError, match=r"rows.req_indices\[0\] must be >= 0, got -1"):
        build(LogitsRows([-1, 1], [0, 0]))
    with pytest.raises(TypeError, match=r"rows.num_output_tokens\[1\] must be an int, got float"):
        build(LogitsRows([0, 1], [0, 1.5]))
    with pytest.raises(ValueError, match=r"rows must describe 2 rows, got 1 in rows.num_output_tokens"):
        build(LogitsRows([0, 1], [0]))
    with pytest.raises(ValueError, match=r"must describe 2 rows, got 3 in rows.preceding_token_ids"):
        build(LogitsRows([0, 1], [0, 0], [[], [], []]))
    with pytest.raises(TypeError, match="rows must be a LogitsRows"):
        build([0, 1])
    md = build(LogitsRows([0, 1], [0, 0]))
    with pytest.raises(ValueError, match=r"rows.req_indices\[0\] must be <= 3, got 4"):
        md.expand([0], rows=LogitsRows([4], [0]))
    logits = torch.zeros(2, V)
    Sampler(backend="torch")(logits, md)
    assert logits[0, 3] == 100.0   # the bias reached its row


def test_logits_that_are_no_tensor_are_a_type_error_naming_the_type():
    # a nested list was a ValueError ("must be a 2-D tensor"); a 1-D tensor stays a ValueError with its shape
    md = SamplingMetadata.from_params([1.0], vocab_size=V)
    for bad in ([[0.0] * V], None):
        with pytest.raises(TypeError, match=f"logits must be a torch.Tensor .* got {type(bad).__name__}"):
            Sampler(backend="torch")(bad, md)
    with pytest.raises(TypeError, match="raw_logits must be a torch.Tensor .* got list"):
        compute_logprobs("raw_logprobs", 1, torch.zeros(1, dtype=torch.long), raw_logits=[[0.0] * V])
    with pytest.raises(ValueError, match=rf"logits must be 2-D \[rows, vocab\], got shape \({V},\)"):
        Sampler(backend="torch")(torch.zeros(V), md)


def test_batch_update_bounds_read_well_without_a_limit():
    # max_num_reqs None (a processor built without one): no upper bound, and the message says so
    check_batch_update(BatchUpdate(3, added=[(10**6, P(), [], [])]), None)
    with pytest.raises(ValueError, match=r"BatchUpdate.batch_size must be >= 0, got -1"):
        check_batch_update(BatchUpdate(-1), None)
    with pytest.raises(ValueError, match=r"BatchUpdate.removed\[0\] must be >= 0, got -2"):
        check_batch_update(BatchUpdate(1, removed=[-2]), None)


# ---- from a review of the op API (session 68) --------------------------------------------------

def test_penalty_state_with_a_strided_last_dimension_is_refused_when_built():
    # the triton path's penalty op refused it only after the allowed-token mask was written into
    # the caller's logits, and the torch path accepted it: now the builder refuses it on both
    good = dict(vocab_size=64, repetition_penalties=[1.2, 1.0], allowed_token_ids=[[0, 1], None])
    counts = torch.zeros(2, 64, dtype=torch.int32)
    strided = (torch.rand(64, 2) < 0.2).t()
    with pytest.raises(ValueError, match=r"prompt_mask must have a contiguous last dimension \(stride 1\), got strides \(1, 2\)"):
        SamplingMetadata.from_params([1.0, 1.0], prompt_mask=strided, output_counts=counts, **good)
    with pytest.raises(ValueError, match=r"output_counts must have a contiguous last dimension"):
        SamplingMetadata.from_params([1.0, 1.0], prompt_mask=strided.contiguous(),
                                     output_counts=torch.zeros(64, 2, dtype=torch.int32).t(), **good)
    md = SamplingMetadata.from_params([1.0, 1.0], prompt_mask=strided.contiguous(), output_counts=counts, **good)
    assert Sampler(backend="torch")(torch.zeros(2, 64), md).sampled_token_ids.shape == (2,)


def test_expand_checks_host_position_offsets_and_keeps_seeded_positions_below_2_32():
    md = SamplingMetadata.from_params([1.0, 1.0], vocab_size=8, seeds=[1, None], positions=[5, 7])
    with pytest.raises(ValueError, match=r"position_offsets\[0\] must be >= 0, got -10"):
        md.expand([0], position_offsets=[-10])
    with pytest.raises(TypeError, match=r"position_offsets\[0\] must be an int"):
        md.expand([0], position_offsets=[1.5])
    with pytest.raises(TypeError, match=r"position_offsets must be an int32/int64 tensor, got torch.float32"):
        md.expand([0], position_offsets=torch.tensor([1.5]))
    assert md.expand([0, 0], position_offsets=[0, 3]).positions.tolist() == [5, 8]
    # a trusted tensor offset pushing a seeded row to 2**32 + 1: modulo 2**32, so its key's high
    # word stays 0 and never equals an unseeded row's lane (it drew that row's noise before)
    far = md.expand([0, 1], position_offsets=torch.tensor([2**32 - 4, 0]))
    assert far.positions.tolist()[0] == 1 and far.positions.tolist()[1] >> 32 == 2


def test_an_empty_batch_still_checks_the_backend_name():
    from specops.sampling import sample
    empty = dict(seeds=torch.empty(0, dtype=torch.int64), positions=torch.empty(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="backend"):
        sample(torch.empty(0, 8), torch.empty(0), backend="bogus", **empty)
    assert sample(torch.empty(0, 8), torch.empty(0), backend="torch", **empty).tokens.shape == (0,)


def test_a_device_string_torch_cannot_parse_is_a_named_value_error():
    from specops.spec_decode import build_spec_decode_metadata
    for build in (lambda: SamplingMetadata.from_params([1.0], vocab_size=V, device="gpu"),
                  lambda: build_spec_decode_metadata([1], [2], device="gpu")):
        with pytest.raises(ValueError, match="device must be a torch.device or a device string .* got 'gpu'"):
            build()


def test_the_processor_helpers_are_public_beside_the_processor_interface():
    import specops
    assert specops.build_logits_processors is build_logits_processors
    procs = specops.build_logits_processors(2, V, use_entry_points=False)
    md = SamplingMetadata.from_params([1.0, 1.0], vocab_size=V, logitsprocs=procs, rows=specops.LogitsRows.identity(2))
    assert md.rows.req_indices == [0, 1]
    assert {"LogitsRows", "build_logits_processors", "LogitsProcessor", "BatchUpdate"} <= set(specops.__all__)
