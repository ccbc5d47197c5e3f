"""Top-k / top-p / min-p + the draw: argument checks and backend dispatch.

`sample` draws one token per row from temperature-scaled, truncated logits (greedy rows
take the argmax) and returns the processed distribution with it (see
specops.sampling.sampler_torch.SampleResult). `draw` is the draw alone, for logits
that were already processed. Backends: "triton" (the two fused passes of
specops.triton_kernels.sampling_stats / sampling_topk_topp: no sort of the vocabulary,
no host sync, CUDA-graph capturable), "torch" (the sort-based reference), "auto"
(triton on CUDA, torch elsewhere).
"""

from __future__ import annotations

import os

import torch

from specops import rng
from specops._arg_checks import LOGIT_DTYPES, check_1d, check_not_meta, dense, unit_stride_rows

from .sampler_torch import SampleResult, sample_torch



def _check_rows(name: str, t, R: int, dtypes, device, optional: bool = False) -> None:
    if t is None:
        if optional:
            return
        raise TypeError(f"{name} must be a tensor of shape [{R}], got None" + (" (required: every draw is keyed)"
                                                                             if name in ("seeds", "positions") else ""))
    check_1d(name, t, R, dtypes, device)


def check_sample_args(logits, inv_temperature, top_k, top_p, min_p, seeds, positions, stream) -> None:
    """Shapes, dtypes and devices (never values: that would sync the host)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits must be fp32, bf16 or fp16, got {logits.dtype}")
    R, V = logits.shape
    if V < 1:
        raise ValueError("logits must have at least one column")
    check_not_meta("logits", logits)
    dev = logits.device
    _check_rows("inv_temperature", inv_temperature, R, (torch.float32,), dev)
    _check_rows("top_k", top_k, R, (torch.int32,), dev, optional=True)
    _check_rows("top_p", top_p, R, (torch.float32,), dev, optional=True)
    _check_rows("min_p", min_p, R, (torch.float32,), dev, optional=True)
    _check_rows("seeds", seeds, R, (torch.int64,), dev)
    _check_rows("positions", positions, R, (torch.int64,), dev)
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < rng.SUB_STREAM:
        # streams from 2**16 up hold the sub-chunk noise of the two-level draw (stream + SUB_STREAM)
        raise ValueError(f"stream must be an int in [0, 2**16), got {stream!r}")


BACKENDS = ("auto", "triton", "torch")


def check_backend_name(backend: str) -> None:
    """Raise ValueError unless `backend` is one of BACKENDS."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")


def kernel_option_names() -> frozenset[str]:
    """The keys `sample(**kernel_options)` and `Sampler(kernel_options=...)` take: the
    keyword-only options of the Triton draw,
    `specops.triton_kernels.sampling_topk_topp.sample_top_k_top_p_triton` ("pivot" included),
    read from its signature when that module is imported, so that the list lives in one place."""
    from specops.triton_kernels.sampling_topk_topp import KERNEL_OPTION_NAMES
    return KERNEL_OPTION_NAMES


def unknown_kernel_options(options: dict) -> list:
    """The keys of `options` that are not kernel options (`kernel_option_names`), sorted."""
    return sorted(set(options) - kernel_option_names(), key=str) if options else []


def check_kernel_option_values(options: dict, vocab: int | None = None) -> None:
    """Raise ValueError on a kernel option's value that the Triton draw cannot take (with
    `vocab`, also the rules that depend on it): before any launch, and before the Sampler
    writes the logits."""
    if options:
        from specops.triton_kernels.sampling_topk_topp import check_kernel_options
        try:
            check_kernel_options(vocab, **options)
        except ValueError as e:
            raise ValueError(f"kernel_options: {e}") from None


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend that runs on `device`: "auto" is Triton on CUDA and torch elsewhere; "triton"
    on CPU needs the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    check_backend_name(backend)
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' on CPU needs TRITON_INTERPRET=1 (set before importing triton)")
    return backend


