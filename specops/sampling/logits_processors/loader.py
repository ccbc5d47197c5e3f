"""Load custom logits processors by `module:Class` name and from an entry-point group.

Custom processors are classes (subclasses of `LogitsProcessor`) registered once per
engine, never per request: either named as "package.module:ClassName" (or passed as the
class itself) or advertised by an installed package under the entry-point group
"specops.logits_processors".
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import Iterable, Sequence

import torch

from specops._arg_checks import as_device, check_int

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
        if not module_name or not class_name:
            raise ValueError(f"logits processor must be 'module.path:ClassName', got {spec!r}")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:   # ImportError, or whatever the module raised while importing
            raise ValueError(f"cannot import module {module_name!r} of logits processor {spec!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
        try:
            cls = getattr(module, class_name)
        except AttributeError as exc:
            raise ValueError(f"module {module_name!r} has no class {class_name!r}") from exc
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise TypeError(f"logits processor {spec!r} must be a subclass of specops LogitsProcessor")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise TypeError(f"logits processor {spec!r} is abstract: it does not implement {missing}")
    return cls


def load_entry_point_classes(group: str = ENTRY_POINT_GROUP) -> list[type]:
    """Every `LogitsProcessor` class that installed packages advertise under `group`. A broken
    entry point raises ValueError naming it, its package and the group (build_logits_processors
    with use_entry_points=False leaves the group out)."""
    classes = []
    for ep in entry_points(group=group):
        where = f"entry point {getattr(ep, 'name', '?')!r} = {getattr(ep, 'value', '?')!r} of group {group!r}"
        dist = getattr(ep, "dist", None)
        if dist is not None:
            where += f" (package {dist.name})"
        try:
            loaded = ep.load()
        except Exception as exc:   # a missing module or class, or an error while importing it
            raise ValueError(f"cannot load logits processor {where}: {type(exc).__name__}: {exc}") from exc
        try:
            classes.append(load_processor_class(loaded))
        except TypeError as exc:
            raise TypeError(f"{where}: {exc}") from exc
    return classes


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

    def check_update(self, batch_update: BatchUpdate | None) -> None:
        """Every processor's `check_update`: raises what one of them refuses (a bad index or
        direction, a bad parameter), changing nothing. An engine can run it on a request's
        parameters when the request arrives, to fail that request alone."""
        for proc in self.all:
            proc.check_update(batch_update)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """`check_update`, then every processor's `update_state`: an update that one processor
        refuses raises before any processor's state changes."""
        self.check_update(batch_update)
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

    Custom classes come from `custom` ("module:Class" names or classes, or one of them) and, with
    `use_entry_points`, from the "specops.logits_processors" entry-point group; each is
    constructed as `cls(max_num_reqs, vocab_size, device)`. Each class is built once: a
    class named twice, or a built-in named among the custom ones while the built-ins are on
    (it would add a request's logit_bias twice), is not built again. A subclass of a built-in
    is another class: it runs beside the built-in (pass builtin=False to replace them).
    """
    max_num_reqs = check_int("max_num_reqs", max_num_reqs, 0)
    vocab_size = check_int("vocab_size", vocab_size, 1)
    as_device("device", device)   # checked; passed on as given
    procs: list[LogitsProcessor] = []
    seen = set()
    if builtin:
        procs += [MinTokensLogitsProcessor(max_num_reqs, vocab_size, device, eos_token_ids),
                  LogitBiasLogitsProcessor(max_num_reqs, vocab_size, device),
                  MinPLogitsProcessor(max_num_reqs, vocab_size, device)]
        seen = {type(p) for p in procs}
    if isinstance(custom, (str, type)):   # one name or class, not a sequence of its characters
        custom = [custom]
    classes = [load_processor_class(c) for c in custom]
    if use_entry_points:
        classes += load_entry_point_classes()
    for cls in classes:
        if cls in seen:
            continue
        seen.add(cls)
        procs.append(cls(max_num_reqs, vocab_size, device))
    return LogitsProcessors(procs)


__all__ = ["ENTRY_POINT_GROUP", "LogitsProcessors", "LogitsRows", "build_logits_processors",
           "load_entry_point_classes", "load_processor_class"]
