"""CUDA-graph replay of the steady sampling step.

In steady decoding every row of the persistent batch samples, and from one step to the
next only the logits and the generator keys change: the sampler issues the same device
work on the same tensors. `SteadyStepGraph` captures that work once and replays it, so the
host cost of a step falls from dozens of eager ops and up to eight Triton launches to one
graph launch:

- the caller may compute the logits straight into the graph's input (`input_buffer`);
  other logits are copied there;
- the keys (token positions and generator keys) grow by one per steady step, so the body
  adds one to the key tensor it is given, as its last work (the engine fuses it into its
  last kernel). The caller says whether this step's keys are the last step's plus one
  (`advanced`); only when they are not (a skipped step, a counter wrapping) are they built
  on the host and copied.

The caller names the work with a key, and the key must change whenever the sampler would
issue different work: another batch, other parameters, a processor whose device tensors
changed. A key is captured only on the third step in a row that has it. The first step builds
every lazy cache: processor index tensors, the min_p tensor and Triton's compiled kernels.
The second shows that nothing was rebuilt, so the capture records no copy from a host
temporary. A failed capture turns graphs off for good (with a warning), and that step and
every later one run eagerly.

The capture calls `CUDAGraph.capture_begin` on a side stream rather than the
`torch.cuda.graph` context manager. The context manager synchronises the device and runs
`gc.collect()` and `empty_cache()` first, which would cost milliseconds each time the batch
changes. Each capture has its own memory pool; a dropped graph's pool stays reserved until
the caching allocator frees it (on `empty_cache()` or under memory pressure).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

# Consecutive steps that must have the same key before it is captured (see the module docstring).
STEADY_STEPS_BEFORE_CAPTURE = 2


@dataclass
class _CapturedStep:
    key: Hashable
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [N, V] static input: the step's logits, computed or copied here
    keys: torch.Tensor  # [2, N] int64 static input: token positions, then generator keys
    keys_host: torch.Tensor  # [2, N] int64 pinned staging buffer of `keys`
    keys_copied: torch.cuda.Event  # recorded after the last copy out of keys_host
    outputs: object  # what the body returned while capturing: static tensors, rewritten by each replay


class SteadyStepGraph:
    """Captures and replays one steady sampling step (one graph at a time).

    Parameters
    ----------
    enabled : bool
        False: `run` always returns None and the caller samples eagerly.

    Attributes
    ----------
    num_captures, num_replays : int
        Counters for tests and benchmarks.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.num_captures = 0
        self.num_replays = 0
        self._captured: _CapturedStep | None = None
        self._key: Hashable = None
        self._seen = 0  # consecutive steps with self._key

    def input_buffer(self, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor | None:
        """The captured step's logits input when it has this shape and dtype (compute the next
        step's logits into it to save a copy), else None."""
        cap = self._captured
        if cap is None or tuple(cap.logits.shape) != tuple(shape) or cap.logits.dtype != dtype:
            return None
        return cap.logits

    def reset(self) -> None:
        """Forget the captured step and free its memory."""
        self._captured, self._key, self._seen = None, None, 0

    def run(
        self,
        key: Hashable,  # None: this step cannot be replayed
        logits: torch.Tensor,  # [N, V] the step's logits
        keys_host: list[list[int]] | Callable[[], list[list[int]]],  # [2][N] token positions, generator keys
        body: Callable[[torch.Tensor, torch.Tensor], object],  # (logits, keys [2, N] int64) -> outputs;
        advanced: bool = False,                                 # it must leave keys + 1 (module docstring)
    ):
        """The body's outputs from a replay of the step captured under `key`, or None when the
        caller must run the body eagerly this step. Replayed outputs are valid until the next call.

        `keys_host` may be a function that builds them: it is called only when they are copied.
        `advanced`: this step's keys are each the last call's plus one. A replay then reads the
        keys that the last replay left on the device (every call with a captured key replays it,
        so the last call replayed it too) and nothing is built or copied.
        """
        if not self.enabled or key is None or not logits.is_cuda:
            self.reset()
            return None
        cap = self._captured
        if cap is not None and cap.key == key:
            self._load(cap, logits, keys_host, advanced)
            cap.graph.replay()
            self.num_replays += 1
            return cap.outputs
        if key != self._key:
            self._captured, self._key, self._seen = None, key, 0
        self._seen += 1
        if self._seen <= STEADY_STEPS_BEFORE_CAPTURE:
            return None
        return self._capture(key, logits, keys_host, body)

    @staticmethod
    def _load(cap: _CapturedStep, logits: torch.Tensor, keys_host, advanced: bool) -> None:
        """Put the step's logits and keys where the graph reads them; the keys only when the last
        replay did not leave them there."""
        if logits.data_ptr() != cap.logits.data_ptr():
            cap.logits.copy_(logits)
        if not advanced:
            cap.keys_copied.synchronize()  # the previous copy has left the staging buffer
            cap.keys_host.numpy()[:] = keys_host() if callable(keys_host) else keys_host
            cap.keys.copy_(cap.keys_host, non_blocking=True)
            cap.keys_copied.record()

    def _capture(self, key, logits, keys_host, body):
        self._captured = None  # drop the previous graph before the new one allocates
        n = logits.shape[0]
        cap = _CapturedStep(key, torch.cuda.CUDAGraph(), torch.empty_like(logits),
                            torch.empty((2, n), dtype=torch.int64, device=logits.device),
                            torch.empty((2, n), dtype=torch.int64, pin_memory=True), torch.cuda.Event(), None)
        self._load(cap, logits, keys_host, advanced=False)
        main = torch.cuda.current_stream(logits.device)
        side = torch.cuda.Stream(logits.device)
        side.wait_stream(main)
        error = None
        try:
            with torch.cuda.stream(side):
                # thread_local: CUDA calls of other threads (grammar workers) do not break the capture
                cap.graph.capture_begin(capture_error_mode="thread_local")
                try:
                    cap.outputs = body(cap.logits, cap.keys)  # leaves the next step's keys (see _load)
                except Exception as exc:  # noqa: BLE001 - reported below, after the capture ends
                    error = exc
                try:
                    cap.graph.capture_end()
                except Exception as exc:  # noqa: BLE001
                    error = error or exc
        except Exception as exc:  # noqa: BLE001
            error = error or exc
        main.wait_stream(side)
        if error is not None:  # any failure: sample eagerly from now on
            self.enabled = False
            self.reset()
            warnings.warn(f"capturing the steady sampling step failed ({type(error).__name__}: {error}); "
                          "sampling runs eagerly from now on", RuntimeWarning, stacklevel=3)
            return None
        self._captured = cap
        self.num_captures += 1
        cap.graph.replay()  # capturing ran nothing: this step's work happens now
        self.num_replays += 1
        return cap.outputs
