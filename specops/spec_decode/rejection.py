"""rejection_sample: verify the drafts of a batch against the target logits (checks + dispatch).

The Triton path reads every target row once (pass 1: per-chunk softmax statistics and
per-sub-chunk sums, argmax, acceptance, output row). For requests whose first rejection is
a random row, the recovered token is drawn by a two-level race (a sub-chunk of the row by
its residual mass, then a token of that sub-chunk): without draft probs pass 1's finalize
kernel does it from the sub-chunk sums and one sub-chunk of the row; with draft probs a
second pass reads that row and its draft probs once (the sub-chunk residual masses, no
noise), then one sub-chunk. Draft ids are read as given (int32 or int64; an id outside
[0, V) is invalid inside the kernels). Everything stays on the device: no host sync,
CUDA-graph capturable. The torch path (specops.spec_decode.rejection_torch)
is the reference and the CPU fallback.
"""

from __future__ import annotations

import torch

from specops.spec_decode.rejection_args import check_rejection_args
from specops.spec_decode.rejection_torch import rejection_sample_torch
from specops._arg_checks import dense, unit_stride_rows
from specops.sampling.topk_topp import resolve_backend
from specops.triton_kernels.rejection_recover import rejection_recover_pass
from specops.triton_kernels.rejection_sample import (check_sub_chunk, chunk_size, rejection_sample_pass,
                                                    sub_chunk_size)

