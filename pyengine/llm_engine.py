"""LLMEngine: requests in, one schedule -> forward -> sample -> commit step at a time, outputs out."""

from __future__ import annotations

import copy
import itertools
import numbers
import os
import time
from dataclasses import dataclass

import torch

from .block_manager import BlockManager
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .outputs import CompletionOutput, RequestOutput
from .request import Request, RequestStatus
from .sampling_params import SamplingParams, check_unicode
from .scheduler import Scheduler

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}
_CPU_KV_BYTES = 512 << 20


def _missing_grammar_package(exc: Exception) -> Exception:
    """An ImportError (structured output without xgrammar installed) as the request's own
    ValueError; other errors as they are."""
    if isinstance(exc, ImportError) and "xgrammar" in f"{exc.name} {exc}":
        return ValueError(f"structured output needs the xgrammar package (pip install 'specops[grammar]'): {exc}")
    return exc


@dataclass
class _Parent:
    """A request as the user sees it: n samples (child Requests) of one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    detoks: list[IncrementalDetokenizer]
    error: str | None = None
    reported_final: bool = False
    num_rejected_samples: int = 0   # a request refused on arrival: its samples, each "error" and empty


class LLMEngine:
    """The engine: a model, a KV pool, a scheduler and a runner.

    Parameters
    ----------
    config : EngineConfig or None
        None: EngineConfig(**kwargs).
    loaded : LoadedModel or None
        An already loaded model (from ``specops.engine.model.loader.load_model``) to share
        between engines; None loads config.model.
    draft_loaded : LoadedModel or None
        An already loaded draft model for ``spec_method="draft"``; None loads config.draft_model.

    With ``config.spec_method`` set, every step ends by proposing drafts for the requests in
    pure decode (``self.proposer``, K from ``self.k_schedule``); the next step verifies them.
    ``stats()["spec_decoding"]`` holds the acceptance counts.

    Structured output (``SamplingParams.structured_outputs``): the options are checked on
    arrival (a bad one fails that request alone); the grammar compiles in the
    StructuredOutputManager's worker pool while the request waits in the scheduler's
    ``blocked`` set (other requests are admitted past it); a compile error or timeout fails
    that request alone. Drafts are cut after the first one the grammar forbids (verified,
    so rejected by its masked row) before they are scheduled; the runner masks every
    sampling row (1 + K for a speculating request); the grammar advances with the tokens
    emitted, and its termination ends the request (tokens after it are dropped).
    """

    def __init__(self, config: EngineConfig | None = None, loaded=None, draft_loaded=None, **kwargs):
        config = config if config is not None else EngineConfig(**kwargs)
        config.validate()
        self.config = config
        if loaded is None:
            from .model.loader import load_model

            device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
            loaded = load_model(config.model, device=device, dtype=_DTYPES.get(config.dtype))
        if config.attn_backend is not None:
            loaded.model.set_attn_backend(config.attn_backend)
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_config = mc = loaded.config
        self.vocab_size = mc.vocab_size
        self.eos_token_ids = list(self.tokenizer.eos_token_ids or mc.eos_token_ids)
        self.device = next(self.model.parameters()).device

        max_len = config.max_model_len or mc.max_position_embeddings
        if max_len > mc.max_position_embeddings:
            raise ValueError(f"max_model_len ({max_len}) exceeds the model's max_position_embeddings "
                             f"({mc.max_position_embeddings})")
        num_blocks = self._num_kv_blocks(max_len)
        # what sets the context's length, for the error of a prompt that fills it
        self._context_limit = ("max_model_len" if config.max_model_len is not None else
                               "the model's max_position_embeddings")
        if num_blocks * config.block_size < max_len:
            if config.max_model_len is not None:
                raise ValueError(f"the KV cache holds {num_blocks * config.block_size} tokens, fewer than "
                                 f"max_model_len={max_len}: raise num_kv_blocks/kv_cache_memory or lower max_model_len")
            max_len = num_blocks * config.block_size
            self._context_limit = (f"what the KV cache holds: {num_blocks} blocks of {config.block_size} tokens, "
                                   f"sized by {self._kv_sized_by}")
        self.max_model_len = max_len
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self._init_spec(num_blocks, draft_loaded)
        lookahead = self.proposer.num_lookahead_tokens if self.proposer is not None else 0
        self.scheduler = Scheduler(config, max_len, self.block_manager, num_lookahead_tokens=lookahead)
        self.runner = ModelRunner(self.model, mc.vocab_size, num_blocks, config.block_size, config.max_num_seqs,
                                  max_len, seed=config.seed, num_lookahead_tokens=lookahead,
                                  eos_token_ids=self.eos_token_ids, logits_processors=config.logits_processors,
                                  synthetic_acceptance=self._synthetic, sampler_cuda_graphs=config.sampler_cuda_graphs)
        # EAGLE/MTP-style proposers read the target's hidden states (kept by the runner only for them)
        self.runner.keep_hidden_states = self.proposer is not None and self.proposer.needs_hidden_states
        self.structured = None  # StructuredOutputManager, made on the first structured request
        self.parents: dict[str, _Parent] = {}
        self._child_parent: dict[str, _Parent] = {}
        self._counter = itertools.count()
        self._pending: list[RequestOutput] = []  # rejected or aborted requests to report at the next step
        self.num_steps = 0
        self.num_generated_tokens = 0

    def _init_spec(self, num_blocks: int, draft_loaded) -> None:
        """Speculative decoding: the proposer, the K schedule, the metrics (None when off)."""
        cfg = self.config
        self.proposer = self.k_schedule = self.spec_metrics = self._synthetic = None
        self._spec_live: set[str] = set()  # requests the proposer may hold state for
        if cfg.spec_method is None:
            return
        from .spec_decode import (DraftModelProposer, KSchedule, SpecDecodingMetrics, SyntheticAcceptance,
                                  draft_pool_blocks, make_proposer)

        k, bs = cfg.num_spec_tokens, cfg.block_size
        # draft KV for every running request at full length, but no more than the target pool holds
        pool = min(draft_pool_blocks(cfg.max_num_seqs, self.max_model_len, k, bs),
                   num_blocks + cfg.max_num_seqs * (-(-k // bs) + 1))
        if cfg.spec_method == "draft" and draft_loaded is not None:
            self.proposer = DraftModelProposer(draft_loaded.model, pool, bs, seed=cfg.seed,
                                               target_vocab_size=self.vocab_size)
        else:
            try:
                self.proposer = make_proposer(cfg.spec_method, draft_model=cfg.draft_model, num_blocks=pool,
                                              block_size=bs, device=self.device, dtype=self.model.dtype,
                                              seed=cfg.seed, target_vocab_size=self.vocab_size,
                                              min_n=cfg.ngram_min_n, max_n=cfg.ngram_max_n)
            except (FileNotFoundError, ValueError) as exc:   # the draft model's path or files: say so
                if cfg.spec_method != "draft" or str(exc).startswith("draft_model"):
                    raise
                raise (FileNotFoundError if isinstance(exc, FileNotFoundError) else ValueError)(
                    f"draft_model: {exc}") from None
        self.k_schedule = KSchedule(k, cfg.spec_batch_schedule)
        self.spec_metrics = SpecDecodingMetrics(cfg.spec_log_interval_s)
        if cfg.spec_synthetic_acceptance is not None:
            self._synthetic = SyntheticAcceptance(cfg.spec_synthetic_acceptance, seed=cfg.seed)

    def _num_kv_blocks(self, max_len: int) -> int:
        """Blocks of the KV pool: num_kv_blocks, or what the budget holds (at most a full context
        per row, plus one). ValueError, before anything is allocated, when the pool asked for
        would not fit the memory it may take, or one block does not fit the budget."""
        cfg, mc = self.config, self.model_config
        itemsize = torch.empty((), dtype=self.model.dtype if hasattr(self.model, "dtype") else torch.float32).element_size()
        per_block = mc.num_layers * 2 * cfg.block_size * mc.num_kv_heads * mc.head_dim * itemsize
        self._kv_sized_by = "num_kv_blocks"   # for the error of a prompt that fills a context the pool cut
        if cfg.num_kv_blocks is not None:
            limit, where = self._kv_limit()
            if limit is not None and cfg.num_kv_blocks * per_block > limit:
                raise ValueError(f"num_kv_blocks={cfg.num_kv_blocks}: the KV cache would take "
                                 f"{cfg.num_kv_blocks * per_block / 2**30:.2f} GiB ({per_block} bytes a block), "
                                 f"more than {where} ({limit / 2**30:.2f} GiB)")
            return cfg.num_kv_blocks
        if cfg.kv_cache_memory is not None:
            budget, where = cfg.kv_cache_memory, "kv_cache_memory"
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget, where = int(free * cfg.gpu_memory_utilization), "gpu_memory_utilization of the free GPU memory"
        else:
            budget, where = _CPU_KV_BYTES, "the CPU KV cache budget (set kv_cache_memory)"
        if budget < per_block:   # named after what the caller set: kv_cache_memory when given
            head = (f"kv_cache_memory={budget} bytes is less than one KV block takes ({per_block} bytes at "
                    f"block_size={cfg.block_size})" if cfg.kv_cache_memory is not None else
                    f"block_size={cfg.block_size}: one KV block takes {per_block} bytes, more than {where} "
                    f"({budget} bytes)")
            raise ValueError(head)
        self._kv_sized_by = where
        per_seq = -(-max_len // cfg.block_size)
        return max(1, min(budget // per_block, per_seq * cfg.max_num_seqs + 1))

    def _kv_limit(self) -> tuple[int | None, str]:
        """(bytes, what they are) that an explicit num_kv_blocks may take: kv_cache_memory when
        given, else the device's free memory (CUDA) or the host's available memory (None where
        the platform does not say)."""
        if self.config.kv_cache_memory is not None:
            return self.config.kv_cache_memory, "kv_cache_memory"
        if self.device.type == "cuda":
            return torch.cuda.mem_get_info(self.device)[0], "the free GPU memory"
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the available host memory"
        except (AttributeError, ValueError, OSError):
            return None, ""

    # ---- requests -----------------------------------------------------------------------

    def check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Raise the error that would fail `prompt` with `params` on arrival (an empty or too long
        prompt, a parameter outside its range or the vocabulary); return the prompt's token ids.
        `add_request` runs it and reports the error as the request's; a caller that wants it
        raised (e.g. a command line, to name the option) runs it first."""
        ids = self._prompt_ids(prompt)
        self._check_params(params, ids)
        return ids

    def _check_params(self, params: SamplingParams, prompt_ids: list[int]) -> None:
        """check_request's half that reads the parameters (the prompt's ids already made)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        params.validate(self.vocab_size)
        self.runner.sampler.check_request(params, prompt_ids)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request; returns its id.

        A bad request (empty or too long prompt, invalid parameters) does not raise: it is
        reported finished with `error` set by the next step(), and the others go on.
        A duplicate request_id raises ValueError.
        """
        params = params if params is not None else SamplingParams()
        copy_error = None
        if isinstance(params, SamplingParams):
            # the request's own copy, checked below: a caller that changes its object afterwards
            # (e.g. reuses it for the next request) changes neither this request nor its checks
            try:
                params = copy.deepcopy(params)
            except RecursionError:
                copy_error = ValueError("sampling params are nested too deeply to copy (e.g. a JSON schema "
                                        "hundreds of levels deep)")
            except Exception as exc:  # noqa: BLE001 - e.g. a lock or a generator in extra_args
                copy_error = TypeError(f"sampling params cannot be copied ({type(exc).__name__}: {exc}): "
                                       "extra_args, logit_bias and the other fields must hold plain values")
        # the ids the request will hold: its own and, for a valid n > 1, its samples' (an n past
        # MAX_N fails validation below, as one request, without listing that many ids)
        n = params.n if isinstance(params, SamplingParams) and isinstance(params.n, int) else 1
        n = n if 1 < n <= SamplingParams.MAX_N else 1

        def taken(rid: str) -> str | None:
            """The first id of the request `rid` that a live request already holds, or None."""
            return next((c for c in [rid] + ([f"{rid}#{i}" for i in range(n)] if n > 1 else [])
                         if self._id_in_use(c)), None)

        if request_id is not None and not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str (or None), got {type(request_id).__name__}")
        if request_id is None:
            rid = str(next(self._counter))
            while taken(rid) is not None:      # an explicit id took it or one of its samples': the next one
                rid = str(next(self._counter))
        else:
            rid = request_id
        cid = taken(rid)
        if cid is not None:
            raise ValueError(f"request_id {rid!r} is already in use"
                             + (f" (its sample {cid!r} would clash with a live request)" if cid != rid else ""))
        text = prompt if isinstance(prompt, str) else None
        ids: list[int] = []
        try:
            ids = self._prompt_ids(prompt)   # first: a request refused for its parameters keeps its prompt ids
            if copy_error is not None:
                raise copy_error
            self._check_params(params, ids)
        except (ValueError, TypeError, RecursionError, ImportError) as exc:
            if isinstance(exc, RecursionError):   # e.g. a JSON schema text thousands of levels deep
                exc = ValueError("sampling params are nested too deeply to check (e.g. a JSON schema hundreds "
                                 "of levels deep)")
            exc = _missing_grammar_package(exc)
            parent = _Parent(rid, text, ids, [], [], error=f"{type(exc).__name__}: {exc}",
                             num_rejected_samples=n)   # 1 when n itself is invalid
            self.parents[rid] = parent
            self._pending.append(self._make_output(parent))
            return rid
        children, detoks = [], []
        for i in range(params.n):
            sp = params
            if params.n > 1:
                sp = SamplingParams(**{**vars(params), "n": 1,
                                       "seed": None if params.seed is None else params.seed + i})
            child = Request(rid if params.n == 1 else f"{rid}#{i}", ids, sp, self.eos_token_ids, text,
                            arrival=next(self._counter))
            child.banned_words = self._bad_words(sp)
            children.append(child)
            detoks.append(IncrementalDetokenizer(self.tokenizer, ids, sp.skip_special_tokens, sp.stop,
                                                 sp.include_stop_str_in_output))
        if params.structured_outputs is not None:
            try:
                so = self.structured_output_manager()
                for child in children:
                    so.add_request(child.request_id, params.structured_outputs, ids)
            except (ValueError, TypeError, RecursionError, ImportError) as exc:
                exc = _missing_grammar_package(exc)
                if self.structured is not None:   # None when the manager itself failed to start
                    for child in children:
                        self.structured.remove_request(child.request_id)
                parent = _Parent(rid, text, ids, [], [], error=f"{type(exc).__name__}: {exc}",
                                 num_rejected_samples=params.n)
                self.parents[rid] = parent
                self._pending.append(self._make_output(parent))
                return rid
            self.scheduler.blocked.update(c.request_id for c in children)  # until compiled
        parent = _Parent(rid, text, ids, children, detoks)
        self.parents[rid] = parent
        for child in children:
            self._forget_drafts_of(child.request_id)
            self._child_parent[child.request_id] = parent
            self.scheduler.add_request(child)
        return rid

    def _forget_drafts_of(self, rid: str) -> None:
        """Drop what the proposer keeps for an earlier request of this id (finished or aborted
        since the last propose call, which would have dropped it): a new request starts clean."""
        if self.proposer is not None and rid in self._spec_live:
            self.proposer.free(rid)
            self._spec_live.discard(rid)

    def _id_in_use(self, rid: str) -> bool:
        """Whether rid names a live request or one of the samples of an n > 1 request ("<id>#<i>")."""
        return rid in self.parents or rid in self._child_parent

    def structured_output_manager(self):
        """The engine's StructuredOutputManager (made on first use from the config)."""
        if self.structured is None:
            from .structured_output import ReasoningConfig, StructuredOutputManager

            cfg = self.config
            reasoning = None
            if cfg.reasoning_end is not None:
                reasoning = ReasoningConfig.from_text(self.tokenizer, cfg.reasoning_end, cfg.reasoning_start)
            k = cfg.num_spec_tokens if self.proposer is not None else 0
            self.set_structured_output_manager(StructuredOutputManager(
                self.tokenizer, self.vocab_size, max_rows=cfg.max_num_seqs * (1 + k),
                max_workers=cfg.structured_compile_workers, compile_timeout_s=cfg.structured_compile_timeout_s,
                reasoning=reasoning))
        return self.structured

    def set_structured_output_manager(self, manager) -> None:
        """Use ``manager`` (a StructuredOutputManager) for structured requests from now on (tests inject
        slow or failing backends this way); only before the first structured request."""
        if self.structured is not None and self.structured is not manager:
            raise ValueError("the engine already has a StructuredOutputManager")
        self.structured = manager
        self.runner.structured = manager

    def shutdown(self) -> None:
        """Stop the grammar compiler threads (if any)."""
        if self.structured is not None:
            self.structured.shutdown()

    def _poll_structured(self) -> list[RequestOutput]:
        """Admit requests whose grammar compiled; fail those whose compilation failed or timed out."""
        from .structured_output import CompileStatus

        failed: dict[str, _Parent] = {}   # one output per request, after all its samples are failed
        blocked = self.scheduler.blocked
        for rid in list(blocked):
            status = self.structured.poll(rid)
            if status is CompileStatus.WAITING:
                continue
            blocked.discard(rid)
            req = self.scheduler.requests.get(rid)
            if status is CompileStatus.FAILED and req is not None:
                req.error = self.structured.error(rid)
                self.scheduler.finish_request(req, RequestStatus.FINISHED_ERROR)
                parent = self._child_parent[rid]
                failed[parent.request_id] = parent
        return [self._make_output(parent) for parent in failed.values() if not parent.reported_final]

    def _advance_grammar(self, req: Request, before: int) -> None:
        """Feed the grammar the tokens the request kept this step; a terminated grammar ends it."""
        so = self.structured
        rid = req.request_id
        if not so.accept_tokens(rid, req.output_token_ids[before:]):
            req.error = f"structured output: the grammar rejected output tokens {req.output_token_ids[before:]}"
            if req.is_finished:  # already stopped this step (its blocks are freed): only the status changes
                req.status = RequestStatus.FINISHED_ERROR
            else:
                self.scheduler.finish_request(req, RequestStatus.FINISHED_ERROR)
        elif so.is_terminated(rid) and not req.is_finished:
            self.scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
        elif so.is_terminated(rid) and req.status == RequestStatus.FINISHED_LENGTH:
            req.status = RequestStatus.FINISHED_STOPPED  # the grammar ended on the last allowed token

    def _prompt_ids(self, prompt) -> list[int]:
        if getattr(prompt, "ndim", None) == 1 and hasattr(prompt, "tolist"):   # a numpy / torch row of ids
            prompt = prompt.tolist()
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            check_unicode("prompt", prompt)   # the tokenizer refuses a lone surrogate (JSON can carry one)
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            for i, t in enumerate(prompt):   # ints, numpy ints included; never bools or floats
                if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                    raise TypeError(f"prompt token ids must be ints, got {type(t).__name__} at index {i} ({t!r})")
            ids = [int(t) for t in prompt]
        else:
            raise TypeError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad and isinstance(prompt, str):   # a tokenizer with more tokens than the model has embeddings
            raise ValueError(f"prompt encodes to token ids {bad[:5]} outside the model's vocabulary "
                             f"[0, {self.vocab_size}): the tokenizer has tokens the model has no embedding for")
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        if not ids:
            raise ValueError("prompt is empty (no tokens)")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens but the context holds {self.max_model_len} "
                             f"({self._context_limit}), leaving no room for output")
        if not self.config.enable_chunked_prefill and len(ids) > self.config.max_num_batched_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens, more than max_num_batched_tokens="
                             f"{self.config.max_num_batched_tokens}, and chunked prefill is off")
        return ids

    def _bad_words(self, sp: SamplingParams) -> list[list[int]]:
        """The token sequences of `sp.bad_words` (each word, and with a leading space). A sequence
        holding a token past the model's vocabulary (a tokenizer with more tokens than the model)
        is left out: the model can never output that token, so the word can never appear."""
        words = []
        for w in sp.bad_words or []:
            for variant in (w, " " + w):
                ids = self.tokenizer.encode(variant, add_special_tokens=False)  # no BOS: never in the output
                if ids and ids not in words and all(0 <= t < self.vocab_size for t in ids):
                    words.append(ids)
        return words

    def abort_request(self, request_id: str) -> None:
        """Stop a request now; its final output (finish_reason "abort") comes with the next step."""
        parent = self.parents.get(request_id)
        if parent is None or parent.reported_final:
            return
        for child in parent.children:
            self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
        self._pending.append(self._make_output(parent))

    def has_unfinished_requests(self) -> bool:
        """Whether `step` has work: a request is waiting or running, or a rejected or aborted one
        still has its output to report."""
        return self.scheduler.has_unfinished_requests() or bool(self._pending)

    # ---- one step -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step; return the outputs of the requests that changed."""
        outputs, self._pending = self._pending, []
        if self.scheduler.blocked:
            outputs += self._poll_structured()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            if self.scheduler.blocked:  # only requests whose grammar compiles: wait a little for one
                self.structured.wait(next(iter(self.scheduler.blocked)), timeout=0.002)
                return self._drop_reported(outputs)
            if self.scheduler.has_unfinished_requests():
                raise RuntimeError("scheduler made no progress with requests waiting: "
                                   f"{list(self.scheduler.requests)}")
            if self.proposer is not None:
                self._propose()  # frees the draft state of aborted requests
            return self._drop_reported(outputs)
        result = self.runner.execute_model(sched)
        self.num_steps += 1
        num_before = {r.request_id: r.num_output_tokens for r in sched.scheduled}
        updated = self.scheduler.update_from_output(sched, result.sampled)
        if sched.scheduled_spec_decode_tokens:
            self._record_spec(sched, result.sampled)
        touched: dict[str, _Parent] = {}
        num_new: dict[str, int] = {}
        for req in updated:
            before = num_before[req.request_id]
            parent = self._child_parent[req.request_id]
            idx = parent.children.index(req) if len(parent.children) > 1 else 0
            grammar_ended = False   # on the step's last kept token, a stop token (even with ignore_eos)
            if req.sampling_params.structured_outputs is not None:
                end, grammar_ended = self.structured.end_of_output(req.request_id, req.output_token_ids[before:])
                if before + end < req.num_output_tokens:
                    req.truncate_output(before + end)  # tokens after the grammar's end: _advance_grammar ends it
            stop = self._detokenize(parent.detoks[idx], req, before, grammar_ended)
            new = req.num_output_tokens - before  # tokens appended (a stop string may have cut some)
            if req.sampling_params.structured_outputs is not None:
                self._advance_grammar(req, before)
            num_new[req.request_id] = new
            self.num_generated_tokens += new
            if req.logprobs is not None:
                for lp in result.logprobs.get(req.request_id, [])[:new]:
                    req.logprobs.append(lp)
                    req.cumulative_logprob += lp.logprob
            if stop is not None and not req.is_finished:
                self.scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
            elif stop is not None and req.status == RequestStatus.FINISHED_LENGTH:
                req.status = RequestStatus.FINISHED_STOPPED     # the stop string came on the last token
            if stop is None and req.is_finished:
                # the text an incomplete UTF-8 tail held back: a stop string may end in it
                past_min = req.num_output_tokens > req.sampling_params.min_tokens
                tail_stop = parent.detoks[idx].flush(check_stop=past_min)
                if tail_stop is not None and req.status in (RequestStatus.FINISHED_LENGTH,
                                                            RequestStatus.FINISHED_STOPPED):
                    req.status, stop = RequestStatus.FINISHED_STOPPED, tail_stop
            if stop is not None:
                req.stop_reason = stop
            touched[parent.request_id] = parent
        for parent in touched.values():
            if not parent.reported_final:
                outputs.append(self._make_output(parent, num_new))
        if self.proposer is not None:
            self._propose()
        return self._drop_reported(outputs)

    def _detokenize(self, detok: IncrementalDetokenizer, req: Request, before: int,
                    grammar_ended: bool = False) -> str | None:
        """Feed the step's new tokens to the detokenizer; returns the stop string that ended the text.
        The token that ended the request (EOS, a stop token id, the grammar's stop token) is
        left out of the text unless include_stop_str_in_output, as in vLLM.

        Several tokens (speculative decoding) are fed one at a time when the request has stop
        strings, and the output is cut after the token that completed one, as if the tokens
        had come one step at a time.
        """
        sp = req.sampling_params
        new = req.output_token_ids[before:]
        if (req.status == RequestStatus.FINISHED_STOPPED or grammar_ended) and not sp.include_stop_str_in_output:
            new = new[:-1]    # the EOS / stop token that ended it: in the token ids, not in the text (vLLM)
        if not new:
            return None
        if not sp.stop:
            # counted up to the last token fed: a stop token left out above is not one of them
            return detok.update(new, check_stop=before + len(new) > sp.min_tokens)
        # one at a time even for one token: a stop string it completes cuts the stop token left
        # out above (a step of [x, EOS] under speculation; plain decoding never makes that EOS)
        for j, tok in enumerate(new):
            stop = detok.update([tok], check_stop=before + j + 1 > sp.min_tokens)
            if stop is not None:
                if before + j + 1 < req.num_output_tokens:
                    req.truncate_output(before + j + 1)
                    if req.is_finished:  # by a later token: the stop string came first
                        req.status, req.error = RequestStatus.FINISHED_STOPPED, None
                return stop
        return None

    # ---- speculative decoding -----------------------------------------------------------

    def _record_spec(self, sched, sampled: dict[str, list[int]]) -> None:
        from .spec_decode import count_accepted

        drafts = sched.scheduled_spec_decode_tokens
        nd = [len(d) for d in drafts.values()]
        self.spec_metrics.record(nd, count_accepted(nd, [sampled.get(rid, []) for rid in drafts]))
        self.spec_metrics.maybe_log()

    def _propose(self) -> None:
        """Drafts for the next step: every running request in pure decode gets up to K of them."""
        from .spec_decode import ProposeContext
        from .spec_decode.proposer import verifiable_drafts

        running = self.scheduler.running
        live = {r.request_id for r in running}
        for rid in self._spec_live - live:  # finished, aborted or preempted since the last call
            self.proposer.free(rid)
        # pure decode: the last token is the one sampled last step (a prompt chunk that ended one
        # token short has the same count, but no output yet: it drafts once it has sampled)
        decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1 and r.num_output_tokens > 0]
        self._spec_live = (self._spec_live & live) | {r.request_id for r in decoding}
        if not decoding:
            self.runner.last_drafts = None
            return
        ks = self.k_schedule.k_for_requests(decoding, self.max_model_len, batch_size=len(running))
        batch = self.proposer.propose(decoding, ks, ProposeContext(step=self.num_steps,
                                                                hidden=self.runner.last_hidden))
        so = self.structured
        for req, drafts, k in zip(decoding, batch.token_ids, ks):
            # any proposer's output (a custom one included): at most k ids, each in the vocabulary
            drafts = verifiable_drafts(drafts, k, self.vocab_size)
            if so is not None and req.sampling_params.structured_outputs is not None and drafts:
                drafts = so.validate_drafts(req.request_id, list(drafts))  # + the first forbidden one
            req.spec_token_ids = list(drafts)
        self.runner.last_drafts = batch

    def _drop_reported(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        for out in outputs:
            if out.finished:
                parent = self.parents.pop(out.request_id, None)
                if parent is not None:
                    for child in parent.children:
                        self._child_parent.pop(child.request_id, None)
                        if self.structured is not None:
                            self.structured.remove_request(child.request_id)
                            self.scheduler.blocked.discard(child.request_id)
        return outputs

    def _make_output(self, parent: _Parent, num_new: dict[str, int] | None = None) -> RequestOutput:
        outs = []
        for i, (req, detok) in enumerate(zip(parent.children, parent.detoks)):
            delta = detok.take_delta(req.is_finished)
            n_new = (num_new or {}).get(req.request_id, 0)  # tokens appended this step
            outs.append(CompletionOutput(
                index=i, text=detok.text[:detok.num_emitted], token_ids=list(req.output_token_ids), delta_text=delta,
                delta_token_ids=req.output_token_ids[len(req.output_token_ids) - n_new:] if n_new else [],
                finish_reason=req.finish_reason, stop_reason=req.stop_reason,
                logprobs=list(req.logprobs) if req.logprobs is not None else None,
                cumulative_logprob=req.cumulative_logprob if req.logprobs is not None else None))
        outs += [CompletionOutput(index=i, text="", token_ids=[], finish_reason="error")
                 for i in range(parent.num_rejected_samples)]
        finished = parent.error is not None or all(r.is_finished for r in parent.children)
        parent.reported_final = finished
        error = parent.error or next((r.error for r in parent.children if r.error), None)
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, outs, finished,
                             error, max((r.num_cached_tokens for r in parent.children), default=0))

    # ---- conveniences -------------------------------------------------------------------

    def stats(self) -> dict:
        """Counters since the engine started: steps, generated tokens, preemptions, KV-cache usage,
        prefix-cache hit rate, time in the forward and in sampling (seconds, with the clock now),
        and "spec_decoding" (the speculative-decoding metrics; None without speculation)."""
        bm = self.block_manager
        return {"steps": self.num_steps, "generated_tokens": self.num_generated_tokens,
                "preemptions": self.scheduler.num_preemptions, "kv_usage": bm.usage,
                "prefix_hit_rate": bm.num_prefix_hits / bm.num_prefix_queries if bm.num_prefix_queries else 0.0,
                "time_forward_s": self.runner.time_forward, "time_sample_s": self.runner.time_sample,
                "time_now": time.perf_counter(),
                "spec_decoding": self.spec_metrics.snapshot() if self.spec_metrics is not None else None}
