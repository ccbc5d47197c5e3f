"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import Logprob


@dataclass
class CompletionOutput:
    """One sample of a request.

    text and token_ids are cumulative; delta_text and delta_token_ids are what this step added
    (for streaming). finish_reason is "stop", "length", "abort", "error" or None while running;
    stop_reason is the stop string or stop token id that ended it, if any.
    """

    index: int
    text: str
    token_ids: list[int]
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[Logprob] | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after a step; error is set (and finished) when it failed. A
    request refused on arrival has one empty output per requested sample, finish_reason "error"."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    error: str | None = None
    num_cached_tokens: int = 0

    @property
    def text(self) -> str:
        return self.outputs[0].text if self.outputs else ""

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids if self.outputs else []
