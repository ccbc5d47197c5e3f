"""A plain Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over a paged KV cache.

``forward`` takes the scheduled tokens of all sequences concatenated, with their
positions and the step's AttnMetadata, and returns the final-normed hidden states;
``compute_logits`` projects the rows the engine samples from. q/k/v and gate/up are
fused into one matmul each to keep the per-layer Python and kernel count low
(that matters on a 2-core CPU at batch 1).

Parameter names (``state_dict`` of this module)::

    embed_tokens.weight                 [vocab, hidden]
    layers.{i}.input_norm.weight        [hidden]
    layers.{i}.qkv_proj.weight          [(heads + 2 * kv_heads) * head_dim, hidden]
    layers.{i}.qkv_proj.bias            [(heads + 2 * kv_heads) * head_dim]   (attention_bias only)
    layers.{i}.o_proj.weight            [hidden, heads * head_dim]
    layers.{i}.o_proj.bias              [hidden]                              (o_proj_bias only)
    layers.{i}.post_norm.weight         [hidden]
    layers.{i}.gate_up_proj.weight      [2 * intermediate, hidden]  (gate rows first)
    layers.{i}.down_proj.weight         [hidden, intermediate]
    norm.weight                         [hidden]
    lm_head.weight                      [vocab, hidden]   (absent when tie_word_embeddings)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import AttnMetadata, make_attention_backend, write_kv
from .config import ModelConfig


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of ``LlamaForCausalLM(config)``."""
    c = config
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    shapes = {"embed_tokens.weight": (c.vocab_size, c.hidden_size), "norm.weight": (c.hidden_size,)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes[p + "input_norm.weight"] = (c.hidden_size,)
        shapes[p + "qkv_proj.weight"] = (qkv, c.hidden_size)
        if c.attention_bias:
            shapes[p + "qkv_proj.bias"] = (qkv,)
        shapes[p + "o_proj.weight"] = (c.hidden_size, c.num_heads * c.head_dim)
        if c.o_proj_bias:
            shapes[p + "o_proj.bias"] = (c.hidden_size,)
        shapes[p + "post_norm.weight"] = (c.hidden_size,)
        shapes[p + "gate_up_proj.weight"] = (2 * c.intermediate_size, c.hidden_size)
        shapes[p + "down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:  # [head_dim // 2] fp32
    """Rotary inverse frequencies, with HF's "linear" and "llama3" scaling."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = config.rope_scaling
    if s is not None and s["rope_type"] == "linear":
        inv = inv / float(s["factor"])
    elif s is not None and s["rope_type"] == "llama3":
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_len = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        scaled = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
        inv = scaled
    return inv.float()


def apply_rope(
    x: torch.Tensor,  # [T, heads, head_dim]
    cos: torch.Tensor,  # [T, 1, head_dim // 2]
    sin: torch.Tensor,  # [T, 1, head_dim // 2]
    interleaved: bool,
) -> torch.Tensor:  # [T, heads, head_dim]
    """Rotate (x1, x2) pairs: the two halves of each head, or adjacent pairs when interleaved."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype=None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused op
        # Low precision: normalise in fp32, cast, then scale (HF's order).
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


def _param(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class _Linear(nn.Module):
    """A weight (and optional bias) without initialisation: the loader fills it."""

    def __init__(self, out_features: int, in_features: int, bias: bool, dtype, device):
        super().__init__()
        self.weight = _param((out_features, in_features), dtype, device)
        self.bias = _param((out_features,), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Embedding(nn.Module):
    """A lookup table without initialisation (nn.Embedding would randomly initialise it)."""

    def __init__(self, num: int, dim: int, dtype, device):
        super().__init__()
        self.weight = _param((num, dim), dtype, device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dtype, device):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.scale = c.head_dim ** -0.5
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.qkv_proj = _Linear(self.q_size + 2 * self.kv_size, c.hidden_size, c.attention_bias, dtype, device)
        self.o_proj = _Linear(c.hidden_size, self.q_size, c.o_proj_bias, dtype, device)
        self.post_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.gate_up_proj = _Linear(2 * c.intermediate_size, c.hidden_size, False, dtype, device)
        self.down_proj = _Linear(c.hidden_size, c.intermediate_size, False, dtype, device)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, head_dim // 2]
        sin: torch.Tensor,  # [T, 1, head_dim // 2]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, kv_heads, head_dim]
        attn: AttnMetadata,
        attn_backend,
        interleaved: bool,
    ) -> torch.Tensor:  # [T, hidden]
        t = x.shape[0]
        qkv = self.qkv_proj(self.input_norm(x))
        # Rotate q and k heads in one call: [T, heads + kv_heads, head_dim].
        qk = apply_rope(qkv[:, :self.q_size + self.kv_size].view(t, -1, self.head_dim), cos, sin, interleaved)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.num_kv_heads, self.head_dim)
        write_kv(kv_cache, k, v, attn)
        o = attn_backend(q, kv_cache, attn, self.scale)
        x = x + self.o_proj(o.reshape(t, self.q_size))
        gate, up = self.gate_up_proj(self.post_norm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class LlamaForCausalLM(nn.Module):
    """A Llama-family decoder over a paged KV cache.

    Parameters
    ----------
    config : ModelConfig
    dtype : torch.dtype
        Parameter, activation and KV-cache dtype.
    device : torch.device | str
        Where parameters live; "meta" builds an empty shell for ``load_state_dict(assign=True)``.
    attn_backend : str | None
        "torch", "flashinfer" or None (FlashInfer on CUDA when installed, else torch).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu",
                 attn_backend: str | None = None):
        super().__init__()
        c = config
        self.config = c
        self.dtype = dtype
        self.embed_tokens = _Embedding(c.vocab_size, c.hidden_size, dtype, device)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c, dtype, device) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.lm_head = None if c.tie_word_embeddings else _Linear(c.vocab_size, c.hidden_size, False, dtype, device)
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)
        self.attn_backend = None
        if torch.device(device).type != "meta":
            self.set_attn_backend(attn_backend)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def set_attn_backend(self, name: str | None) -> None:
        """Choose the attention backend ("torch", "flashinfer", or None for the device default)."""
        self.attn_backend = make_attention_backend(name, self.device, self.dtype, self.config.head_dim)

    @property
    def attn_backend_name(self) -> str:
        return self.attn_backend.name

    def rope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim // 2] in the model dtype for integer positions [T]."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return freqs.cos().to(self.dtype)[:, None, :], freqs.sin().to(self.dtype)[:, None, :]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        attn: AttnMetadata,
    ) -> torch.Tensor:  # [T, hidden] final-normed hidden states
        """Run all scheduled tokens (concatenated sequence by sequence) through the decoder.

        Writes their K/V into ``attn.kv_caches`` and returns the final-normed hidden
        states; pass the rows to sample from to ``compute_logits``.
        """
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must both be [T], got {tuple(input_ids.shape)} "
                             f"and {tuple(positions.shape)}")
        if len(attn.kv_caches) != len(self.layers):
            raise ValueError(f"attn.kv_caches must hold one cache per layer ({len(self.layers)}), "
                             f"got {len(attn.kv_caches)}")
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope_cos_sin(positions)
        interleaved = self.config.rope_interleaved
        for layer, kv_cache in zip(self.layers, attn.kv_caches):
            x = layer(x, cos, sin, kv_cache, attn, self.attn_backend, interleaved)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor,  # [N, hidden]
                       out: torch.Tensor | None = None) -> torch.Tensor:  # [N, vocab] fp32
        """Project hidden states to fp32 logits, written into `out` when given (no extra copy)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden, weight)
        return logits.float() if out is None else out.copy_(logits)

    def make_kv_caches(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        """Zeroed per-layer caches, each [2, num_blocks, block_size, num_kv_heads, head_dim] in the model dtype."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        c = self.config
        shape = (2, num_blocks, block_size, c.num_kv_heads, c.head_dim)
        return [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]

    @classmethod
    def from_state_dict(
        cls,
        config: ModelConfig,
        state_dict: dict[str, torch.Tensor],
        device="cpu",
        dtype: torch.dtype = torch.float32,
        attn_backend: str | None = None,
    ) -> "LlamaForCausalLM":
        """Build the model from tensors named as in this module's docstring.

        Raises
        ------
        ValueError
            On a missing, unexpected or wrongly shaped tensor (naming it).
        """
        shapes = expected_shapes(config)
        missing = [k for k in shapes if k not in state_dict]
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        extra = [k for k in state_dict if k not in shapes]
        if extra:
            raise ValueError(f"checkpoint has unexpected tensors: {extra[:8]}")
        for k, shape in shapes.items():
            if tuple(state_dict[k].shape) != shape:
                raise ValueError(f"tensor {k} has shape {tuple(state_dict[k].shape)}, expected {shape}")
        model = cls(config, dtype=dtype, device="meta")
        tensors = {k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}
        model.load_state_dict(tensors, strict=True, assign=True)
        for p in model.parameters():
            p.requires_grad_(False)
        model.inv_freq = rope_inv_freq(config).to(device)
        model.set_attn_backend(attn_backend)
        return model.eval()
