"""Load a Hugging Face layout directory: config.json, *.safetensors, tokenizer.json."""

from __future__ import annotations

import glob
import json
import os

import torch

from .config import ModelConfig
from .safetensors_reader import read_safetensors_file
from .tokenizer import Tokenizer


def checkpoint_files(path: str) -> list[str]:
    """The safetensors files of the checkpoint in ``path``: those ``model.safetensors.index.json``
    lists when it exists, else every ``*.safetensors`` but ``consolidated*.safetensors`` (the
    original-format copy Mistral repos ship beside the HF files) unless it is the only one."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index}: not a safetensors index with a weight_map ({e})") from e
        return [os.path.join(path, n) for n in names]
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    hf = [f for f in files if not os.path.basename(f).startswith("consolidated")]
    return hf or files


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint's safetensors files in ``path`` (``checkpoint_files``; CPU,
    stored dtype). A tensor name found in two files is an error, not a silent overwrite.

    Read by safetensors_reader (standard library + torch), not the ``safetensors``
    package: loading through the package aborted the process ("free(): invalid pointer")
    with safetensors 0.8.0 + torch 2.11 on the GPU image.
    """
    files = checkpoint_files(path)
    if not files:
        raise ValueError(f"{path}: no *.safetensors files (a HF-layout model directory needs them)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors = read_safetensors_file(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from e
        twice = sorted(set(tensors) & set(out))
        if twice:
            raise ValueError(f"{f}: tensors {twice[:4]} are in another file of {path} too")
        out.update(tensors)
    return out


def hf_to_state_dict(config: ModelConfig, hf: dict[str, torch.Tensor], path: str = "") -> dict[str, torch.Tensor]:
    """Rename and fuse HF tensors into LlamaForCausalLM names, checking names and shapes."""
    c = config
    qs, kvs = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    used = set()

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"{path}: checkpoint is missing tensor {name!r}")
        w = hf[name]
        if tuple(w.shape) != shape:
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
        if not w.is_floating_point():
            # an int8 / bool tensor would be cast to the model dtype: garbage weights, no error
            raise ValueError(f"{path}: tensor {name!r} has dtype {w.dtype}, expected a floating-point dtype "
                             "(quantized checkpoints are not supported)")
        used.add(name)
        return w

    sd = {"embed_tokens.weight": take("model.embed_tokens.weight", (c.vocab_size, c.hidden_size)),
          "norm.weight": take("model.norm.weight", (c.hidden_size,))}
    if not c.tie_word_embeddings:
        sd["lm_head.weight"] = take("lm_head.weight", (c.vocab_size, c.hidden_size))
    else:
        used.add("lm_head.weight")  # some tied checkpoints still store a copy
    for i in range(c.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        sd[p + "input_norm.weight"] = take(h + "input_layernorm.weight", (c.hidden_size,))
        sd[p + "qkv_proj.weight"] = torch.cat([
            take(h + "self_attn.q_proj.weight", (qs, c.hidden_size)),
            take(h + "self_attn.k_proj.weight", (kvs, c.hidden_size)),
            take(h + "self_attn.v_proj.weight", (kvs, c.hidden_size))])
        if c.attention_bias:
            sd[p + "qkv_proj.bias"] = torch.cat([
                take(h + "self_attn.q_proj.bias", (qs,)),
                take(h + "self_attn.k_proj.bias", (kvs,)),
                take(h + "self_attn.v_proj.bias", (kvs,))])
        sd[p + "o_proj.weight"] = take(h + "self_attn.o_proj.weight", (c.hidden_size, qs))
        if c.o_proj_bias:
            sd[p + "o_proj.bias"] = take(h + "self_attn.o_proj.bias", (c.hidden_size,))
        sd[p + "post_norm.weight"] = take(h + "post_attention_layernorm.weight", (c.hidden_size,))
        sd[p + "gate_up_proj.weight"] = torch.cat([
            take(h + "mlp.gate_proj.weight", (c.intermediate_size, c.hidden_size)),
            take(h + "mlp.up_proj.weight", (c.intermediate_size, c.hidden_size))])
        sd[p + "down_proj.weight"] = take(h + "mlp.down_proj.weight", (c.hidden_size, c.intermediate_size))
    unused = sorted(k for k in hf if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if unused:
        raise ValueError(f"{path}: checkpoint has tensors this model does not use: {unused[:8]}")
    return sd


def load_hf_dir(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Read a HF-layout directory.

    Returns
    -------
    (ModelConfig, state_dict in LlamaForCausalLM names (CPU, stored dtype), Tokenizer)

    Raises
    ------
    ValueError
        On a missing/invalid config.json, unsupported architecture, missing or misshapen
        tensors, or a missing tokenizer.json.
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{path}: no config.json (a HF-layout model directory needs one)")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            raw = json.load(f)
    except ValueError as e:   # json.JSONDecodeError, or UnicodeDecodeError (not UTF-8)
        raise ValueError(f"{cfg_path}: invalid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    config = ModelConfig.from_hf_dict(raw)
    tokenizer = Tokenizer.from_hf_dir(path, config_eos_ids=config.eos_token_ids, bos_token_id=config.bos_token_id)
    for e in tokenizer.eos_token_ids:
        if e not in config.eos_token_ids:
            config.eos_token_ids.append(e)
    hf = read_safetensors(path)
    return config, hf_to_state_dict(config, hf, path), tokenizer
