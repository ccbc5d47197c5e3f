"""Load a GGUF file (llama / qwen2 architectures): config, dequantised weights, tokenizer.

Every tensor is dequantised to fp32 at load with ``gguf.quants.dequantize`` (F32
tensors come back as read-only memory maps, so they are copied first).

GGUF's llama converter permutes the rows of each head of the q and k projections so
that llama.cpp can apply *interleaved* rotary embedding (adjacent pairs) where HF
rotates the two halves of each head: per head, HF row ``p * d/2 + j`` becomes GGUF
row ``2 * j + p``. Either undo that (``rope_layout="rotate_half"``, the default, giving
HF-identical weights) or keep the file's rows and rotate interleaved pairs
(``rope_layout="interleaved"``): the two are the same model. Mixing them (file rows
with rotate-half rope) gives a perplexity near 130 instead of 15 on the default model;
tests/test_model_gguf.py checks all three. Qwen2's converter does not permute.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .config import ModelConfig
from .tokenizer import Tokenizer

# GGUF architecture -> (HF architecture, whether q/k rows are permuted for interleaved rope)
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
}
ROPE_LAYOUTS = ("rotate_half", "interleaved")


def open_gguf(path: str):
    """A ``gguf.GGUFReader`` whose file map is held as a plain ndarray view.

    The reader slices its map once per metadata string (~100k for a 49k-token vocabulary
    and its merges); slicing an ``np.memmap`` costs several times a plain view's, so this
    halves the open time. Falls back to the stock reader if that ever fails.
    """
    import gguf

    class _PlainMapReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain_map

        @data.setter
        def data(self, value):
            self._plain_map = np.asarray(value)  # same buffer, base ndarray class

    try:
        return _PlainMapReader(path)
    except Exception:  # noqa: BLE001 - retry with the stock reader, which reports the real error
        return gguf.GGUFReader(path)


def read_fields(reader) -> dict:
    """GGUF metadata as plain Python values (lists for arrays)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out


def unpermute_rows(w, num_heads: int):
    """Undo GGUF's llama q/k row permutation: weights [rows, in] or biases [rows], torch or numpy."""
    rows = w.shape[0]
    head_dim = rows // num_heads
    rest = tuple(w.shape[1:])
    return w.reshape(num_heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def permute_rows(w, num_heads: int):
    """GGUF's llama converter permutation (HF rows -> GGUF rows); the inverse of ``unpermute_rows``."""
    rows = w.shape[0]
    head_dim = rows // num_heads
    rest = tuple(w.shape[1:])
    return w.reshape(num_heads, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def config_from_fields(fields: dict) -> tuple[ModelConfig, bool]:
    """ModelConfig from GGUF metadata, and whether its q/k rows are permuted."""
    arch = fields.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF general.architecture {arch!r} is not supported; expected one of "
                         f"{sorted(GGUF_ARCHITECTURES)}")
    hf_arch, permuted = GGUF_ARCHITECTURES[arch]

    def get(key, default=None, required=True):
        full = f"{arch}.{key}"
        if full not in fields:
            if required:
                raise ValueError(f"GGUF file lacks metadata key {full!r}")
            return default
        return fields[full]

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads, required=False))
    head_dim = int(get("rope.dimension_count", hidden // heads, required=False))
    vocab = get("vocab_size", None, required=False)
    if vocab is None:
        vocab = len(fields.get("tokenizer.ggml.tokens") or [])
    eos = fields.get("tokenizer.ggml.eos_token_id")
    eot = fields.get("tokenizer.ggml.eot_token_id")
    eos_ids = list(dict.fromkeys(int(e) for e in (eos, eot) if e is not None))
    bos = fields.get("tokenizer.ggml.bos_token_id")
    scaling = _rope_scaling(get("rope.scaling.type", None, required=False),
                            get("rope.scaling.factor", None, required=False),
                            get("rope.scale_linear", None, required=False))
    config = ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=float(get("rope.freq_base", 10000.0, required=False)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6, required=False)),
        max_position_embeddings=int(get("context_length", 2048, required=False)),
        tie_word_embeddings=False,  # decided from the tensors below
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
        architecture=hf_arch,
        attention_bias=arch == "qwen2",
        rope_scaling=scaling,
    )
    return config, permuted


def _rope_scaling(kind, factor, scale_linear) -> dict | None:
    """ModelConfig.rope_scaling of GGUF's rope.scaling.type / .factor (or the older
    rope.scale_linear): linear scaling, or None; any other type is refused (not ignored)."""
    if kind is None and scale_linear is not None:
        kind, factor = "linear", scale_linear
    if kind in (None, "none"):
        return None
    if kind != "linear" or factor is None:
        raise ValueError(f"GGUF rope scaling type {kind!r} (factor {factor!r}) is not supported "
                         "(expected none or linear with a factor)")
    if not math.isfinite(float(factor)) or float(factor) <= 0:
        raise ValueError(f"GGUF rope scaling factor must be a finite number > 0, got {factor!r}")
    return None if float(factor) == 1.0 else {"rope_type": "linear", "factor": float(factor)}


