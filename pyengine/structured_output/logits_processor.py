"""Structured output as a specops LogitsProcessor: works with today's engine, unchanged.

A stop-gap until the scheduler integration (see manager.py): the engine already runs
custom logits processors on every sampling row, including the rows of draft positions
(``LogitsRows.preceding_token_ids``), so structured output can ride on that interface:

    cls = make_logits_processor(tokenizer)                      # bound to the engine's tokenizer
    llm = LLM(logits_processors=[cls])
    sp = SamplingParams(extra_args={"structured_output": StructuredOutputOptions(json_schema=s)})

What it cannot do from inside the sampler: keep a request out of the batch while its
grammar compiles (it starts compiling when the request joins the batch and waits for it
at the first sampling step), and fail a request with an error (a request whose grammar
failed gets only its stop tokens, so it ends at once with empty output; the error is in
``errors``). The scheduler integration does both properly.
"""

from __future__ import annotations

import torch

from specops.sampling.logits_processors.interface import LogitsProcessor, LogitsRows, process_dict_updates

from .batch_bitmask import apply_token_bitmask
from .compiler_pool import CompileStatus
from .grammar_state import ALL_ALLOWED
from .manager import StructuredOutputManager
from .options import StructuredOutputOptions

EXTRA_ARGS_KEY = "structured_output"


def make_logits_processor(tokenizer=None, **manager_kwargs) -> type:
    """A LogitsProcessor class bound to ``tokenizer`` (None = the default model's).

    ``manager_kwargs`` go to ``StructuredOutputManager`` (compile_timeout_s, reasoning, ...).
    Requests opt in with ``SamplingParams(extra_args={"structured_output": options})``, where
    options is a StructuredOutputOptions or a dict of its fields.
    """
    return type("StructuredOutputLogitsProcessor", (StructuredOutputLogitsProcessor,),
                {"tokenizer": tokenizer, "manager_kwargs": dict(manager_kwargs)})


class StructuredOutputLogitsProcessor(LogitsProcessor):
    """Masks each row of a structured request to the tokens its grammar allows (see module doc)."""

    tokenizer = None
    manager_kwargs: dict = {}

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device | str = "cpu"):
        super().__init__(max_num_reqs, vocab_size, device)
        tok = self.tokenizer
        if tok is None:
            from .testing import default_tokenizer

            tok = default_tokenizer()
        kwargs = {"max_rows": max_num_reqs * 5, **self.manager_kwargs}
        self.so = StructuredOutputManager(tok, vocab_size, **kwargs)
        self._state: dict[int, list] = {}  # batch index -> [request id, live output ids, tokens consumed]
        self._count = 0
        self.errors: dict[str, str] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # masking changes the argmax: runs for greedy rows too, before penalties

    def is_active(self) -> bool:
        return bool(self._state)

    def _new_entry(self, params, prompt_ids, output_ids):
        opts = (getattr(params, "extra_args", None) or {}).get(EXTRA_ARGS_KEY)
        if opts is None:
            return None
        if isinstance(opts, dict):
            opts = StructuredOutputOptions(**opts)
        rid = f"so-{self._count}"
        self._count += 1
        try:
            self.so.add_request(rid, opts, list(prompt_ids or ()))
        except (ValueError, TypeError) as e:
            self.errors[rid] = str(e)
        return [rid, output_ids, 0]

    def update_state(self, batch_update) -> None:
        before = {e[0] for e in self._state.values()}
        process_dict_updates(self._state, batch_update, self._new_entry)
        for rid in before - {e[0] for e in self._state.values()}:
            self.so.remove_request(rid)

    def _sync(self, entry: list) -> bool:
        """Wait for the grammar, then advance it with the request's new output tokens; False if failed."""
        rid, outputs, consumed = entry
        if rid in self.errors:
            return False
        if self.so.poll(rid) is CompileStatus.WAITING:
            self.so.wait(rid)
        if self.so.poll(rid) is CompileStatus.FAILED:
            self.errors[rid] = self.so.error(rid)
            return False
        new = list(outputs[consumed:])
        if new:
            if not self.so.accept_tokens(rid, new):
                self.errors[rid] = f"structured output: the grammar rejected output tokens {new}"
                return False
            entry[2] = consumed + len(new)
        return True

    def apply(self, logits: torch.Tensor, rows: LogitsRows | None = None) -> torch.Tensor:
        if not self._state:
            return logits
        rows = rows if rows is not None else LogitsRows.identity(logits.shape[0])
        ok = {idx: self._sync(e) for idx, e in self._state.items()}
        bitmask = torch.full((len(rows), self.so.backend.bitmask_width), ALL_ALLOWED, dtype=torch.int32)
        indices = []
        for i, idx in enumerate(rows.req_indices):
            entry = self._state.get(idx)
            if entry is None:
                continue
            rid = entry[0]
            if not ok[idx]:
                bitmask[i].zero_()
                for s in self.so.backend.stop_token_ids:
                    bitmask[i, s // 32] |= _bit(s % 32)
                indices.append(i)
                continue
            drafts = list(rows.preceding_token_ids[i]) if rows.preceding_token_ids else []
            if self._fill_row(rid, drafts, bitmask, i):
                indices.append(i)
        if indices:
            dev = logits.device
            apply_token_bitmask(logits, bitmask.to(dev), torch.tensor(indices, dtype=torch.int32).to(dev))
        return logits

    def _fill_row(self, rid: str, drafts: list[int], bitmask: torch.Tensor, row: int) -> bool:
        """Row ``row``: the tokens allowed after the committed output plus ``drafts``."""
        entry = self.so._entries[rid]
        grammar = entry.grammar
        first = entry.gate.first_constrained(drafts) if entry.gate is not None else 0
        if first > len(drafts):
            return False
        advanced = 0
        for t in drafts[first:]:
            if not grammar.advance(t):
                break
            advanced += 1
        constrained = advanced == len(drafts) - first and grammar.fill_bitmask(bitmask, row)
        grammar.rollback(advanced)
        return constrained


def _bit(k: int) -> int:
    """int32 with bit k set (bit 31 as a negative number)."""
    return -(1 << 31) if k == 31 else 1 << k
