"""GGUF metadata and tensor types without a model file: the tokenizer rebuilt from
``tokenizer.ggml.*`` as llama.cpp reads it, and tensor types gguf-py cannot dequantize."""

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from specops.engine.model.tokenizer import Tokenizer

ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def _byte_level(text: str) -> str:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)[0][0]


def _fields(pre, tokens, merges, specials, **extra):
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3] * specials + [1] * (len(tokens) - specials),
            "tokenizer.ggml.merges": merges, **extra}


def test_llama3_gguf_tokenizer_takes_whole_words_from_the_vocabulary_and_adds_bos():
    """pre = llama-bpe (Llama 3): llama.cpp, like Llama-3's tokenizer.json ("ignore_merges": true),
    takes a pre-token found in the vocabulary as one token before any merge (llama.cpp PR 7193's
    " Việt"), and adds BOS unless the file says add_bos_token = false."""
    whole = _byte_level(" Việt")
    tokens = ["<|begin_of_text|>", "<|eot_id|>"] + ALPHABET + ["ĠV", "ĠVi", "á»", "á»ĩ", whole]
    merges = ["Ġ V", "ĠV i", "á »", "á» ĩ"]              # no chain of merges reaches the whole word
    ids = {"tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}
    tok = Tokenizer.from_gguf_fields(_fields("llama-bpe", tokens, merges, 2, **ids))
    assert tok.encode(" Việt", add_special_tokens=False) == [len(tokens) - 1]
    assert tok.add_bos and tok.encode(" Việt") == [0, len(tokens) - 1]
    no_bos = Tokenizer.from_gguf_fields(_fields("llama-bpe", tokens, merges, 2, **ids,
                                                **{"tokenizer.ggml.add_bos_token": False}))
    assert not no_bos.add_bos
    qwen = Tokenizer.from_gguf_fields(_fields("qwen2", tokens, merges, 2, **ids))   # merges as before there
    assert [qwen.id_to_token(i) for i in qwen.encode(" Việt", add_special_tokens=False)] == ["ĠVi", "á»ĩ", "t"]
    assert not qwen.add_bos


@pytest.mark.parametrize("pre, pieces", [("smollm", ["2", "0", "2", "4"]), ("starcoder", ["2", "0", "2", "4"]),
                                         ("gpt2", ["2024"])])
def test_starcoder_gguf_tokenizer_splits_digits(pre, pieces):
    """llama.cpp's STARCODER pre-tokenizer (as SMOLLM's) splits digits one by one; GPT-2's does not."""
    tokens = ["<|endoftext|>"] + ALPHABET + ["20", "24", "2024"]
    tok = Tokenizer.from_gguf_fields(_fields(pre, tokens, ["2 0", "2 4", "20 24"], 1,
                                             **{"tokenizer.ggml.eos_token_id": 0}))
    assert [tok.id_to_token(i) for i in tok.encode("2024")] == pieces


def test_tensor_types_gguf_py_cannot_dequantize(tmp_path):
    """F64 is cast to fp32 (gguf-py has no dequantizer for it); another such type (I32 here) is a
    ValueError naming the tensor and its type, not gguf-py's NotImplementedError."""
    gguf = pytest.importorskip("gguf")
    from specops.engine.model.gguf_loader import _dequantize

    path = str(tmp_path / "types.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("wide", np.arange(6, dtype=np.float64).reshape(3, 2) / 4)
    w.add_tensor("ints", np.arange(4, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    wide, ints = gguf.GGUFReader(path).tensors
    out = _dequantize(wide)
    assert out.dtype == np.float32 and out.tolist() == [[0.0, 0.25], [0.5, 0.75], [1.0, 1.25]]
    with pytest.raises(ValueError, match="GGUF tensor ints: GGML type I32 is not supported"):
        _dequantize(ints)
