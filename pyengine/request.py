"""Request: one sequence being generated, with its tokens, KV blocks and progress."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # waiting again; its KV was dropped and will be recomputed
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def finished(self) -> bool:
        return self.value >= RequestStatus.FINISHED_STOPPED.value


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True)  # slots: built once per row and step on the hot path (half the cost)
class Logprob:
    """Log-probability of the sampled token and of the top-n alternatives at one position."""

    token_id: int
    logprob: float
    rank: int
    top: dict[int, float] = field(default_factory=dict)


class Request:
    """The engine's state for one sequence.

    `all_token_ids` = prompt + output. `num_computed_tokens` counts the tokens whose K/V are in
    the cache; the scheduler gives a request `num_tokens_with_spec - num_computed_tokens` more
    (its prompt remainder, or the last sampled token plus any draft tokens).
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_ids: list[int] = (), prompt: str | None = None, arrival: int = 0):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = tuple(eos_token_ids)
        self.arrival = arrival
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.spec_token_ids: list[int] = []  # drafts for the next step (speculative decoding)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache on first admission
        self.num_preemptions = 0
        self.block_ids: list[int] = []
        self.block_hashes: list[bytes] = []  # digest chain of the full blocks of all_token_ids (block_manager)
        self.num_hashed_blocks = 0  # leading blocks of block_ids registered in the prefix cache
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.logprobs: list[Logprob] | None = [] if sampling_params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.banned_words: list[list[int]] = []  # bad_words as token sequences

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Keep the first num_output_tokens outputs (a stop string ended the text among tokens
        that one speculative step emitted). Only for a request that finishes now."""
        if not 0 <= num_output_tokens <= self.num_output_tokens:
            raise ValueError(f"num_output_tokens must be in [0, {self.num_output_tokens}], got {num_output_tokens}")
        del self.output_token_ids[num_output_tokens:]
        del self.all_token_ids[self.num_prompt_tokens + num_output_tokens:]
        self.num_computed_tokens = min(self.num_computed_tokens, self.num_tokens)
