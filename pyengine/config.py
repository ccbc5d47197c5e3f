"""EngineConfig: the knobs of the engine, with defaults that fit a laptop CPU and one GPU."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from specops._arg_checks import check_int, check_real, check_seed
from specops.spec_decode.metadata import MAX_SPEC_LEN

MAX_NUM_SEQS = 1 << 16
"""Largest max_num_seqs: the persistent batch's tables are allocated for every row up front."""


def check_device(device) -> None:
    """None (automatic), or cpu / cuda / cuda:N that this torch can use; ValueError otherwise.
    EngineConfig checks it before the model loads (a CPU-only torch failed inside the model's
    first CUDA allocation), the command line before anything else."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (None: automatic), got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch has no CUDA device (torch {torch.__version__})")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


@dataclass
class EngineConfig:
    """Engine settings.

    Parameters
    ----------
    model : str or None
        HF-layout directory or .gguf file; None = the default model (SmolLM2-135M-Instruct).
    device : str or None
        "cpu", "cuda", "cuda:1"...; None = cuda when available, else cpu.
    dtype : str or None
        "float32", "bfloat16", "float16"; None = float32 on CPU, bfloat16 on CUDA.
    max_num_seqs : int
        Most requests in one step (rows of the persistent batch), at most MAX_NUM_SEQS (65536).
    max_num_batched_tokens : int
        Token budget of one step (prefill chunks + decodes).
    max_model_len : int or None
        Context length (prompt + output); None = the model's max_position_embeddings, capped
        by what the KV cache holds.
    block_size : int
        Tokens per KV block.
    num_kv_blocks : int or None
        Size of the KV pool; None = kv_cache_memory bytes' worth (at least one full context).
        The engine refuses a pool larger than the memory it may take (kv_cache_memory when
        given, else the device's free memory, or the host's available memory on CPU).
    kv_cache_memory : int or None
        Bytes for the KV cache when num_kv_blocks is None; None = 512 MiB on CPU, and on CUDA
        gpu_memory_utilization of the free memory left after the weights.
    gpu_memory_utilization : float
        Share of free GPU memory that the KV cache may take.
    enable_prefix_caching : bool
        Share the KV of identical prompt prefixes.
    enable_chunked_prefill : bool
        Split long prompts over steps to fit the token budget.
    attn_backend : str or None
        Attention backend name passed to the model side; None = its default for the device.
    seed : int
        Engine seed for unseeded requests.
    logits_processors : list
        Custom specops LogitsProcessor classes or "module:Class" names (installed packages'
        "specops.logits_processors" entry points are loaded too).
    sampler_cuda_graphs : bool
        On CUDA, replay the sampler of steady decode steps (same batch, every row samples)
        from a CUDA graph instead of launching its ops one by one (pyengine/sampler_graph.py).

    Speculative decoding (issue 6; off unless spec_method is set):

    spec_method : str or None
        "ngram" (prompt lookup) or "draft" (a separate small model); None = no speculation.
    num_spec_tokens : int
        K, the most draft tokens per request per step (1..MAX_SPEC_LEN, i.e. 1..128).
    draft_model : str or None
        HF directory or .gguf file of the draft model (spec_method="draft"); it must share
        the target's vocabulary.
    spec_batch_schedule : str, dict, list or None
        Batch-size schedule of K, e.g. "1:4,16:2,64:0" (K falls to 0 at large batches).
    ngram_min_n, ngram_max_n : int
        Suffix lengths that the n-gram proposer matches, longest first.
    spec_synthetic_acceptance : float, list of float or None
        Benchmarks only: accept draft i with this probability (per position) instead of
        verifying it; outputs are then NOT the model's.
    spec_log_interval_s : float or None
        Seconds between spec-decoding log lines (logger "specops.engine.spec_decode"); None = never.

    Structured output (issue 7; requests opt in with SamplingParams.structured_outputs):

    structured_compile_timeout_s : float
        Hard limit on compiling one grammar; past it the request fails alone.
    structured_compile_workers : int
        Threads compiling grammars (off the engine's step loop).
    reasoning_end : str or None
        End-of-reasoning marker text (e.g. "</think>"): structured requests are unconstrained
        until the model emits it, then constrained. None = constrained from the first token.
    reasoning_start : str or None
        Start marker, used only to see whether the prompt already closed its reasoning block.
    """

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.5
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attn_backend: str | None = None
    seed: int = 0
    logits_processors: list = field(default_factory=list)
    sampler_cuda_graphs: bool = True
    # speculative decoding
    spec_method: str | None = None
    num_spec_tokens: int = 4
    draft_model: str | None = None
    spec_batch_schedule: object = None
    ngram_min_n: int = 1
    ngram_max_n: int = 3
    spec_synthetic_acceptance: object = None
    spec_log_interval_s: float | None = 5.0
    # structured output
    structured_compile_timeout_s: float = 30.0
    structured_compile_workers: int = 2
    reasoning_end: str | None = None
    reasoning_start: str | None = "<think>"

    def validate(self) -> None:
        """Raise a ValueError naming the first field whose value is out of range or of the wrong type."""
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_num_seqs > MAX_NUM_SEQS:   # rows of host and device tables are allocated up front
            raise ValueError(f"max_num_seqs must be at most {MAX_NUM_SEQS}, got {self.max_num_seqs}")
        for name in ("max_model_len", "num_kv_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        check_device(self.device)
        check_seed("seed", self.seed)   # the engine seed of unseeded requests, as torch.manual_seed takes it
        check_real("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "sampler_cuda_graphs"):
            if not isinstance(getattr(self, name), bool):   # a truthy "false" would turn the feature on
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.dtype not in (None, "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        self._validate_spec()
        t = self.structured_compile_timeout_s
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0:   # inf: no limit
            raise ValueError(f"structured_compile_timeout_s must be > 0 (seconds), got {t!r}")
        w = self.structured_compile_workers
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"structured_compile_workers must be a positive int, got {w!r}")
        if self.reasoning_end is not None and (not isinstance(self.reasoning_end, str) or not self.reasoning_end):
            raise ValueError(f"reasoning_end must be None or a non-empty string, got {self.reasoning_end!r}")
        if self.reasoning_start is not None and (not isinstance(self.reasoning_start, str) or not self.reasoning_start):
            raise ValueError(f"reasoning_start must be None or a non-empty string, got {self.reasoning_start!r}")

    def _validate_spec(self) -> None:
        if self.spec_method not in (None, "ngram", "draft"):
            raise ValueError(f"spec_method must be None, 'ngram' or 'draft', got {self.spec_method!r}")
        k = self.num_spec_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPEC_LEN:
            raise ValueError(f"num_spec_tokens must be an int in [1, {MAX_SPEC_LEN}] (MAX_SPEC_LEN), got {k!r}")
        for name in ("ngram_min_n", "ngram_max_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.ngram_min_n > self.ngram_max_n:
            raise ValueError(f"ngram_min_n must be <= ngram_max_n, got {self.ngram_min_n} > {self.ngram_max_n}")
        if self.spec_log_interval_s is not None:
            check_real("spec_log_interval_s", self.spec_log_interval_s, 0.0, lo_open=True)
        if self.spec_method is None:
            return
        from .spec_decode import SyntheticAcceptance, parse_batch_schedule

        try:
            parse_batch_schedule(self.spec_batch_schedule)
        except ValueError as exc:
            raise ValueError(f"spec_batch_schedule: {exc}") from None
        if self.spec_synthetic_acceptance is not None:
            SyntheticAcceptance(self.spec_synthetic_acceptance)
