"""ModelConfig: the shape and numerics of a Llama-family decoder, from a HF config.json."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# HF "architectures" names we run, and the model_type each implies when that list is absent.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


_ROPE_SCALING_KEYS = {   # the numbers each supported rope scaling needs, all finite and > 0
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def _check_rope_scaling(scaling: dict) -> None:
    """Raise ValueError unless `scaling` is a supported rope scaling with every number it needs,
    each finite and > 0 (a missing one raised a bare KeyError when the model was built; a factor
    of 0 made every rotary frequency infinite: NaN logits)."""
    kind = scaling.get("rope_type")
    if kind not in _ROPE_SCALING_KEYS:
        raise ValueError(f"ModelConfig.rope_scaling type {kind!r} is not supported (expected None, 'linear' or 'llama3')")
    for key in _ROPE_SCALING_KEYS[kind]:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"ModelConfig.rope_scaling ({kind}) needs {key} as a finite number > 0, got {value!r}")


@dataclass
class ModelConfig:
    """Shape and numerics of a Llama-family decoder (Llama, Mistral, Qwen2, SmolLM).

    Attributes
    ----------
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim
        Shapes; ``num_heads`` must be a multiple of ``num_kv_heads``.
    rope_theta : float
        RoPE base.
    rms_norm_eps : float
        RMSNorm epsilon.
    max_position_embeddings : int
        Longest context the engine may run (capped at the sliding window when one is set,
        since this model does full attention).
    tie_word_embeddings : bool
        The output projection is the embedding matrix.
    bos_token_id : int | None
        Beginning-of-sequence token, if the model has one.
    eos_token_ids : list[int]
        Tokens that end generation.
    architecture : str
        HF architecture name, e.g. ``"LlamaForCausalLM"``.
    attention_bias : bool
        q/k/v projections carry biases (Qwen2; Llama with ``attention_bias``).
    o_proj_bias : bool
        The output projection carries a bias too (Llama with ``attention_bias``: HF's
        LlamaAttention gives all four projections one; Qwen2's has none).
    rope_interleaved : bool
        Rotate adjacent pairs (GPT-J/GGUF-llama style) instead of the two halves of each
        head (HF style). Must match how the q/k rows are ordered in the weights.
    rope_scaling : dict | None
        HF ``rope_scaling`` ("linear" or "llama3"), or None.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    architecture: str = "LlamaForCausalLM"
    attention_bias: bool = False
    o_proj_bias: bool = False
    rope_interleaved: bool = False
    rope_scaling: dict | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)

    @classmethod
    def from_hf_dict(cls, cfg: dict, extra_eos_ids: list[int] | None = None) -> "ModelConfig":
        """Build from a parsed HF ``config.json``.

        Raises
        ------
        ValueError
            On a missing required key, an unsupported architecture or activation.
        """
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else None
        if arch is None:
            by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
            arch = by_type.get(cfg.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"config.json: architecture {archs or cfg.get('model_type')!r} is not supported; "
                f"expected one of {sorted(SUPPORTED_ARCHITECTURES)}")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ValueError(f"config.json is missing required keys {missing}")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json: hidden_act {act!r} is not supported (expected 'silu')")
        if cfg.get("mlp_bias", False):
            raise ValueError("config.json: mlp_bias=true is not supported")

        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        max_pos = cfg.get("max_position_embeddings", 2048)
        window = cfg.get("sliding_window")
        if window and (arch != "Qwen2ForCausalLM" or cfg.get("use_sliding_window", False)):
            max_pos = min(max_pos, window)  # full attention is exact only up to the window
        eos = cfg.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        for e in extra_eos_ids or []:
            if e not in eos_ids:
                eos_ids.append(e)
        theta, scaling = cfg.get("rope_theta"), cfg.get("rope_scaling")
        rope_params = cfg.get("rope_parameters")          # transformers >= 5 keeps both in here
        if rope_params is not None:
            if not isinstance(rope_params, dict) or any(isinstance(v, dict) for v in rope_params.values()):
                raise ValueError(f"config.json: rope_parameters {rope_params!r} is not supported "
                                 "(expected one dict with rope_type and rope_theta)")
            theta = theta if theta is not None else rope_params.get("rope_theta")
            if scaling is None:
                scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.get("type"))
            if scaling["rope_type"] in ("default", None):
                scaling = None
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rope_theta=float(theta if theta is not None else 10000.0),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            architecture=arch,
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            o_proj_bias=arch == "LlamaForCausalLM" and bool(cfg.get("attention_bias", False)),
            rope_scaling=scaling,
        )

    def to_hf_dict(self) -> dict:
        """The HF ``config.json`` contents describing this config (used by checkpoint writers)."""
        cfg = {
            "architectures": [self.architecture],
            "model_type": SUPPORTED_ARCHITECTURES[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids,
            "attention_bias": self.attention_bias,
        }
        if self.rope_scaling is not None:
            cfg["rope_scaling"] = self.rope_scaling
        return cfg