def _dequantize(t) -> np.ndarray:
    from gguf.quants import dequantize

    if t.tensor_type.name == "F64":   # gguf-py has no dequantizer for it: a plain cast
        arr = np.asarray(t.data, dtype=np.float64).reshape(tuple(int(d) for d in reversed(t.shape)))
        return arr.astype(np.float32)
    try:
        arr = dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise ValueError(f"GGUF tensor {t.name}: GGML type {t.tensor_type.name} is not supported") from None
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    elif not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, dtype=np.float32, copy=True)  # F32 tensors are read-only memory maps
    return arr


def _tensor(*parts: np.ndarray) -> torch.Tensor:
    # numpy's single-threaded concatenate: torch.cat's threads stall on a busy 2-core machine.
    arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return torch.from_numpy(np.ascontiguousarray(arr))


def load_gguf(path: str, rope_layout: str = "rotate_half") -> tuple[ModelConfig, dict, Tokenizer]:
    """Read a GGUF file.

    Parameters
    ----------
    path : str
        The .gguf file.
    rope_layout : {"rotate_half", "interleaved"}
        How to reconcile the converter's q/k permutation (see the module docstring).

    Returns
    -------
    (ModelConfig, state_dict in LlamaForCausalLM names (fp32 CPU tensors), Tokenizer)

    Raises
    ------
    ValueError
        On unsupported architecture/tokenizer, missing metadata, missing or misshapen tensors.
    """
    if rope_layout not in ROPE_LAYOUTS:
        raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, got {rope_layout!r}")
    try:
        reader = open_gguf(path)
    except Exception as e:  # noqa: BLE001 - a corrupt file raises many kinds of errors
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e
    fields = read_fields(reader)
    config, permuted = config_from_fields(fields)
    tensors = {t.name: t for t in reader.tensors}
    config.tie_word_embeddings = "output.weight" not in tensors
    if rope_layout == "interleaved" and permuted:
        config.rope_interleaved = True
    c = config
    qs, kvs = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{path}: GGUF file is missing tensor {name!r}")
        w = _dequantize(tensors[name])
        if tuple(w.shape) != shape:
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
        return w

    def qk(name: str, shape: tuple[int, ...], heads: int) -> np.ndarray:
        w = take(name, shape)
        return unpermute_rows(w, heads) if permuted and rope_layout == "rotate_half" else w

    used = set()
    sd = {"embed_tokens.weight": _tensor(take("token_embd.weight", (c.vocab_size, c.hidden_size))),
          "norm.weight": _tensor(take("output_norm.weight", (c.hidden_size,)))}
    used |= {"token_embd.weight", "output_norm.weight"}
    if not c.tie_word_embeddings:
        sd["lm_head.weight"] = _tensor(take("output.weight", (c.vocab_size, c.hidden_size)))
        used.add("output.weight")
    for i in range(c.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        names = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                 "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
        used |= {b + n for n in names}
        sd[p + "input_norm.weight"] = _tensor(take(b + "attn_norm.weight", (c.hidden_size,)))
        sd[p + "qkv_proj.weight"] = _tensor(
            qk(b + "attn_q.weight", (qs, c.hidden_size), c.num_heads),
            qk(b + "attn_k.weight", (kvs, c.hidden_size), c.num_kv_heads),
            take(b + "attn_v.weight", (kvs, c.hidden_size)))
        if c.attention_bias:
            used |= {b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"}
            sd[p + "qkv_proj.bias"] = _tensor(
                qk(b + "attn_q.bias", (qs,), c.num_heads),
                qk(b + "attn_k.bias", (kvs,), c.num_kv_heads),
                take(b + "attn_v.bias", (kvs,)))
        sd[p + "o_proj.weight"] = _tensor(take(b + "attn_output.weight", (c.hidden_size, qs)))
        sd[p + "post_norm.weight"] = _tensor(take(b + "ffn_norm.weight", (c.hidden_size,)))
        sd[p + "gate_up_proj.weight"] = _tensor(
            take(b + "ffn_gate.weight", (c.intermediate_size, c.hidden_size)),
            take(b + "ffn_up.weight", (c.intermediate_size, c.hidden_size)))
        sd[p + "down_proj.weight"] = _tensor(take(b + "ffn_down.weight", (c.hidden_size, c.intermediate_size)))
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"{path}: GGUF tensors not supported by this loader: {unused[:8]} "
                         "(e.g. rope_freqs for Llama-3.1 rope scaling)")
    tokenizer = Tokenizer.from_gguf_fields(fields)
    return config, sd, tokenizer
