"""Compiled ops (``torch.ops.specops.*``) with their checked Python wrappers and torch references.

Every op runs on CPU (C++ loops, rows in parallel) and on CUDA (when the build has CUDA),
has a fake implementation for ``torch.compile(fullgraph=True)``, and a plain-torch
``*_torch`` reference beside it.
"""

from specops.ops.bincount import (
    token_bincount,
    token_bincount_torch,
    token_bincount_update_,
    token_bincount_update_torch,
)
from specops.ops.bitmask import apply_token_bitmask_, apply_token_bitmask_torch, unpack_bitmask
from specops.ops.penalties import (
    apply_penalties_,
    apply_penalties_torch,
    apply_repetition_penalties_,
    apply_repetition_penalties_torch,
)

__all__ = [
    "token_bincount",
    "token_bincount_torch",
    "token_bincount_update_",
    "token_bincount_update_torch",
    "apply_penalties_",
    "apply_penalties_torch",
    "apply_repetition_penalties_",
    "apply_repetition_penalties_torch",
    "apply_token_bitmask_",
    "apply_token_bitmask_torch",
    "unpack_bitmask",
]
