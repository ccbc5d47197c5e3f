"""Logprobs of a draw: the top-n tokens, the sampled token's logprob and its rank.

Four modes (vLLM's names):

- "raw_logprobs": log_softmax of the logits as the Sampler got them, before any of its
  processing (the default). In the engine a structured-output request's grammar mask comes
  before the Sampler, as in vLLM v1: its raw logprobs are those of the masked logits, tokens
  the grammar forbids at -inf;
- "raw_logits": those logits themselves;
- "processed_logprobs": log-probabilities of the distribution actually sampled from
  (after penalties, processors, temperature, min-p, top-k, top-p; -inf outside the kept
  set). Greedy rows report the softmax of their processed logits;
- "processed_logits": the processed, temperature-scaled logits, -inf outside the kept set.

Rank = 1 + the number of tokens with a strictly larger value (ties share the best rank).
Rows whose token is -1 (invalid), or any id outside [0, V), get token id -1, NaN values and
rank -1, on both backends.

Backends of the "raw_*" modes: "torch" (logsumexp, topk, a rank count and a gather: several
passes over the logits) and "triton" (specops.triton_kernels.logprob_stats: logsumexp, the
top n (up to MAX_TOP_N = 32: more takes torch.topk) and the rank in one read of the logits);
"auto" takes triton on CUDA and torch elsewhere. Neither syncs the host. The two agree on
ids and ranks exactly (the top-1 of tied maxima is the first index in both; among ties for
n >= 2 torch.topk's order decides on the torch path and for n > 32, the lowest index first on
the Triton one for n <= 32: the ids of tied values may then differ between a batch asking
for 32 logprobs and one asking for 33) and on values to fp32 rounding. The kernels rank -0.0
and +0.0 as equal, as torch does, and report each token's own value (-0.0 stays -0.0).

The processed modes have the same two backends (`compute_processed_logprobs`): "torch"
scales the logits into a new [R, V] tensor and gathers from it; "triton"
(`logprob_stats.processed_logprob_stats`) scales them as it reads them, takes the
normaliser from the draw's distribution, and, for the Sampler, also widens that
distribution to a drawn token it leaves out (`sampler_torch.keep_drawn_tokens`) in the same
read. For n > 32 it takes torch.topk of the unscaled logits: 1/T > 0 keeps their order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specops._arg_checks import LOGIT_DTYPES, check_1d, unit_stride_rows

from .metadata import LOGPROBS_MODES
from .sampler_torch import SampleResult, keep_drawn_tokens, need_distribution, scale_logits
from .topk_topp import resolve_backend




def _check_has_columns(name: str, logits: torch.Tensor) -> None:
    """A [rows, vocab] tensor with a vocabulary: no column is no distribution (as `sample` says)."""
    if logits.dim() == 2 and logits.shape[1] == 0:
        raise ValueError(f"{name} must have at least one column (one per vocabulary token), got shape "
                         f"{tuple(logits.shape)}")


def _check_logits_dtype(name: str, logits) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dtype not in LOGIT_DTYPES:
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"{name} must be fp32, bf16 or fp16, got {got}")


def _check_num_logprobs(num_logprobs, V: int) -> None:
    if isinstance(num_logprobs, bool) or not isinstance(num_logprobs, int) or not 0 <= num_logprobs <= V:
        raise ValueError(f"num_logprobs must be an int in [0, {V}], got {num_logprobs!r}")


@dataclass
class LogprobsTensors:
    """The logprobs of one step: the sampled token's and the top n per row.

    Attributes
    ----------
    token_ids : torch.Tensor   [R, n + 1] int64, the sampled token first, then the top n
    logprobs : torch.Tensor    [R, n + 1] fp32, in the requested mode
    ranks : torch.Tensor       [R] int64, rank of the sampled token (1 = most likely)
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor


def gather_logprobs(
    scores: torch.Tensor,               # [R, V] fp32 values in the mode's order (logits)
    tokens: torch.Tensor,               # [R] int64 sampled tokens (-1: invalid row)
    num_logprobs: int,
    offset: torch.Tensor | None = None,     # [R] fp32 subtracted from every value (log-normaliser)
    threshold: torch.Tensor | None = None,  # [R] fp32: values below it are reported as -inf
) -> LogprobsTensors:
    """Top-n, the sampled token's value and rank from one [R, V] score tensor. A token outside
    [0, V) marks an invalid row (ids -1, NaN values, rank -1), with no host sync."""
    R, V = scores.shape
    n = min(int(num_logprobs), V)
    bad = (tokens < 0) | (tokens >= V)                  # outside [0, V): invalid, as on the Triton path
    tok = tokens.clamp(0, V - 1).unsqueeze(1)
    chosen = scores.gather(1, tok)                                    # [R, 1]
    ranks = (scores > chosen).sum(dim=-1) + 1
    if n == 1:   # argmax: the first of tied maxima, as the Triton path (topk orders ties freely)
        top_i = scores.argmax(dim=-1, keepdim=True)
        top_v = scores.gather(1, top_i)
    else:
        top_v, top_i = (scores.topk(n, dim=-1) if n > 0 else
                        (scores[:, :0], torch.zeros(R, 0, dtype=torch.int64, device=scores.device)))
    vals = torch.cat([chosen, top_v], dim=1)
    if threshold is not None:
        vals = torch.where(vals >= threshold.unsqueeze(1), vals, torch.full_like(vals, float("-inf")))
    if offset is not None:
        vals = vals - offset.unsqueeze(1)
    ids = torch.cat([tok, top_i], dim=1)
    bad_rows = bad.unsqueeze(1)
    return LogprobsTensors(ids.masked_fill_(bad_rows, -1), vals.float().masked_fill_(bad_rows, float("nan")),
                           ranks.masked_fill_(bad, -1))


