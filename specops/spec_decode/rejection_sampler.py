"""RejectionSampler: speculative-decoding verification with every sampling parameter honoured.

One step's logits hold, per request, K target rows (one per draft) and one bonus row
(SpecDecodeMetadata). The RejectionSampler

1. samples the bonus rows with the full Sampler (positions + K, penalties counting all
   K drafts, processors seeing output length + K);
2. runs the Sampler's processing on the target rows, each row seeing its own request's
   parameters and history: allowed_token_ids, bad_words (history + earlier drafts),
   min_tokens (output length + i), logit_bias, custom processors, penalties (output counts
   plus the drafts before row i), temperature, min_p, top-k and top-p (as a per-row
   threshold from the Sampler's threshold pass);
3. verifies the drafts (specops.spec_decode.rejection_sample): greedy rows by argmax,
   random rows by p(x) >= u q(x) with recovered tokens from max(0, p - q).

When no parameter needs processing (temperature only), step 2 is skipped and the kernels
read the target rows straight from `logits` (one read per row).
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass

import torch

from specops.sampling import LogitsRows, Sampler, SamplerOutput, SamplingMetadata
from specops.sampling.logits_processors.builtin import MinPLogitsProcessor
from specops.sampling.logits_processors.interface import to_device
from specops.sampling.topk_topp import check_kernel_option_values, resolve_backend, sample_options
from specops.sampling.topk_topp import sample as sample_with_thresholds
from specops.spec_decode.metadata import SpecDecodeMetadata
from specops._arg_checks import LOGIT_DTYPES, check_1d, check_int
from specops.spec_decode.rejection import rejection_sample
from specops.spec_decode.rejection_args import check_draft_probs, check_max_spec_len
from specops.triton_kernels.expand import expand_to_draft_rows


@dataclass
class RejectionSamplerOutput:
    """What `RejectionSampler` returns for one step.

    Attributes
    ----------
    output_token_ids : torch.Tensor
        [num_reqs, max_spec_len + 1] int32: accepted drafts, then the recovered or bonus
        token, then -1 (see specops.spec_decode.parse_output).
    bonus : SamplerOutput
        The Sampler's output on the bonus rows (tokens, logprobs if requested).
    """

    output_token_ids: torch.Tensor
    bonus: SamplerOutput


def _draft_row_index(cu: torch.Tensor, total: int, max_spec_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request of each draft row, draft index within the request), [T] int64 each, on cu's device."""
    num_reqs = cu.shape[0]
    reqs = torch.arange(num_reqs, device=cu.device)
    if cu.is_cuda:
        return (expand_to_draft_rows(reqs, cu, total, max_spec_len),
                expand_to_draft_rows(torch.zeros_like(reqs), cu, total, max_spec_len, add_index=True))
    counts = torch.diff(cu.long(), prepend=cu.new_zeros(1, dtype=torch.long))
    req = torch.repeat_interleave(reqs, counts, output_size=total)
    return req, torch.arange(total, device=cu.device) - (cu.long() - counts)[req]


def _check_spec(spec) -> list[int]:
    """Raise TypeError / ValueError unless `spec` is a consistent SpecDecodeMetadata; return its
    draft counts. Host values and tensor shapes only: no device value is read (cu_num_draft_tokens
    is compared with the counts only when it lives on the CPU, where reading it is free)."""
    if not isinstance(spec, SpecDecodeMetadata):
        raise TypeError(f"spec must be a SpecDecodeMetadata (see build_spec_decode_metadata), got "
                        f"{type(spec).__name__}")
    counts = spec.num_draft_tokens
    if (not isinstance(counts, (list, tuple))
            or not all(isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 0 for c in counts)):
        raise ValueError(f"spec.num_draft_tokens must be a list of ints >= 0, got {counts!r}")
    counts = [int(c) for c in counts]
    k = spec.max_spec_len
    check_max_spec_len("spec.max_spec_len", k)
    if counts and max(counts) > k:
        r = counts.index(max(counts))
        raise ValueError(f"spec.num_draft_tokens[{r}] = {counts[r]} exceeds spec.max_spec_len = {k}: "
                         "every request must have at most max_spec_len drafts")
    num_reqs, total = len(counts), sum(counts)
    for name, n, what in (("cu_num_draft_tokens", num_reqs, "num_reqs"), ("bonus_logits_indices", num_reqs, "num_reqs"),
                          ("target_logits_indices", total, "total drafts")):
        t = getattr(spec, name)
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"spec.{name} must have shape [{n}] ({what} of spec.num_draft_tokens), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"spec.{name} must be int32 or int64, got {t.dtype}")
    cu = spec.cu_num_draft_tokens
    if cu.device.type == "cpu" and cu.tolist() != list(itertools.accumulate(counts)):
        raise ValueError(f"spec.cu_num_draft_tokens must be the cumulative sum of spec.num_draft_tokens "
                         f"{counts}, got {cu.tolist()}")
    return counts


