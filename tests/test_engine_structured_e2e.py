"""Structured output through the engine with the default model (SmolLM2-135M, fp32 on CPU).

Every output under a schema parses and validates (several schemas; greedy and sampled; with
and without n-gram speculation, greedy speculation giving exactly the tokens of plain greedy);
regex and choice outputs match; a grammar that compiles slowly or fails does not delay the
other requests' first tokens and fails alone; bad specifications fail alone; the reasoning
gate leaves the text before its marker unconstrained, also when the marker arrives in a draft
window; the CLI options end to end.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from specops.engine.sampling_params import SamplingParams  # noqa: E402
from specops.engine.structured_output import StructuredOutputOptions as Opts  # noqa: E402

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 10},
            "address": {"type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 12},
                                       "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"]},
        },
        "required": ["name", "address"],
    },
    "array": {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3,
                                 "items": {"type": "object",
                                           "properties": {"fruit": {"enum": ["apple", "pear", "plum"]},
                                                          "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                                           "required": ["fruit", "qty"]}}},
        "required": ["items"],
    },
    "bounds": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "score": {"type": "number", "minimum": 0, "maximum": 10},
                       "delta": {"type": "integer", "minimum": -5, "maximum": 5},
                       "ok": {"type": "boolean"}},
        "required": ["color", "score", "delta", "ok"],
    },
}
PROMPTS = {
    "nested": 'Give JSON for Ann who lives in Paris, zip 75001: {"name": ..., "address": {"city": ..., "zip": ...}}',
    "array": 'List two fruits with quantities as JSON: {"items": [{"fruit": "apple", "qty": 2}, ...]}',
    "bounds": 'Rate the sky as JSON {"color": "blue", "score": 7.5, "delta": 1, "ok": true}.',
}
REGEX = r"[0-9]{3}-[A-Z]{2}"
CHOICES = ["yes", "no", "maybe"]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}},
    "required": ["name", "age", "tags"],
}
MAX_TOKENS = 96  # the guard: every schema above is bounded well within it


@pytest.fixture(scope="module")
def loaded():
    from specops.engine.model import load_model

    try:
        return load_model(dtype=torch.float32)  # fp32: greedy speculation must match plain greedy exactly
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _llm(loaded, **kw):
    from specops.engine.llm import LLM

    return LLM(loaded=loaded, max_num_seqs=32, spec_log_interval_s=None, **kw)


def _params(seed, **so):
    if seed is None:
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=Opts(**so))
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=MAX_TOKENS, structured_outputs=Opts(**so))


def _batch(llm):
    """(name, seed, prompt, params) of every request of the big batch: each grammar greedy and
    sampled, every sampled request with its own seed."""
    reqs = []
    seeds = iter(range(1, 100))
    for name, schema in SCHEMAS.items():
        for seed in (None, next(seeds)):
            reqs.append((name, seed, llm.chat_prompt(PROMPTS[name]), _params(seed, json_schema=schema)))
    for seed in (None, next(seeds)):
        reqs.append(("regex", seed, llm.chat_prompt("Write a code like 123-AB."), _params(seed, regex=REGEX)))
        reqs.append(("choice", seed, llm.chat_prompt("Is the sky blue?"), _params(seed, choice=CHOICES)))
    reqs.append(("plain", None, llm.chat_prompt("Say hi."), SamplingParams(temperature=0.0, max_tokens=12)))
    return reqs


_RUNS: dict = {}


def _run(loaded, spec):
    if spec not in _RUNS:
        llm = _llm(loaded, spec_method=spec, num_spec_tokens=2)  # K=2: 3 verified rows per request (CPU time)
        reqs = _batch(llm)
        outs = llm.generate([r[2] for r in reqs], [r[3] for r in reqs])
        _RUNS[spec] = (reqs, outs, llm.engine.stats()["spec_decoding"])
        llm.engine.shutdown()
    return _RUNS[spec]


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_outputs_follow_their_grammar(loaded, spec):
    reqs, outs, stats = _run(loaded, spec)
    for (name, seed, _, _), out in zip(reqs, outs):
        c = out.outputs[0]
        print(spec, name, seed, c.finish_reason, repr(c.text))
        assert out.error is None, (name, seed, out.error)
        if name == "plain":
            assert len(c.token_ids) == 12  # the unconstrained neighbour runs as usual
            continue
        assert c.finish_reason == "stop", (name, seed, c.text)  # the grammar ended it, not the guard
        if name in SCHEMAS:
            jsonschema.validate(json.loads(c.text), SCHEMAS[name])
        elif name == "regex":
            assert re.fullmatch(REGEX, c.text), c.text
        else:
            assert c.text in CHOICES, c.text
    if spec == "ngram":
        assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] > 0, stats
        plain_reqs, plain_outs, _ = _run(loaded, None)
        for (name, seed, _, _), a, b in zip(reqs, outs, plain_outs):
            if seed is None:  # greedy: speculation changes the step count, never the tokens
                assert a.outputs[0].token_ids == b.outputs[0].token_ids, name


def _first_token_times(engine, limit_s=120.0):
    """Step the engine to the end: ({id: (seconds, step) of its first token or end}, {id: final output})."""
    t0 = time.perf_counter()
    got, final = {}, {}
    step = 0
    while engine.has_unfinished_requests() and time.perf_counter() - t0 < limit_s:
        outs = engine.step()
        step += 1
        for out in outs:
            if out.request_id not in got and (out.outputs and out.outputs[0].token_ids or out.finished):
                got[out.request_id] = (time.perf_counter() - t0, step)
            if out.finished:
                final[out.request_id] = out
    return got, final


SLOW_S, DEADLINE_S = 20.0, 8.0   # the slow grammar's compile time and the compile deadline


def test_slow_or_failing_compile_does_not_delay_others(loaded):
    from specops.engine.llm_engine import LLMEngine
    from specops.engine.structured_output import StructuredOutputManager, XgrammarBackend

    class SlowBackend(XgrammarBackend):
        def compile(self, options):
            if options.kind == "regex" and options.regex == "slow+":
                time.sleep(SLOW_S)
            if options.kind == "regex" and options.regex == "boom":
                raise RuntimeError("injected compiler failure")
            return super().compile(options)

    def engine():
        e = LLMEngine(loaded=loaded, max_num_seqs=8, spec_log_interval_s=None)
        e.set_structured_output_manager(StructuredOutputManager(
            backend=SlowBackend.from_tokenizer(loaded.tokenizer, loaded.config.vocab_size),
            compile_timeout_s=DEADLINE_S))
        return e

    prompt = "The capital of France is"
    plain = SamplingParams(temperature=0.0, max_tokens=4)
    # baseline: two plain requests alone (after one warm-up request)
    base = engine()
    base.add_request(prompt, plain, "warm")
    _first_token_times(base)
    for i in range(2):
        base.add_request(prompt + " " * i, plain, f"p{i}")
    t_base, _ = _first_token_times(base)
    # the same behind a slow (20 s, deadline 8 s) and a failing grammar
    e = engine()
    e.add_request(prompt, plain, "warm")
    _first_token_times(e)
    e.add_request(prompt, SamplingParams(max_tokens=4, structured_outputs=Opts(regex="slow+")), "slow")
    e.add_request(prompt, SamplingParams(max_tokens=4, structured_outputs=Opts(regex="boom")), "boom")
    for i in range(2):
        e.add_request(prompt + " " * i, plain, f"p{i}")
    e.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=4, structured_outputs=Opts(regex="[a-z ]+")),
                  "fast")
    t0 = time.perf_counter()
    t_got, final = _first_token_times(e)
    total = time.perf_counter() - t0
    print("baseline", t_base, "with slow/failing", t_got, "total", total)
    for i in range(2):
        p = f"p{i}"
        assert t_got[p][1] == t_base[p][1] == 1  # first token in the first step, as without them
        # and well before the slow compile's deadline (8 s; its compile takes 20 s): a step that
        # waited for it would end at or past the deadline. Not a bound relative to the baseline:
        # on a loaded 2-core CI machine the first step with five requests took 1.45 s against
        # 0.15 s for two alone (session 51), and 2.66 s on a shared 2-core machine (against
        # 0.66 s), with no delay at all; the deadline was 3 s (bound 2.5 s) before, too close
        assert t_got[p][0] < DEADLINE_S - 1.0, (t_got, t_base)
        assert final[p].error is None and len(final[p].outputs[0].token_ids) == 4
    assert "timed out" in final["slow"].error and final["slow"].outputs[0].finish_reason == "error"
    assert "injected compiler failure" in final["boom"].error
    assert final["slow"].outputs[0].token_ids == [] and final["boom"].outputs[0].token_ids == []
    # failed at its deadline (the next step after it); the deadline counts from add_request,
    # a little before t0, so allow that gap
    assert t_got["slow"][0] >= DEADLINE_S - 0.1
    assert final["fast"].error is None and re.fullmatch("[a-z ]+", final["fast"].outputs[0].text)
    assert not e.scheduler.blocked and not e.structured._entries  # nothing left behind
    e.scheduler.check()
    e.shutdown()
    base.shutdown()


def _nested(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_bad_specifications_fail_alone(loaded):
    llm = _llm(loaded)
    chat = llm.chat_prompt("Is the sky blue?")
    bad = {
        "malformed_json": {"json_schema": '{"type": "object",'},
        "meta_schema": {"json_schema": {"type": "object", "properties": {"x": {"type": 5}}}},
        "bad_regex": {"regex": "(x"},
        "impossible_regex": {"regex": r"[^\s\S]"},
        "empty_choice": {"choice": []},
        "two_kinds": {"regex": "a", "choice": ["a"]},
        "half_enforced": {"json_schema": {"type": "integer", "allOf": [{"maximum": 5}]}},
        "deep_text": {"json_schema": "[" * 5000 + "]" * 5000},         # json.loads recursed past the limit
        "deep_dict": {"json_schema": _nested(5000)},                     # copy.deepcopy did
    }
    params = [SamplingParams(max_tokens=8, structured_outputs=so) for so in bad.values()]
    # min_tokens beyond the end of the grammar: no token is left once a choice is complete
    params.append(SamplingParams(temperature=0.0, max_tokens=20, min_tokens=12, structured_outputs={"choice": CHOICES}))
    params.append(SamplingParams(temperature=0.0, max_tokens=8, structured_outputs={"choice": CHOICES}))
    # the grammar ends on EOS although ignore_eos: that EOS's text ("<|im_end|>") was in the output
    params.append(SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, skip_special_tokens=False,
                                 structured_outputs={"choice": CHOICES}))
    outs = llm.generate([chat] * len(params), params)
    errors = {name: o.error for name, o in zip(bad, outs)}
    print(errors)
    assert "not valid JSON" in errors["malformed_json"]
    assert "malformed at properties/x/type" in errors["meta_schema"]
    assert "regex '(x' is invalid" in errors["bad_regex"]
    assert "accepts no output" in errors["impossible_regex"]
    assert "choice must not be an empty list" in errors["empty_choice"]
    assert errors["two_kinds"] is not None
    assert "beside 'allOf'" in errors["half_enforced"]
    assert "nested too deeply" in errors["deep_text"] and "nested too deeply" in errors["deep_dict"]
    assert "no token could be sampled" in outs[-3].error and "min_tokens" in outs[-3].error, outs[-3].error
    assert outs[-2].error is None and outs[-2].outputs[0].text in CHOICES
    assert outs[-1].outputs[0].text == outs[-2].outputs[0].text and outs[-1].outputs[0].finish_reason == "stop"
    with pytest.raises(TypeError, match="structured_outputs must be None or a StructuredOutputOptions"):
        SamplingParams(structured_outputs=["x"]).validate()
    llm.engine.shutdown()


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_reasoning_then_constrained(loaded, spec):
    """Free text until the end marker (two tokens of the model's own greedy output), then a choice;
    with n-gram drafts on a repetitive prompt the marker completes inside a draft window."""
    from specops.engine.llm_engine import LLMEngine
    from specops.engine.structured_output import ReasoningConfig, StructuredOutputManager

    text = "a b c d e f g h a b c d e f g h a b c d e f g h a b"  # greedy continues " c d e f g h ..."
    e = LLMEngine(loaded=loaded, max_num_seqs=4, spec_method=spec, spec_log_interval_s=None)
    e.add_request(text, SamplingParams(temperature=0.0, max_tokens=10), "free")
    free = _first_token_times(e)[1]["free"].outputs[0].token_ids
    i = next(i for i in range(3, len(free) - 2)  # a pair that does not occur earlier
             if all((free[j], free[j + 1]) != (free[i], free[i + 1]) for j in range(i)))
    so = StructuredOutputManager(loaded.tokenizer, loaded.config.vocab_size,
                                 reasoning=ReasoningConfig(end_marker=tuple(free[i:i + 2]), start_marker=None))
    e.set_structured_output_manager(so)
    e.add_request(text, SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=Opts(choice=CHOICES)),
                  "gated")
    deltas, got = [], None
    while e.has_unfinished_requests():
        for out in e.step():
            deltas.append(out.outputs[0].delta_token_ids)
            got = out.outputs[0]
    print(spec, free, i, got.token_ids, repr(got.text), deltas)
    assert got.token_ids[:i + 2] == free[:i + 2]  # unconstrained through the marker
    assert got.finish_reason == "stop"
    rest = [t for t in got.token_ids[i + 2:] if t not in e.eos_token_ids]
    assert loaded.tokenizer.decode(rest) in CHOICES
    if spec == "ngram":  # one step emitted tokens on both sides of the marker's end
        ends = [sum(map(len, deltas[:k + 1])) for k in range(len(deltas))]
        assert any(end - len(d) < i + 2 < end for d, end in zip(deltas, ends)), deltas
    e.shutdown()


def _cli(*args, timeout=240):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "specops.cli", "generate", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_cli_structured_options(tmp_path, loaded, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(PERSON))
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('"Write JSON like {\\"name\\": \\"Ann\\", \\"age\\": 31, \\"tags\\": [\\"cat\\"]} for Bob, 40."\n'
                       '"Describe Ann, 31, who likes tea, as JSON."\n')
    r = _cli("--chat", "--prompts-file", str(prompts), "--json-schema", str(schema), "--spec", "ngram",
             "--max-tokens", "64")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 2, r.stdout
    for row in rows:
        jsonschema.validate(json.loads(row["text"]), PERSON)
    from specops.cli import main

    # in process (no second model load): --choice as a comma list, sampled
    assert main(["generate", "--chat", "Is the sky blue?", "--choice", "yes,no", "--temperature", "1", "--seed", "3",
                 "--max-tokens", "8"]) == 0
    assert capsys.readouterr().out.strip() in ("yes", "no")
    for flags, msg in ((["--regex", "[a-z"], "is invalid"), (["--choice", ""], "empty string"),
                       (["--json-schema", str(tmp_path / "missing.json")], "cannot read"),
                       (["--grammar", str(schema)], "grammar")):
        assert main(["generate", "hello", *flags]) == 2  # rejected before any model is loaded
        assert msg in capsys.readouterr().err, flags