def gather_logprobs_triton(
    scores: torch.Tensor,               # [R, V] fp32/bf16/fp16 raw logits, any row stride
    tokens: torch.Tensor,               # [R] int64 sampled tokens (-1: invalid row)
    num_logprobs: int,
    log_norm: bool,                     # True: values minus the row's logsumexp ("raw_logprobs")
) -> LogprobsTensors:
    """`gather_logprobs(scores, tokens, n, logsumexp(scores) if log_norm else None)` fused.

    One Triton pass over the rows gives logsumexp, the sampled token's value and rank, and
    the top n (n <= 32; a larger n adds torch.topk). Tokens outside [0, V) are invalid rows
    (-1 ids, NaN values, rank -1), as on the torch path. Runs on CUDA, or on CPU under
    TRITON_INTERPRET=1 (tests).
    """
    from specops.triton_kernels.logprob_stats import MAX_TOP_N, logprob_stats

    R, V = scores.shape
    n = max(0, min(int(num_logprobs), V))
    scores = unit_stride_rows(scores)
    dev = scores.device
    ids = torch.empty(R, n + 1, dtype=torch.int64, device=dev)
    vals = torch.empty(R, n + 1, dtype=torch.float32, device=dev)
    ranks = torch.empty(R, dtype=torch.int64, device=dev)
    lse = torch.empty(R, dtype=torch.float32, device=dev)
    kernel_top_n = n if 2 <= n <= MAX_TOP_N else 0
    logprob_stats(scores, tokens.to(torch.int64).contiguous(), ids, vals, ranks, lse, log_norm=log_norm,
                  top1=n == 1, top_n=kernel_top_n)
    if n >= 2 and not kernel_top_n:
        top_v, top_i = scores.topk(n, dim=-1)
        top_v = top_v.float()
        if log_norm:
            top_v = top_v - lse.unsqueeze(1)
        bad = ids[:, :1] < 0
        ids[:, 1:] = top_i.masked_fill_(bad, -1)
        vals[:, 1:] = top_v.masked_fill_(bad, float("nan"))
    return LogprobsTensors(ids, vals, ranks)


def compute_logprobs(
    mode: str,
    num_logprobs: int,
    tokens: torch.Tensor,                     # [R] int64
    raw_logits: torch.Tensor | None = None,   # [R, V] as the model produced them ("raw_*" modes)
    processed_logits: torch.Tensor | None = None,  # [R, V] processed, before temperature ("processed_*")
    inv_temperature: torch.Tensor | None = None,   # [R] fp32 ("processed_*")
    result: SampleResult | None = None,       # the draw's processed distribution ("processed_*")
    backend: str = "auto",
) -> LogprobsTensors:
    """Logprobs in `mode` (see the module docstring).

    `backend` ("auto", "triton" or "torch") picks the implementation (module docstring). The
    logits must be fp32, bf16 or fp16 and `num_logprobs` an int (not a bool) in [0, V]. A token
    outside [0, V) (e.g. -1) marks an invalid row on both backends: ids -1, NaN values, rank -1.
    """
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs mode must be one of {LOGPROBS_MODES}, got {mode!r}")
    name = "raw_logits" if mode.startswith("raw") else "processed_logits"
    logits = raw_logits if mode.startswith("raw") else processed_logits
    if logits is None:
        raise ValueError(f"{mode} needs {name}")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [rows, vocab], got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"{name} must be a [rows, vocab] tensor, got {tuple(logits.shape)}")
    _check_logits_dtype(name, logits)
    _check_has_columns(name, logits)
    check_1d("tokens", tokens, logits.shape[0], (torch.int32, torch.int64), logits.device)
    _check_num_logprobs(num_logprobs, logits.shape[1])
    if mode.startswith("raw"):
        if resolve_backend(backend, raw_logits.device) == "triton":
            return gather_logprobs_triton(raw_logits, tokens, num_logprobs, mode == "raw_logprobs")
        scores = raw_logits.float()
        offset = torch.logsumexp(scores, dim=-1) if mode == "raw_logprobs" else None
        return gather_logprobs(scores, tokens, num_logprobs, offset)
    if processed_logits is None or inv_temperature is None or result is None:
        raise ValueError(f"{mode} needs processed_logits, inv_temperature and the draw's result")
    need_distribution(result)
    R, dev = processed_logits.shape[0], processed_logits.device
    check_1d("inv_temperature", inv_temperature, R, (torch.float32,), dev)
    for name in ("threshold", "row_max", "log_norm"):   # [R] each: a shorter one would broadcast
        check_1d(f"result.{name}", getattr(result, name), R, (torch.float32,), dev)
    return compute_processed_logprobs(mode, num_logprobs, tokens, processed_logits, inv_temperature, result,
                                      backend=backend)[0]


