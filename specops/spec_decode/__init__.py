"""Speculative decoding: spec-decode metadata, rejection sampling, output parsing."""

from specops.spec_decode.metadata import MAX_SPEC_LEN, SpecDecodeMetadata, build_spec_decode_metadata
from specops.spec_decode.parse import PLACEHOLDER_TOKEN_ID, parse_output
from specops.spec_decode.rejection import rejection_sample
from specops.spec_decode.rejection_sampler import RejectionSampler, RejectionSamplerOutput
from specops.spec_decode.rejection_torch import rejection_sample_torch

__all__ = [
    "MAX_SPEC_LEN", "PLACEHOLDER_TOKEN_ID", "RejectionSampler", "RejectionSamplerOutput", "SpecDecodeMetadata",
    "build_spec_decode_metadata", "parse_output", "rejection_sample", "rejection_sample_torch",
]
