"""Argument checks of rejection sampling, shared by rejection_sample and its torch reference.

`check_rejection_args` checks types, dtypes, shapes and devices only (never values: that
would sync the host), before any launch. `check_rejection_values` checks the values of the
index tensors (cu_num_draft_tokens, target_rows) on the host: the torch path, which reads
them back anyway, calls it; the Triton path does not (no host sync).
"""

from __future__ import annotations

import torch

from specops._arg_checks import LOGIT_DTYPES, check_1d, check_not_meta, check_seed
from specops.spec_decode.metadata import MAX_SPEC_LEN

_INT_DTYPES = (torch.int32, torch.int64)


def check_draft_probs(draft_probs, num_drafts: int, vocab: int, device: torch.device) -> None:
    """Raise TypeError/ValueError unless `draft_probs` is None or a [num_drafts, vocab] float
    tensor on `device` (its values are not read: no host sync)."""
    if draft_probs is None:
        return
    if not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (num_drafts, vocab):
        raise ValueError(f"draft_probs must have shape [{num_drafts}, {vocab}], got "
                         f"{tuple(draft_probs.shape) if isinstance(draft_probs, torch.Tensor) else draft_probs!r}")
    if draft_probs.dtype not in LOGIT_DTYPES:
        raise TypeError(f"draft_probs must be float32, float16 or bfloat16, got {draft_probs.dtype}")
    if draft_probs.device != device:
        raise ValueError(f"draft_probs must be on {device}, got {draft_probs.device}")


def check_max_spec_len(name: str, max_spec_len) -> None:
    """Raise ValueError naming `name` unless max_spec_len is an int in [0, MAX_SPEC_LEN]."""
    if not isinstance(max_spec_len, int) or isinstance(max_spec_len, bool) or not 0 <= max_spec_len <= MAX_SPEC_LEN:
        raise ValueError(f"{name} must be an int in [0, {MAX_SPEC_LEN}] (MAX_SPEC_LEN), got {max_spec_len!r}")


def check_rejection_args(
    logits, draft_token_ids, cu_num_draft_tokens, max_spec_len, bonus_token_ids, *, target_rows=None,
    draft_probs=None, temperature=None, inv_temperature=None, threshold=None, is_greedy=False, seeds=None,
    has_seed=None, positions=None, step=None, engine_seed=0,
) -> int:
    """Raise TypeError / ValueError on a wrong type, dtype, shape or device of any argument of
    rejection_sample (see there), before any launch; return engine_seed as a signed int64
    (the same 64 bits)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor [num_logits, vocab], got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be a [num_logits, vocab] tensor, got {tuple(logits.shape)}")
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
    check_not_meta("logits", logits)
    device = logits.device
    num_logits, vocab = logits.shape
    if vocab == 0:
        raise ValueError("logits must have vocab >= 1 columns")
    check_max_spec_len("max_spec_len", max_spec_len)
    if not isinstance(cu_num_draft_tokens, torch.Tensor) or cu_num_draft_tokens.dim() != 1:
        raise ValueError("cu_num_draft_tokens must be a [num_reqs] tensor")
    num_reqs = cu_num_draft_tokens.shape[0]
    check_1d("cu_num_draft_tokens", cu_num_draft_tokens, num_reqs, _INT_DTYPES, device)
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dim() != 1:
        raise ValueError("draft_token_ids must be a [num_draft_tokens] tensor")
    num_drafts = draft_token_ids.shape[0]
    check_1d("draft_token_ids", draft_token_ids, num_drafts, _INT_DTYPES, device)
    check_1d("bonus_token_ids", bonus_token_ids, num_reqs, _INT_DTYPES, device)
    if num_drafts > num_reqs * max_spec_len:
        raise ValueError(f"max_spec_len={max_spec_len} is too small for draft_token_ids: it has {num_drafts} "
                         f"drafts, more than num_reqs * max_spec_len = {num_reqs} * {max_spec_len} (max_spec_len "
                         "must be at least the largest draft count of one request)")
    if target_rows is not None:
        check_1d("target_rows", target_rows, num_drafts, _INT_DTYPES, device)
        if num_drafts > 0 and num_logits == 0:
            raise ValueError("logits has no rows, so target_rows can name none: give at least one row")
    elif num_logits != num_drafts:
        raise ValueError(f"logits has {num_logits} rows; without target_rows it must have one row per "
                         f"draft ({num_drafts})")
    check_draft_probs(draft_probs, num_drafts, vocab, device)
    if temperature is not None:
        check_1d("temperature", temperature, num_reqs, (torch.float32,), device)
        if inv_temperature is not None:
            raise ValueError("give temperature or inv_temperature, not both")
    if inv_temperature is not None:
        check_1d("inv_temperature", inv_temperature, num_drafts, (torch.float32,), device)
    if threshold is not None:
        check_1d("threshold", threshold, num_drafts, (torch.float32,), device)
    if isinstance(is_greedy, torch.Tensor):
        check_1d("is_greedy", is_greedy, num_reqs, (torch.bool,), device)
    elif not isinstance(is_greedy, bool):
        raise TypeError(f"is_greedy must be a bool tensor or a bool, got {type(is_greedy).__name__}")
    if seeds is not None:
        check_1d("seeds", seeds, num_reqs, (torch.int64,), device)
        if has_seed is None or positions is None:
            raise ValueError("seeds needs has_seed and positions ([num_reqs] bool and int64)")
        check_1d("has_seed", has_seed, num_reqs, (torch.bool,), device)
        check_1d("positions", positions, num_reqs, (torch.int64,), device)
    elif has_seed is not None:
        raise ValueError("has_seed was given without seeds")
    elif positions is not None:
        raise ValueError("positions was given without seeds: they key seeded rows only (pass seeds and has_seed)")
    if step is not None:
        if not isinstance(step, torch.Tensor) or step.numel() != 1 or step.dtype != torch.int64:
            raise ValueError("step must be an int64 tensor with one element")
        if step.device != device:
            raise ValueError(f"step must be on {device}, got {step.device}")
    return check_seed("engine_seed", engine_seed)


def check_rejection_values(
    num_logits: int,
    num_drafts: int,
    cu_num_draft_tokens: torch.Tensor,   # [num_reqs] int
    max_spec_len: int,
    target_rows: torch.Tensor | None,    # [num_drafts] int
) -> None:
    """Raise ValueError unless cu_num_draft_tokens is non-decreasing from >= 0, ends at
    num_drafts and gives no request more than max_spec_len drafts, and every target row is in
    [0, num_logits). Reads the values back to the host (the torch path's check)."""
    cu = cu_num_draft_tokens.long().cpu()
    if cu.numel():
        counts = torch.diff(cu, prepend=torch.zeros(1, dtype=torch.long))
        if int(counts.min()) < 0:
            raise ValueError(f"cu_num_draft_tokens must be non-decreasing from a first value >= 0, got {cu.tolist()}")
        if int(cu[-1]) != num_drafts:
            raise ValueError(f"cu_num_draft_tokens must end at the number of drafts ({num_drafts}), got "
                             f"{int(cu[-1])}")
        if int(counts.max()) > max_spec_len:
            raise ValueError(f"a request has {int(counts.max())} drafts, more than max_spec_len={max_spec_len}")
    if target_rows is not None and target_rows.numel():
        lo, hi = int(target_rows.min()), int(target_rows.max())
        if lo < 0 or hi >= num_logits:
            raise ValueError(f"target_rows must be rows of logits, in [0, {num_logits}), got values in [{lo}, {hi}]")
