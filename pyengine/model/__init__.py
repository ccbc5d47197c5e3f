"""specops.engine.model: Llama-family models over a paged KV cache, their loaders and tokenizers.

The interface the engine uses:

- ``load_model(path=None, device="cpu", dtype=None) -> LoadedModel`` (model, tokenizer, config)
- ``model.forward(input_ids [T], positions [T], attn: AttnMetadata) -> hidden [T, H]``,
  ``model.compute_logits(hidden [N, H], out=None) -> [N, vocab] fp32`` (``out`` optional: the engine
  passes one only to models whose method takes it),
  ``model.make_kv_caches(num_blocks, block_size) -> list of [2, num_blocks, block_size, kv_heads, head_dim]``
- ``reference_forward(model, token_ids) -> [len, vocab]``: non-paged ground truth for tests.
"""

from .attention import AttnMetadata, flashinfer_available, make_attention_backend
from .config import ModelConfig
from .llama import LlamaForCausalLM
from .loader import LoadedModel, default_dtype, default_model_path, load_model
from .random_checkpoint import llama3_8b_shapes_config, make_llama3_8b_shapes_checkpoint, random_model
from .reference import reference_forward
from .tokenizer import Tokenizer

__all__ = [
    "AttnMetadata",
    "LlamaForCausalLM",
    "LoadedModel",
    "ModelConfig",
    "Tokenizer",
    "default_dtype",
    "default_model_path",
    "flashinfer_available",
    "llama3_8b_shapes_config",
    "load_model",
    "make_llama3_8b_shapes_checkpoint",
    "make_attention_backend",
    "random_model",
    "reference_forward",
]
