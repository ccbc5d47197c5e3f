"""Helpers for tests and benchmarks: tokenizers, bitmask decoding, constrained random walks."""

from __future__ import annotations

import functools

import numpy as np
import torch


def allowed_tokens(row: torch.Tensor, vocab_size: int) -> np.ndarray:
    """Ids whose bit is set in one bitmask row.

    row: torch.Tensor,  # [ceil(vocab/32)] int32
    """
    bits = np.unpackbits(row.contiguous().numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


@functools.lru_cache(maxsize=1)
def default_tokenizer():
    """The default model's tokenizer (SmolLM2-135M GGUF), read without loading any weights.

    Raises FileNotFoundError when the model package is not installed.
    """
    from ..model.loader import default_model_path
    from ..model.tokenizer import Tokenizer

    return Tokenizer.from_gguf_fields(read_gguf_metadata(default_model_path(), prefix="tokenizer."))


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: str, prefix: str = "") -> dict:
    """The key/value metadata of a GGUF file whose keys start with ``prefix`` (arrays as lists).

    Reads only the header, so it takes a fraction of a second where ``gguf.GGUFReader``
    (which also maps every tensor) takes seconds.
    """
    import struct

    with open(path, "rb") as f:
        data = f.read(1 << 16)
        pos = 0

        def need(n):
            nonlocal data
            while len(data) - pos < n:
                more = f.read(max(n, 1 << 20))
                if not more:
                    raise ValueError(f"{path}: truncated GGUF header")
                data = data[pos:] + more
                reset()

        def reset():
            nonlocal pos
            pos = 0

        def take(fmt):
            nonlocal pos
            size = struct.calcsize(fmt)
            need(size)
            v = struct.unpack_from(fmt, data, pos)[0]
            pos += size
            return v

        def string():
            nonlocal pos
            n = take("<Q")
            need(n)
            v = data[pos: pos + n].decode("utf-8", errors="replace")
            pos += n
            return v

        def value(t):
            if t == 8:
                return string()
            if t == 9:
                sub, count = take("<I"), take("<Q")
                return [value(sub) for _ in range(count)]
            if t not in _GGUF_SCALARS:
                raise ValueError(f"{path}: unknown GGUF value type {t}")
            return take(_GGUF_SCALARS[t])

        need(4)
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        pos = 4
        version = take("<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        take("<Q")  # tensor count
        out = {}
        for _ in range(take("<Q")):
            key = string()
            v = value(take("<I"))
            if key.startswith(prefix):
                out[key] = v
        return out


SMALL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_SMALL_MERGES = ['{ "', '" :', ': "', '" ,', '" }', 't r', 'tr u', 'tru e', 'f a', 'fa l', 'fal s', 'fals e',
                 'n u', 'nu l', 'nul l', '1 2', '- 1', '0 .', 'a b', 'ab c', 'Ġ "', '" ]', '[ "', ', Ġ', '< /',
                 'a a', 'aa aa', 'x y', '" "', '\\ n']


@functools.lru_cache(maxsize=1)
def small_tokenizer():
    """A byte-level BPE tokenizer of 3 + 256 + 30 = 289 tokens (a vocabulary that is no multiple of 32).

    Ids 0-2 are control tokens (``<|im_end|>`` = 2 is end of sequence), then the 256 byte
    symbols of GPT-2's byte-level alphabet, then merged tokens like ``{"``, ``true``, ``null``.
    """
    import tokenizers
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    from ..model.tokenizer import Tokenizer

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # Order the 256 byte symbols by the byte they stand for.
    byte_syms = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {t: i for i, t in enumerate(SMALL_SPECIALS)}
    for ch in byte_syms:
        vocab[ch] = len(vocab)
    merges = []
    for m in _SMALL_MERGES:
        a, b = m.split(" ")
        a, b = _bl(a), _bl(b)
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SMALL_SPECIALS])
    return Tokenizer(tok, eos_token_ids=[2])


def _bl(s: str) -> str:
    """Byte-level spelling of ASCII text (space -> Ġ); already byte-level symbols pass through."""
    return "".join("Ġ" if ch == " " else ch for ch in s)


@functools.lru_cache(maxsize=None)
def _byte_map() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _byte_of(ch: str) -> int:
    return _byte_map()[ch]


def random_walk(state, vocab_size: int, rng: np.random.Generator, max_tokens: int = 200,
                stop_prob: float = 0.5, stop_token_ids: tuple[int, ...] = ()) -> tuple[list[int], bool]:
    """Sample uniformly among the allowed tokens until the grammar terminates.

    When a stop token is allowed it is taken with probability ``stop_prob`` (so walks end);
    otherwise a token is drawn uniformly from the other allowed ones.

    Returns
    -------
    (tokens, terminated) : the tokens without the final stop token, and whether it was reached.
    """
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    stops = set(stop_token_ids)
    out: list[int] = []
    for _ in range(max_tokens):
        state.fill_bitmask(bitmask, 0)
        allowed = allowed_tokens(bitmask[0], vocab_size)
        if len(allowed) == 0:
            raise AssertionError(f"dead end: no token allowed after {out}")
        is_stop = np.isin(allowed, list(stops)) if stops else np.zeros(len(allowed), dtype=bool)
        can_stop = [int(t) for t in allowed[is_stop]]
        others = allowed[~is_stop]
        if can_stop and (len(others) == 0 or rng.random() < stop_prob):
            tok = can_stop[0]
        else:
            tok = int(rng.choice(others))
        if not state.advance(tok):
            raise AssertionError(f"token {tok} was allowed by the bitmask but rejected by the matcher")
        if state.is_terminated():
            return out, True
        out.append(tok)
    return out, False
