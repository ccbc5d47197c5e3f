"""Logits processors: the interface, the built-ins and the loader of custom ones."""

from .builtin import (LogitBiasLogitsProcessor, MinPLogitsProcessor, MinTokensLogitsProcessor,
                      apply_min_p_)
from .interface import (BatchUpdate, LogitsProcessor, LogitsRows, MoveDirectionality, check_batch_update,
                        process_dict_updates)
from .loader import (ENTRY_POINT_GROUP, LogitsProcessors, build_logits_processors, load_entry_point_classes,
                     load_processor_class)

__all__ = [
    "BatchUpdate", "ENTRY_POINT_GROUP", "LogitBiasLogitsProcessor", "LogitsProcessor", "LogitsProcessors",
    "LogitsRows", "MinPLogitsProcessor", "MinTokensLogitsProcessor", "MoveDirectionality", "apply_min_p_",
    "build_logits_processors", "check_batch_update", "load_entry_point_classes", "load_processor_class",
    "process_dict_updates",
]
