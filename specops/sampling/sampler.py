"""The Sampler: the vLLM-v1 sampling pipeline over a mixed batch (seeds/01, chapter 2).

Order of the steps:

1. keep the raw logits if "raw_*" logprobs are wanted
2. float32 (lazily: only when a later step must write the logits; the draw reads
   bf16/fp16 directly)
3. allowed_token_ids  4. bad_words
5. logits processors that change the argmax (min_tokens, logit_bias, custom)
6. penalties (repetition, frequency, presence: specops.ops.apply_penalties_)
7. greedy rows: argmax; random rows: temperature, min-p (the metadata's and the min_p
   processor's), the custom argmax-invariant processors, top-k, top-p and the draw, in
   vLLM v1's order: one fused two-pass kernel on CUDA (specops.sampling.topk_topp), the
   sort-based reference elsewhere. min-p is fused into the draw unless a custom
   argmax-invariant processor is active: then the logits are scaled and cut by min-p in
   torch (the draw's rule, `row_thresholds_torch`) before those processors; the rows they
   change are drawn from what they returned with no min-p, the rows they leave as they were
   keep the fused min-p draw (so a seeded row's token does not depend on a neighbour's
   processor)
8. logprobs (specops.sampling.logprobs)

`process` runs steps 1-7 up to (not including) the thresholds and the draw and returns
`ProcessedLogits`; `sample_processed` does the rest. The rejection sampler uses the two
halves on its target rows (rows need not be 1:1 with requests: see
`SamplingMetadata.expand` and `LogitsRows`).

The Sampler may modify fp32 `logits` in place (like vLLM); pass a copy to keep them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specops import rng
from specops._arg_checks import LOGIT_DTYPES

from .logits_processors.builtin import MinPLogitsProcessor
from .logprobs import LogprobsTensors, compute_logprobs, compute_processed_logprobs
from .metadata import LOGPROBS_MODES, SamplingMetadata
from .sampler_torch import (SampleResult, apply_allowed_token_mask_, apply_bad_words_, apply_penalties_torch,
                            row_thresholds_torch, scale_logits, target_probs_torch)
from .topk_topp import (check_backend_name, check_kernel_option_values, kernel_option_names, resolve_backend, sample,
                        sample_options, unknown_kernel_options)


@dataclass
class ProcessedLogits:
    """Logits after steps 1-7 of the pipeline, before thresholds and the draw.

    Attributes
    ----------
    logits : torch.Tensor
        [R, V] processed logits (the input tensor itself when nothing had to change them).
        Unscaled, unless custom argmax-invariant processors ran: then they are scaled and
        `inv_temperature` is 1 on random rows; a row those processors changed was cut by
        min-p (-inf below it) before them.
    inv_temperature : torch.Tensor
        [R] fp32, 1/T on random rows, -1 on greedy rows (what the draw must still apply).
    min_p : torch.Tensor or None
        [R] fp32, the row's min_p (metadata and min_p processor combined) that the draw must
        still apply; None when no row has one. 0 on a row that custom argmax-invariant
        processors changed (min-p was applied before them).
    raw_logits : torch.Tensor or None
        [R, V] the logits as given, kept for "raw_*" logprobs.
    """

    logits: torch.Tensor
    inv_temperature: torch.Tensor
    min_p: torch.Tensor | None
    raw_logits: torch.Tensor | None


@dataclass
class SamplerOutput:
    """What `Sampler` returns for one step.

    Attributes
    ----------
    sampled_token_ids : torch.Tensor   [R] int64, -1 for invalid rows
    logprobs : LogprobsTensors or None
    result : SampleResult              the processed distribution of every row; its threshold
                                       and log_norm are None unless processed logprobs were
                                       asked for (`Sampler.target_distribution` always has them)
    """

    sampled_token_ids: torch.Tensor
    logprobs: LogprobsTensors | None
    result: SampleResult


def _check_identity_rows(procs, num_rows: int) -> None:
    """Raise ValueError when `metadata.rows` is None (row i is persistent-batch index i) but an
    active processor holds fewer than `num_rows` indices: its state cannot describe every row
    (the min_p processor's [max_num_reqs] values broadcast over the rows, silently applying
    request 0's min_p to every row when max_num_reqs is 1)."""
    for proc in procs.all:
        limit = getattr(proc, "max_num_reqs", None)
        if (isinstance(limit, int) and not isinstance(limit, bool) and num_rows > limit
                and proc.is_active()):
            raise ValueError(f"metadata.rows is None, so logits row i is persistent-batch index i, but the "
                             f"logits have {num_rows} rows and {type(proc).__name__} holds max_num_reqs={limit} "
                             f"indices: give metadata.rows (LogitsRows) naming each row's batch index")


def _penalties_op():
    try:
        from specops import ops
        return getattr(ops, "apply_penalties_", None)
    except ImportError:  # pragma: no cover - the ops package is absent in a stripped install
        return None


class Sampler:
    """The sampling pipeline.

    Parameters
    ----------
    logprobs_mode : str
        "raw_logprobs" (default), "raw_logits", "processed_logprobs" or "processed_logits".
        The tokens never depend on it: they are the tokens-only draw's (rows of top-p and / or
        min-p without top-k by pivot rejection, see `specops.sampling.sample`); a processed
        mode with logprobs asked for also computes the exact distribution, in a second call
        when a row may be such a row.
    backend : str
        "auto" (fused Triton kernels on CUDA, torch elsewhere), "triton" or "torch" (the
        sort-based reference for thresholds and draw, torch penalties).
    stream : int
        Generator stream of the draw (specops.rng.STREAM_SAMPLE), in [0, 2**16).
    kernel_options : dict, optional
        Tuning knobs of the Triton passes (cap, tile, num_chunks, blocks_per_program, ...: the
        keyword options of `sample_top_k_top_p_triton`, see `kernel_option_names`; another key
        is refused here, whatever the backend); tests use them. They also reach the rejection
        sampler's target rows. The metadata's search hint is added (`sample_options`); an
        explicit "search" stands.

    Examples
    --------
    >>> md = SamplingMetadata.from_params([0.0, 0.8], vocab_size=32000, top_p=[1.0, 0.9],
    ...                                   seeds=[None, 1234], positions=[7, 7])
    >>> out = Sampler()(torch.randn(2, 32000), md)
    >>> out.sampled_token_ids.shape
    torch.Size([2])
    """

    def __init__(self, logprobs_mode: str = "raw_logprobs", backend: str = "auto",
                 stream: int = rng.STREAM_SAMPLE, kernel_options: dict | None = None):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        check_backend_name(backend)
        if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < rng.SUB_STREAM:
            # streams from 2**16 up hold the sub-chunk noise of the two-level draw (stream + SUB_STREAM)
            raise ValueError(f"stream must be an int in [0, 2**16), got {stream!r}")
        if kernel_options is not None and not isinstance(kernel_options, dict):
            raise TypeError(f"kernel_options must be a dict or None, got {type(kernel_options).__name__}")
        if unknown_kernel_options(kernel_options or {}):
            raise ValueError(f"kernel_options has unknown keys {unknown_kernel_options(kernel_options)}: the keys are "
                             f"{sorted(kernel_option_names())}")
        check_kernel_option_values(kernel_options)
        self.logprobs_mode = logprobs_mode
        self.backend = backend
        self.stream = stream
        self.kernel_options = dict(kernel_options or {})

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of `logits` ([R, V] fp32/bf16/fp16)."""
        processed = self.process(logits, metadata)
        # the threshold is read only by processed logprobs: without them, pivot rows need none
        need = metadata.max_num_logprobs is not None and self.logprobs_mode.startswith("processed")
        result = self.sample_processed(processed, metadata, distribution=need)
        tokens = result.tokens
        widen = False
        if need and metadata.greedy_rows_hint() is not True and metadata.pivot_rows_hint(processed.min_p) is not False:
            # the tokens are the tokens-only draw's whatever the logprobs asked for, so that a
            # seeded row's token does not depend on its batch's logprobs (rows of top-p / min-p
            # without top-k: pivot rejection); the distribution comes from the call above, widened
            # to a drawn token that it leaves out at a float near-tie of the top-p boundary
            tokens = self.sample_processed(processed, metadata, distribution=False).tokens
            widen = True
        logprobs = None
        if need:
            logprobs, result = compute_processed_logprobs(self.logprobs_mode, metadata.max_num_logprobs, tokens,
                                                          processed.logits, processed.inv_temperature, result,
                                                          widen=widen, backend=self.backend)
        elif metadata.max_num_logprobs is not None:
            logprobs = compute_logprobs(self.logprobs_mode, metadata.max_num_logprobs, tokens,
                                        raw_logits=processed.raw_logits, backend=self.backend)
        return SamplerOutput(result.tokens, logprobs, result)

    # ---- steps 1-7: processing ----------------------------------------------------------

    def process(self, logits: torch.Tensor, metadata: SamplingMetadata) -> ProcessedLogits:
        """Steps 1-7 except thresholds and draw (see the module docstring)."""
        if not isinstance(metadata, SamplingMetadata):
            raise TypeError(f"metadata must be a SamplingMetadata (SamplingMetadata.from_params), "
                            f"got {type(metadata).__name__}")
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor [rows, vocab], got {type(logits).__name__}")
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
        if logits.dtype not in LOGIT_DTYPES:
            # checked here, not only by the draw: a batch that writes the logits casts them first
            raise TypeError(f"logits must be fp32, bf16 or fp16, got {logits.dtype}")
        R, V = logits.shape
        if R != metadata.num_rows:
            raise ValueError(f"logits has {R} rows but the metadata describes {metadata.num_rows}")
        metadata.check_vocab(V)
        if logits.device != metadata.device:
            raise ValueError(f"logits are on {logits.device} but the metadata on {metadata.device}")
        if resolve_backend(self.backend, logits.device) == "triton":   # errors before anything is written
            check_kernel_option_values(self.kernel_options, V)
        procs = metadata.logitsprocs
        if procs is not None and metadata.rows is None:
            _check_identity_rows(procs, R)   # before anything is written
        active = [p for p in procs.non_argmax_invariant if p.is_active()] if procs is not None else []
        want_raw = metadata.max_num_logprobs is not None and self.logprobs_mode.startswith("raw")
        writes = (metadata.allowed_token_mask is not None or bool(metadata.bad_words_token_ids)
                  or not metadata.no_penalties
                  or bool(active))
        raw = None
        x = logits
        if writes:
            if logits.dtype == torch.float32:
                raw = logits.clone() if want_raw else None
                if logits.requires_grad or (logits.is_inference() and not torch.is_inference_mode_enabled()):
                    # the compiled ops refuse to write a tensor that requires grad, and torch one made
                    # under inference_mode outside it: the Sampler writes a copy
                    x = logits.detach().clone()
            else:
                raw = logits if want_raw else None
                x = logits.detach().float()
            if (V > 1 and x.stride(1) != 1) or (R > 1 and x.stride(0) < V):
                # the compiled penalty ops need a contiguous last dimension, and rows that share
                # memory (an expanded [1, V] row: stride 0) would take each other's writes: copy
                # before anything is written (the caller's logits are then left as they were)
                x = x.contiguous()
        elif want_raw:
            raw = logits
        apply_allowed_token_mask_(x, metadata.allowed_token_mask)
        apply_bad_words_(x, metadata.bad_words_token_ids, metadata.output_token_ids)
        for proc in active:
            x = proc.apply(x, metadata.rows)
        if not metadata.no_penalties:
            self._apply_penalties(x, metadata)
        inv_t = metadata.inv_temperature
        min_p = metadata.min_p
        if procs is not None:
            for proc in procs.argmax_invariant:
                if isinstance(proc, MinPLogitsProcessor):
                    mp = proc.row_min_p(metadata.rows, R, x.device)
                    if mp is not None:
                        min_p = mp if min_p is None else torch.maximum(min_p, mp)
            custom = [p for p in procs.argmax_invariant
                      if not isinstance(p, MinPLogitsProcessor) and p.is_active()]
            if custom:
                x, inv_t, min_p = self._apply_custom_argmax_invariant(x, inv_t, min_p, custom, metadata.rows)
        return ProcessedLogits(x, inv_t, min_p, raw)

    @staticmethod
    def _apply_custom_argmax_invariant(x, inv_t, min_p, custom, rows):
        """vLLM v1's order: temperature, min-p on the scaled logits, then the custom
        processors; returns (x, inv_t, min_p) for the draw.

        A row the processors leave as they got it keeps its min-p for the draw, on its
        unmasked scaled logits (the same law: the draw cuts at the same threshold): so a
        seeded row's token does not change because another request switched a processor on
        (the draw of a row with min-p and the draw of a pre-masked row use the noise
        differently). A row they change is drawn from what they returned, min-p off."""
        random = inv_t > 0
        scaled = scale_logits(x, inv_t)
        x = scaled
        if min_p is not None:
            row_min_p = torch.where(random, min_p, torch.zeros_like(min_p))   # greedy rows: none
            tau = row_thresholds_torch(scaled, None, None, row_min_p)
            x = scaled.masked_fill(scaled < tau.unsqueeze(1), float("-inf"))   # NaN rows stay invalid
            given = x.clone()                                                  # a processor may write in place
        inv_t = torch.where(random, torch.ones_like(inv_t), inv_t)
        for proc in custom:
            x = proc.apply(x, rows)
        if min_p is not None:
            same = (x == given) | (x.isnan() & given.isnan())
            untouched = same.all(dim=1)                                        # [R] bool, no host sync
            x = torch.where(untouched.unsqueeze(1), scaled, x)
            min_p = torch.where(untouched, min_p, torch.zeros_like(min_p))
        return x, inv_t, min_p

    def _apply_penalties(self, x: torch.Tensor, md: SamplingMetadata) -> None:
        op = None if resolve_backend(self.backend, x.device) == "torch" else _penalties_op()
        args = (md.prompt_mask, md.output_counts, md.repetition_penalties, md.frequency_penalties,
                md.presence_penalties)
        if op is None:
            apply_penalties_torch(x, *args)
        else:
            op(x, *args)

    def target_distribution(self, logits: torch.Tensor, metadata: SamplingMetadata,
                            stream: int | None = None) -> tuple[ProcessedLogits, SampleResult]:
        """The whole processing, thresholds included, for rows whose distribution is needed
        (e.g. the target rows of speculative decoding): (processed logits, result).

        `result.threshold`, `row_max` and `log_norm` describe the distribution exactly:
        p_i = exp(x_i - row_max - log_norm) where x_i >= threshold, 0 elsewhere, with x the
        processed logits times `processed.inv_temperature` on random rows
        (`processed_probs` materialises it). The draw comes with it at no extra pass.
        """
        processed = self.process(logits, metadata)
        return processed, self.sample_processed(processed, metadata, stream)

    # ---- thresholds and draw ------------------------------------------------------------

    def sample_processed(self, processed: ProcessedLogits, metadata: SamplingMetadata,
                         stream: int | None = None, distribution: bool = True) -> SampleResult:
        """Temperature, min-p, top-k, top-p and the draw on processed logits;
        `distribution=False`: tokens only (see `specops.sampling.sample`)."""
        md = metadata
        filters = (None, None, None) if md.greedy_rows_hint() is True else (md.top_k, md.top_p, processed.min_p)
        backend = resolve_backend(self.backend, processed.logits.device)
        opts = sample_options(md, filters[2], self.kernel_options, distribution) if backend == "triton" else {}
        return sample(processed.logits, processed.inv_temperature, *filters, md.seeds, md.positions,
                      self.stream if stream is None else stream, backend, distribution, **opts)


def processed_probs(processed: ProcessedLogits, result: SampleResult) -> torch.Tensor:
    """[R, V] fp32 probabilities of the distribution each row was drawn from (zeros on
    invalid rows; greedy rows: the softmax of their processed logits)."""
    return target_probs_torch(scale_logits(processed.logits, processed.inv_temperature), result)
