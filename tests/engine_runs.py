"""Helpers shared by the engine and scheduler tests.

- `fake_next` / `expected`: a deterministic stand-in model (the next token is a hash of the
  whole context, EOS now and then) and the tokens it generates, for scheduler tests that run
  without any model;
- `run_all`: add requests to an LLMEngine, step it to the end and check that every request
  finished exactly once and that the KV pool is whole again.
"""

VOCAB = 50
EOS = 0


def fake_next(ctx: list[int]) -> int:
    """Deterministic 'model': the next token from the whole context (EOS now and then)."""
    h = len(ctx)
    for t in ctx:
        h = (h * 1000003 + t) % (2**61 - 1)
    return h % VOCAB


def expected(prompt: list[int], max_tokens: int, max_model_len: int) -> list[int]:
    """The tokens `fake_next` generates after `prompt` until EOS, max_tokens or max_model_len."""
    toks, out = list(prompt), []
    while True:
        t = fake_next(toks)
        toks.append(t)
        out.append(t)
        if t == EOS or len(out) >= max_tokens or len(toks) >= max_model_len:
            return out


def run_all(eng, prompts, params, on_step=None) -> list:
    """Add every prompt with its SamplingParams, step to the end (``on_step(eng)`` after every
    step); return the RequestOutputs in prompt order, and check the scheduler's invariants after
    every step, that each request finished once and that the KV pool is whole again."""
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                assert out.request_id not in done, "finished twice"
                done[out.request_id] = out
        eng.scheduler.check()
        if on_step is not None:
            on_step(eng)
    assert set(done) == set(ids), "a request was lost"
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return [done[i] for i in ids]
