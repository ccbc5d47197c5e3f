"""Tiny HF-layout checkpoints for tests (random weights, a small `tokenizers` BPE).

Use from any test module::

    from model_fixtures import make_tiny_checkpoint, tiny_checkpoint  # noqa: F401  (fixture)

    def test_something(tiny_checkpoint):          # a session-wide directory path
        lm = load_model(tiny_checkpoint)

``make_tiny_checkpoint(dir, vocab_size=384, num_layers=2, hidden_size=128, num_heads=2,
num_kv_heads=1, head_dim=64, intermediate_size=256, tie_word_embeddings=True,
architecture="LlamaForCausalLM", dtype=torch.float32, seed=0) -> dir`` writes
config.json, model.safetensors, tokenizer.json (ids 0 <|endoftext|>, 1 <|im_start|> = BOS,
2 <|im_end|> = EOS), tokenizer_config.json (ChatML template), generation_config.json.
"""

from __future__ import annotations

import pytest
import torch

from specops.engine.model.random_checkpoint import (  # noqa: F401  (re-exported for tests)
    BOS_ID,
    EOS_ID,
    make_tiny_checkpoint as _make_tiny_checkpoint,
    tiny_config,
)


def make_tiny_checkpoint(path, vocab_size: int = 384, num_layers: int = 2, dtype: torch.dtype = torch.float32,
                         seed: int = 0, **config_kwargs) -> str:
    """Write a tiny random Llama-family checkpoint into directory ``path`` and return it as a str.

    ``config_kwargs`` go to ``tiny_config`` (hidden_size, num_heads, num_kv_heads, head_dim,
    intermediate_size, tie_word_embeddings, architecture ("LlamaForCausalLM",
    "Qwen2ForCausalLM" (q/k/v biases), "MistralForCausalLM"), max_position_embeddings, rope_theta).
    """
    return _make_tiny_checkpoint(str(path), dtype=dtype, seed=seed, vocab_size=vocab_size,
                                 num_layers=num_layers, **config_kwargs)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """Path of a session-wide tiny Llama checkpoint (default arguments of make_tiny_checkpoint)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"))
