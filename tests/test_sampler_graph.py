"""The steady sampling step replayed from a CUDA graph (pyengine/sampler_graph.py) samples exactly
what the eager sampler samples: tokens, logprobs and penalty counts, across batch changes, min_tokens
reaching its minimum, and a capture that fails."""

import random

import pytest
import torch
from model_fixtures import tiny_checkpoint  # noqa: F401  (fixture)

from specops.engine.config import EngineConfig
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.loader import load_model
from specops.engine.sampler_graph import STEADY_STEPS_BEFORE_CAPTURE, SteadyStepGraph
from specops.engine.sampling_params import SamplingParams

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def test_cpu_never_captures():
    g = SteadyStepGraph()
    x = torch.randn(3, 7)
    for _ in range(5):
        assert g.run("k", x, [[0, 1, 2], [3, 4, 5]], lambda a, b: a * 2) is None
    assert g.num_captures == 0 and g.num_replays == 0


@cuda_only
def test_replay_follows_inputs_and_keys():
    g = SteadyStepGraph()

    def body(x, keys):  # [N, V], [2, N]; leaves keys + 1, as the graph's contract asks
        out = x.float().sum(dim=1) + keys[1].float()
        keys.add_(1)
        return out

    ref = []
    for step in range(8):
        key = "a" if step < 5 else "b"  # a new key: eager again, then a new capture
        x = torch.randn(4, 33, device="cuda")
        keys = [[step] * 4, [10 * step + i for i in range(4)]]
        out = g.run(key, x, keys, body)
        if out is None:
            out = body(x, torch.tensor(keys, device="cuda"))
        want = x.sum(dim=1) + torch.tensor(keys[1], device="cuda").float()
        assert torch.allclose(out, want), step
        ref.append(out.clone())
    assert g.num_captures == 2
    assert g.num_replays == 8 - 2 * STEADY_STEPS_BEFORE_CAPTURE


@cuda_only
def test_keys_grow_inside_the_graph_and_logits_can_be_computed_in_place():
    """The body adds one to the graph's keys: keys that the caller says grew by one since the last
    step are neither built nor copied again, any other keys are; logits written into `input_buffer`
    need no copy."""
    g = SteadyStepGraph()

    def body(x, keys):  # [N, V], [2, N]; leaves keys + 1
        out = x.sum(dim=1) + keys[0].float() * 1000 + keys[1].float()
        keys.add_(1)
        return out

    uploads = []
    copy = torch.Tensor.copy_

    def counting_copy(dst, src, *args, **kwargs):
        if src.device.type == "cpu" and dst.is_cuda:
            uploads.append(src.shape)
        return copy(dst, src, *args, **kwargs)

    torch.Tensor.copy_ = counting_copy
    try:
        pos = 100
        for step in range(10):
            pos += 5 if step == 7 else 1  # one jump: its keys must be copied
            keys = [[pos] * 4, [pos - 90 + i for i in range(4)]]
            buf = g.input_buffer((4, 33), torch.float32)
            x = torch.randn(4, 33, device="cuda")
            if buf is not None:
                buf.copy_(x)  # as the model runner's compute_logits(out=...)
            uploads.clear()
            built = []

            def make_keys(keys=keys):
                built.append(1)
                return keys

            advanced = 0 < step != 7
            out = g.run("a", x if buf is None else buf, make_keys, body, advanced=advanced)
            if out is None:
                out = body(x, torch.tensor(keys, device="cuda"))
            want = x.sum(dim=1) + torch.tensor(keys[0], device="cuda").float() * 1000 \
                + torch.tensor(keys[1], device="cuda").float()
            assert torch.allclose(out, want), step
            replayed_in_place = buf is not None
            if replayed_in_place:
                assert uploads == ([(2, 4)] if step == 7 else []), (step, uploads)
                assert len(built) == (not advanced), (step, built)
        assert g.num_captures == 1
        assert g.input_buffer((5, 33), torch.float32) is None
        assert g.input_buffer((4, 33), torch.float16) is None
    finally:
        torch.Tensor.copy_ = copy


@cuda_only
def test_failed_capture_falls_back_to_eager():
    g = SteadyStepGraph()

    def body(x, keys):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("cannot be captured")
        return x * 2

    x = torch.randn(2, 5, device="cuda")
    for _ in range(STEADY_STEPS_BEFORE_CAPTURE):
        assert g.run("k", x, [[0, 0], [0, 0]], body) is None
    with pytest.warns(RuntimeWarning, match="capturing the steady sampling step failed"):
        assert g.run("k", x, [[0, 0], [0, 0]], body) is None
    assert not g.enabled and g.num_captures == 0
    # the stream still works: no capture is left open, and work queued on it runs to completion
    assert not torch.cuda.is_current_stream_capturing()
    y = x * 2
    torch.cuda.current_stream().synchronize()   # raises if the failed capture broke the stream
    assert torch.equal(y.cpu(), x.cpu() * 2)
    assert g.run("k", x, [[0, 0], [0, 0]], body) is None   # graphs stay off: the caller runs the body


