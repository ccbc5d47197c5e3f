"""The xgrammar backend: the vocabulary as xgrammar sees it, and grammar compilation.

``make_tokenizer_info`` turns the engine's Tokenizer into an ``xgrammar.TokenizerInfo``:
byte-level tokens in their raw vocabulary form, control (special) tokens as "" so that
xgrammar never allows them anywhere (otherwise ``<|im_start|>`` reads as literal text and
is allowed inside a JSON string), the end-of-sequence ids as stop tokens, and the model's
logits width as the vocabulary size (ids past the tokenizer's are never allowed).
"""

from __future__ import annotations

import json
import re

from .options import (StructuredOutputOptions, check_json_schema_meta, clean_xgrammar_error, parse_json_schema,
                      schema_dicts)


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words of one bitmask row: ceil(vocab_size / 32)."""
    return (int(vocab_size) + 31) // 32


def detect_vocab_type(tokenizer) -> str:
    """'byte_level' (GPT-2 style, the default), 'byte_fallback' (SentencePiece style) or 'raw'."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None or not hasattr(backend, "to_str"):
        return "byte_level"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {p.get("type") for p in parts if isinstance(p, dict)}
    if "ByteLevel" in types:
        return "byte_level"
    if "ByteFallback" in types:
        return "byte_fallback"
    return "raw"


def make_tokenizer_info(tokenizer, vocab_size: int | None = None, stop_token_ids: list[int] | None = None):
    """An ``xgrammar.TokenizerInfo`` for the engine's tokenizer.

    Parameters
    ----------
    tokenizer : pyengine.model.tokenizer.Tokenizer (or anything with ``vocab_size``,
        ``id_to_token(i)``, ``eos_token_ids`` and optionally ``special_token_ids``, ``backend``)
    vocab_size : int | None
        The model's logits width; None = the tokenizer's. Tokenizer ids at or past it (added
        tokens the model cannot produce) are left out of the grammar's vocabulary.
    stop_token_ids : list[int] | None
        Tokens that end a grammar's output; None = ``tokenizer.eos_token_ids``.

    Returns
    -------
    xgrammar.TokenizerInfo
    """
    import xgrammar as xgr

    n = int(tokenizer.vocab_size)
    vocab_size = n if vocab_size is None else int(vocab_size)
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be at least 1, got {vocab_size}")
    n = min(n, vocab_size)   # ids past the logits never come out
    if stop_token_ids is None:   # the tokenizer's EOS ids the model can produce
        stops = [s for s in tokenizer.eos_token_ids if int(s) < vocab_size]
    else:
        stops = list(stop_token_ids)
    if not stops:
        why = "" if stop_token_ids is not None else f" (no EOS id of the tokenizer is below the logits' width {vocab_size})"
        raise ValueError(f"stop_token_ids must not be empty: a grammar needs a token that ends the output{why}")
    for s in stops:
        if not 0 <= int(s) < vocab_size:
            raise ValueError(f"stop token id {s} is outside the vocabulary [0, {vocab_size})")
    specials = set(getattr(tokenizer, "special_token_ids", ())) | set(stops)
    vocab = ["" if i in specials else tokenizer.id_to_token(i) for i in range(n)]
    kind = detect_vocab_type(tokenizer)
    vocab_type = {"byte_level": xgr.VocabType.BYTE_LEVEL, "byte_fallback": xgr.VocabType.BYTE_FALLBACK,
                  "raw": xgr.VocabType.RAW}[kind]
    add_prefix_space = kind == "byte_fallback"
    return xgr.TokenizerInfo(vocab, vocab_type, vocab_size=vocab_size, stop_token_ids=[int(s) for s in stops],
                             add_prefix_space=add_prefix_space)


_BOUNDED_STRING_CLASS = r'[^\"\\\r\n]'
_JSON_STRING_CHAR_CLASS = r'[^\0-\x1f\"\\]'


_SURROGATES = r"\ud800-\udfff"
_CLASS_ESCAPES = {"0": 0, "a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "e": 27}


def _class_without_surrogates(part: str) -> str:
    """A positive character class ``[...]`` with U+D800-U+DFFF cut out of its ranges (e.g. a
    regex "." is [\\0-\\U0010ffff]); unchanged when it holds none, or when it cannot be read."""
    body, ranges, i = part[1:-1], [], 0

    def char(i: int) -> tuple[int, int]:   # (code point, next index)
        if body[i] != "\\":
            return ord(body[i]), i + 1
        e = body[i + 1]
        digits = {"x": 2, "u": 4, "U": 8}.get(e)
        if digits:
            return int(body[i + 2:i + 2 + digits], 16), i + 2 + digits
        return _CLASS_ESCAPES.get(e, ord(e)), i + 2

    try:
        while i < len(body):
            lo, i = char(i)
            hi = lo
            if i + 1 < len(body) and body[i] == "-":
                hi, i = char(i + 1)
            ranges.append((lo, hi))
    except (IndexError, ValueError):
        return part
    if not any(lo <= 0xDFFF and hi >= 0xD800 for lo, hi in ranges):
        return part
    kept = []
    for lo, hi in ranges:
        kept += [(a, b) for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)) if a <= b]
    return "[" + "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in kept) + "]"


