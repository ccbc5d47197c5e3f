"""specops: the last step of LLM decoding as fast, exact ops.

Importing specops loads the compiled extension specops._C, which registers the
`torch.ops.specops.*` operators (CPU always, CUDA where the build had CUDA).

Public API
----------
Compiled ops (in place where the name ends in ``_``), each with a ``*_torch`` reference:
    token_bincount, token_bincount_update_, apply_penalties_,
    apply_repetition_penalties_, apply_token_bitmask_
Sampling (Triton on CUDA, torch reference elsewhere):
    SamplingMetadata, Sampler, sample, draw, compute_logprobs,
    LogitsProcessor, BatchUpdate, LogitsRows, build_logits_processors
Speculative decoding:
    build_spec_decode_metadata, SpecDecodeMetadata, RejectionSampler,
    rejection_sample, parse_output, MAX_SPEC_LEN (128: the most drafts per request, K)
The reference engine lives in ``specops.engine`` (``LLM``, ``SamplingParams``).
"""

# torch first: importing the extension before torch lets the dynamic linker resolve libtorch
# and its CUDA libraries without torch's own loading order, which on the CUDA image ended in
# "free(): invalid pointer" at the first model built in a fresh process (`specops generate`).
import torch  # noqa: F401

try:
    from specops import _C  # noqa: F401  (registers torch.ops.specops.*)
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "specops._C is missing: build the extension with "
        "`pip install --no-build-isolation -e .` (see README.md)") from exc

from specops.ops import (
    apply_penalties_,
    apply_penalties_torch,
    apply_repetition_penalties_,
    apply_repetition_penalties_torch,
    apply_token_bitmask_,
    apply_token_bitmask_torch,
    token_bincount,
    token_bincount_torch,
    token_bincount_update_,
    token_bincount_update_torch,
)
from specops.sampling import (
    BatchUpdate,
    LogitsProcessor,
    LogitsRows,
    Sampler,
    SamplerOutput,
    SamplingMetadata,
    build_logits_processors,
    compute_logprobs,
    draw,
    sample,
    sample_torch,
)
from specops.spec_decode import (
    MAX_SPEC_LEN,
    RejectionSampler,
    SpecDecodeMetadata,
    build_spec_decode_metadata,
    parse_output,
    rejection_sample,
    rejection_sample_torch,
)

__version__ = "0.1.0"

__all__ = [
    "token_bincount", "token_bincount_torch", "token_bincount_update_", "token_bincount_update_torch",
    "apply_penalties_", "apply_penalties_torch", "apply_repetition_penalties_", "apply_repetition_penalties_torch",
    "apply_token_bitmask_", "apply_token_bitmask_torch",
    "SamplingMetadata", "Sampler", "SamplerOutput", "sample", "sample_torch", "draw", "compute_logprobs",
    "LogitsProcessor", "BatchUpdate", "LogitsRows", "build_logits_processors",
    "build_spec_decode_metadata", "SpecDecodeMetadata", "RejectionSampler", "rejection_sample",
    "rejection_sample_torch", "parse_output", "MAX_SPEC_LEN",
]
