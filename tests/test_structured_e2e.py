"""The manager in a hand-written decode loop with the default model (SmolLM2-135M): output under a
schema parses and validates, greedy and sampled, with n-gram speculation, where greedy
speculation must give exactly the tokens of plain greedy. (The engine itself:
test_engine_structured_e2e.py.)"""

import json

import numpy as np
import pytest
import torch

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from specops.engine.structured_output import (StructuredOutputManager, StructuredOutputOptions,  # noqa: E402
                                              apply_batch_bitmask)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "London", "Tokyo", "Lima"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "city", "tags"],
}
PROMPT = ('Write JSON like {"name": "Ann", "age": 31, "city": "Paris", "tags": ["cat", "tea"]} '
          "for Bob, who is 40, lives in London and likes dogs.")


@pytest.fixture(scope="module")
def loaded():
    from specops.engine.model import load_model

    try:
        return load_model(dtype=torch.float32)  # fp32: greedy speculation must match exactly
    except FileNotFoundError as e:
        pytest.skip(str(e))


BLOCK = 16


@torch.inference_mode()
def _forward(model, caches, tokens, computed):
    """Logits of ``tokens`` placed at positions computed.. of one sequence (paged KV cache)."""
    from specops.engine.model import AttnMetadata

    table = list(range(caches[0].shape[1]))
    attn = AttnMetadata.build(caches, [computed], [len(tokens)], [table], BLOCK)
    dev = caches[0].device
    hidden = model.forward(torch.tensor(tokens, dtype=torch.int64, device=dev),
                           torch.arange(computed, computed + len(tokens), device=dev), attn)
    return model.compute_logits(hidden).float().cpu()


def _decode(model, so, rid, ctx, max_tokens, k, rng=None):
    """Decode under the grammar; k > 0 adds n-gram drafts verified in one forward (greedy
    acceptance, or rejection sampling with one-hot draft probabilities when rng is given)."""
    from specops.engine.spec_decode.ngram import ngram_propose

    ctx = list(ctx)
    caches = model.make_kv_caches(-(-(len(ctx) + max_tokens + k + 1) // BLOCK), BLOCK)
    computed = 0  # tokens of ctx whose K/V are in the cache
    out, forwards, accepted = [], 0, 0
    eos = so.backend.stop_token_ids
    while len(out) < max_tokens:
        drafts = []
        if k:
            d, n = ngram_propose(np.array([ctx]), np.array([len(ctx)]), k)
            drafts = so.validate_drafts(rid, d[0, : n[0]].tolist())[: max_tokens - len(out) - 1]
        logits = _forward(model, caches, ctx[computed:] + drafts, computed)[-(len(drafts) + 1):]
        forwards += 1
        apply_batch_bitmask(logits, so.build_bitmask([(rid, 1 + len(drafts), drafts)]))
        emitted = []
        for j in range(len(drafts) + 1):
            probs = torch.softmax(logits[j].double(), -1)
            if rng is None:
                t = int(torch.argmax(logits[j]))
                ok = j < len(drafts) and t == drafts[j]
            else:
                ok = j < len(drafts) and rng.random() < float(probs[drafts[j]])
                if not ok:
                    if j < len(drafts):
                        probs[drafts[j]] = 0
                    t = int(rng.choice(len(probs), p=(probs / probs.sum()).numpy()))
            if ok:
                emitted.append(drafts[j])
                accepted += 1
                continue
            emitted.append(t)
            break
        computed = len(ctx) + len(emitted) - 1  # the accepted drafts' K/V are valid, the last token's not yet
        stop = next((i for i, t in enumerate(emitted) if t in eos), None)
        if stop is not None:
            emitted = emitted[: stop + 1]
        assert so.accept_tokens(rid, emitted), emitted
        out += emitted
        ctx += emitted
        if so.is_terminated(rid):
            return out[:-1], forwards, accepted
    return out, forwards, accepted


def test_ngram_speculation_under_schema(loaded):
    tok = loaded.tokenizer
    so = StructuredOutputManager(tok, loaded.config.vocab_size, max_rows=8)
    ctx = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special_tokens=False)
    runs = {}
    for name, k, rng in (("plain", 0, None), ("spec", 4, None), ("spec_sampled", 4, np.random.default_rng(0))):
        so.add_request(name, StructuredOutputOptions(json_schema=SCHEMA))
        assert so.wait(name, 60).value == "ready"
        runs[name] = _decode(loaded.model, so, name, ctx, 60, k, rng)
        so.remove_request(name)
    print({n: (tok.decode(o), f, a) for n, (o, f, a) in runs.items()})
    for name, (out, _, _) in runs.items():
        jsonschema.validate(json.loads(tok.decode(out)), SCHEMA)
    assert runs["spec"][0] == runs["plain"][0]  # greedy: speculation changes nothing but the step count
    assert runs["spec"][2] > 0 and runs["spec"][1] < runs["plain"][1]
    so.shutdown()