def without_surrogates(ebnf: str) -> str:
    """``ebnf`` with U+D800-U+DFFF taken out of every character class: xgrammar matches a
    surrogate code point as its 3-byte encoding (ED A0..BF xx), which is not UTF-8, so the
    output text got U+FFFD where the grammar saw one character. String literals and comments
    are left as they are."""
    out, i, n = [], 0, len(ebnf)
    while i < n:
        ch = ebnf[i]
        if ch in "\"[":   # a string literal or a character class: copy it whole, escapes included
            close = "\"" if ch == "\"" else "]"
            j = i + 1
            while j < n and ebnf[j] != close:
                j += 2 if ebnf[j] == "\\" else 1
            part = ebnf[i:j + 1]
            if ch == "[" and part.startswith("[^"):
                part = "[^" + _SURROGATES + part[2:]
            elif ch == "[":
                part = _class_without_surrogates(part)
            out.append(part)
            i = j + 1
        elif ch == "#":   # a comment, to the end of its line
            j = ebnf.find("\n", i)
            j = n if j < 0 else j
            out.append(ebnf[i:j])
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


class XgrammarBackend:
    """Compiles StructuredOutputOptions into xgrammar CompiledGrammars for one vocabulary.

    Thread-safe: the compiler pool calls ``compile`` from several threads (xgrammar
    releases the GIL while compiling).

    Parameters
    ----------
    tokenizer_info : xgrammar.TokenizerInfo
    max_threads : int
        Threads xgrammar uses inside one compilation.
    cache_enabled : bool
        xgrammar's own compile cache (the pool keeps one of its own in front of it).
    """

    def __init__(self, tokenizer_info, max_threads: int = 1, cache_enabled: bool = True):
        import xgrammar as xgr

        self._xgr = xgr
        self.tokenizer_info = tokenizer_info
        self.vocab_size = int(tokenizer_info.vocab_size)
        self.stop_token_ids = list(tokenizer_info.stop_token_ids)
        self.compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=cache_enabled)

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int | None = None, **kwargs) -> "XgrammarBackend":
        """Backend for the engine's tokenizer (see ``make_tokenizer_info``)."""
        return cls(make_tokenizer_info(tokenizer, vocab_size), **kwargs)

    @property
    def bitmask_width(self) -> int:
        return bitmask_width(self.vocab_size)

    def compile(self, options: StructuredOutputOptions):
        """Compile ``options`` (validated, meta-schema check aside); ValueError naming the problem on failure.

        Also rejects a grammar that accepts no output at all (e.g. ``[^\\s\\S]`` or
        contradictory bounds), found as an empty bitmask in the initial state.
        """
        kind, text = options.spec()
        if kind == "json_schema":
            check_json_schema_meta(parse_json_schema(options.json_schema))  # left out of validate() on arrival
        xgr = self._xgr
        try:
            if kind == "json_schema":
                ebnf = self._json_schema_ebnf(text, options.any_whitespace)
            elif kind == "json_object":
                ebnf = str(xgr.Grammar.from_json_schema('{"type":"object"}', any_whitespace=options.any_whitespace,
                                                        strict_mode=False))
            elif kind == "regex":
                ebnf = str(xgr.Grammar.from_regex(text))
            else:  # choice, grammar
                ebnf = text
            compiled = self.compiler.compile_grammar(without_surrogates(ebnf))
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{kind}: cannot compile: {clean_xgrammar_error(e)}") from None
        if not self._accepts_something(compiled):
            raise ValueError(f"{kind}: the specification accepts no output (no token is allowed at the start)")
        return compiled

    def _json_schema_ebnf(self, schema: str, any_whitespace: bool) -> str:
        # xgrammar (0.2.x) writes length-bounded strings (minLength/maxLength) with the class
        # [^"\\\r\n], which lets raw control characters into a JSON string (invalid JSON).
        # Rewrite that class to exclude U+0000-U+001F, as its unbounded strings do.
        ebnf = str(self._xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace, strict_mode=True))
        self._check_number_ranges(json.loads(schema))
        return ebnf.replace(_BOUNDED_STRING_CLASS, _JSON_STRING_CHAR_CLASS)

    def _check_number_ranges(self, schema) -> None:
        """A number range holding no value of at most 6 decimals (e.g. minimum 1.123456789 with
        maximum 1.12345679) compiles to a rule for the empty string, and the output had no value
        there ({"x": }): compile each bounded number subschema alone and refuse such a range."""
        for node in schema_dicts(schema):
            bounds = {k: v for k, v in node.items() if k in _NUMBER_BOUNDS}
            if node.get("type") != "number" or not bounds:
                continue
            alone = str(self._xgr.Grammar.from_json_schema(json.dumps({"type": "number", **bounds}), strict_mode=True))
            if re.search(r'^\S+ ::= \(""\)$', alone, flags=re.MULTILINE):
                raise ValueError(f"the number range {json.dumps(bounds)} holds no value that structured output "
                                 "can write (it writes at most 6 decimals); widen the range")

    def new_matcher(self, compiled):
        """A fresh ``xgrammar.GrammarMatcher`` at the start of ``compiled``."""
        return self._xgr.GrammarMatcher(compiled)

    def _accepts_something(self, compiled) -> bool:
        import torch

        m = self._xgr.GrammarMatcher(compiled)
        row = torch.zeros((1, self.bitmask_width), dtype=torch.int32)
        m.fill_next_token_bitmask(row, 0)
        return bool(row.any())