def compute_processed_logprobs(
    mode: str,                          # "processed_logprobs" or "processed_logits"
    num_logprobs: int,
    tokens: torch.Tensor,               # [R] int32/int64 sampled tokens (-1: invalid row)
    processed_logits: torch.Tensor,     # [R, V] processed, before temperature
    inv_temperature: torch.Tensor,      # [R] fp32: 1/T on random rows, <= 0 on greedy rows
    result: SampleResult,               # the draw's processed distribution
    *,
    widen: bool = False,
    backend: str = "auto",
) -> tuple[LogprobsTensors, SampleResult]:
    """Processed logprobs and the distribution they were read from.

    With `widen`, `tokens` come from another draw than `result`'s (the Sampler's tokens-only
    draw beside the threshold search): a row whose token lies below its threshold gets the
    distribution widened to that token first (`keep_drawn_tokens`), and the returned
    SampleResult carries `tokens` and the widened threshold / log_norm. Without it `result`
    comes back as given. mode, num_logprobs and the dtype of processed_logits are checked here;
    the shapes are the caller's to check (`compute_logprobs` does); inv_temperature must be
    finite, as SamplingMetadata builds it. Tokens outside [0, V) are invalid rows on both
    backends (ids -1, NaN values, rank -1; `widen` leaves their distribution as it is).
    """
    if mode not in ("processed_logprobs", "processed_logits"):
        raise ValueError(f"mode must be 'processed_logprobs' or 'processed_logits', got {mode!r}")
    _check_logits_dtype("processed_logits", processed_logits)
    _check_has_columns("processed_logits", processed_logits)
    _check_num_logprobs(num_logprobs, processed_logits.shape[1])
    n = num_logprobs
    logprobs_mode = mode == "processed_logprobs"
    if resolve_backend(backend, processed_logits.device) != "triton":
        x = scale_logits(processed_logits, inv_temperature)
        if widen:
            result = keep_drawn_tokens(x, result, tokens.to(torch.int64))
        offset = result.row_max + result.log_norm if logprobs_mode else None
        return gather_logprobs(x, tokens, n, offset, result.threshold), result

    from specops.triton_kernels.logprob_stats import MAX_TOP_N, processed_logprob_stats

    R, V = processed_logits.shape
    scores = unit_stride_rows(processed_logits)
    dev = scores.device
    tokens = tokens.to(torch.int64).contiguous()
    inv_t = inv_temperature.contiguous()
    threshold, row_max, log_norm = (t.contiguous() for t in (result.threshold, result.row_max, result.log_norm))
    ids = torch.empty(R, n + 1, dtype=torch.int64, device=dev)
    vals = torch.empty(R, n + 1, dtype=torch.float32, device=dev)
    ranks = torch.empty(R, dtype=torch.int64, device=dev)
    if widen:
        threshold_out, log_norm_out = torch.empty_like(threshold), torch.empty_like(log_norm)
    else:
        threshold_out, log_norm_out = threshold, log_norm      # not written
    kernel_top_n = n if 2 <= n <= MAX_TOP_N else 0
    processed_logprob_stats(scores, tokens, inv_t, threshold, row_max, log_norm, ids, vals, ranks,
                            threshold_out, log_norm_out, logprobs=logprobs_mode, top1=n == 1, widen=widen,
                            top_n=kernel_top_n)
    if widen:
        result = SampleResult(tokens=tokens, threshold=threshold_out, row_max=result.row_max, log_norm=log_norm_out)
    if n >= 2 and not kernel_top_n:
        top_v, top_i = scores.topk(n, dim=-1)        # x = scores * (1/T > 0): the same order
        top_v = scale_logits(top_v, inv_t)
        top_v = torch.where(top_v >= result.threshold.unsqueeze(1), top_v, torch.full_like(top_v, float("-inf")))
        if logprobs_mode:
            top_v = top_v - (result.row_max + result.log_norm).unsqueeze(1)
        bad = ids[:, :1] < 0
        ids[:, 1:] = top_i.masked_fill_(bad, -1)
        vals[:, 1:] = top_v.masked_fill_(bad, float("nan"))
    return LogprobsTensors(ids, vals, ranks), result
