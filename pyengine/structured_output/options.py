"""StructuredOutputOptions: what a request asks its output to match, checked on arrival.

Exactly one of ``json_schema``, ``json_object``, ``regex``, ``choice``, ``grammar`` is set.
``validate()`` rejects malformed specifications with a ValueError/TypeError that names the
option and the problem. With ``check_meta_schema=False`` it does only cheap work (JSON
parsing, a walk over the schema, xgrammar's regex/EBNF parsers: tens of microseconds), so
the engine runs it on the request's arrival path; the JSON Schema meta-schema check
(milliseconds with ``jsonschema``) then runs with the compilation in the compiler pool
(compiler_pool.py), where a malformed schema, a compile error or a grammar that accepts
no output at all fails that request alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")

# JSON Schema keywords that xgrammar does not enforce (it ignores them, so output could
# violate the schema) or that need more than a context-free grammar. A schema that uses
# one is rejected up front rather than silently half-enforced.
UNSUPPORTED_SCHEMA_KEYWORDS = (
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
    "contains", "minContains", "maxContains", "propertyNames", "uniqueItems",
    "unevaluatedItems", "unevaluatedProperties", "$dynamicRef", "$recursiveRef",
)
# Keywords whose value is one subschema, a {name: subschema} map, or a list of subschemas.
_SUB_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "propertyNames",
            "if", "then", "else", "unevaluatedItems", "unevaluatedProperties")
_SUB_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUB_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")

MAX_SPEC_CHARS = 1 << 20  # 1 MiB: a bigger grammar specification is refused before parsing
MAX_SCHEMA_DEPTH = 128    # subschemas nested deeper are refused (the checks and the compiler recurse)

# Keywords that constrain nothing (annotations, identifiers, definitions): they may stand
# beside $ref / allOf / anyOf / oneOf / enum / const, whose other siblings xgrammar drops.
_ANNOTATIONS = frozenset((
    "title", "description", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly",
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$vocabulary", "$defs", "definitions",
    "contentEncoding", "contentMediaType", "contentSchema",
))
_COMBINATORS = ("$ref", "allOf", "anyOf", "oneOf")
# Keywords of one JSON type that xgrammar (0.2) drops from a subschema without "type": it
# compiles such a subschema to "any JSON value" (the keyword -> the type to add).
_TYPED_KEYWORDS = {
    "pattern": "string", "format": "string", "minLength": "string", "maxLength": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
    "minItems": "array", "maxItems": "array", "minProperties": "object", "maxProperties": "object",
}


@dataclass
class StructuredOutputOptions:
    """Constrain a request's output to a JSON schema, any JSON object, a regex, a choice or an EBNF grammar.

    Parameters
    ----------
    json_schema : dict | str | None
        A JSON Schema (a dict, or its JSON text). Output is one JSON value valid against it.
    json_object : bool
        Output is any JSON object.
    regex : str | None
        Output matches this regular expression (xgrammar's ECMAScript-like syntax, no
        lookaround or backreferences).
    choice : list[str] | None
        Output is exactly one of these non-empty strings.
    grammar : str | None
        An EBNF grammar in xgrammar/GBNF syntax with a ``root`` rule.
    any_whitespace : bool
        JSON only: allow any whitespace between tokens (True) or the compact fixed
        layout ``{"a": 1, "b": [2, 3]}`` (False, the default: small models otherwise can
        emit newlines forever).

    Examples
    --------
    >>> StructuredOutputOptions(choice=["yes", "no"]).validate()
    >>> StructuredOutputOptions(regex=r"\\d{3}").kind
    'regex'
    """

    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    any_whitespace: bool = False

    @property
    def kind(self) -> str:
        """The one option that is set (one of ``KINDS``); ValueError when zero or several are."""
        set_ = [k for k in KINDS if (self.json_object is True if k == "json_object" else getattr(self, k) is not None)]
        if len(set_) != 1:
            raise ValueError("structured output: set exactly one of json_schema, json_object, regex, choice, "
                             f"grammar; got {', '.join(set_) if set_ else 'none'}")
        return set_[0]

    def validate(self, check_meta_schema: bool = True) -> None:
        """Raise ValueError/TypeError naming the option and the problem; return None when well formed.

        ``check_meta_schema=False`` leaves out the (slow) check of a JSON schema against its
        meta-schema; ``XgrammarBackend.compile`` does it before compiling.
        """
        if not isinstance(self.json_object, bool):
            raise TypeError(f"json_object must be a bool, got {self.json_object!r}")
        if not isinstance(self.any_whitespace, bool):
            raise TypeError(f"any_whitespace must be a bool, got {self.any_whitespace!r}")
        kind = self.kind
        if kind == "json_schema":
            check_json_schema(parse_json_schema(self.json_schema), meta=check_meta_schema)
        elif kind == "regex":
            check_regex(self.regex)
        elif kind == "choice":
            check_choice(self.choice)
        elif kind == "grammar":
            check_ebnf(self.grammar)

    def spec(self) -> tuple[str, str]:
        """(kind, canonical text) of the grammar to compile; also the compile-cache key.

        JSON schemas are re-serialised (key order kept: it fixes the order of the output's
        properties), so two spellings of one schema share a cache entry.
        """
        kind = self.kind
        if kind == "json_schema":
            text = json.dumps(parse_json_schema(self.json_schema), ensure_ascii=False, separators=(",", ":"))
        elif kind == "json_object":
            text = ""
        elif kind == "regex":
            text = self.regex
        elif kind == "choice":
            text = choice_to_ebnf(self.choice)
        else:
            text = self.grammar
        return kind, text

    def cache_key(self) -> tuple:
        """Hashable key of the compiled grammar: the spec plus the options that change it."""
        kind, text = self.spec()
        ws = self.any_whitespace if kind in ("json_schema", "json_object") else None
        return kind, text, ws

    @classmethod
    def from_cli(cls, json_schema_file: str | None = None, regex: str | None = None,
                 choice: list[str] | str | None = None, grammar_file: str | None = None,
                 json_object: bool = False) -> "StructuredOutputOptions | None":
        """Options from ``generate --json-schema FILE --regex R --choice A --choice B --grammar FILE``.

        ``choice`` may be a list (repeated flag) or one comma-separated string. Returns None
        when no option is given; raises ValueError naming the flag on a bad file or value.
        """
        kwargs: dict = {}
        if json_schema_file is not None:
            kwargs["json_schema"] = _read_text("--json-schema", json_schema_file)
        if regex is not None:
            kwargs["regex"] = regex
        if choice is not None:
            kwargs["choice"] = [c.strip() for c in choice.split(",")] if isinstance(choice, str) else list(choice)
        if grammar_file is not None:
            kwargs["grammar"] = _read_text("--grammar", grammar_file)
        if json_object:
            kwargs["json_object"] = True
        if not kwargs:
            return None
        opts = cls(**kwargs)
        opts.validate()
        return opts


# ---- checks -----------------------------------------------------------------------------

def parse_json_schema(schema) -> dict:
    """The schema as a dict: a dict is returned as is, a str is parsed as JSON."""
    if isinstance(schema, str):
        if len(schema) > MAX_SPEC_CHARS:
            raise ValueError(f"json_schema is too long ({len(schema)} characters, at most {MAX_SPEC_CHARS})")
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if isinstance(schema, bool):
        raise ValueError("json_schema must be a JSON object; for any JSON object use json_object=True (--json-object)")
    if not isinstance(schema, dict):
        raise TypeError(f"json_schema must be a dict or its JSON text, got {type(schema).__name__}")
    return schema


def check_json_schema(schema: dict, meta: bool = True) -> None:
    """Check ``schema`` for keywords xgrammar cannot enforce and (``meta``) against its meta-schema.
    The subschemas a ``$ref`` points at are checked too, wherever they are kept (an OpenAPI
    ``#/components/...`` holds them outside the keywords the walk follows)."""
    _walk_schema(schema, "#")
    for pointer, target in _ref_targets(schema):
        _walk_schema(target, pointer)
    if meta:
        check_json_schema_meta(schema)


def schema_dicts(schema):
    """Every dict in the parsed JSON ``schema`` (itself included), at any depth, in no order."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _ref_targets(schema: dict) -> list[tuple[str, dict]]:
    """(pointer, subschema) of every '#/...' $ref in ``schema`` that resolves to a dict."""
    refs = dict.fromkeys(node["$ref"] for node in schema_dicts(schema)
                         if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"))
    out = []
    for ref in refs:
        node = schema
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                node = None
                break
        if isinstance(node, dict):
            out.append((ref, node))
    return out


def check_json_schema_meta(schema: dict) -> None:
    """Check ``schema`` against its JSON Schema meta-schema (``$schema``, default draft 2020-12).

    Skipped when ``jsonschema`` is not installed (xgrammar still rejects much of what it catches).
    """
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a test requirement
        return
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise ValueError(f"json_schema is malformed at {where}: {e.message}") from None


def _walk_schema(s, path: str, depth: int = 0) -> None:
    if not isinstance(s, dict):
        return
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"json_schema nests subschemas more than {MAX_SCHEMA_DEPTH} levels deep (at {path})")
    for kw in UNSUPPORTED_SCHEMA_KEYWORDS:
        if kw in s:
            raise ValueError(f"json_schema uses {kw!r} at {path}, which structured output cannot enforce")
    for kw in ("allOf", "oneOf"):
        if isinstance(s.get(kw), list) and len(s[kw]) > 1:
            what = "an intersection" if kw == "allOf" else "exactly one match"
            raise ValueError(f"json_schema uses {kw!r} with several subschemas at {path} ({what} cannot be "
                             "enforced); use anyOf or merge the subschemas")
    _check_half_enforced(s, path)
    for kw in _SUB_ONE:
        sub = s.get(kw)
        if isinstance(sub, dict):
            _walk_schema(sub, f"{path}/{kw}", depth + 1)
        elif isinstance(sub, list):  # draft-4 tuple "items"
            for i, x in enumerate(sub):
                _walk_schema(x, f"{path}/{kw}/{i}", depth + 1)
    for kw in _SUB_MAP:
        sub = s.get(kw)
        if isinstance(sub, dict):
            for name, x in sub.items():
                _walk_schema(x, f"{path}/{kw}/{name}", depth + 1)
    for kw in _SUB_LIST:
        sub = s.get(kw)
        if isinstance(sub, list):
            for i, x in enumerate(sub):
                _walk_schema(x, f"{path}/{kw}/{i}", depth + 1)


def _check_half_enforced(s: dict, path: str) -> None:
    """Refuse the keyword combinations of which xgrammar (0.2) enforces only a part, so that
    output could violate the schema: constraints beside $ref / allOf / anyOf / oneOf (dropped),
    enum / const values that their sibling constraints exclude (the values are produced as
    listed), pattern with minLength / maxLength (only the pattern is kept), multipleOf on
    non-integers (ignored), a required property that ``properties`` does not define (never
    produced), minProperties met by extra keys (a repeated key counts twice), a type's
    keywords (pattern, maximum, minItems, ...) in a subschema without "type" (compiled to any
    value) and a $ref that is not a JSON pointer into the schema (likewise)."""
    ref = s.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        raise ValueError(f"json_schema has '$ref': {ref!r} at {path}: structured output resolves only JSON "
                         "pointers into the schema ('#/$defs/name'), not anchors, other files or URLs; "
                         "point it at the definition")
    combinators = [kw for kw in _COMBINATORS if kw in s]
    implied = any(kw in s for kw in ("properties", "additionalProperties", "items", "prefixItems"))
    if "type" not in s and not combinators and "enum" not in s and "const" not in s and not implied:
        # (xgrammar infers object / array from these, and then enforces the count keywords)
        typed = [kw for kw in _TYPED_KEYWORDS if kw in s]
        if typed:
            raise ValueError(f"json_schema has {typed[0]!r} at {path} without \"type\": structured output would "
                             f"allow any JSON value there; add \"type\": \"{_TYPED_KEYWORDS[typed[0]]}\"")
    if combinators:
        others = [kw for kw in s if kw not in _ANNOTATIONS and kw != combinators[0]]
        if others:
            raise ValueError(f"json_schema has {', '.join(map(repr, others))} beside {combinators[0]!r} at {path}: "
                             f"structured output enforces only the {combinators[0]!r}; move the other keywords "
                             "into the subschema(s)")
    for kw in ("enum", "const"):
        if kw in s:
            siblings = {k: v for k, v in s.items() if k not in _ANNOTATIONS and k not in ("enum", "const")}
            values = s[kw] if kw == "enum" and isinstance(s[kw], list) else [s[kw]]
            bad = _values_outside(values, siblings)
            if bad:
                raise ValueError(f"json_schema at {path} lists {kw} value {json.dumps(bad[0])}, which its other "
                                 f"keywords ({', '.join(siblings)}) exclude: structured output would produce it; "
                                 f"remove it from {kw!r}")
    if isinstance(s.get("pattern"), str):
        # xgrammar's schema compiler drops what its regex parser cannot read (e.g. lookaround)
        _check_xgrammar_regex(s["pattern"], f"json_schema 'pattern' at {path}")
    if isinstance(s.get("pattern"), str):
        written = _json_special_in_pattern(s["pattern"])
        if written:
            raise ValueError(f"json_schema 'pattern' at {path} writes {written}: structured output may put it in "
                             "the JSON string unescaped (invalid JSON); match it with a class such as [^a-z] or "
                             "leave it out")
    if "format" in s and any(kw in s for kw in ("minLength", "maxLength", "pattern")):
        beside = next(kw for kw in ("minLength", "maxLength", "pattern") if kw in s)
        raise ValueError(f"json_schema has 'format' with {beside!r} at {path}: structured output enforces only the "
                         "format; keep one of them")
    pattern_props = s.get("patternProperties")
    if isinstance(pattern_props, dict) and isinstance(s.get("properties"), dict):
        for regex in pattern_props:
            try:
                clash = next((name for name in s["properties"] if re.search(regex, name)), None)
            except re.error:
                continue
            if clash is not None:
                raise ValueError(f"json_schema property {clash!r} at {path} also matches 'patternProperties' "
                                 f"{regex!r}: structured output enforces only its 'properties' subschema; merge "
                                 "the two subschemas or change the pattern")
    if "pattern" in s and ("minLength" in s or "maxLength" in s):
        raise ValueError(f"json_schema has 'pattern' with 'minLength'/'maxLength' at {path}: structured output "
                         "enforces only the pattern; put the length in the pattern (e.g. ^a{2,5}$)")
    if "multipleOf" in s and s.get("type") != "integer":
        raise ValueError(f"json_schema has 'multipleOf' at {path} without \"type\": \"integer\": structured "
                         "output enforces it on integers only")
    required, props = s.get("required"), s.get("properties", {})
    min_props = s.get("minProperties")
    extra_keys = s.get("additionalProperties", False) is not False or "patternProperties" in s
    if isinstance(min_props, int) and extra_keys and min_props > len(required if isinstance(required, list) else []):
        raise ValueError(f"json_schema has 'minProperties' at {path} with keys beyond its required properties "
                         "('additionalProperties' / 'patternProperties'): structured output counts a repeated key "
                         "again, so the object could hold fewer distinct keys; require enough properties instead")
    if isinstance(required, list) and isinstance(props, dict):
        missing = [name for name in required if name not in props]
        if missing:
            raise ValueError(f"json_schema requires {missing[0]!r} at {path} but 'properties' does not define it: "
                             "structured output would never produce it; add it to 'properties'")


def _json_special_in_pattern(regex: str) -> str | None:
    """How ``regex`` writes a double quote, a backslash or a control character (U+0000-U+001F)
    explicitly (raw, escaped or as a code), or None. xgrammar turns a pattern of literals and
    listed characters into grammar rules that emit such a character raw inside the JSON string."""
    i, n = 0, len(regex)
    while i < n:
        ch = regex[i]
        if ch == '"':
            return "a double quote"
        if ord(ch) < 0x20:
            return f"the control character U+{ord(ch):04X}"
        if ch == "\\" and i + 1 < n:
            e = regex[i + 1]
            if e in '"\\':
                return "a double quote" if e == '"' else "a backslash"
            if e in "nrtfv0c":
                return f"the control character \\{e}"
            digits = {"x": 2, "u": 4}.get(e)
            if digits:
                code = regex[i + 2:i + 2 + digits]
                if e == "u" and code.startswith("{"):
                    code = regex[i + 3:regex.find("}", i)] if "}" in regex[i:] else ""
                try:
                    value = int(code, 16)
                except ValueError:
                    value = None
                if value is not None and (value < 0x20 or value in (0x22, 0x5C)):
                    return f"the character U+{value:04X} (\\{e}{code})"
            i += 2
            continue
        i += 1
    return None


def _values_outside(values: list, siblings: dict) -> list:
    """The values that the sibling keywords exclude (all of them, when they constrain and
    ``jsonschema`` is not installed to tell)."""
    if not siblings:
        return []
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a test requirement
        return list(values)
    try:
        validator = jsonschema.Draft202012Validator(siblings)
        return [v for v in values if not validator.is_valid(v)]
    except (jsonschema.SchemaError, TypeError, ValueError, RecursionError):
        return []   # a malformed sibling: the meta-schema check reports it


_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
MAX_REPEAT = 2**31 - 1
"""Largest repetition count of a regex / EBNF quantifier ({n}, {n,m}): xgrammar keeps counts
in 32 bits, so a larger one is refused or, from 2**32 on, silently wrapped."""


def _check_repeat_counts(text: str, what: str) -> None:
    """Refuse a quantifier {n} / {n,} / {n,m} of `text` with a count above MAX_REPEAT."""
    for m in _REPEAT.finditer(text):
        for count in m.groups():
            if count and int(count) > MAX_REPEAT:
                raise ValueError(f"{what} has the quantifier {m.group(0)}: a repetition count must be at most "
                                 f"{MAX_REPEAT} (xgrammar holds counts in 32 bits)")


_XGRAMMAR_LETTER_ESCAPES = frozenset("acdefnrstvwDSW")
"""Letters xgrammar's regex parser reads after a backslash (\\d, \\n, \\cX ...); it refuses \\b \\B
\\k \\p \\P and reads \\x / \\u / \\U (8 hex digits) as codes, but any other letter it takes as
itself, with only a warning on stderr: \\A...\\Z, Python's anchors, would have the output begin
with "A"."""


def _misread_escape(regex: str) -> str | None:
    """Why an escape of ``regex`` would not mean what Python's ``re`` makes of it under
    xgrammar (which would match something else, silently), or None."""
    i, n = 0, len(regex)
    while i < n - 1:
        if regex[i] != "\\":
            i += 1
            continue
        e = regex[i + 1]
        if e in "AZz":
            return (f"the anchor \\{e}: a regex here always matches the whole output, so drop it "
                    f"(xgrammar would match the letter {e})")
        if e == "0":
            return "the escape \\0: xgrammar would match nothing there; write \\u0000 for the NUL character"
        if e == "U" and re.fullmatch(r"[0-9a-fA-F]{8}", regex[i + 2:i + 10]):
            i += 10   # \UXXXXXXXX, a code point (a bare \U is the letter)
            continue
        if e.isascii() and e.isalpha() and e not in _XGRAMMAR_LETTER_ESCAPES and e not in "bBkpPxu":
            return f"the escape \\{e}: xgrammar does not know it and would match the letter {e} there"
        i += 2
    return None


def _check_xgrammar_regex(regex: str, what: str) -> None:
    """Refuse a regex that xgrammar's regex parser does not accept (e.g. lookaround), reads
    otherwise than Python's ``re`` (an unknown letter escape), or with a count it cannot hold."""
    _check_repeat_counts(regex, what)
    misread = _misread_escape(regex)
    if misread:
        raise ValueError(f"{what} {_short(regex)} has {misread}")
    import xgrammar as xgr

    try:
        xgr.Grammar.from_regex(regex)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{what} {_short(regex)} is invalid: {clean_xgrammar_error(e)}") from None


def check_regex(regex) -> None:
    """A non-empty regex that xgrammar's regex parser accepts."""
    if not isinstance(regex, str):
        raise TypeError(f"regex must be a str, got {type(regex).__name__}")
    if not regex:
        raise ValueError("regex must not be empty")
    if len(regex) > MAX_SPEC_CHARS:
        raise ValueError(f"regex is too long ({len(regex)} characters, at most {MAX_SPEC_CHARS})")
    _check_xgrammar_regex(regex, "regex")


def check_choice(choice) -> None:
    """A non-empty list of non-empty strings."""
    if isinstance(choice, str) or not isinstance(choice, (list, tuple)):
        raise TypeError(f"choice must be a list of strings, got {type(choice).__name__}")
    if not choice:
        raise ValueError("choice must not be an empty list")
    for i, c in enumerate(choice):
        if not isinstance(c, str):
            raise TypeError(f"choice[{i}] must be a str, got {type(c).__name__}")
        if not c:
            raise ValueError(f"choice[{i}] is the empty string; every choice must be non-empty")
        if "\x00" in c:
            raise ValueError(f"choice[{i}] holds a NUL character, which structured output cannot produce")
    if sum(len(c) for c in choice) > MAX_SPEC_CHARS:
        raise ValueError(f"choice is too long (more than {MAX_SPEC_CHARS} characters in all)")


def check_ebnf(grammar) -> None:
    """A non-empty EBNF grammar with a ``root`` rule that xgrammar's parser accepts."""
    if not isinstance(grammar, str):
        raise TypeError(f"grammar must be a str (EBNF text), got {type(grammar).__name__}")
    if not grammar.strip():
        raise ValueError("grammar must not be empty")
    if len(grammar) > MAX_SPEC_CHARS:
        raise ValueError(f"grammar is too long ({len(grammar)} characters, at most {MAX_SPEC_CHARS})")
    _check_repeat_counts(grammar, "grammar")
    import xgrammar as xgr

    try:
        xgr.Grammar.from_ebnf(grammar)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"grammar is invalid EBNF: {clean_xgrammar_error(e)}") from None


def choice_to_ebnf(choice) -> str:
    """``root ::= "a" | "b"`` with each choice as an escaped EBNF string literal."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choice)


def _ebnf_literal(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            # \u and exactly 4 digits: xgrammar reads every hex digit after \x ("\x1bA1" was U+1BA1)
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_XGR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def clean_xgrammar_error(e: BaseException) -> str:
    """xgrammar's message without its ``[time] file.cc:line:`` prefix; an empty one (xgrammar
    raises RuntimeError('') on, e.g., a number past the float range) names the exception type."""
    text = _XGR_PREFIX.sub("", str(e).strip())
    return text or f"{type(e).__name__} without a message from xgrammar (e.g. a number out of the float range)"


def _short(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[:n] + "...")


def _read_text(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag}: cannot read {path!r}: {e.strerror}") from None