def _check_draft_lists(draft_token_lists, counts: list[int]) -> None:
    """Raise TypeError / ValueError unless draft_token_lists holds num_draft_tokens[r] ints for
    every request r (host values: the caller's copy of the drafts)."""
    if not isinstance(draft_token_lists, (list, tuple)) or len(draft_token_lists) != len(counts):
        raise ValueError(f"draft_token_lists must be a list with one list of drafts per request ({len(counts)})")
    for r, (drafts, c) in enumerate(zip(draft_token_lists, counts)):
        if not isinstance(drafts, (list, tuple)) or len(drafts) != c:
            raise ValueError(f"draft_token_lists[{r}] must be a list of num_draft_tokens[{r}] = {c} drafts, got "
                             f"{len(drafts) if isinstance(drafts, (list, tuple)) else type(drafts).__name__}")
        for i, t in enumerate(drafts):
            check_int(f"draft_token_lists[{r}][{i}]", t)


def _active(procs, argmax_invariant: bool) -> list:
    if procs is None:
        return []
    group = procs.argmax_invariant if argmax_invariant else procs.non_argmax_invariant
    return [p for p in group if not isinstance(p, MinPLogitsProcessor) and p.is_active()]


class RejectionSampler:
    """Verify K draft tokens per request in one pass over the target rows.

    Parameters
    ----------
    sampler : Sampler, optional
        The Sampler used for bonus rows and for processing target rows (default: a new
        ``Sampler(backend=backend)``).
    backend : {"auto", "triton", "torch"}
        Backend of the rejection kernels ("auto": Triton on CUDA, torch elsewhere).

    A request may have up to ``MAX_SPEC_LEN`` = 128 drafts (K) per step. Every argument is
    checked before any launch: types, shapes, dtypes and devices, and the host side of
    ``spec`` (``num_draft_tokens`` within ``max_spec_len`` <= MAX_SPEC_LEN, one per request,
    tensor lengths that match it). Device values are not read (no host sync), so the
    caller guarantees that ``spec``'s device tensors match its host counts (the builder
    makes them so) and that ``draft_probs`` holds distributions (see ``__call__``).

    Examples
    --------
    >>> from specops.spec_decode import build_spec_decode_metadata
    >>> spec = build_spec_decode_metadata([2, 0], [3, 4])          # 2 requests, 2 + 0 drafts
    >>> md = SamplingMetadata.from_params([0.0, 0.7], vocab_size=100, seeds=[1, None], positions=[10, 4])
    >>> logits = torch.randn(4, 100)                                # rows: target, target, bonus, bonus
    >>> out = RejectionSampler()(logits, spec, md, draft_token_ids=torch.tensor([5, 9]))
    >>> out.output_token_ids.shape
    torch.Size([2, 3])
    """

    def __init__(self, sampler: Sampler | None = None, backend: str = "auto"):
        if backend not in ("auto", "triton", "torch"):
            raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
        if sampler is not None and not isinstance(sampler, Sampler):
            raise TypeError(f"sampler must be a specops Sampler or None, got {type(sampler).__name__}")
        self.sampler = sampler if sampler is not None else Sampler(backend=backend)
        self.backend = backend

    def __call__(
        self,
        logits: torch.Tensor,                       # [T + num_reqs, V] logits at spec.logits_indices
        spec: SpecDecodeMetadata,
        metadata: SamplingMetadata,                 # one row per request
        draft_token_ids: torch.Tensor | None = None,  # [T] int (default: spec.draft_token_ids)
        draft_probs: torch.Tensor | None = None,    # [T, V] draft distributions, None for n-gram drafts
        draft_token_lists: list[list[int]] | None = None,  # host copy of the drafts per request
    ) -> RejectionSamplerOutput:
        """Verify the drafts of every request; see the module docstring.

        Parameters
        ----------
        logits : torch.Tensor
            The step's logits at ``spec.logits_indices`` (target and bonus rows interleaved
            per request, as ``spec.target_logits_indices`` / ``bonus_logits_indices`` say).
        spec : SpecDecodeMetadata
            The step's layout (``build_spec_decode_metadata``): every request has at most
            ``spec.max_spec_len`` <= MAX_SPEC_LEN (128) drafts.
        metadata : SamplingMetadata
            Per-request sampling parameters (row r = request r). ``token_positions`` are
            the positions of each request's first draft. With logits processors,
            ``metadata.rows`` must give each request's persistent index and output length.
        draft_token_ids : torch.Tensor, optional
            [T] int32 / int64 drafts (default ``spec.draft_token_ids``); an id outside
            [0, V) is rejected.
        draft_probs : torch.Tensor, optional
            [T, V] probabilities the drafts were sampled from. The caller must guarantee
            that each row is a distribution (finite, >= 0, summing to 1) with q(x) > 0 at
            its draft x; only shape, dtype and device are checked on the host (see
            ``rejection_sample`` for what the kernels guard and what biases the output).
        draft_token_lists : list of list of int, optional
            Host copy of each request's drafts, used by bad_words and logits processors
            (read back from the device when needed and not given).

        Returns
        -------
        RejectionSamplerOutput

        Raises
        ------
        TypeError, ValueError
            On a wrong argument (type, shape, dtype, device, or an inconsistent ``spec``),
            before any launch.
        """
        counts = _check_spec(spec)
        if not isinstance(metadata, SamplingMetadata):
            raise TypeError(f"metadata must be a SamplingMetadata, got {type(metadata).__name__}")
        num_reqs, total = len(counts), sum(counts)
        if draft_token_ids is None:
            draft_token_ids = spec.draft_token_ids
        if draft_token_ids is None:
            raise ValueError("draft_token_ids is required when spec has none (build it with input_ids)")
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor [{total + num_reqs}, vocab] (target + bonus rows), "
                            f"got {type(logits).__name__}")
        if logits.dim() != 2 or logits.shape[0] != total + num_reqs:
            raise ValueError(f"logits must be [{total + num_reqs}, vocab] (target + bonus rows), got "
                             f"{tuple(logits.shape)}")
        if metadata.num_rows != num_reqs:
            raise ValueError(f"metadata has {metadata.num_rows} rows, expected one per request ({num_reqs})")
        if logits.dtype not in LOGIT_DTYPES:
            raise TypeError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
        device, vocab = logits.device, logits.shape[1]
        metadata.check_vocab(vocab)
        # every input checked here, before the bonus rows' Sampler launches anything
        check_1d("draft_token_ids", draft_token_ids, total, (torch.int32, torch.int64), device)
        check_draft_probs(draft_probs, total, vocab, device)
        resolve_backend(self.backend, device)   # before any launch: triton on CPU needs the interpreter
        if resolve_backend(self.sampler.backend, device) == "triton":
            check_kernel_option_values(self.sampler.kernel_options, vocab)
        md = metadata
        procs = md.logitsprocs
        history_procs = _active(procs, False) + _active(procs, True)
        min_p_proc = procs.get(MinPLogitsProcessor) if procs is not None else None
        min_p_proc_active = min_p_proc is not None and min_p_proc.num_active > 0
        uses_min_p = md.min_p is not None or min_p_proc_active
        all_greedy = md.greedy_rows_hint() is True
        filters = not all_greedy and (md.top_k is not None or md.top_p is not None or uses_min_p)
        needs_drafts_on_host = bool(md.bad_words_token_ids) or bool(history_procs)
        # processors keep state by persistent row (min_p given as a metadata tensor needs no rows)
        if (history_procs or min_p_proc_active) and md.rows is None:
            raise ValueError("metadata.rows (LogitsRows: persistent index and output length of each request) "
                             "is required when logits processors are active")
        if needs_drafts_on_host and draft_token_lists is None:
            flat = draft_token_ids.tolist()   # host sync: bad_words / custom processors work on host lists
            starts = [sum(counts[:r]) for r in range(num_reqs)]
            draft_token_lists = [flat[s:s + c] for s, c in zip(starts, counts)]
        if draft_token_lists is not None:
            _check_draft_lists(draft_token_lists, counts)

        cu = spec.cu_num_draft_tokens.to(device)
        row_req = [r for r, c in enumerate(counts) for _ in range(c)]
        within = [i for c in counts for i in range(c)]

        # 1. bonus rows: the full Sampler, positions + K, history + all K drafts
        b_md = md.expand(list(range(num_reqs)), position_offsets=counts,
                         rows=self._rows(md, list(range(num_reqs)), counts, draft_token_lists, full=True),
                         output_token_ids=self._history(md, list(range(num_reqs)), counts, draft_token_lists)
                         if md.bad_words_token_ids else None)
        if not md.no_penalties:
            self._count_drafts(b_md, list(range(num_reqs)), counts, counts, draft_token_ids)
        needs_processing = (filters or md.allowed_token_mask is not None or bool(md.bad_words_token_ids)
                            or not md.no_penalties or bool(history_procs))
        uniform = num_reqs > 0 and min(counts) == max(counts) and logits.is_contiguous()
        if uniform and not needs_processing:
            # every request has K drafts: the bonus rows are every (K+1)-th row, read in place
            # (the Sampler writes nothing when no parameter needs processing)
            bonus_logits = logits.view(num_reqs, counts[0] + 1, vocab)[:, counts[0]]
        else:
            bonus_logits = logits[spec.bonus_logits_indices.to(device).long()]
        bonus = self.sampler(bonus_logits, b_md)

        hint = md.greedy_rows_hint()
        greedy = md.temperature == 0 if hint is None else hint   # a host bool when the batch is uniform
        keys = dict(seeds=md.request_seeds, has_seed=md.has_seed, positions=md.token_positions, step=md.step,
                    engine_seed=md.engine_seed)
        target_idx = spec.target_logits_indices.to(device).long()
        if not needs_processing:
            # temperature only: the kernels read the target rows in place
            out = rejection_sample(
                logits, draft_token_ids, cu, spec.max_spec_len, bonus.sampled_token_ids,
                target_rows=target_idx, draft_probs=draft_probs,
                temperature=None if all_greedy else md.temperature, is_greedy=greedy,
                backend=self.backend, **keys)
            return RejectionSamplerOutput(out, bonus)

        # 2. target rows: each row with its request's parameters and the drafts before it
        if md.bad_words_token_ids:
            req_of_row, offsets = row_req, within             # bad_words needs host indices
        else:
            req_of_row, offsets = _draft_row_index(cu, total, spec.max_spec_len)
        t_md = md.expand(req_of_row, position_offsets=offsets,
                         rows=self._rows(md, row_req, within, draft_token_lists, full=False),
                         output_token_ids=self._history(md, row_req, within, draft_token_lists)
                         if md.bad_words_token_ids else None)
        if not md.no_penalties:
            self._count_drafts(t_md, row_req, within, counts, draft_token_ids)
        processed = self.sampler.process(logits[target_idx], t_md)   # a gathered copy: may be written
        threshold = None
        if filters and total:
            backend = resolve_backend(self.sampler.backend, processed.logits.device)
            opts = sample_options(t_md, processed.min_p, self.sampler.kernel_options) if backend == "triton" else {}
            res = sample_with_thresholds(processed.logits, processed.inv_temperature, t_md.top_k, t_md.top_p,
                                         processed.min_p, t_md.seeds, t_md.positions, backend=backend, **opts)
            threshold = res.threshold
        out = rejection_sample(
            processed.logits, draft_token_ids, cu, spec.max_spec_len, bonus.sampled_token_ids,
            draft_probs=draft_probs, inv_temperature=processed.inv_temperature, threshold=threshold,
            is_greedy=greedy, backend=self.backend, **keys)
        return RejectionSamplerOutput(out, bonus)

    # ---- per-row history ------------------------------------------------------------------

    @staticmethod
    def _rows(md: SamplingMetadata, row_req: list[int], num_before: list[int],
              drafts: list[list[int]] | None, full: bool) -> LogitsRows | None:
        """LogitsRows of new rows: request row_req[j] with num_before[j] drafts before it."""
        if md.rows is None:
            return None
        preceding = None
        if drafts is not None:
            preceding = [list(drafts[r][:n]) for r, n in zip(row_req, num_before)]
        return LogitsRows([md.rows.req_indices[r] for r in row_req],
                          [md.rows.num_output_tokens[r] + n for r, n in zip(row_req, num_before)],
                          preceding)

    @staticmethod
    def _history(md: SamplingMetadata, row_req: list[int], num_before: list[int],
                 drafts: list[list[int]]) -> list[list[int]]:
        base = md.output_token_ids or [[] for _ in range(md.num_rows)]
        # a row without bad words may have no history (None): the Sampler reads none of it
        return [(list(base[r]) if base[r] is not None else []) + list(drafts[r][:n])
                for r, n in zip(row_req, num_before)]

    @staticmethod
    def _count_drafts(md: SamplingMetadata, row_req: list[int], num_before: list[int], counts: list[int],
                      draft_token_ids: torch.Tensor) -> None:
        """Add the drafts before each row to its (gathered, private) output counts."""
        starts = [0] * len(counts)
        for r in range(1, len(counts)):
            starts[r] = starts[r - 1] + counts[r - 1]
        rows = [j for j, n in enumerate(num_before) for _ in range(n)]
        pos = [starts[row_req[j]] + k for j, n in enumerate(num_before) for k in range(n)]
        if not rows:
            return
        device = md.output_counts.device
        tokens = draft_token_ids.to(device)[to_device(pos, torch.int64, device)]   # pinned copies: no wait
        from specops.ops import token_bincount_update_
        token_bincount_update_(md.output_counts, to_device(rows, torch.int64, device), tokens)
