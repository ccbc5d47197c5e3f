"""Structured output with the default model's tokenizer: constrained random walks always give
valid output; drafts, 1+K bitmask rows and rollback are exact; control tokens stay out."""

import json
import re

import numpy as np
import pytest
import torch

xgr = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from specops.engine.structured_output import (GrammarState, StructuredOutputOptions,  # noqa: E402
                                              XgrammarBackend)
from specops.engine.structured_output.grammar_state import ALL_ALLOWED  # noqa: E402
from specops.engine.structured_output.testing import allowed_tokens, default_tokenizer, random_walk  # noqa: E402

SCHEMAS = {
    "nested_objects": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "address": {"type": "object", "properties": {
                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "address", "age"],
    },
    "array_of_objects": {
        "type": "array", "minItems": 1, "maxItems": 3,
        "items": {"type": "object", "properties": {
            "x": {"type": "number", "minimum": -1.5, "maximum": 2.25},
            "ok": {"type": "boolean"}}, "required": ["x", "ok"]},
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"enum": [1, 2, None, "x y"]},
                       "tag": {"const": "v1"}},
        "required": ["color", "n", "tag"],
    },
    "number_bounds": {
        "type": "object",
        "properties": {"i": {"type": "integer", "minimum": -50, "maximum": 50},
                       "f": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                       "big": {"type": "integer", "minimum": 1000, "maximum": 100000},
                       "neg": {"type": "number", "minimum": -10.5, "exclusiveMaximum": -2}},
        "required": ["i", "f", "big", "neg"],
    },
    "refs_anyof_lists": {
        "$defs": {"pt": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                          {"type": "integer", "minimum": 0, "maximum": 9}],
                         "items": False}},
        "type": "object",
        "properties": {"pts": {"type": "array", "items": {"$ref": "#/$defs/pt"}, "maxItems": 2},
                       "v": {"anyOf": [{"type": "boolean"}, {"type": "string", "maxLength": 3}]}},
        "required": ["pts", "v"],
    },
}

