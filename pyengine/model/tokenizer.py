"""Tokenizer: a `tokenizers` tokenizer plus the model's special tokens and jinja2 chat template.

Built from a HF directory (tokenizer.json, tokenizer_config.json, chat_template.jinja)
or from GGUF metadata (byte-level BPE rebuilt from the file's tokens and merges).
"""

from __future__ import annotations

import datetime
import json
import os

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

# GGUF token types (llama.cpp's llama_token_type).
GGUF_TOKEN_NORMAL, GGUF_TOKEN_CONTROL, GGUF_TOKEN_USER_DEFINED = 1, 3, 4

# Pre-tokenizer regexes of the GGUF "tokenizer.ggml.pre" names we know (llama.cpp's names).
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                   r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# llama.cpp's LLAMA3 pre-tokenizer type: merges ignored when the word is a token, BOS added
# unless the file says otherwise (Llama-3's tokenizer.json has "ignore_merges": true too)
_LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")


def _gguf_pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("smollm", "default", "gpt-2", "gpt2", "starcoder"):
        # smollm / starcoder (llama.cpp's STARCODER and SMOLLM types, SmolLM's tokenizer.json):
        # digits split one by one, then GPT-2's byte-level regex
        first = [pre_tokenizers.Digits(individual_digits=True)] if pre in ("smollm", "starcoder") else []
        return pre_tokenizers.Sequence(first + [pre_tokenizers.ByteLevel(add_prefix_space=False)])
    if pre in _LLAMA3_NAMES + ("smaug-bpe",):
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(tokenizers.Regex(_LLAMA3_PATTERN), "isolated"), byte_level])
    if pre in ("qwen2",):
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(tokenizers.Regex(_QWEN2_PATTERN), "isolated"), byte_level])
    raise ValueError(f"GGUF tokenizer.ggml.pre {pre!r} is not supported "
                     "(known: smollm, gpt2/default, llama-bpe, qwen2); load the HF directory instead")


def _chat_environment():
    """The jinja2 environment chat templates are written for (transformers'): sandboxed, trimmed
    blocks, `{% break %}` / `{% continue %}`, `tojson` keeping non-ASCII text and `<`, `>`, `&`
    as they are (jinja2's own escapes them for HTML), `raise_exception` and `strftime_now`."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def check_messages(messages) -> None:
    """Raise ValueError unless ``messages`` is a non-empty list of chat messages: dicts with a
    string "role" and a string "content" (the keys every chat template reads)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role': str, 'content': str}} dicts, "
                         f"got {type(messages).__name__ if not isinstance(messages, list) else 'an empty list'}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                got = "nothing" if key not in m else type(m[key]).__name__
                raise ValueError(f"messages[{i}][{key!r}] must be a string, got {got}")