def rejection_sample(
    logits: torch.Tensor,               # [num_logits, V] fp32/bf16/fp16 target logits
    draft_token_ids: torch.Tensor,      # [T] int32/int64, drafts of all requests concatenated
    cu_num_draft_tokens: torch.Tensor,  # [num_reqs] int32/int64, inclusive cumulative drafts
    max_spec_len: int,
    bonus_token_ids: torch.Tensor,      # [num_reqs] int32/int64
    *,
    target_rows: torch.Tensor | None = None,   # [T] int32/int64 rows of logits to verify with
    draft_probs: torch.Tensor | None = None,   # [T, V] fp32/bf16/fp16 draft distributions
    temperature: torch.Tensor | None = None,   # [num_reqs] fp32, > 0 for random requests
    inv_temperature: torch.Tensor | None = None,  # [T] fp32 1/T per draft row (instead of temperature)
    threshold: torch.Tensor | None = None,     # [T] fp32 per draft row: scaled logits below are dropped
    is_greedy: torch.Tensor | bool = False,    # [num_reqs] bool, or one flag for the batch
    seeds: torch.Tensor | None = None,         # [num_reqs] int64 request seeds
    has_seed: torch.Tensor | None = None,      # [num_reqs] bool
    positions: torch.Tensor | None = None,     # [num_reqs] int64 sequence position of draft 0
    step: torch.Tensor | None = None,          # [] / [1] int64 engine step counter (device)
    engine_seed: int = 0,
    backend: str = "auto",
    fuse_recover: bool | None = None,
    sub_chunk: int | None = None,
) -> torch.Tensor:                             # [num_reqs, max_spec_len + 1] int32
    """Accept or reject each request's drafts; emit accepted drafts + one target token.

    Request r owns draft rows [cu[r-1], cu[r]). For draft i with token x and target
    distribution p = softmax(logits / T) of its row:

    - greedy requests accept while x == argmax(logits); the first mismatch emits the argmax;
    - random requests accept when p(x) >= u * q(x) (q = ``draft_probs``, or q(x) = 1 for
      drafts without probabilities, i.e. accept with probability p(x)); the first
      rejection emits a recovered token drawn from normalise(max(0, p - q)) (for one-hot
      q: p without x) by an exponential race over the sub-chunks of the row (weighted by
      their residual mass), then over the tokens of the chosen sub-chunk (exact: see
      specops.triton_kernels.rejection_sample);
    - a draft id outside [0, V) (e.g. -1 padding) is always rejected; the token emitted
      there is drawn from p (greedy: the argmax);
    - an invalid target row (a NaN or +inf logit after scaling, or no logit above -inf,
      e.g. below the threshold; as the Sampler's invalid rows) accepts nothing and emits
      nothing: the request's output ends before it (-1 there), its earlier accepted drafts
      kept. A caller sees it as a row of accepted drafts only (no recovered or bonus token).
      A random request whose temperature is not finite and > 0 (0, negative, +-inf or NaN;
      likewise an ``inv_temperature`` that is not finite and > 0) is a caller's bug, and every
      one of its rows is invalid: its output is all -1 (greedy requests ignore their
      temperature);
    - when every draft is accepted, ``bonus_token_ids[r]`` is appended; an id outside [0, V)
      appends nothing (-1 there), tested before any narrowing, as a draft id is.

    The output row is the emitted tokens followed by -1. Uniforms come from
    (seed, position + i, STREAM_ACCEPT), recovered noise from STREAM_RECOVER_CHUNK
    (sub-chunks) and STREAM_RECOVER (tokens) (see specops.rng); sub-chunks are a function
    of V only (sub_chunk_size), so a seeded request's output depends only on its own inputs.

    Parameters
    ----------
    logits : torch.Tensor
        Target logits, already processed (penalties, masks, ...) except for the
        temperature when ``temperature`` is given. Rows ``target_rows`` (default: all,
        then num_logits == T) are the draft rows, in draft order: values in
        [0, num_logits), checked on the torch path (ValueError). The Triton path cannot check
        them (no host sync): a row outside is never read and counts as an invalid row (the
        request's output ends there with -1).
    draft_token_ids, cu_num_draft_tokens, bonus_token_ids : torch.Tensor
        See the shapes above. The caller must guarantee that ``cu_num_draft_tokens`` is
        non-decreasing from a first value >= 0, ends at T (``cu[-1] == T``) and gives no
        request more than ``max_spec_len`` drafts. The torch path reads these values back
        and raises ValueError on a violation; the Triton path cannot (no host sync) and
        stays in bounds instead: a request with more than ``max_spec_len`` drafts emits
        nothing (all -1), counts are clamped into [0, T], and a decreasing ``cu`` gives the
        requests concerned unspecified outputs (tokens of the vocabulary, bonus tokens or
        -1). ``RejectionSampler`` checks its host copy of the counts before any
        launch. Draft ids are read at their width (int64 ids are never narrowed).
    max_spec_len : int
        At least the largest draft count of one request (the output has max_spec_len + 1
        columns), at most MAX_SPEC_LEN = 128 (``specops.MAX_SPEC_LEN``: the largest K
        supported; ValueError above it).
    draft_probs : torch.Tensor, optional
        Draft distributions; None for n-gram style drafts. The caller must guarantee that
        row i is the distribution draft i was drawn from: finite, >= 0, summing to 1 (up to
        rounding), with q(x) > 0 at the draft token. Only the shape, dtype and device are
        checked on the host (reading the values would sync it). What the kernels read is
        guarded: a random row whose valid draft has q(x) < 0, NaN or +inf is invalid (the
        output ends there, -1), and so is the recovered token of a rejected row holding
        such a value anywhere (-1), on both backends. Other bad values are not detected and
        bias the output: q(x) = 0 accepts every draft with p(x) > 0, and a row scaled by c
        accepts with probability min(1, p(x) / (c q(x))).
    temperature : torch.Tensor, optional
        Per-request temperature applied inside the kernel as logits * (1 / T) (ignored for
        greedy requests), finite and > 0 for random requests (see above for other values);
        None when the logits are already scaled.
    inv_temperature : torch.Tensor, optional
        Per-draft-row 1 / T instead of ``temperature`` (the Sampler's convention; values of
        greedy requests are ignored).
    threshold : torch.Tensor, optional
        Per-draft-row truncation of random rows (top-k / top-p / min-p): tokens whose
        scaled logit is below it have probability 0 (e.g. ``SampleResult.threshold``).
    is_greedy : torch.Tensor or bool
        Per-request greedy flags, or one flag for every request.
    seeds, has_seed, positions : torch.Tensor, optional
        Per-request seeds: rows with ``has_seed`` use (seed, position + i); the other rows
        use (engine_seed, lane, step) as in specops.rng.row_keys. ``seeds`` None: no row
        is seeded, and has_seed / positions given without seeds are refused.
    step : torch.Tensor, optional
        The engine's step counter on the device (default 0).
    engine_seed : int
        Seed of unseeded rows.
    backend : {"auto", "triton", "torch"}
        "auto": Triton on CUDA, torch elsewhere. "triton" on CPU needs TRITON_INTERPRET=1.
    fuse_recover : bool, optional
        Without draft probs, run the token level of the race in every sub-chunk of every
        random row during the first pass (noise for every token) instead of in one sub-chunk
        of the rejected row after it. Same tokens either way; None (default): after it.
    sub_chunk : int, optional
        Tokens per sub-chunk of the recovered-token race, a power of two in
        [16, chunk_size(V)] (default sub_chunk_size(V)). It changes which tokens are drawn,
        not their distribution; for experiments (keep it a function of V: batch invariance).

    Returns
    -------
    torch.Tensor
        [num_reqs, max_spec_len + 1] int32.

    Raises
    ------
    TypeError, ValueError
        On a wrong type, dtype, shape or device, before any launch (and, on the torch path,
        on the values of cu_num_draft_tokens and target_rows).

    Examples
    --------
    >>> logits = torch.tensor([[0.0, 5.0, 0.0], [9.0, 0.0, 0.0]])
    >>> rejection_sample(logits, torch.tensor([1, 2]), torch.tensor([2]), 2, torch.tensor([0]),
    ...                  is_greedy=True, backend="torch")
    tensor([[ 1,  0, -1]], dtype=torch.int32)
    """
    engine_seed = check_rejection_args(
        logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, bonus_token_ids, target_rows=target_rows,
        draft_probs=draft_probs, temperature=temperature, inv_temperature=inv_temperature, threshold=threshold,
        is_greedy=is_greedy, seeds=seeds, has_seed=has_seed, positions=positions, step=step, engine_seed=engine_seed)
    device = logits.device
    num_reqs, vocab = cu_num_draft_tokens.shape[0], logits.shape[1]
    chunk = chunk_size(vocab)
    sub_chunk = sub_chunk_size(vocab) if sub_chunk is None else sub_chunk
    check_sub_chunk(sub_chunk, chunk)
    backend = resolve_backend(backend, device)

    if backend == "torch":
        return rejection_sample_torch(
            logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, bonus_token_ids,
            target_rows=target_rows, draft_probs=draft_probs, temperature=temperature,
            inv_temperature=inv_temperature, threshold=threshold, is_greedy=is_greedy,
            seeds=seeds, has_seed=has_seed, positions=positions, step=step, engine_seed=engine_seed,
            sub_chunk=sub_chunk)

    out = torch.empty((num_reqs, max_spec_len + 1), dtype=torch.int32, device=device)
    if num_reqs == 0:
        return out
    logits = unit_stride_rows(logits)
    if draft_probs is not None:
        draft_probs = unit_stride_rows(draft_probs)
    if step is None:
        step = torch.zeros(1, dtype=torch.int64, device=device)
    step = step.reshape(1)
    if fuse_recover is None:
        fuse_recover = False
    fuse = bool(fuse_recover) and draft_probs is None and is_greedy is not True
    args = dict(target_rows=dense(target_rows), draft_token_ids=dense(draft_token_ids),
                draft_probs=draft_probs, cu_num_draft_tokens=dense(cu_num_draft_tokens),
                temperature=dense(temperature), inv_temperature=dense(inv_temperature), threshold=dense(threshold),
                seeds=dense(seeds), has_seed=dense(has_seed), positions=dense(positions), step=step,
                engine_seed=engine_seed)
    is_greedy = dense(is_greedy)
    pass1 = rejection_sample_pass(out, logits, bonus_token_ids=dense(bonus_token_ids),
                                  is_greedy=is_greedy, fuse_race=fuse, chunk=chunk, sub_chunk=sub_chunk, **args)
    if draft_probs is not None and is_greedy is not True:
        rejection_recover_pass(out, logits, pass1=pass1, chunk=chunk, sub_chunk=sub_chunk, **args)
    return out