REGEXES = [r"\d{3}-[A-Z]{2}", r"(ab|cd)+x?", r"[a-z]{1,5}@[a-z]{2,4}\.(com|org)",
           r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?"]
GRAMMAR = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]{0,2}
"""


@pytest.fixture(scope="module")
def tok():
    try:
        return default_tokenizer()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def backend(tok):
    return XgrammarBackend.from_tokenizer(tok)


def _walks(backend, opts, seeds, max_tokens=160):
    compiled = backend.compile(opts)
    outs = []
    for seed in seeds:
        state = GrammarState(backend.new_matcher(compiled))
        out, done = random_walk(state, backend.vocab_size, np.random.default_rng(seed), max_tokens=max_tokens,
                                stop_prob=0.7, stop_token_ids=tuple(backend.stop_token_ids))
        outs.append((out, done))
    return outs


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_random_walks_validate_against_schema(backend, tok, name):
    schema = SCHEMAS[name]
    outs = _walks(backend, StructuredOutputOptions(json_schema=schema), range(12))
    done = [tok.decode(o) for o, d in outs if d]
    assert len(done) >= 9, f"only {len(done)}/12 walks finished"
    for text in done:
        value = json.loads(text)  # strict: no raw control characters in strings
        jsonschema.validate(value, schema)


def test_random_walks_json_object(backend, tok):
    outs = _walks(backend, StructuredOutputOptions(json_object=True), range(10), max_tokens=80)
    done = [tok.decode(o) for o, d in outs if d]
    assert done
    for text in done:
        assert isinstance(json.loads(text), dict)


def test_random_walks_regex_choice_grammar(backend, tok):
    for rx in REGEXES:
        for out, done in _walks(backend, StructuredOutputOptions(regex=rx), range(8)):
            assert done
            assert re.fullmatch(rx, tok.decode(out)), (rx, tok.decode(out))
    choices = ["Paris", "New York", "Los Angeles", "N"]
    for out, done in _walks(backend, StructuredOutputOptions(choice=choices), range(8)):
        assert done and tok.decode(out) in choices
    expr_re = re.compile(r"[1-9][0-9]{0,2}|[()+\-0-9]+")
    for out, done in _walks(backend, StructuredOutputOptions(grammar=GRAMMAR), range(8), max_tokens=60):
        if not done:
            continue
        text = tok.decode(out)
        assert expr_re.fullmatch(text) and text.count("(") == text.count(")"), text
        eval(text, {"__builtins__": {}})  # a well-formed arithmetic expression


def test_tokenizer_info_control_tokens_and_padding(tok):
    """Control tokens are never allowed (not even inside a JSON string); EOS only at the end;
    ids past the tokenizer (a padded logits width) never."""
    pad = 40
    backend = XgrammarBackend.from_tokenizer(tok, vocab_size=tok.vocab_size + pad)
    assert backend.vocab_size == tok.vocab_size + pad
    compiled = backend.compile(StructuredOutputOptions(json_schema={"type": "object", "properties": {
        "s": {"type": "string"}}, "required": ["s"]}))
    state = GrammarState(backend.new_matcher(compiled))
    bm = torch.zeros((1, backend.bitmask_width), dtype=torch.int32)
    specials = set(tok.special_token_ids)
    assert len(specials) > 1
    eos = tok.eos_token_ids[0]
    for piece in ['{"s": "', "hello <|im_start|> world"]:
        for t in tok.encode(piece):
            if t in specials:
                assert not state.advance(t)
            else:
                assert state.advance(t)
        state.fill_bitmask(bm, 0)
        allowed = set(allowed_tokens(bm[0], backend.vocab_size).tolist())
        assert len(allowed) > 1000
        assert not allowed & specials, sorted(allowed & specials)
        assert not allowed & set(range(tok.vocab_size, tok.vocab_size + pad))
    assert state.accept_tokens(tok.encode('"}'))
    state.fill_bitmask(bm, 0)
    assert allowed_tokens(bm[0], backend.vocab_size).tolist() == [eos]
    assert state.advance(eos) and state.is_terminated()


def _walk_tokens(backend, compiled, seed, n=40):
    """A valid token sequence of length n from a random walk (stop token never taken)."""
    state = GrammarState(backend.new_matcher(compiled))
    out, _ = random_walk(state, backend.vocab_size, np.random.default_rng(seed), max_tokens=n, stop_prob=0.0,
                         stop_token_ids=tuple(backend.stop_token_ids))
    return out


def _row_after(backend, compiled, tokens):
    """Reference: a fresh matcher advanced through ``tokens`` one by one, then filled."""
    s = GrammarState(backend.new_matcher(compiled))
    assert s.accept_tokens(tokens)
    bm = torch.zeros((1, backend.bitmask_width), dtype=torch.int32)
    s.fill_bitmask(bm, 0)
    return bm[0]


def _disallowed(row, vocab, rng):
    allowed = set(allowed_tokens(row, vocab).tolist())
    while True:
        t = int(rng.integers(vocab))
        if t not in allowed:
            return t


@pytest.mark.parametrize("seed", range(4))
def test_drafts_rows_and_rollback_exact(backend, seed):
    compiled = backend.compile(StructuredOutputOptions(json_schema=SCHEMAS["nested_objects"]))
    rng = np.random.default_rng(100 + seed)
    seq = _walk_tokens(backend, compiled, seed, n=30)
    assert len(seq) >= 12
    K = 4
    for start in (0, 3, len(seq) - K - 1):
        prefix, drafts = seq[:start], seq[start: start + K]
        state = GrammarState(backend.new_matcher(compiled))
        assert state.accept_tokens(prefix)
        before = _row_after(backend, compiled, prefix)
        # valid drafts: all kept; 1+K rows equal step-by-step rows
        assert state.validate_tokens(drafts) == drafts
        bm = torch.full((K + 3, backend.bitmask_width), 7, dtype=torch.int32)
        n = state.fill_bitmask_rows(bm, 1, drafts)
        assert n == K + 1
        for j in range(K + 1):
            assert torch.equal(bm[1 + j], _row_after(backend, compiled, prefix + drafts[:j])), j
        assert (bm[0] == 7).all() and (bm[K + 2] == 7).all()  # neighbours untouched
        # invalid draft at position i: the valid prefix is kept exactly; rows after it are free
        for i in range(K):
            bad = _disallowed(_row_after(backend, compiled, prefix + drafts[:i]), backend.vocab_size, rng)
            d = drafts[:i] + [bad] + drafts[i + 1:]
            assert state.validate_tokens(d) == drafts[:i]
            n = state.fill_bitmask_rows(bm, 1, d)
            assert n == i + 1
            for j in range(i + 1):
                assert torch.equal(bm[1 + j], _row_after(backend, compiled, prefix + drafts[:j]))
            assert (bm[1 + i + 1: K + 2] == ALL_ALLOWED).all()
        # state restored: same mask, same count, and it still accepts the true continuation
        row = torch.zeros((1, backend.bitmask_width), dtype=torch.int32)
        state.fill_bitmask(row, 0)
        assert torch.equal(row[0], before)
        assert state.num_accepted == len(prefix)
        # explicit rollback restores too
        assert state.accept_tokens(drafts)
        state.rollback(len(drafts))
        state.fill_bitmask(row, 0)
        assert torch.equal(row[0], before)
        # a rejected token in accept_tokens leaves the state unchanged (all or nothing)
        assert not state.accept_tokens(drafts[:2] + [_disallowed(
            _row_after(backend, compiled, prefix + drafts[:2]), backend.vocab_size, rng)])
        state.fill_bitmask(row, 0)
        assert torch.equal(row[0], before) and state.num_accepted == len(prefix)


def test_stop_token_in_drafts(backend, tok):
    compiled = backend.compile(StructuredOutputOptions(choice=["yes", "no"]))
    eos = tok.eos_token_ids[0]
    yes = tok.encode("yes")
    state = GrammarState(backend.new_matcher(compiled))
    drafts = yes + [eos, eos]
    assert state.validate_tokens(drafts) == yes + [eos]  # nothing after the stop token
    bm = torch.zeros((len(drafts) + 1, backend.bitmask_width), dtype=torch.int32)
    n = state.fill_bitmask_rows(bm, 0, drafts)
    assert n == len(yes) + 1  # rows up to the one that allows the stop token; after it, nothing to constrain
    assert allowed_tokens(bm[len(yes)], backend.vocab_size).tolist() == [eos]
    assert (bm[len(yes) + 1:] == ALL_ALLOWED).all()
    assert not state.is_terminated() and state.num_accepted == 0
    # rollback across termination
    assert state.accept_tokens(yes + [eos]) and state.is_terminated()
    state.rollback(1)
    assert not state.is_terminated()
    assert state.advance(eos) and state.is_terminated()


def test_length_bounded_strings_exclude_control_characters(backend, tok):
    """xgrammar writes minLength/maxLength strings with a class that admits raw control bytes
    (invalid JSON); the backend rewrites it. No token holding a byte < 0x20 may start such a string."""
    control = [i for i in range(tok.vocab_size) if i not in set(tok.special_token_ids)
               and any(b < 0x20 for b in tok.decode([i]).encode("utf-8"))]
    assert control
    for schema in ({"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2, "maxLength": 9},
                   {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}):
        state = GrammarState(backend.new_matcher(backend.compile(StructuredOutputOptions(json_schema=schema))))
        assert state.accept_tokens(tok.encode('"'))
        bm = torch.zeros((1, backend.bitmask_width), dtype=torch.int32)
        state.fill_bitmask(bm, 0)
        allowed = set(allowed_tokens(bm[0], backend.vocab_size).tolist())
        assert len(allowed) > 100 and not allowed & set(control)


def test_tokenizer_ids_past_the_logits_are_left_out(tok):
    """A tokenizer with added ids past the model's logits (a checkpoint whose tokenizer grew):
    every structured request failed with "vocab_size must be at least the tokenizer's"; now
    the grammar works over the ids the model can produce, and an EOS id past them is dropped."""
    width = tok.vocab_size - 5
    eos = tok.eos_token_ids[0]
    assert eos < width
    backend = XgrammarBackend.from_tokenizer(tok, vocab_size=width)
    assert backend.vocab_size == width
    compiled = backend.compile(StructuredOutputOptions(choice=["yes", "no"]))
    state = GrammarState(backend.new_matcher(compiled))
    assert state.accept_tokens(tok.encode("yes"))
    bm = torch.zeros((1, backend.bitmask_width), dtype=torch.int32)
    state.fill_bitmask(bm, 0)
    assert allowed_tokens(bm[0], width).tolist() == [eos]

    class Narrow:   # the same tokenizer with only an EOS id past the logits
        vocab_size, eos_token_ids, special_token_ids = tok.vocab_size, [tok.vocab_size - 1], []
        id_to_token, backend = tok.id_to_token, getattr(tok, "backend", None)

    with pytest.raises(ValueError, match="no EOS id of the tokenizer is below the logits' width"):
        XgrammarBackend.from_tokenizer(Narrow(), vocab_size=width)
