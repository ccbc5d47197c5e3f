"""Structured output: request options, their validation, and compile-time rejections."""

import json

import pytest

xgr = pytest.importorskip("xgrammar")

from specops.engine.structured_output import (StructuredOutputOptions, XgrammarBackend,  # noqa: E402
                                              GrammarState)
from specops.engine.structured_output.options import choice_to_ebnf  # noqa: E402
from specops.engine.structured_output.testing import random_walk, small_tokenizer  # noqa: E402

import numpy as np  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    return XgrammarBackend.from_tokenizer(small_tokenizer())


def _bad(match, **kw):
    with pytest.raises((ValueError, TypeError), match=match):
        StructuredOutputOptions(**kw).validate()


def test_exactly_one_option():
    _bad("got none", )
    _bad("got json_schema, regex", json_schema={"type": "integer"}, regex="a")
    _bad("got json_object, choice", json_object=True, choice=["a"])
    with pytest.raises(TypeError, match="json_object must be a bool"):
        StructuredOutputOptions(json_object=1).validate()
    for kw in ({"json_schema": {"type": "integer"}}, {"json_object": True}, {"regex": "a+"},
               {"choice": ["x"]}, {"grammar": 'root ::= "a"'}):
        opts = StructuredOutputOptions(**kw)
        opts.validate()
        assert opts.kind == next(iter(kw))