def sample(
    logits: torch.Tensor,                  # [R, V] fp32/bf16/fp16 processed logits (before temperature)
    inv_temperature: torch.Tensor,         # [R] fp32: 1/T on random rows, -1 on greedy rows
    top_k: torch.Tensor | None = None,     # [R] int32, 0 = off
    top_p: torch.Tensor | None = None,     # [R] fp32, 1 = off
    min_p: torch.Tensor | None = None,     # [R] fp32, 0 = off
    seeds: torch.Tensor | None = None,     # [R] int64, required (None only to keep the order of the arguments)
    positions: torch.Tensor | None = None,  # [R] int64, required
    stream: int = rng.STREAM_SAMPLE,
    backend: str = "auto",
    distribution: bool = True,
    **kernel_options,
) -> SampleResult:
    """Temperature, min-p, top-k, top-p and the exponential-noise draw in one call.

    `seeds` and `positions` are required ([R] int64, the keys of every row's noise: e.g.
    SamplingMetadata's `seeds` / `positions`). Parameter values follow
    specops.sampling.metadata (validated there, once, on the host).
    Here they are device values and not checked (no host sync); both backends read values
    outside those ranges alike: top_k <= 0 or >= V, top_p >= 1 or NaN and min_p <= 0 or NaN
    are off; min_p > 1 acts as 1 (only the max's ties are kept); a NaN or non-positive 1/T
    is greedy; a 1/T of +inf makes the row invalid (token -1). top_p <= 0 alone keeps only
    the max's ties too, but beside a top-k the Triton kernels keep the top-k set where the
    torch reference keeps the max's ties: both draw a token of the row's top k.
    Random rows draw argmax over kept tokens of exp(x - max) / E with E the Exp(1) noise of
    specops.rng keyed by (seeds[r], positions[r], stream): a seeded row's token depends on
    its seed, position and logits only. Rows without top-k, top-p or min-p draw the same
    law in two levels: a sub-chunk of draw_sub_chunk(V) tokens by the race of its mass
    (noise on stream + rng.SUB_STREAM), then the token inside it by the race above; only
    one sub-chunk's token noise is computed. Greedy rows take the argmax of the logits. Rows
    with a NaN or +inf logit, or with all logits -inf, get token -1.

    `distribution=False` asks for the tokens only: `threshold` and `log_norm` are None, and
    rows with top-p and / or min-p but no top-k are drawn without a threshold, by pivot
    rejection (specops.triton_kernels.sampling_pivot: a candidate from the two-level draw,
    kept when it reaches the min-p threshold and the mass above it is below top_p times the
    mass kept by min-p, else drawn again from the tokens above it; fresh noise each round,
    on streams from rng.PIVOT_STREAM up). The law is the same but the token may differ from
    the threshold path's, and it costs a read of the row or two instead of the threshold
    search.

    Returns
    -------
    SampleResult
        tokens [R] int64 and the processed distribution (threshold, row_max, log_norm).

    Examples
    --------
    >>> logits = torch.randn(4, 1000)
    >>> inv_t = torch.tensor([1.0, 1.0, 2.0, -1.0])    # the last row is greedy
    >>> seeds = torch.arange(4); positions = torch.zeros(4, dtype=torch.int64)
    >>> res = sample(logits, inv_t, top_k=torch.tensor([0, 50, 5, 0], dtype=torch.int32),
    ...              seeds=seeds, positions=positions)
    >>> res.tokens.shape
    torch.Size([4])
    """
    R = logits.shape[0] if isinstance(logits, torch.Tensor) and logits.dim() == 2 else 0
    check_sample_args(logits, inv_temperature, top_k, top_p, min_p, seeds, positions, stream)
    if not isinstance(distribution, bool):
        raise TypeError(f"distribution must be a bool, got {type(distribution).__name__}")
    if unknown_kernel_options(kernel_options):   # whatever the backend: a misspelt knob must not pass
        raise TypeError(f"sample() got unknown keyword arguments {unknown_kernel_options(kernel_options)}: "
                        f"its kernel options are {sorted(kernel_option_names())}")
    check_backend_name(backend)   # an empty batch launches nothing, but a bad name is still refused
    if R == 0:
        empty = torch.empty(0, dtype=torch.float32, device=logits.device)
        return SampleResult(torch.empty(0, dtype=torch.int64, device=logits.device), empty if distribution else None,
                            empty, empty if distribution else None)
    if backend == "torch" or resolve_backend(backend, logits.device) == "torch":
        return sample_torch(logits, inv_temperature, top_k, top_p, min_p, seeds, positions, stream, distribution)
    logits = unit_stride_rows(logits)
    from specops.triton_kernels.sampling_topk_topp import sample_top_k_top_p_triton

    # pivot rounds only for a tokens-only draw, and only when a row may have top-p or min-p
    pivot = kernel_options.pop("pivot", top_p is not None or min_p is not None) and not distribution
    tokens, thr, rmax, lnorm = sample_top_k_top_p_triton(
        logits, dense(inv_temperature), dense(top_k), dense(top_p), dense(min_p), dense(seeds), dense(positions),
        stream, pivot=pivot, **kernel_options)
    if not distribution:
        return SampleResult(tokens=tokens, threshold=None, row_max=rmax, log_norm=None)
    return SampleResult(tokens=tokens, threshold=thr, row_max=rmax, log_norm=lnorm)


