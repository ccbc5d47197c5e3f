"""The xgrammar backend: the vocabulary as xgrammar sees it, and grammar compilation.

``make_tokenizer_info`` turns the engine's Tokenizer into an ``xgrammar.TokenizerInfo``:
byte-level tokens in their raw vocabulary form, control (special) tokens as "" so that
xgrammar never allows them anywhere (otherwise ``<|im_start|>`` reads as literal text and
is allowed inside a JSON string), the end-of-sequence ids as stop tokens, and the model's
logits width as the vocabulary size (ids past the tokenizer's are never allowed).
"""

from __future__ import annotations

import json

from .options import StructuredOutputOptions, check_json_schema_meta, clean_xgrammar_error, parse_json_schema


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
        The model's logits width (>= the tokenizer's vocabulary); None = the tokenizer's.
    stop_token_ids : list[int] | None
        Tokens that end a grammar's output; None = ``tokenizer.eos_token_ids``.

    Returns
    -------
    xgrammar.TokenizerInfo
    """
    import xgrammar as xgr

    n = int(tokenizer.vocab_size)
    vocab_size = n if vocab_size is None else int(vocab_size)
    if vocab_size < n:
        raise ValueError(f"vocab_size ({vocab_size}) must be at least the tokenizer's vocabulary size ({n})")
    stops = list(tokenizer.eos_token_ids if stop_token_ids is None else stop_token_ids)
    if not stops:
        raise ValueError("stop_token_ids must not be empty: a grammar needs a token that ends the output")
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
        c = self.compiler
        try:
            if kind == "json_schema":
                compiled = self._compile_json_schema(text, options.any_whitespace)
            elif kind == "json_object":
                compiled = c.compile_json_schema('{"type":"object"}', any_whitespace=options.any_whitespace,
                                                 strict_mode=False)
            elif kind == "regex":
                compiled = c.compile_regex(text)
            else:  # choice, grammar
                compiled = c.compile_grammar(text)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"{kind}: cannot compile: {clean_xgrammar_error(e)}") from None
        if not self._accepts_something(compiled):
            raise ValueError(f"{kind}: the specification accepts no output (no token is allowed at the start)")
        return compiled

    def _compile_json_schema(self, schema: str, any_whitespace: bool):
        # xgrammar (0.2.x) writes length-bounded strings (minLength/maxLength) with the class
        # [^"\\\r\n], which lets raw control characters into a JSON string (invalid JSON).
        # Rewrite that class to exclude U+0000-U+001F, as its unbounded strings do.
        xgr = self._xgr
        ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace, strict_mode=True))
        fixed = ebnf.replace(_BOUNDED_STRING_CLASS, _JSON_STRING_CHAR_CLASS)
        if fixed == ebnf:
            return self.compiler.compile_json_schema(schema, any_whitespace=any_whitespace, strict_mode=True)
        return self.compiler.compile_grammar(fixed)

    def new_matcher(self, compiled):
        """A fresh ``xgrammar.GrammarMatcher`` at the start of ``compiled``."""
        return self._xgr.GrammarMatcher(compiled)

    def _accepts_something(self, compiled) -> bool:
        import torch

        m = self._xgr.GrammarMatcher(compiled)
        row = torch.zeros((1, self.bitmask_width), dtype=torch.int32)
        m.fill_next_token_bitmask(row, 0)
        return bool(row.any())
