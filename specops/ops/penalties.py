"""Repetition, frequency and presence penalties applied to logits in place, in one fused
pass (vLLM's apply_penalties semantics), plus vLLM's standalone repetition-penalty op."""

from __future__ import annotations

import torch

from specops import _C  # noqa: F401  (registers torch.ops.specops.*)
from specops.ops._checks import FLOAT_DTYPES, check_no_overlap, check_tensor, check_vocab_width, check_written_in_place


def _check_common(op: str, logits: torch.Tensor, prompt_mask: torch.Tensor,
                  repetition_penalties: torch.Tensor) -> None:
    check_tensor(op, "logits", logits, FLOAT_DTYPES, 2)
    check_vocab_width(op, "logits", logits)
    check_written_in_place(op, "logits", logits)
    check_tensor(op, "prompt_mask", prompt_mask, (torch.bool,), 2, like=logits,
                 shape=tuple(logits.shape), shape_desc=" like logits")
    check_tensor(op, "repetition_penalties", repetition_penalties, (torch.float32,), 1, like=logits,
                 shape=(logits.shape[0],), shape_desc=" (one per logits row)")


def _check_penalties(op: str, logits, prompt_mask, output_counts, repetition_penalties, frequency_penalties,
                     presence_penalties) -> None:
    _check_common(op, logits, prompt_mask, repetition_penalties)
    check_tensor(op, "output_counts", output_counts, (torch.int32,), 2, like=logits,
                 shape=tuple(logits.shape), shape_desc=" like logits")
    for name, t in (("frequency_penalties", frequency_penalties), ("presence_penalties", presence_penalties)):
        check_tensor(op, name, t, (torch.float32,), 1, like=logits, shape=(logits.shape[0],),
                     shape_desc=" (one per logits row)")


def _check_repetition(op: str, logits, prompt_mask, output_mask, repetition_penalties) -> None:
    _check_common(op, logits, prompt_mask, repetition_penalties)
    check_tensor(op, "output_mask", output_mask, (torch.bool,), 2, like=logits,
                 shape=tuple(logits.shape), shape_desc=" like logits")


def apply_penalties_(
    logits: torch.Tensor,  # [num_rows, vocab] fp32/bf16/fp16, updated in place
    prompt_mask: torch.Tensor,  # [num_rows, vocab] bool: token occurs in the prompt
    output_counts: torch.Tensor,  # [num_rows, vocab] int32: occurrences in the output
    repetition_penalties: torch.Tensor,  # [num_rows] fp32, 1.0 = off
    frequency_penalties: torch.Tensor,  # [num_rows] fp32, 0.0 = off
    presence_penalties: torch.Tensor,  # [num_rows] fp32, 0.0 = off
) -> None:
    """Apply the three penalties to ``logits`` in place, in one pass (vLLM semantics).

    For each row ``r`` and token ``t``, in this order:

    * repetition: if ``prompt_mask[r, t]`` or ``output_counts[r, t] > 0``, a positive logit
      is divided by ``repetition_penalties[r]`` and a non-positive one multiplied by it;
    * frequency: ``logit -= frequency_penalties[r] * output_counts[r, t]``;
    * presence: ``logit -= presence_penalties[r] * (output_counts[r, t] > 0)``.

    Arithmetic is float32 whatever the logits dtype, rounded once on the store. Rows whose
    penalties are all neutral (1, 0, 0) are not touched, and the prompt mask of a row
    without repetition penalty is not read. ``output_counts`` typically comes from
    :func:`token_bincount` / :func:`token_bincount_update_`.

    All tensors are on one device (CPU or CUDA); rows may be strided, the last dimension
    must be contiguous. No host sync: safe under CUDA-graph capture and torch.compile.
    """
    op = "apply_penalties_"
    _check_penalties(op, logits, prompt_mask, output_counts, repetition_penalties, frequency_penalties,
                     presence_penalties)
    check_no_overlap(op, "logits", logits, prompt_mask=prompt_mask, output_counts=output_counts,
                     repetition_penalties=repetition_penalties, frequency_penalties=frequency_penalties,
                     presence_penalties=presence_penalties)
    torch.ops.specops.apply_penalties_(logits, prompt_mask, output_counts, repetition_penalties,
                                       frequency_penalties, presence_penalties)


def apply_repetition_penalties_(
    logits: torch.Tensor,  # [num_rows, vocab] fp32/bf16/fp16, updated in place
    prompt_mask: torch.Tensor,  # [num_rows, vocab] bool
    output_mask: torch.Tensor,  # [num_rows, vocab] bool
    repetition_penalties: torch.Tensor,  # [num_rows] fp32, 1.0 = off
) -> None:
    """vLLM's ``apply_repetition_penalties_``: for tokens in the prompt or output mask,
    divide positive logits and multiply non-positive logits by the row's penalty, in place."""
    op = "apply_repetition_penalties_"
    _check_repetition(op, logits, prompt_mask, output_mask, repetition_penalties)
    check_no_overlap(op, "logits", logits, prompt_mask=prompt_mask, output_mask=output_mask,
                     repetition_penalties=repetition_penalties)
    torch.ops.specops.apply_repetition_penalties_(logits, prompt_mask, output_mask, repetition_penalties)


@torch.library.register_fake("specops::apply_penalties_")
def _apply_penalties_fake(logits, prompt_mask, output_counts, repetition_penalties,
                          frequency_penalties, presence_penalties):
    _check_penalties("apply_penalties_", logits, prompt_mask, output_counts, repetition_penalties,
                     frequency_penalties, presence_penalties)   # a direct torch.ops call is checked too
    return None


@torch.library.register_fake("specops::apply_repetition_penalties_")
def _apply_repetition_penalties_fake(logits, prompt_mask, output_mask, repetition_penalties):
    _check_repetition("apply_repetition_penalties_", logits, prompt_mask, output_mask, repetition_penalties)
    return None


def _repetition(x: torch.Tensor, seen: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
    rep = rep.unsqueeze(1)
    return torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)


def apply_penalties_torch(
    logits: torch.Tensor,  # [num_rows, vocab] fp32/bf16/fp16, updated in place
    prompt_mask: torch.Tensor,  # [num_rows, vocab] bool
    output_counts: torch.Tensor,  # [num_rows, vocab] int32
    repetition_penalties: torch.Tensor,  # [num_rows] fp32
    frequency_penalties: torch.Tensor,  # [num_rows] fp32
    presence_penalties: torch.Tensor,  # [num_rows] fp32
) -> torch.Tensor:
    """In-place reference for :func:`apply_penalties_`: plain torch in float32, vLLM's formulas.
    Returns `logits` (also `specops.sampling.apply_penalties_torch`, the Sampler's torch path)."""
    x = logits.float()
    seen_out = output_counts > 0
    x = _repetition(x, prompt_mask | seen_out, repetition_penalties)
    x = x - frequency_penalties.unsqueeze(1) * output_counts.float()
    x = x - torch.where(seen_out, presence_penalties.unsqueeze(1), 0.0)   # unseen: untouched (an inf penalty too)
    return logits.copy_(x)


def apply_repetition_penalties_torch(
    logits: torch.Tensor,  # [num_rows, vocab] fp32/bf16/fp16, updated in place
    prompt_mask: torch.Tensor,  # [num_rows, vocab] bool
    output_mask: torch.Tensor,  # [num_rows, vocab] bool
    repetition_penalties: torch.Tensor,  # [num_rows] fp32
) -> None:
    """In-place reference for :func:`apply_repetition_penalties_`."""
    logits.copy_(_repetition(logits.float(), prompt_mask | output_mask, repetition_penalties))