def sample_options(metadata, min_p: torch.Tensor | None, kernel_options: dict | None = None,
                   distribution: bool = True) -> dict:
    """Triton kernel options for `sample` on the rows of `metadata` (a SamplingMetadata):
    `kernel_options`, plus search=False when the host knows that no row needs the bracket
    search (every random row unfiltered, or with top_k <= the plan's direct limit): 5 of
    the 9 kernels are then left out. `min_p` is the one `sample` gets; one that is not the
    metadata's own (a processor added it) counts as unknown (`SamplingMetadata.filter_bound`).
    `distribution=False` (the `sample` call's): rows with top-p and / or min-p but no top-k
    need no search either, and "pivot" is False when no random row is such a row (the pivot
    rounds are left out).
    An explicit "search" in `kernel_options` stands. When a random row with top-p has a top_k
    wider than the default candidate capacity holds, "cap" is raised to hold it
    (`cap_for_top_k`); an explicit "cap" stands. "direct_beside" is False when the host
    knows that no random row has a top_k the plan's direct path takes (`min_top_k_bound`
    above "kmax"): no side stream is forked for such rows; an explicit one stands.
    "refine" is False when the widest filtered row is a spread row (top_k <= "spread_kmax"):
    the refine launches are left out; "spread_kmax" is 0 when every random row's top_k is
    wider than SPREAD_TOP_K (`min_top_k_bound`): the collect launch is the plain one.
    """
    from specops.triton_kernels.sampling_topk_topp import DEFAULT_CAP, DIRECT_TOP_K, SPREAD_TOP_K, cap_for_top_k

    opts = dict(kernel_options or {})
    # rows of top-p / min-p without top-k need no search only when they take the pivot rounds
    pivot = not distribution and opts.get("pivot", True) is not False
    widest = metadata.filter_bound(min_p, pivot=pivot)
    if "pivot" not in opts and not distribution and metadata.pivot_rows_hint(min_p) is False:
        opts["pivot"] = False   # no such row: no pivot rounds to launch
    if "search" not in opts and widest is not None:
        kmax = opts.get("kmax", DIRECT_TOP_K) if opts.get("select", True) else 0
        if widest <= kmax:
            opts["search"] = False
        elif "refine" not in opts and opts.get("select", True) and widest <= opts.get("spread_kmax", SPREAD_TOP_K):
            opts["refine"] = False      # the spread rows need the collect launch only
    k_low = metadata.min_top_k_bound()
    if ("spread_kmax" not in opts and metadata.top_k is not None and opts.get("search", True) is not False
            and k_low is not None and k_low > SPREAD_TOP_K):
        opts["spread_kmax"] = 0         # no row to spread: the collect launch without that branch
    if ("direct_beside" not in opts and metadata.top_k is not None and opts.get("search", True) is not False
            and k_low is not None and k_low > opts.get("kmax", DIRECT_TOP_K)):
        opts["direct_beside"] = False   # no small top-k row: nothing to decide beside the search
    k_bound = metadata.top_k_with_top_p_bound()
    if "cap" not in opts and k_bound is not None and cap_for_top_k(k_bound) != DEFAULT_CAP:
        opts["cap"] = cap_for_top_k(k_bound)
    return opts


def draw(
    logits: torch.Tensor,                  # [R, V] processed logits: scaled and masked (-inf) already
    greedy: torch.Tensor,                  # [R] bool: rows that take the argmax
    seeds: torch.Tensor,                   # [R] int64
    positions: torch.Tensor,               # [R] int64
    stream: int = rng.STREAM_SAMPLE,
    backend: str = "auto",
) -> torch.Tensor:                         # [R] int64
    """The draw alone, on random rows: a sub-chunk by the race of its mass, then argmax of
    exp(x - max) / E inside it (the two-level draw of `sample`'s rows without a filter);
    argmax on greedy rows.

    `logits` must already be scaled by the temperature and cut by top-k / top-p / min-p
    (-inf outside the kept set), e.g. by `sampler_torch.scale_logits` then
    `top_k_top_p_min_p_mask_torch`. `Sampler.process` does not return such logits: they
    are unscaled and uncut (`Sampler.sample_processed` applies both). On such logits this
    draws from the same distribution as `sample` on the raw ones, with the same noise keys.
    The token is `sample`'s own for rows `sample` drew without a filter; for rows it
    filtered (top-k, top-p, min-p: one race over the kept tokens) it may be another token
    of the same law.
    """
    if not isinstance(greedy, torch.Tensor) or greedy.dtype != torch.bool:
        raise TypeError("greedy must be a bool tensor of shape [rows]")
    if isinstance(logits, torch.Tensor) and logits.dim() == 2:
        check_1d("greedy", greedy, logits.shape[0], (torch.bool,), logits.device)
    inv_t = torch.where(greedy, torch.full_like(greedy, -1.0, dtype=torch.float32),
                        torch.ones_like(greedy, dtype=torch.float32))
    return sample(logits, inv_t, None, None, None, seeds, positions, stream, backend).tokens