ALL = dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.1, frequency_penalty=0.2,
           presence_penalty=0.1, logit_bias={5: 1.0, 7: -1.0}, logprobs=2, ignore_eos=True)


def run_engine(lm, graphs: bool, **config):
    """Six requests with every parameter on, finishing at different steps (the batch changes), and
    min_tokens that stop banning mid-way; every step's tokens and logprobs."""
    eng = LLMEngine(EngineConfig(max_model_len=128, max_num_seqs=8, sampler_cuda_graphs=graphs, **config), loaded=lm)
    rng = random.Random(0)
    for i in range(6):
        sp = SamplingParams(**ALL, seed=100 + i if i % 2 else None, min_tokens=3 * i, max_tokens=12 + 3 * i)
        eng.add_request([rng.randrange(10, 300) for _ in range(5 + i)], sp)
    steps = []
    while eng.has_unfinished_requests():
        outs = eng.step()
        steps.append(sorted((o.request_id, tuple(c.token_ids),
                             tuple((lp.token_id, round(lp.logprob, 4), lp.rank, tuple(lp.top))
                                   for lp in (c.logprobs or [])))
                            for o in outs for c in o.outputs))
    return steps, eng


def assert_graphs_give_eager_steps(run, tiny_checkpoint):
    """run(lm, graphs) -> (steps, engine): with graphs on, the same steps, replayed from graphs."""
    lm = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32)
    eager, e_eager = run(lm, graphs=False)
    graphed, e_graph = run(lm, graphs=True)
    g_eager, g = e_eager.runner.sampler.graph, e_graph.runner.sampler.graph
    assert g_eager.num_replays == 0
    assert g.num_captures >= 2 and g.num_replays >= 10, (g.num_captures, g.num_replays)
    assert graphed == eager


@cuda_only
def test_engine_with_graphs_samples_what_eager_samples(tiny_checkpoint):  # noqa: F811
    assert_graphs_give_eager_steps(run_engine, tiny_checkpoint)


def run_greedy_engine(lm, graphs: bool):
    """Plain-greedy requests (no processing, no logprobs) finishing at different steps, after
    one request with penalties (so the penalty counts exist and must follow); every step's tokens."""
    eng = LLMEngine(EngineConfig(max_model_len=128, max_num_seqs=8, sampler_cuda_graphs=graphs), loaded=lm)
    rng = random.Random(1)
    eng.add_request([rng.randrange(10, 300) for _ in range(6)],
                    SamplingParams(temperature=0.0, repetition_penalty=1.2, max_tokens=3, ignore_eos=True))
    for i in range(5):
        eng.add_request([rng.randrange(10, 300) for _ in range(4 + i)],
                        SamplingParams(temperature=0.0, max_tokens=10 + 4 * i, ignore_eos=True))
    steps = []
    while eng.has_unfinished_requests():
        steps.append(sorted((o.request_id, tuple(c.token_ids)) for o in eng.step() for c in o.outputs))
    return steps, eng


@cuda_only
def test_plain_greedy_steps_replayed_from_a_graph(tiny_checkpoint):  # noqa: F811
    assert_graphs_give_eager_steps(run_greedy_engine, tiny_checkpoint)


@cuda_only
def test_spec_decoding_steps_between_graph_replays(tiny_checkpoint):  # noqa: F811
    """Verification steps give the processors other rows (one per draft), which rebuilds their
    cached tensors: the graph must be dropped, never replayed on freed memory."""
    lm = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32)
    # 5-grams: the first steps find no match, so their steady steps capture and replay a graph
    # before the first verification step (on CPU: five steady steps before the first drafts)
    spec = dict(spec_method="ngram", num_spec_tokens=3, ngram_min_n=5, ngram_max_n=5)
    eager, _ = run_engine(lm, graphs=False, **spec)
    graphed, eng = run_engine(lm, graphs=True, **spec)
    # the run mixes both kinds of step: drafts were verified, and plain steps replayed a graph
    assert eng.stats()["spec_decoding"]["num_draft_tokens"] > 0
    g = eng.runner.sampler.graph
    assert g.num_captures >= 1 and g.num_replays >= 1, (g.num_captures, g.num_replays)
    assert graphed == eager
