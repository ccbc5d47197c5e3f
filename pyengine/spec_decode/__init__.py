"""Speculative decoding, engine side: proposers (n-gram, draft model, an EAGLE-style head), the K schedule, metrics.

Verification itself (metadata, rejection kernels, parser) lives in ``specops.spec_decode``.
"""

from .draft_model import STREAM_DRAFT, DraftModelProposer, draft_pool_blocks
from .eagle import EagleHead, EagleProposer
from .k_schedule import KSchedule, SyntheticAcceptance, parse_batch_schedule
from .metrics import SpecDecodingMetrics, SpecDecodingStats, count_accepted, format_line
from .ngram import NgramProposer, ngram_propose, ngram_propose_naive
from .proposer import DraftBatch, ProposeContext, Proposer, TargetHiddenStates

__all__ = [
    "DraftBatch",
    "DraftModelProposer",
    "EagleHead",
    "EagleProposer",
    "KSchedule",
    "NgramProposer",
    "ProposeContext",
    "Proposer",
    "STREAM_DRAFT",
    "SpecDecodingMetrics",
    "SpecDecodingStats",
    "SyntheticAcceptance",
    "TargetHiddenStates",
    "count_accepted",
    "draft_pool_blocks",
    "format_line",
    "make_proposer",
    "ngram_propose",
    "ngram_propose_naive",
    "parse_batch_schedule",
]


def make_proposer(method: str, *, draft_model: str | None = None, num_blocks: int | None = None,
                  block_size: int = 16, device="cpu", dtype=None, seed: int = 0,
                  target_vocab_size: int | None = None, min_n: int = 1, max_n: int = 3) -> Proposer:
    """The proposer for ``--spec METHOD`` ("ngram" or "draft"; "draft" needs ``draft_model`` and ``num_blocks``)."""
    if method == "ngram":
        return NgramProposer(min_n=min_n, max_n=max_n)
    if method == "draft":
        if not draft_model:
            raise ValueError("--spec draft needs --draft-model PATH (a HF directory or .gguf file)")
        if num_blocks is None:
            raise ValueError("num_blocks (the draft KV pool size) is required for --spec draft")
        return DraftModelProposer.from_path(draft_model, num_blocks, block_size, device=device, dtype=dtype,
                                            seed=seed, target_vocab_size=target_vocab_size)
    raise ValueError(f"spec method must be 'ngram' or 'draft', got {method!r}")
