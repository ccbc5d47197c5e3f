"""SamplingParams: what one request asks of the last step of decoding, checked on arrival."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from specops.sampling.metadata import FP32_MAX, FP32_TINY


@dataclass
class SamplingParams:
    """Per-request sampling and stopping parameters (vLLM conventions).

    Parameters
    ----------
    n : int
        Number of independent completions of the prompt (they share its prefix-cache blocks).
    temperature : float
        0 means greedy (argmax); > 0 divides the logits before sampling.
    top_k : int
        Keep the k most likely tokens; 0 or -1 means off.
    top_p : float
        Keep the smallest set of most likely tokens whose probability reaches top_p; 1 means off.
    min_p : float
        Drop tokens whose probability is below min_p times the largest one; 0 means off.
    repetition_penalty : float
        Divides positive (multiplies negative) logits of tokens seen in the prompt or output; 1 means off.
        At least 1.18e-38 (the smallest normal float32) and at most float32's max.
    frequency_penalty, presence_penalty : float
        Subtract penalty * count(token in output) and penalty * [token in output]; 0 means off.
    logit_bias : dict[int, float] or None
        Added to the logits of the given token ids.
    allowed_token_ids : list[int] or None
        Only these tokens can be sampled.
    bad_words : list[str] or None
        Words that are never completed: the last token of a word is banned when the output ends
        with the word's other tokens.
    min_tokens : int
        End-of-sequence and stop tokens are banned until this many tokens were generated, and a
        stop string only counts when it ends in the text of a later token (as in vLLM).
    max_tokens : int or None
        Generate at most this many tokens (None: until the context is full).
    stop : list[str] or None
        Generation stops when the text contains one of these; it is cut off before it
        unless include_stop_str_in_output.
    stop_token_ids : list[int] or None
        Generation stops after one of these tokens (kept in the token ids, not in the text).
    ignore_eos : bool
        Keep going past end-of-sequence tokens.
    seed : int or None
        Per-request seed: the request's draws depend only on it, its inputs and the position.
        None: the request draws from the engine's seed (`EngineConfig.seed`, 0 by default, as
        vLLM's) and step counter, so the same run repeats in a new process.
        With n > 1, sample i uses seed + i (so seed + n - 1 must fit an int64).
    logprobs : int or None
        Return the log-probabilities of this many most likely tokens (and of the sampled one),
        before temperature, penalties and filters but, with structured output, after the
        grammar mask (as vLLM v1: tokens the grammar forbids are at -inf).
    skip_special_tokens : bool
        Leave special tokens out of the text.
    structured_outputs : StructuredOutputOptions, dict or None
        Constrain the output to a JSON schema, any JSON object, a regex, a choice list or an
        EBNF grammar (``specops.engine.structured_output.StructuredOutputOptions``; a dict
        of its fields is converted). Checked on arrival; the grammar compiles off the step loop.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    min_tokens: int = 0
    max_tokens: int | None = 256
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    extra_args: dict = field(default_factory=dict)
    structured_outputs: object = None

    MAX_N = 64
    MAX_LOGPROBS = 20

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        if isinstance(self.structured_outputs, dict):
            from .structured_output.options import StructuredOutputOptions

            self.structured_outputs = StructuredOutputOptions(**self.structured_outputs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError/TypeError naming the first bad field and what it must be."""
        _int("n", self.n, lo=1, hi=self.MAX_N)
        _num("temperature", self.temperature, lo=0.0, hi=FP32_MAX)
        _int("top_k", self.top_k, lo=-1)
        if vocab_size is not None and self.top_k > vocab_size:
            raise ValueError(f"top_k must be -1, 0 (off) or at most the vocabulary size {vocab_size}, "
                             f"got {self.top_k}")
        _num("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _num("min_p", self.min_p, lo=0.0, hi=1.0)
        # below the smallest normal fp32 a penalty is 0 or subnormal on the device: logits / it overflow
        _num("repetition_penalty", self.repetition_penalty, lo=FP32_TINY, hi=FP32_MAX)
        _num("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        _num("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _int("min_tokens", self.min_tokens, lo=0)
        if self.max_tokens is not None:
            _int("max_tokens", self.max_tokens, lo=1)
            if self.min_tokens > self.max_tokens:
                raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")
        if self.seed is not None:
            # with n > 1, sample i takes seed + i: every one must be an int64
            _int("seed", self.seed, lo=-(2**63), hi=2**63 - self.n)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, lo=0, hi=self.MAX_LOGPROBS if vocab_size is None
                 else min(self.MAX_LOGPROBS, vocab_size))
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise TypeError(f"logit_bias must be a dict {{token_id: bias}}, got {type(self.logit_bias).__name__}")
            for tok, bias in self.logit_bias.items():
                _token("logit_bias", tok, vocab_size)
                _num(f"logit_bias[{tok}]", bias, lo=-100.0, hi=100.0)
        if self.allowed_token_ids is not None:
            _token_list("allowed_token_ids", self.allowed_token_ids, vocab_size)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty (use None for no restriction)")
        if self.stop_token_ids is not None:
            _token_list("stop_token_ids", self.stop_token_ids, vocab_size)
        for name in ("stop", "bad_words"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
                raise TypeError(f"{name} must be a list of strings, got {value!r}")
            for s in value:   # the tokenizer encodes them: no lone surrogates
                check_unicode(name, s)
            if any(s == "" for s in value):
                raise ValueError(f"{name} must not contain the empty string")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.extra_args, (dict, type(None))):
            raise TypeError(f"extra_args must be a dict, got {type(self.extra_args).__name__}")
        own_k = (self.extra_args or {}).get("num_spec_tokens")
        if own_k is not None and (isinstance(own_k, bool) or not isinstance(own_k, int) or own_k < 0):
            raise ValueError(f"extra_args['num_spec_tokens'] (this request's most drafts per step) must be an "
                             f"int >= 0, got {own_k!r}")
        if self.structured_outputs is not None:
            from .structured_output.options import StructuredOutputOptions

            if not isinstance(self.structured_outputs, StructuredOutputOptions):
                raise TypeError("structured_outputs must be None or a StructuredOutputOptions, "
                                f"got {type(self.structured_outputs).__name__}")
            self.structured_outputs.validate(check_meta_schema=False)  # cheap; the rest in the compile pool

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("extra_args", "structured_outputs")]


def _num(name: str, value, lo: float | None = None, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:   # e.g. 10**400 from a JSON line: not a float at all
            raise ValueError(f"{name} must be in [{lo if lo is not None else '-inf'}, "
                             f"{hi if hi is not None else 'inf'}], got an int of {value.bit_length()} bits") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if lo is not None and value < lo or hi is not None and value > hi:
        raise ValueError(f"{name} must be in [{lo if lo is not None else '-inf'}, "
                         f"{hi if hi is not None else 'inf'}], got {value}")


def _int(name: str, value, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if lo is not None and value < lo or hi is not None and value > hi:
        raise ValueError(f"{name} must be in [{lo if lo is not None else '-inf'}, "
                         f"{hi if hi is not None else 'inf'}], got {value}")


def _token(name: str, tok, vocab_size: int | None) -> None:
    if isinstance(tok, bool) or not isinstance(tok, int):
        raise TypeError(f"{name} must hold int token ids, got {tok!r}")
    if tok < 0 or vocab_size is not None and tok >= vocab_size:
        vocab = f"[0, {vocab_size})" if vocab_size is not None else "(token ids are >= 0)"
        raise ValueError(f"{name}: token id {tok} is outside the vocabulary {vocab}")


def _token_list(name: str, toks, vocab_size: int | None) -> None:
    if not isinstance(toks, (list, tuple)):
        raise TypeError(f"{name} must be a list of token ids, got {toks!r}")
    for tok in toks:
        _token(name, tok, vocab_size)


def check_unicode(name: str, text: str) -> None:
    """`text` must encode as UTF-8 (a lone surrogate such as "\\ud800", which JSON can carry, does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be valid Unicode text, got {text[:40]!r} (a lone surrogate at "
                         f"index {exc.start})") from None
