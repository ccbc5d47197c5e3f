"""The target's hidden states for EAGLE/MTP-style proposers: the runner keeps, per step, the final-normed
hidden state of every token whose KV the step committed (rejected drafts left out), and only for a
proposer that asks; the EAGLE-style example proposer drafts from them, and greedy decoding with it
equals plain greedy decoding."""

import random
from types import SimpleNamespace

import pytest
import torch
from test_engine_spec_greedy import GREEDY, SCHEDULES, copy_prompts, model, run, untied  # noqa: F401

from specops.engine.model.reference import reference_forward
from specops.engine.spec_decode import DraftBatch, EagleHead, EagleProposer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def reference_hidden(lm, token_ids: list[int]) -> torch.Tensor:  # [len, hidden] fp32
    """Final-normed hidden states of every position by the plain full-sequence forward (no cache, no
    paging): ``reference_forward`` with an identity LM head returns them instead of logits."""
    m = lm.model
    eye = torch.eye(m.config.hidden_size, dtype=m.dtype, device=m.device)
    shell = SimpleNamespace(config=m.config, device=m.device, embed_tokens=m.embed_tokens, layers=m.layers,
                            norm=m.norm, lm_head=SimpleNamespace(weight=eye))
    return reference_forward(shell, token_ids)


def copy_head(hidden_size: int) -> EagleHead:
    """A head that keeps the feature: its drafts repeat the token just sampled (some right, most not)."""
    head = EagleHead(hidden_size, seed=None)
    head.weight[:, :hidden_size] = torch.eye(hidden_size)
    return head


class OracleEagle(EagleProposer):
    """The EAGLE-style proposer, recording the feature it drafts from; its drafts are then replaced by
    plain greedy decoding's next tokens, the ones from a random m on made wrong, so steps accept and reject."""

    def __init__(self, target, plain: dict[tuple, list[int]], seed: int):
        super().__init__(target)
        self.plain = plain  # prompt -> plain greedy output
        self.rng = random.Random(seed)
        self.used = []  # (request id, engine step, number of tokens, feature [hidden]) per request per call

    def propose(self, requests, num_spec_tokens, context=None):
        batch = super().propose(requests, num_spec_tokens, context)
        drafts = []
        for req, k in zip(requests, batch.token_ids):
            self.used.append((req.request_id, context.step, len(req.all_token_ids),
                              self.features[req.request_id].clone()))
            nxt = self.plain[tuple(req.prompt_token_ids)][req.num_output_tokens:][:len(k)]
            m = self.rng.randrange(len(nxt) + 1)
            drafts.append(nxt[:m] + [(t + 1) % 384 for t in nxt[m:]])
        return DraftBatch(batch.request_ids, drafts)


def test_proposer_gets_the_right_hidden_states(untied):
    """Against the full-sequence reference, for 4 requests with chunked prefill, budget-skipped decodes and
    mixed accepts/rejects: every position's committed row comes exactly once, with the reference value,
    and the proposer drafts from the hidden state of each request's last computed token."""
    lm = model(untied)
    long, *short = copy_prompts(4, seed=7)
    prompts = [p[:3] for p in short] + [long]  # three decode early, the long one is prefilled in chunks
    cfg = dict(max_num_batched_tokens=10, max_num_seqs=4, num_spec_tokens=4)  # the third decode waits at times
    plain, _ = run(lm, prompts, GREEDY, **cfg)
    proposer = OracleEagle(lm.model, {tuple(p): o.token_ids for p, o in zip(prompts, plain)}, seed=1)
    steps = []

    def record(eng):  # steps[s - 1]: request id -> (first position, committed rows) of engine step s
        h = eng.runner.last_hidden
        steps.append({rid: (pos, rows.clone()) for rid in h.request_ids for pos, rows in [h.rows(rid)]})
        assert len(steps) == eng.num_steps

    outs, eng = run(lm, prompts, GREEDY, proposer=proposer, on_step=record, **cfg)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    st = eng.stats()["spec_decoding"]
    assert 0 < st["num_accepted_tokens"] < st["num_draft_tokens"], st

    prefill_chunks = 0
    for out in outs:
        rid, tokens = out.request_id, out.prompt_token_ids + out.token_ids
        ref = reference_hidden(lm, tokens)
        n = len(tokens) - 1  # positions whose KV was computed (the last token's never is)
        seen = []
        for step in steps:
            if rid in step:
                prefill_chunks += step[rid][0] < len(out.prompt_token_ids)
                pos, rows = step[rid]
                rows = rows[:max(n - pos, 0)]  # accepted drafts past max_tokens are cut from the output
                torch.testing.assert_close(rows, ref[pos:pos + len(rows)], atol=1e-4, rtol=1e-4)
                seen += range(pos, pos + len(step[rid][1]))
        assert seen == list(range(len(seen))) and len(seen) >= n, rid  # each position once, no rejected rows
        used = [(num, f) for r, _, num, f in proposer.used if r == rid]
        assert len(used) > 5
        for num, f in used:
            torch.testing.assert_close(f, ref[num - 2], atol=1e-4, rtol=1e-4)
    assert prefill_chunks > len(outs)  # some prompt took several steps
    # requests skipped by the token budget in the step before drafted from the feature they kept
    assert any(rid not in steps[s - 1] for rid, s, *_ in proposer.used)


