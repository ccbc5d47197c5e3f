"""Random-weight checkpoints in the HF layout: a tiny one for tests, Llama-3-8B shapes for benchmarks.

A checkpoint directory holds config.json, model.safetensors, tokenizer.json (a
byte-level BPE trained with `tokenizers` on a small built-in text, its vocabulary padded
with unreachable filler entries up to the model's vocab_size, so every id decodes),
tokenizer_config.json (a ChatML chat template) and generation_config.json.
Special tokens: 0 ``<|endoftext|>``, 1 ``<|im_start|>`` (BOS), 2 ``<|im_end|>`` (EOS).
"""

from __future__ import annotations

import json
import math
import os

import torch

from .config import ModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_ID, EOS_ID = 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """\
The capital of France is Paris. The capital of Italy is Rome, and the capital of Spain is Madrid.
A language model predicts the next token from the tokens before it. Sampling picks one token from
the distribution; greedy decoding always takes the most likely one. Speculative decoding lets a
small draft propose several tokens that the target model verifies in one step.
The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ?
def add(a, b):
    return a + b
{"name": "specops", "version": 1, "tags": ["sampling", "decoding"], "ok": true}
Numbers like 42, 1024, 3.14159 and 2025 appear in text; so do lists, code and tables.
"""


def train_tokenizer(vocab_size: int, train_size: int = 400):
    """A byte-level BPE `tokenizers.Tokenizer` with exactly ``vocab_size`` ids.

    Trained on a small built-in text to at most ``train_size`` entries, then padded with
    filler entries (never produced by encoding) so that ids ``0 .. vocab_size-1`` all exist.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {len(alphabet) + len(SPECIAL_TOKENS)} "
                         f"(byte alphabet + special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, max(train_size, len(alphabet) + len(SPECIAL_TOKENS))),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True) * 4, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    chars = sorted(alphabet)
    i = 0
    while len(vocab) < vocab_size:
        # Three-character strings of the byte alphabet that no merge produces: unreachable
        # by encoding, and they still decode (to bytes, maybe invalid UTF-8).
        n = len(chars)
        filler = "Ā" + chars[i % n] + chars[(i // n) % n] + chars[(i // n ** 2) % n]
        if filler not in vocab:
            vocab[filler] = len(vocab)
        i += 1
    return Tokenizer.from_str(json.dumps(spec))


def tiny_config(vocab_size: int = 384, num_layers: int = 2, hidden_size: int = 128, num_heads: int = 2,
                num_kv_heads: int = 1, head_dim: int = 64, intermediate_size: int = 256,
                tie_word_embeddings: bool = True, architecture: str = "LlamaForCausalLM",
                max_position_embeddings: int = 1024, rope_theta: float = 10000.0) -> ModelConfig:
    """The config of the tiny test model (head_dim 64 so FlashInfer runs it too)."""
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        rope_theta=rope_theta, rms_norm_eps=1e-5, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings, bos_token_id=BOS_ID, eos_token_ids=[EOS_ID],
        architecture=architecture, attention_bias=architecture == "Qwen2ForCausalLM")


def llama3_8b_shapes_config(num_layers: int = 4) -> ModelConfig:
    """Llama-3-8B layer shapes (hidden 4096, 32 heads, 8 KV heads, head_dim 128, FFN 14336,
    vocab 128256, untied head) with fewer layers."""
    return ModelConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=num_layers,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=False, bos_token_id=BOS_ID,
        eos_token_ids=[EOS_ID], architecture="LlamaForCausalLM")


def smollm2_135m_shapes_config() -> ModelConfig:
    """The default model's shapes (SmolLM2-135M-Instruct: hidden 576, 30 layers, 9 heads, 3 KV
    heads, head_dim 64, FFN 1536, vocab 49152, tied head), for timing where its file is absent."""
    return ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_ids=[EOS_ID], architecture="LlamaForCausalLM")


def random_hf_tensors(config: ModelConfig, dtype: torch.dtype = torch.float32, seed: int = 0,
                      device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Random weights under HF tensor names, scaled so activations stay O(1) and logits spread.

    Projections ~ N(0, 1/fan_in); embeddings ~ N(0, 0.5^2); norm weights ~ 1 + N(0, 0.1^2).
    Generated on ``device`` (use CUDA for big shapes), returned there.
    """
    c = config
    g = torch.Generator(device=device).manual_seed(seed)

    def normal(shape, std):
        return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

    def norm_w(n):
        return (1 + 0.1 * torch.randn(n, generator=g, device=device, dtype=torch.float32)).to(dtype)

    qs, kvs = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    t = {"model.embed_tokens.weight": normal((c.vocab_size, c.hidden_size), 0.5)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm_w(c.hidden_size)
        for name, rows in (("q", qs), ("k", kvs), ("v", kvs)):
            t[p + f"self_attn.{name}_proj.weight"] = normal((rows, c.hidden_size), 1 / math.sqrt(c.hidden_size))
            if c.attention_bias:
                t[p + f"self_attn.{name}_proj.bias"] = normal((rows,), 0.1)
        t[p + "self_attn.o_proj.weight"] = normal((c.hidden_size, qs), 1 / math.sqrt(qs))
        if c.o_proj_bias:
            t[p + "self_attn.o_proj.bias"] = normal((c.hidden_size,), 0.1)
        t[p + "post_attention_layernorm.weight"] = norm_w(c.hidden_size)
        t[p + "mlp.gate_proj.weight"] = normal((c.intermediate_size, c.hidden_size), 1 / math.sqrt(c.hidden_size))
        t[p + "mlp.up_proj.weight"] = normal((c.intermediate_size, c.hidden_size), 1 / math.sqrt(c.hidden_size))
        t[p + "mlp.down_proj.weight"] = normal((c.hidden_size, c.intermediate_size), 1 / math.sqrt(c.intermediate_size))
    t["model.norm.weight"] = norm_w(c.hidden_size)
    if not c.tie_word_embeddings:
        t["lm_head.weight"] = normal((c.vocab_size, c.hidden_size), 0.5)
    return t


def write_random_checkpoint(path: str, config: ModelConfig, dtype: torch.dtype = torch.float32, seed: int = 0,
                            device: torch.device | str = "cpu") -> str:
    """Write a random-weight HF-layout checkpoint of ``config`` into directory ``path``; return ``path``."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    tensors = random_hf_tensors(config, dtype, seed, device)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    del tensors
    cfg = config.to_hf_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    train_tokenizer(config.vocab_size).save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIAL_TOKENS[BOS_ID], "eos_token": SPECIAL_TOKENS[EOS_ID],
                   "chat_template": CHATML_TEMPLATE}, f, indent=2)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}, f, indent=2)
    return path


def make_tiny_checkpoint(path: str, dtype: torch.dtype = torch.float32, seed: int = 0, **config_kwargs) -> str:
    """Write the tiny test checkpoint (``tiny_config(**config_kwargs)``) into ``path``; return ``path``."""
    return write_random_checkpoint(path, tiny_config(**config_kwargs), dtype=dtype, seed=seed)


def make_llama3_8b_shapes_checkpoint(path: str, num_layers: int = 4, dtype: torch.dtype = torch.bfloat16,
                                     seed: int = 0, device: torch.device | str | None = None) -> str:
    """Write a random bf16 checkpoint of Llama-3-8B layer shapes with ``num_layers`` layers.

    About 2.1 GB (embeddings and head) + 0.44 GB per layer in bf16. Weights are drawn on
    CUDA when available (``device`` None), which takes seconds instead of a minute.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return write_random_checkpoint(path, llama3_8b_shapes_config(num_layers), dtype=dtype, seed=seed, device=device)


def random_model(config: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                 seed: int = 0, attn_backend: str | None = None):
    """A LoadedModel with random weights built in memory (no files), with the tiny test tokenizer.

    Examples
    --------
    >>> lm = random_model(llama3_8b_shapes_config(2), device="cuda")  # doctest: +SKIP
    """
    from .hf_loader import hf_to_state_dict
    from .llama import LlamaForCausalLM
    from .loader import LoadedModel, default_dtype
    from .tokenizer import Tokenizer

    dtype = dtype or default_dtype(device)
    sd = hf_to_state_dict(config, random_hf_tensors(config, dtype, seed, device), "<random>")
    model = LlamaForCausalLM.from_state_dict(config, sd, device=device, dtype=dtype, attn_backend=attn_backend)
    tok = Tokenizer(train_tokenizer(config.vocab_size), [EOS_ID], BOS_ID, CHATML_TEMPLATE)
    return LoadedModel(model=model, tokenizer=tok, config=config, path="<random>")
