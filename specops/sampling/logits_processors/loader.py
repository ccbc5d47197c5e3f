"""Load custom logits processors by `module:Class` name and from an entry-point group.

Custom processors are classes (subclasses of `LogitsProcessor`) registered once per
engine, never per request: either named as "package.module:ClassName" (or passed as the
class itself) or advertised by an installed package under the entry-point group
"specops.logits_processors".
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Iterable, Sequence

import torch

from .builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor, MinTokensLogitsProcessor
from .interface import BatchUpdate, LogitsProcessor, LogitsRows

ENTRY_POINT_GROUP = "specops.logits_processors"


def load_processor_class(spec: str | type) -> type:
    """Resolve "module.path:ClassName" (or a class) to a `LogitsProcessor` subclass."""
    if isinstance(spec, type):
        cls = spec
    else:
        if not isinstance(spec, str) or spec.count(":") != 1:
            raise ValueError(f"logits processor must be a class or 'module.path:ClassName', got {spec!r}")
        module_name, class_name = spec.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import module {module_name!r} of logits processor {spec!r}: {exc}") from exc
        try:
            cls = getattr(module, class_name)
        except AttributeError as exc:
            raise ValueError(f"module {module_name!r} has no class {class_name!r}") from exc
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise TypeError(f"logits processor {spec!r} must be a subclass of specops LogitsProcessor")
    return cls


def load_entry_point_classes(group: str = ENTRY_POINT_GROUP) -> list[type]:
    """Every `LogitsProcessor` class that installed packages advertise under `group`."""
    return [load_processor_class(ep.load()) for ep in entry_points(group=group)]


class LogitsProcessors:
    """The processors of one engine, split by argmax invariance, with one `update_state` fan-out.

    Parameters
    ----------
    processors : Iterable[LogitsProcessor]
    """

    def __init__(self, processors: Iterable[LogitsProcessor] = ()):
        self.all = list(processors)
        self.argmax_invariant = [p for p in self.all if p.is_argmax_invariant()]
        self.non_argmax_invariant = [p for p in self.all if not p.is_argmax_invariant()]

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        for proc in self.all:
            proc.update_state(batch_update)

    def get(self, cls: type) -> LogitsProcessor | None:
        return next((p for p in self.all if isinstance(p, cls)), None)

    def __len__(self) -> int:
        return len(self.all)


def build_logits_processors(
    max_num_reqs: int,
    vocab_size: int,
    device: torch.device | str = "cpu",
    custom: Sequence[str | type] = (),
    eos_token_ids: Sequence[int] = (),
    use_entry_points: bool = True,
    builtin: bool = True,
) -> LogitsProcessors:
    """Instantiate the built-ins (min_tokens, logit_bias, min_p) and the custom processors.

    Custom classes come from `custom` ("module:Class" names or classes) and, with
    `use_entry_points`, from the "specops.logits_processors" entry-point group; each is
    constructed as `cls(max_num_reqs, vocab_size, device)`.
    """
    procs: list[LogitsProcessor] = []
    if builtin:
        procs += [MinTokensLogitsProcessor(max_num_reqs, vocab_size, device, eos_token_ids),
                  LogitBiasLogitsProcessor(max_num_reqs, vocab_size, device),
                  MinPLogitsProcessor(max_num_reqs, vocab_size, device)]
    classes = [load_processor_class(c) for c in custom]
    if use_entry_points:
        classes += load_entry_point_classes()
    seen = set()
    for cls in classes:
        if cls in seen:
            continue
        seen.add(cls)
        procs.append(cls(max_num_reqs, vocab_size, device))
    return LogitsProcessors(procs)


__all__ = ["ENTRY_POINT_GROUP", "LogitsProcessors", "LogitsRows", "build_logits_processors",
           "load_entry_point_classes", "load_processor_class"]