@pytest.mark.parametrize("head", ["random", "copy"])
def test_eagle_greedy_equals_plain(untied, head):
    lm = model(untied)
    hidden = lm.model.config.hidden_size
    accepted = drafted = 0
    for batch, cfg in SCHEDULES.items():  # batch 1; 3 with chunked prefill; 8 with preemption
        prompts = copy_prompts(batch, seed=batch)
        plain, _ = run(lm, prompts, GREEDY, **cfg)
        proposer = EagleProposer(lm.model, copy_head(hidden) if head == "copy" else None, seed=batch)
        outs, eng = run(lm, prompts, GREEDY, proposer=proposer, num_spec_tokens=4, **cfg)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain], (head, batch)
        assert not proposer.features  # the engine freed every request
        st = eng.stats()["spec_decoding"]
        accepted += st["num_accepted_tokens"]
        drafted += st["num_draft_tokens"]
        if batch == 8:
            assert eng.scheduler.num_preemptions > 0
    assert drafted > 100
    if head == "copy":
        assert 20 < accepted < drafted


def test_hidden_states_kept_only_when_asked(untied):
    lm = model(untied)
    seen = []
    run(lm, copy_prompts(2, seed=3), GREEDY, spec_method="ngram", on_step=lambda e: seen.append(e.runner.last_hidden))
    assert seen and all(h is None for h in seen)
    with pytest.raises(ValueError, match="hidden states"):
        EagleProposer(lm.model).propose([SimpleNamespace(request_id="a", all_token_ids=[1, 2])], 2)


def test_head_load(untied, tmp_path):
    from safetensors.torch import save_file

    lm = model(untied)
    h = lm.model.config.hidden_size
    w, b = torch.randn(h, 2 * h), torch.randn(h)
    save_file({"fc.weight": w, "fc.bias": b}, tmp_path / "head.safetensors")
    p = EagleProposer.from_path(lm.model, str(tmp_path / "head.safetensors"))
    assert torch.equal(p.head.weight, w) and torch.equal(p.head.bias, b)
    save_file({"fc.weight": w[:, :h].contiguous()}, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="expected"):
        EagleProposer.from_path(lm.model, str(tmp_path / "bad.safetensors"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: the head and the runner's hidden states on the GPU")
def test_eagle_greedy_equals_plain_cuda(untied):
    """fp32 on CUDA with the copy head: equal tokens, or a first difference at a near-tie."""
    lm = model(untied, device="cuda")
    saved, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        for batch in (3, 8):
            prompts = copy_prompts(batch, seed=batch)
            plain, _ = run(lm, prompts, GREEDY, **SCHEDULES[batch])
            proposer = EagleProposer(lm.model, copy_head(lm.model.config.hidden_size).cuda())
            outs, eng = run(lm, prompts, GREEDY, proposer=proposer, num_spec_tokens=4, **SCHEDULES[batch])
            assert eng.stats()["spec_decoding"]["num_draft_tokens"] > 0
            for p, a, b in zip(prompts, outs, plain):
                if a.token_ids != b.token_ids:
                    i = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
                    top = reference_forward(lm.model, p + b.token_ids[:i])[-1].topk(2).values
                    assert float(top[0] - top[1]) < 1e-3, (batch, i, float(top[0] - top[1]))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