class Tokenizer:
    """Text <-> token ids for one model, with its special tokens and chat template.

    Attributes
    ----------
    eos_token_ids : list[int]
        Tokens that end generation.
    bos_token_id : int | None
    vocab_size : int
        Number of ids the tokenizer knows (may be smaller than the model's logits width).
    chat_template : str | None
        jinja2 source, or None when the model ships none.
    """

    def __init__(self, tok: tokenizers.Tokenizer, eos_token_ids: list[int], bos_token_id: int | None = None,
                 chat_template: str | None = None, add_bos: bool = False):
        self._tok = tok
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template
        self.add_bos = add_bos
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._template = None

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_hf_dir(cls, path: str, config_eos_ids: list[int] | None = None,
                    bos_token_id: int | None = None) -> "Tokenizer":
        """Load tokenizer.json (+ tokenizer_config.json, chat_template.jinja, generation_config.json)."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise ValueError(f"{path}: no tokenizer.json (a HF-layout model directory needs one)")
        try:
            tok = tokenizers.Tokenizer.from_file(tj)
        except Exception as exc:   # noqa: BLE001 - the tokenizers library raises a bare Exception
            raise ValueError(f"{tj}: not a readable tokenizer file ({exc})") from None
        tc_path = os.path.join(path, "tokenizer_config.json")
        tcfg = _read_json(tc_path)
        gcfg = _read_json(os.path.join(path, "generation_config.json"))
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            if not all(isinstance(t, dict) for t in template):
                raise ValueError(f'{tc_path}: chat_template must be a string or a list of {{"name": ..., '
                                 f'"template": ...}} objects, got {json.dumps(template)[:60]}')
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if template is not None and not isinstance(template, str):
            raise ValueError(f"{tc_path}: chat_template must be a string (jinja2 source), got "
                             f"{type(template).__name__}")
        jinja_file = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()
        eos = list(config_eos_ids or [])
        gen_eos = gcfg.get("eos_token_id")
        for e in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])):
            if e not in eos:
                eos.append(e)
        eos_text = _token_text(tcfg.get("eos_token"), "eos_token", tc_path)
        if eos_text is not None and tok.token_to_id(eos_text) is not None and tok.token_to_id(eos_text) not in eos:
            eos.append(tok.token_to_id(eos_text))
        bos_text = _token_text(tcfg.get("bos_token"), "bos_token", tc_path)
        if bos_token_id is None and bos_text is not None:
            bos_token_id = tok.token_to_id(bos_text)
        return cls(tok, eos, bos_token_id, template, add_bos=False)

    @classmethod
    def from_gguf_fields(cls, fields: dict) -> "Tokenizer":
        """Rebuild the tokenizer from GGUF metadata (``tokenizer.ggml.*``, ``tokenizer.chat_template``).

        ``fields`` maps metadata keys to Python values (lists for arrays).
        """
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE 'gpt2'); "
                             "load the HF directory instead")
        tokens = fields.get("tokenizer.ggml.tokens")
        merges = fields.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ValueError("GGUF file lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
        types = fields.get("tokenizer.ggml.token_type") or [GGUF_TOKEN_NORMAL] * len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        pre = fields.get("tokenizer.ggml.pre", "default")
        llama3 = pre in _LLAMA3_NAMES   # llama.cpp: ignore_merges (a word in the vocabulary is one token), BOS
        tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=llama3))
        tok.pre_tokenizer = _gguf_pre_tokenizer(pre)
        tok.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False)
                    for t, ty in zip(tokens, types) if ty == GGUF_TOKEN_CONTROL]
        user = [AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types) if ty == GGUF_TOKEN_USER_DEFINED]
        tok.add_special_tokens(specials)
        if user:
            tok.add_tokens(user)
        if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise ValueError("GGUF tokenizer: rebuilt vocabulary does not match the file's token list")
        eos = fields.get("tokenizer.ggml.eos_token_id")
        eot = fields.get("tokenizer.ggml.eot_token_id")
        eos_ids = [int(e) for e in (eos, eot) if e is not None]
        eos_ids = list(dict.fromkeys(eos_ids))
        bos = fields.get("tokenizer.ggml.bos_token_id")
        return cls(tok, eos_ids, None if bos is None else int(bos), fields.get("tokenizer.chat_template"),
                   add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", llama3)))

    # ---- the interface the engine uses ------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token strings in it (e.g. ``<|im_start|>``) map to their ids.

        ``add_special_tokens`` lets the tokenizer add its BOS (HF post-processor, or GGUF
        ``add_bos_token``), except to text that starts with it (rendered by a chat template
        that writes its own): that text keeps one BOS, not two.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        if add_special_tokens and bos is not None and ids[:2] == [bos, bos] and text.startswith(self.id_to_token(bos)):
            ids = ids[1:]  # the text has its BOS already (a chat template wrote it): not a second one
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; ids outside the tokenizer's vocabulary (a model wider than it) are dropped."""
        ids = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        """The raw vocabulary string of token ``i`` (byte-level form, e.g. ``'Ġthe'``); '' if unknown."""
        t = self._tok.id_to_token(int(i))
        return "" if t is None else t

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def special_token_ids(self) -> list[int]:
        """Ids of the special (control) tokens."""
        return sorted(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}, ...]) with the model's chat template."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; pass plain prompts instead of chat messages")
        check_messages(messages)
        import jinja2

        if self._template is None:
            try:
                self._template = _chat_environment().from_string(self.chat_template)
            except jinja2.TemplateError as exc:
                raise ValueError(f"this model's chat template does not compile: {type(exc).__name__}: {exc}") from None
        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos, eos_token=eos)
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError) as exc:
            # a message the template cannot use (e.g. a key it needs that check_messages lets pass)
            raise ValueError(f"chat template could not render these messages: {type(exc).__name__}: {exc}") from None

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def __len__(self) -> int:
        return self.vocab_size


def _read_json(path: str) -> dict:
    """The JSON object in `path` ({} when there is no such file); ValueError naming the file when
    it is not UTF-8 JSON or not an object."""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except ValueError as exc:   # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _token_text(t, name: str = "token", where: str = "tokenizer_config.json") -> str | None:
    """The text of a special token written as a string or {"content": str} (None when absent);
    ValueError naming `name` and the file `where` otherwise."""
    if isinstance(t, dict):
        t = t.get("content")
    if t is not None and not isinstance(t, str):
        raise ValueError(f"{where}: {name} must be a string or {{\"content\": string}}, got {json.dumps(t)[:60]}")
    return t
