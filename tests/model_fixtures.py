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


class PagedRunner:
    """Minimal paged bookkeeping to drive ``model.forward`` in tests, without the engine.

    Every sequence owns a fixed, shuffled set of blocks (so block tables are not the
    identity), enough for ``max_len`` tokens. ``step({seq: [new token ids], ...})``
    runs one forward over all given sequences (in the dict's order) and returns each
    sequence's logits for its new tokens.
    """

    def __init__(self, model, num_seqs: int, max_len: int, block_size: int, seed: int = 0):
        per_seq = -(-max_len // block_size)
        total = num_seqs * per_seq + 1
        perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed)).tolist()
        self.model = model
        self.block_size = block_size
        self.tables = [perm[i * per_seq:(i + 1) * per_seq] for i in range(num_seqs)]
        self.caches = model.make_kv_caches(total, block_size)
        self.ctx = [0] * num_seqs

    def step(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        from specops.engine.model import AttnMetadata

        seqs = list(chunks)
        attn = AttnMetadata.build(self.caches, [self.ctx[s] for s in seqs], [len(chunks[s]) for s in seqs],
                                  [self.tables[s] for s in seqs], self.block_size)
        dev = self.model.device
        ids = torch.tensor([t for s in seqs for t in chunks[s]], dtype=torch.int64, device=dev)
        pos = torch.tensor([p for s in seqs for p in range(self.ctx[s], self.ctx[s] + len(chunks[s]))],
                           dtype=torch.int64, device=dev)
        logits = self.model.compute_logits(self.model(ids, pos, attn))
        out, start = {}, 0
        for s in seqs:
            n = len(chunks[s])
            out[s] = logits[start:start + n]
            start += n
            self.ctx[s] += n
        return out
