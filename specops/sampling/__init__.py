"""Sampling: per-row metadata, the fused top-k/top-p/min-p draw, logprobs and the Sampler.

- `SamplingMetadata`: per-row parameters as device tensors, validated when built;
  `expand` for rows that are not 1:1 with requests (speculative decoding).
- `sample` / `draw`: temperature + min-p + top-k + top-p + exponential-noise draw (fused
  Triton passes on CUDA, sort-based torch reference elsewhere); `sample_torch` is the
  reference; `sample_options` the kernel options a `SamplingMetadata` allows (the Sampler
  passes them itself).
- `Sampler`: the whole vLLM-v1 pipeline, with `process` / `sample_processed` halves.
- `logits_processors`: the LogitsProcessor interface, BatchUpdate, built-ins, loader.
"""

from .logits_processors import (BatchUpdate, LogitsProcessor, LogitsProcessors, LogitsRows, MoveDirectionality,
                                build_logits_processors)
from .logprobs import LogprobsTensors, compute_logprobs
from .metadata import GREEDY_EPS, LOGPROBS_MODES, SamplingMetadata, inv_temperature
from .sampler import ProcessedLogits, Sampler, SamplerOutput, processed_probs
from .sampler_torch import (SampleResult, apply_penalties_torch, row_thresholds_torch, sample_torch,
                            target_probs_torch, top_k_top_p_min_p_mask_torch)
from .topk_topp import draw, sample, sample_options

__all__ = [
    "BatchUpdate", "GREEDY_EPS", "LOGPROBS_MODES", "LogitsProcessor", "LogitsProcessors", "LogitsRows",
    "LogprobsTensors", "MoveDirectionality", "ProcessedLogits", "SampleResult", "Sampler", "SamplerOutput",
    "SamplingMetadata", "apply_penalties_torch", "build_logits_processors", "compute_logprobs", "draw",
    "inv_temperature", "processed_probs", "row_thresholds_torch", "sample", "sample_options", "sample_torch",
    "target_probs_torch",
    "top_k_top_p_min_p_mask_torch",
]