def test_malformed_json_schema():
    pytest.importorskip("jsonschema")
    _bad("not valid JSON: Expecting ':' delimiter at line 1 column 31",
         json_schema='{"type": "object", "required" ["a"]}')
    _bad("malformed at type: 'objekt' is not valid", json_schema={"type": "objekt"})
    _bad("malformed at properties/a/minimum",
         json_schema={"type": "object", "properties": {"a": {"type": "number", "minimum": "3"}}})
    _bad("must be a dict or its JSON text", json_schema=["type", "object"])
    _bad("must be a JSON object; for any JSON object use json_object=True \\(--json-object\\)", json_schema=True)
    _bad("'not' at #/properties/a", json_schema={"type": "object", "properties": {"a": {"not": {"type": "null"}}}})
    _bad("'uniqueItems' at #/prefixItems/0",
         json_schema={"type": "array", "prefixItems": [{"type": "array", "uniqueItems": True}]})
    _bad("'oneOf' with several subschemas at #/\\$defs/x",
         json_schema={"$defs": {"x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})
    # a property *named* like an unsupported keyword is fine
    StructuredOutputOptions(json_schema={"type": "object", "properties": {"not": {"type": "integer"}}}).validate()


# Each was accepted before and compiled into a grammar that enforced only part of it: random
# walks of the grammar produced output the schema rejects (a review's fuzz, 2026-12-02).
HALF_ENFORCED = [
    ("'type', 'minimum', 'maximum' beside 'allOf' at #",
     {"type": "integer", "minimum": 0, "maximum": 50, "allOf": [{"maximum": 5}]}),
    ("'required' beside 'anyOf' at #/properties/x",
     {"type": "object", "properties": {"x": {"anyOf": [{"type": "object"}], "required": ["a"]}}}),
    ("'minimum', 'maximum' beside '\\$ref' at #",
     {"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x", "minimum": 3, "maximum": 4}),
    ("enum value 1, which its other keywords \\(type\\) exclude", {"type": "string", "enum": ["a", 1]}),
    ("const value \"x\"", {"type": "integer", "const": "x"}),
    ("enum value \"abc\"", {"type": "string", "enum": ["abc", "a"], "maxLength": 1}),
    ("'pattern' with 'minLength'/'maxLength'", {"type": "string", "pattern": "^a*$", "minLength": 2}),
    ("'multipleOf' at #/items without", {"type": "array", "items": {"type": "number", "multipleOf": 0.5}}),
    ("requires 'b' at # but 'properties' does not define it",
     {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}),
    ("requires 'z'", {"type": "object", "required": ["z"]}),
    # xgrammar counts key/value pairs, not distinct keys: {"k": 1, "k": 2} met minProperties 2
    ("'minProperties' at # with keys beyond its required properties",
     {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}),
    ("'minProperties' at #/items",
     {"type": "array", "items": {"type": "object", "patternProperties": {"^x": {"type": "integer"}},
                                 "minProperties": 1}}),
    # xgrammar's schema compiler dropped the lookahead: "a" came out (its regex parser refuses it)
    ("json_schema 'pattern' at # '\\^\\(\\?!a\\)\\[ab\\]\\$' is invalid: .*Lookahead is not supported",
     {"type": "string", "pattern": "^(?!a)[ab]$"}),
    ("json_schema 'pattern' at #/properties/x has the quantifier \\{4294967296\\}",
     {"type": "object", "properties": {"x": {"type": "string", "pattern": "^a{4294967296}$"}}}),
    # a subschema without "type" compiled to any JSON value: {"zip": "hello world"} came out
    # for a 5-digit pattern, {"zip": 123456} for maximum 10 (a review, session 70)
    ("'pattern' at #/properties/zip without \"type\": .* add \"type\": \"string\"",
     {"type": "object", "properties": {"zip": {"pattern": "^[0-9]{5}$"}}, "required": ["zip"]}),
    ("'maxLength' at #/properties/zip without \"type\"", {"type": "object", "properties": {"zip": {"maxLength": 5}}}),
    ("'maximum' at #/items without \"type\": .* \"number\"", {"type": "array", "items": {"maximum": 10}}),
    ("'minItems' at # without \"type\"", {"minItems": 3}),
    ("'maxProperties' at # without \"type\"", {"maxProperties": 1}),
    # a $ref to an $anchor, a file or a URL compiled to any JSON value
    ("'\\$ref': '#num' at #/properties/zip: structured output resolves only JSON pointers",
     {"$defs": {"n": {"$anchor": "num", "type": "integer"}}, "type": "object",
      "properties": {"zip": {"$ref": "#num"}}, "required": ["zip"]}),
    ("'\\$ref': 'other.json' at #", {"$ref": "other.json"}),
    # a review, session 71: each gave output that breaks the schema, or is not JSON
    # a pattern of literals is written raw into the string: {"q": "say "hi""}, "C:\temp" (a tab)
    ("'pattern' at #/properties/q writes a double quote",
     {"type": "object", "properties": {"q": {"type": "string", "pattern": '^say "hi"$'}}, "required": ["q"]}),
    ("'pattern' at # writes a backslash", {"type": "string", "pattern": "^C:\\\\temp$"}),
    ("'pattern' at # writes the character U\\+0022", {"type": "string", "pattern": "^\\x22$"}),
    ("'pattern' at # writes the control character", {"type": "string", "pattern": "^a\\nb$"}),
    # a property's own subschema was enforced, the matching patternProperties one not: {"id": -640}
    ("property 'id' at # also matches 'patternProperties' '\\^\\[a-z\\]\\+\\$'",
     {"type": "object", "properties": {"id": {"type": "integer"}},
      "patternProperties": {"^[a-z]+$": {"type": "string"}}, "required": ["id"]}),
    # only the format was enforced: "2022-01-01" for maxLength 5
    ("'format' with 'maxLength' at #", {"type": "string", "format": "date", "maxLength": 5}),
    ("'format' with 'pattern' at #", {"type": "string", "format": "date", "pattern": "^2024-"}),
    # a $ref into a container the walk did not follow (OpenAPI's components) skipped every check
    ("'uniqueItems' at #/components/P",
     {"components": {"P": {"type": "array", "items": {"const": 1}, "minItems": 2, "maxItems": 2,
                           "uniqueItems": True}},
      "type": "object", "properties": {"v": {"$ref": "#/components/P"}}, "required": ["v"]}),
]


@pytest.mark.parametrize("match, schema", HALF_ENFORCED)
def test_schemas_that_would_be_half_enforced_are_refused(match, schema):
    pytest.importorskip("jsonschema")
    _bad(match, json_schema=schema)


def test_what_is_enforced_stays_accepted(backend):
    # annotations beside $ref / anyOf, enum values that their type admits, integer multipleOf:
    # accepted, and random walks of their grammars give only valid output
    jsonschema = pytest.importorskip("jsonschema")
    rng = np.random.default_rng(0)
    for schema in ({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "X"},
                   {"$defs": {"c": {"enum": ["red", "blue"]}}, "type": "object",
                    "properties": {"c": {"$ref": "#/$defs/c", "description": "a colour"}}, "required": ["c"]},
                   {"type": "string", "enum": ["a", "bb"], "maxLength": 2},
                   {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 100},
                   # no "type", but xgrammar infers it from items / properties and enforces the counts
                   {"items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
                   {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "maxProperties": 1}):
        opts = StructuredOutputOptions(json_schema=schema)
        opts.validate()
        compiled = backend.compile(opts)
        tok = small_tokenizer()
        for _ in range(30):
            st = GrammarState(backend.new_matcher(compiled))
            toks, ended = random_walk(st, backend.vocab_size, rng, max_tokens=40, stop_prob=0.3, stop_token_ids=(2,))
            if ended:
                jsonschema.validate(json.loads(tok.decode(toks)), schema)


@pytest.mark.parametrize("kw", [{"json_schema": {"type": "string"}},
                                {"json_schema": {"type": "string", "maxLength": 1}},
                                {"json_object": True}, {"regex": "a.b"}, {"regex": "[^x]+"}, {"regex": r"[\s\S]"},
                                {"grammar": 'root ::= [^"]+'}])
def test_no_grammar_accepts_a_surrogate(backend, kw):
    # ED A0 80 is U+D800 encoded like a character, which is not UTF-8: the text got U+FFFD
    # where the grammar had counted one character. small_tokenizer: ids 3..258 are the bytes.
    opts = StructuredOutputOptions(**kw)
    opts.validate()
    compiled = backend.compile(opts)
    prefix = {"json_schema": b'"', "json_object": b'{"', "regex": b"a" if kw.get("regex") == "a.b" else b""}
    for lead in (b"\xed\xa0\x80", b"\xed\xbf\xbf"):
        st = GrammarState(backend.new_matcher(compiled))
        ids = [3 + b for b in prefix.get(next(iter(kw)), b"") + lead]
        assert not st.accept_tokens(ids), (kw, lead)
    st = GrammarState(backend.new_matcher(compiled))   # a real 3-byte character still passes
    assert st.accept_tokens([3 + b for b in prefix.get(next(iter(kw)), b"") + "\u20ac".encode()]), kw


def test_deeply_nested_schema_is_refused():
    deep = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    _bad("more than 128 levels deep", json_schema=deep)


def test_bad_regex():
    _bad("regex must not be empty", regex="")
    _bad("regex must be a str", regex=3)
    _bad(r"regex '\(ab' is invalid: .*parenthesis is not closed", regex="(ab")
    _bad(r"regex 'a\{5,2\}' is invalid: .*5 > 2", regex="a{5,2}")
    _bad("regex '\\[z-a\\]' is invalid: .*lower bound is larger than upper bound", regex="[z-a]")
    _bad("Lookahead is not supported", regex="a(?=b)")
    _bad("Backreference is not supported", regex=r"(a)\1")
    # xgrammar reads counts modulo 2**32: a{4294967296} was the empty language's "", a{4294967297} "a"
    for q in ("{4294967296}", "{0,4294967296}", "{2147483648,}"):
        _bad(f"regex has the quantifier \\{q}: a repetition count must be at most 2147483647", regex="a" + q)


def test_escapes_xgrammar_would_misread_are_refused():
    # xgrammar takes an unknown letter escape as the letter (\A...\Z, Python's anchors, made the
    # output "AfooZ") and \0 as nothing ("x\0y" matched "xy"), with only a warning on stderr
    _bad(r"has the anchor \\A: a regex here always matches the whole output", regex=r"\Afoo\Z")
    _bad(r"has the anchor \\Z", regex=r"foo\Z")
    _bad(r"has the escape \\0: xgrammar would match nothing there", regex=r"[\0-\x1f]")
    _bad(r"has the escape \\q: xgrammar does not know it and would match the letter q there", regex=r"a\q")
    _bad(r"has the escape \\U: xgrammar does not know it", regex=r"a\Ub")   # \U needs 8 hex digits
    _bad(r"json_schema 'pattern' at .* has the anchor \\A",
         json_schema={"type": "string", "pattern": r"\A[a-z]+\Z"})
    for ok in (r"\d+\.\w\s\S\D\W", r"\\A", r"[\t\n\r\f\v]", r"\x41\u00e9", r"a\\0", r"\U0001F600",
               r"[\U0001F600-\U0001F64F]", r"\cA"):
        StructuredOutputOptions(regex=ok).validate()


def test_bad_choice():
    _bad("choice must not be an empty list", choice=[])
    _bad("choice must be a list of strings, got str", choice="yes")
    _bad(r"choice\[1\] must be a str", choice=["a", 1])
    _bad(r"choice\[0\] is the empty string", choice=["", "b"])
    _bad(r"choice\[1\] holds a NUL character", choice=["a", "a\x00b"])   # xgrammar drops it from a literal


def test_bad_grammar():
    _bad("grammar must not be empty", grammar="  ")
    _bad('root rule with name "root" is not found', grammar='start ::= "a"')
    _bad("grammar is invalid EBNF", grammar='root ::= "a" |')
    _bad("grammar has the quantifier \\{4294967296\\}: a repetition count must be at most",
         grammar='root ::= "a"{4294967296}')


def test_empty_language_fails_at_compile(backend):
    # Well formed but matches nothing: found when compiling (in the pool), as a ValueError.
    for opts in (StructuredOutputOptions(regex=r"[^\s\S]"),
                 StructuredOutputOptions(grammar=r'root ::= [^\0-\U0010FFFF]')):
        try:
            opts.validate()
        except ValueError:
            continue  # rejected even earlier: also fine
        with pytest.raises(ValueError, match="accepts no output"):
            backend.compile(opts)
    with pytest.raises(ValueError, match="json_schema: cannot compile: .*minimum greater than maximum"):
        backend.compile(StructuredOutputOptions(json_schema={"type": "integer", "minimum": 5, "maximum": 2}))
    with pytest.raises(ValueError, match="cannot compile: .*Cannot find field"):
        backend.compile(StructuredOutputOptions(json_schema={"type": "object", "properties": {
            "a": {"$ref": "#/$defs/missing"}}}))
    # a range with no value of at most 6 decimals compiled to an empty value: {"x": } came out
    for bounds in ({"minimum": 1.123456789, "maximum": 1.12345679}, {"exclusiveMinimum": 1, "exclusiveMaximum": 1.0000001}):
        with pytest.raises(ValueError, match="json_schema: cannot compile: the number range .* holds no value"):
            backend.compile(StructuredOutputOptions(json_schema={"type": "object", "properties": {
                "x": {"type": "number", **bounds}}, "required": ["x"]}))
    # xgrammar raises RuntimeError('') on a bound past the float range: the reason is never empty
    with pytest.raises(ValueError, match="json_schema: cannot compile: RuntimeError without a message"):
        backend.compile(StructuredOutputOptions(json_schema={"type": "integer", "minimum": 10**400}))


def test_cache_key_and_spec():
    a = StructuredOutputOptions(json_schema={"type": "object", "properties": {"b": {}, "a": {}}})
    b = StructuredOutputOptions(json_schema='{ "type" : "object", "properties": {"b": {}, "a": {}} }')
    c = StructuredOutputOptions(json_schema={"type": "object", "properties": {"a": {}, "b": {}}})
    assert a.cache_key() == b.cache_key()
    assert a.cache_key() != c.cache_key()  # property order decides the output's order
    assert a.cache_key() != StructuredOutputOptions(json_schema=a.json_schema, any_whitespace=True).cache_key()
    assert StructuredOutputOptions(regex="a").cache_key() != StructuredOutputOptions(grammar="a").cache_key()
    hash(a.cache_key())


def test_from_cli(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "integer", "minimum": 0, "maximum": 9}))
    assert StructuredOutputOptions.from_cli() is None
    assert StructuredOutputOptions.from_cli(json_schema_file=str(schema)).kind == "json_schema"
    assert StructuredOutputOptions.from_cli(choice="yes,no").choice == ["yes", "no"]
    assert StructuredOutputOptions.from_cli(choice="yes, no").choice == ["yes", "no"]   # " no" kept its space
    assert StructuredOutputOptions.from_cli(choice=["a,b", "c"]).choice == ["a,b", "c"]
    g = tmp_path / "g.ebnf"
    g.write_text('root ::= "x"+')
    assert StructuredOutputOptions.from_cli(grammar_file=str(g)).grammar == 'root ::= "x"+'
    with pytest.raises(ValueError, match="--json-schema: cannot read"):
        StructuredOutputOptions.from_cli(json_schema_file=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="got json_schema, regex"):
        StructuredOutputOptions.from_cli(json_schema_file=str(schema), regex="a")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        StructuredOutputOptions.from_cli(json_schema_file=str(bad))


def test_choice_escaping_walks_to_each_choice(backend):
    """Choices with quotes, backslashes, newlines and non-ASCII compile and yield exactly one of them."""
    tok = small_tokenizer()
    # control characters before a hex digit: \x1b then "A1" was read as U+1BA1
    choices = ['say "hi"', "back\\slash", "two\nlines", "tab\there", "é🙂", "a", "aa", "aaaa", "\x1bA1", "x\x7fE",
               "a\x01b"]
    assert choice_to_ebnf(["a\"b"]) == 'root ::= "a\\"b"'
    compiled = backend.compile(StructuredOutputOptions(choice=choices))
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(60):
        state = GrammarState(backend.new_matcher(compiled))
        out, done = random_walk(state, backend.vocab_size, rng, stop_prob=0.5, stop_token_ids=(2,))
        assert done
        text = tok.decode(out)
        assert text in choices, text
        seen.add(text)
    assert len(seen) >= 5  # the walk reaches many of them, prefixes ("a" vs "aa") included
    from xgrammar.testing import _is_grammar_accept_string as is_grammar_accept_string
    g = xgr.Grammar.from_ebnf(choice_to_ebnf(["\x1bA1", "x\x7fE"]))
    for c in ("\x1bA1", "x\x7fE"):
        assert is_grammar_accept_string(g, c), repr(c)
    assert not is_grammar_accept_string(g, "\u1ba1")
