"""StructuredOutputManager: everything the engine calls for structured output, by request id.

The engine's side of it, in the order of a request's life:

    so = StructuredOutputManager(tokenizer, vocab_size, max_rows=max_num_seqs * (1 + K))
    so.add_request(rid, options, prompt_ids)  # on arrival: validate (ValueError), start compiling
    so.poll(rid)                              # scheduler, each step: WAITING / READY / FAILED, never blocks
    so.validate_drafts(rid, drafts)           # before scheduling drafts: grammatical prefix + first forbidden
    so.end_of_output(rid, new_tokens)         # after sampling: how many to keep, whether the grammar ended
    batch = so.build_bitmask([(rid | None, num_rows, drafts), ...])   # after launching the forward
    apply_batch_bitmask(logits, batch)        # before sampling
    ok = so.accept_tokens(rid, new_tokens)    # after sampling; False = the grammar rejected a token
    so.is_terminated(rid)                     # grammar complete: finish the request
    so.remove_request(rid)                    # when it finishes
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .backend import XgrammarBackend
from .batch_bitmask import BatchBitmask, BitmaskBuilder, BitmaskRequest
from .compiler_pool import CompilerPool, CompileStatus, CompileTicket
from .grammar_state import GrammarState
from .options import StructuredOutputOptions
from .reasoning import ReasoningConfig, ReasoningGate


@dataclass
class _Entry:
    ticket: CompileTicket
    gate: ReasoningGate | None
    grammar: GrammarState | None = None
    error: str | None = None
    arrived: float = field(default_factory=time.monotonic)
    ready_at: float | None = None


class StructuredOutputManager:
    """Per-engine structured output: compile pool, per-request grammar states, batch bitmasks.

    Parameters
    ----------
    tokenizer : pyengine.model.tokenizer.Tokenizer
        The engine's tokenizer (see ``backend.make_tokenizer_info``).
    vocab_size : int | None
        The model's logits width; None = the tokenizer's vocabulary size.
    max_rows : int
        Initial bitmask rows: max_num_seqs * (1 + num_spec_tokens).
    max_workers, compile_timeout_s, cache_size :
        The compiler pool's (see ``CompilerPool``).
    reasoning : ReasoningConfig | None
        Leave output unconstrained until its end marker (reasoning models).
    fill_threads : int
        Threads filling bitmask rows of large batches (see ``BitmaskBuilder``).
    backend : XgrammarBackend | None
        A prebuilt backend (tests inject slow/failing ones); None = built from ``tokenizer``.
    """

    def __init__(self, tokenizer=None, vocab_size: int | None = None, max_rows: int = 256, max_workers: int = 2,
                 compile_timeout_s: float = 30.0, cache_size: int = 256, reasoning: ReasoningConfig | None = None,
                 fill_threads: int = 1, backend: XgrammarBackend | None = None):
        if backend is None:
            if tokenizer is None:
                raise ValueError("StructuredOutputManager needs a tokenizer or a backend")
            backend = XgrammarBackend.from_tokenizer(tokenizer, vocab_size)
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self.reasoning = reasoning
        self.pool = CompilerPool(backend.compile, max_workers=max_workers, timeout_s=compile_timeout_s,
                                 cache_size=cache_size)
        self.builder = BitmaskBuilder(self.vocab_size, max_rows=max_rows, num_threads=fill_threads)
        self._entries: dict[str, _Entry] = {}

    # ---- arrival and readiness ------------------------------------------------------------
    def add_request(self, request_id: str, options: StructuredOutputOptions,
                    prompt_token_ids: list[int] = ()) -> None:
        """Validate ``options`` (cheap checks) and start compiling; ValueError/TypeError on a bad specification.

        A schema that breaks its meta-schema, or a grammar that fails to compile, is found in
        the pool instead: the request then polls FAILED with the reason in ``error``.
        """
        if not isinstance(options, StructuredOutputOptions):
            raise TypeError(f"options must be a StructuredOutputOptions, got {type(options).__name__}")
        if request_id in self._entries:
            raise ValueError(f"request {request_id!r} already has structured output")
        options.validate(check_meta_schema=False)
        ticket = self.pool.submit(options.cache_key(), options)
        gate = ReasoningGate(self.reasoning, prompt_token_ids) if self.reasoning is not None else None
        self._entries[request_id] = _Entry(ticket, gate)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def poll(self, request_id: str) -> CompileStatus:
        """WAITING while compiling, READY once the grammar is in place, FAILED (see ``error``). Never blocks."""
        e = self._entries[request_id]
        if e.grammar is not None:
            return CompileStatus.READY
        if e.error is not None:
            return CompileStatus.FAILED
        status = self.pool.poll(e.ticket)
        if status is CompileStatus.READY:
            try:
                e.grammar = GrammarState(self.backend.new_matcher(e.ticket.result))
            except Exception as exc:  # noqa: BLE001 - fails this request only
                e.error = f"structured output: {exc}"
                return CompileStatus.FAILED
            e.ready_at = time.monotonic()
        elif status is CompileStatus.FAILED:
            e.error = f"structured output: {e.ticket.error}"
        return status

    def ready(self, request_id: str) -> bool:
        """True once the request's grammar is compiled (non-blocking)."""
        return self.poll(request_id) is CompileStatus.READY

    def error(self, request_id: str) -> str | None:
        """Why the request failed (compile error or timeout), or None."""
        self.poll(request_id)
        return self._entries[request_id].error

    def wait(self, request_id: str, timeout: float | None = None) -> CompileStatus:
        """Block until compiled or failed (offline use and tests; the engine polls instead)."""
        self.pool.wait(self._entries[request_id].ticket, timeout)
        return self.poll(request_id)

    # ---- per step -----------------------------------------------------------------------
    def _grammar(self, request_id: str) -> GrammarState:
        e = self._entries[request_id]
        if e.grammar is None:
            raise RuntimeError(f"request {request_id!r}: grammar not ready (poll() until READY first)")
        return e.grammar

    def _first(self, request_id: str, drafts: list[int]) -> int:
        gate = self._entries[request_id].gate
        return 0 if gate is None else gate.first_constrained(drafts)

    def validate_drafts(self, request_id: str, drafts: list[int]) -> list[int]:
        """The drafts to verify: the longest prefix the grammar allows (reasoning tokens before
        the marker pass) and, unless the grammar ended within it, the first draft it does not
        allow. That one is kept so that its position is verified like any rejected draft: its
        masked row gives it probability 0, so it is rejected and the token there is drawn from
        the residual max(0, p - q). Cutting it off instead would draw that token from p, which
        is not the target law when the draft has probabilities (whether it was cut depends on
        the draft's value)."""
        g = self._grammar(request_id)
        first = self._first(request_id, drafts)
        if first > len(drafts):
            return list(drafts)
        n, ended = self._accepted_prefix(g, drafts[first:])
        kept = first + n
        if kept < len(drafts) and not ended:
            kept += 1
        return list(drafts[:kept])

    @staticmethod
    def _accepted_prefix(g: GrammarState, tokens: list[int]) -> tuple[int, bool]:
        """How many leading ``tokens`` the grammar accepts from its state (it accepts none
        after its end), and whether it has ended after them. The state is unchanged."""
        n = 0
        for t in tokens:
            if not g.advance(t):
                break
            n += 1
        ended = g.is_terminated()
        g.rollback(n)
        return n, ended

    def end_of_output(self, request_id: str, tokens: list[int]) -> tuple[int, bool]:
        """(how many of ``tokens`` (emitted this step) the output keeps, whether the last of
        those ends the grammar): all of them, or those up to and including the one that ends
        the grammar, a stop token (with speculative decoding, accepted drafts and the bonus
        token can follow it: they are dropped, as plain decoding would have stopped there).
        The state is unchanged."""
        first = self._first(request_id, tokens)
        n, ended = self._accepted_prefix(self._grammar(request_id), tokens[first:])
        return (first + n, True) if ended else (len(tokens), False)

    def build_bitmask(self, batch: list[tuple[str | None, int, list[int]]]) -> BatchBitmask | None:
        """Bitmask for a scheduled batch, rows in logits order.

        ``batch`` has one ``(request_id or None, num_rows, drafts)`` per scheduled request:
        None (or an id without structured output) for rows left unconstrained. Pass None
        also for a request whose prefill chunk samples nothing this step.
        """
        reqs = []
        for rid, num_rows, drafts in batch:
            e = self._entries.get(rid) if rid is not None else None
            if e is None or e.grammar is None:
                reqs.append(BitmaskRequest(None, num_rows))
            else:
                drafts = list(drafts)
                reqs.append(BitmaskRequest(e.grammar, num_rows, drafts, self._first(rid, drafts)))
        return self.builder.build(reqs)

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance with the tokens emitted this step (after the stop check trimmed them).

        Returns False when the grammar rejects one (a bug upstream: masked sampling never
        produces one); the engine then fails the request.
        """
        g = self._grammar(request_id)
        gate = self._entries[request_id].gate
        if gate is not None:
            tokens = gate.split(tokens)
        return g.accept_tokens(tokens)

    def is_terminated(self, request_id: str) -> bool:
        """True when the grammar has accepted its stop token: the request is complete."""
        e = self._entries[request_id]
        return e.grammar is not None and e.grammar.is_terminated()

    def remove_request(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def shutdown(self) -> None:
        self.pool.shutdown()
