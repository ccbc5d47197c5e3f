"""SamplingMetadata: per-row sampling parameters as device tensors, checked when built.

Rows are logits rows. In plain decoding there is one row per request; with speculative
decoding a request owns several rows (its draft positions and the bonus row), so every
per-request value is gathered per row (`expand`), and `rows` tells logits processors
which request each row belongs to.

Conventions (documented once, used by every backend):

- temperature: 0 (anything below 1e-5) means greedy, the argmax of the processed logits.
  Random rows use logits * (1 / temperature); `inv_temperature` holds 1 / temperature,
  and -1 on greedy rows.
- top_k: 0 or -1 means off, as does any value >= vocab size; otherwise keep every token
  whose value is >= the k-th largest value (tokens tied with the k-th are all kept).
  Values below -1 are rejected.
- top_p in (0, 1], 1 means off: keep token i when the probability mass of the tokens
  strictly more likely than i is < top_p (so tokens tied at the boundary are all kept),
  computed over what top-k and min_p kept.
- min_p in [0, 1], 0 means off: keep token i when p_i >= min_p * max_j p_j, i.e.
  logit_i >= max + log(min_p) after temperature.
- seeds / positions: the keys of the counter-based generator (see specops.rng). A seeded
  row uses (seed, token position); an unseeded row uses (engine seed, step | lane << 32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

from specops import rng
from specops._arg_checks import as_data_device, check_int, check_not_meta, check_real, check_seed

from .logits_processors.interface import LogitsRows, to_device
from .logits_processors.loader import LogitsProcessors

GREEDY_EPS = 1e-5
FP32_MAX = 3.4028234663852886e38   # a temperature or penalty above it is inf in fp32 (1/T = 0: greedy)
FP32_TINY = 1.1754943508222875e-38  # the smallest normal fp32: a repetition penalty below it divides to inf
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _as_list(name: str, values, n: int | None, default=None) -> list:
    if values is None:
        if n is None:
            raise ValueError(f"{name} is required")
        return [default] * n
    if isinstance(values, torch.Tensor):
        values = values.tolist()  # host inputs only: the builder validates values
    if isinstance(values, (str, bytes, Mapping, AbstractSet)) or not hasattr(values, "__iter__"):
        # a {row: value} dict would give its keys and a set an arbitrary order: neither is per row
        raise TypeError(f"{name} must be a sequence with one value per row, got {type(values).__name__}")
    values = list(values)
    if n is not None and len(values) != n:
        raise ValueError(f"{name} must have one value per row ({n}), got {len(values)}")
    return values


def _check_penalty_state(on: bool, prompt_mask, output_counts, n: int, V: int) -> None:
    if not on:
        return
    for name, t, dt in (("prompt_mask", prompt_mask, torch.bool), ("output_counts", output_counts, torch.int32)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} ([{n}, {V}] {dt}) is required when a row has penalties")
        if tuple(t.shape) != (n, V) or t.dtype != dt:
            raise ValueError(f"{name} must be [{n}, {V}] {dt}, got {tuple(t.shape)} {t.dtype}")
        if V > 1 and n > 0 and t.stride(1) != 1:   # the penalty ops read rows in place (counts are updated there)
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def _check_allowed(name: str, ids, V: int) -> list[int]:
    if isinstance(ids, (str, bytes, Mapping)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of token ids (or None), got {type(ids).__name__}")
    ids = [check_int(name, t, 0, V - 1) for t in ids]
    if not ids:
        raise ValueError(f"{name} must not be empty")
    return ids


def _check_bad_words(bad_words, n: int, V: int) -> dict[int, list[list[int]]]:
    """bad_words_token_ids checked and copied: {row in [0, n): [non-empty lists of ids in [0, V)]}."""
    if not isinstance(bad_words, dict):
        raise TypeError(f"bad_words_token_ids must be a dict {{row: list of token id lists}}, "
                        f"got {type(bad_words).__name__}")
    bad = {}
    for row, words in bad_words.items():
        row = check_int("bad_words_token_ids row", row, 0, n - 1)
        if not isinstance(words, (list, tuple)):
            raise TypeError(f"bad_words_token_ids[{row}] must be a list of token id lists, got {type(words).__name__}")
        bad[row] = []
        for j, word in enumerate(words):
            name = f"bad_words_token_ids[{row}][{j}]"
            if not isinstance(word, (list, tuple)):
                raise TypeError(f"{name} must be a list of token ids, got {type(word).__name__}")
            if not word:
                raise ValueError(f"{name} must not be empty")
            bad[row].append([check_int(f"{name}[{k}]", t, 0, V - 1) for k, t in enumerate(word)])
    return bad


def _check_history(history, bad: dict, n: int, rows: str = "row") -> None:
    """output_token_ids: one list of token ids per row; what the bad-words step reads of a row
    with bad words (its last len(word) - 1 ids) must be ints. Nothing more is read, so nothing
    more is checked (a long history costs nothing)."""
    if bad and history is None:
        raise ValueError("output_token_ids (per-row history) is required with bad_words_token_ids")
    if history is None:
        return
    if not isinstance(history, (list, tuple)):
        raise TypeError(f"output_token_ids must be a list with one list of token ids per {rows}, "
                        f"got {type(history).__name__}")
    if len(history) != n:
        raise ValueError(f"output_token_ids must have one list per {rows} ({n}), got {len(history)}")
    for row, words in bad.items():
        hist = history[row]
        if not isinstance(hist, (list, tuple)):
            raise TypeError(f"output_token_ids[{row}] must be a list of token ids (row {row} has bad words), "
                            f"got {type(hist).__name__}")
        tail = min(len(hist), max(len(w) for w in words) - 1) if words else 0
        for k in range(len(hist) - tail, len(hist)):
            check_int(f"output_token_ids[{row}][{k}]", hist[k])


def _check_logitsprocs(logitsprocs, V: int) -> None:
    """A LogitsProcessors or None, whose processors (those that say) were built for V tokens: a
    logit bias built for a wider vocabulary wrote another row's logits (flat index)."""
    if logitsprocs is not None and not isinstance(logitsprocs, LogitsProcessors):
        raise TypeError(f"logitsprocs must be a LogitsProcessors (build_logits_processors) or None, "
                        f"got {type(logitsprocs).__name__}")
    for proc in [] if logitsprocs is None else logitsprocs.all:
        built_for = getattr(proc, "vocab_size", None)
        if isinstance(built_for, int) and not isinstance(built_for, bool) and built_for != V:
            raise ValueError(f"logitsprocs: {type(proc).__name__} was built for vocab_size {built_for}, "
                             f"the metadata's vocab_size is {V}")


def _check_logits_rows(rows, n: int, logitsprocs, unit: str = "rows") -> None:
    """None, or a LogitsRows of `n` rows whose request indices lie in [0, max_num_reqs) of every
    processor (the processors index their per-request state by them: a bad one failed inside
    the Sampler after a logit bias was added to the caller's logits) and whose counts are >= 0."""
    if rows is None:
        return
    if not isinstance(rows, LogitsRows):
        raise TypeError(f"rows must be a LogitsRows (or None), got {type(rows).__name__}")
    fields = [("req_indices", rows.req_indices), ("num_output_tokens", rows.num_output_tokens)]
    if rows.preceding_token_ids is not None:
        fields.append(("preceding_token_ids", rows.preceding_token_ids))
    for name, values in fields:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise TypeError(f"rows.{name} must be a list, got {type(values).__name__}")
        if len(values) != n:
            raise ValueError(f"rows must describe {n} {unit}, got {len(values)} in rows.{name}")
    limits = [p.max_num_reqs for p in ([] if logitsprocs is None else logitsprocs.all)
              if isinstance(getattr(p, "max_num_reqs", None), int)]
    hi = min(limits) - 1 if limits else None
    for name, values, top in (("req_indices", rows.req_indices, hi),
                              ("num_output_tokens", rows.num_output_tokens, None)):
        if _plain_ints_within(values, 0, top):
            continue   # the engine's case, checked in C loops (~60 us for 2048 rows); else name the first bad one
        for j, v in enumerate(values):
            check_int(f"rows.{name}[{j}]", v, 0, top)


def _plain_ints_within(values, lo: int, hi: int | None) -> bool:
    """Whether `values` (a list) holds Python ints only (no bool), all in [lo, hi] (hi None: no bound)."""
    return set(map(type, values)) <= {int} and (not values or (min(values) >= lo and (hi is None or max(values) <= hi)))


def _allowed_mask(allowed: list, n: int, V: int, dev: torch.device) -> torch.Tensor:
    """[n, V] bool: True where a token may be sampled (rows without a list allow everything);
    built on the device from one copy of the (row, token) pairs."""
    mask = torch.ones(n, V, dtype=torch.bool, device=dev)
    limited = [i for i, ids in enumerate(allowed) if ids is not None]
    pairs = to_device([[i for i in limited for _ in allowed[i]], [t for i in limited for t in allowed[i]]],
                      torch.int64, dev)  # [2, m]
    mask[to_device(limited, torch.int64, dev)] = False
    mask[pairs[0], pairs[1]] = True
    return mask


@dataclass(frozen=True)
class RowParams:
    """One request's sampling parameters, checked and normalised once (`from_sampling_params`),
    for `SamplingMetadata.from_rows`: temperature 0 = greedy, top_k 0 = off (also for values
    >= vocab size), the other fields as given.
    """

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    allowed_token_ids: list[int] | None = None
    num_logprobs: int | None = None  # checked against the vocabulary by from_rows (as the batch's max)

    @classmethod
    def from_sampling_params(cls, p: Any, vocab_size: int) -> "RowParams":
        """Check an object with SamplingParams attributes (the checks of `from_params`)."""
        V = vocab_size
        g = lambda name, default: getattr(p, name, default)  # noqa: E731
        t = check_real("temperature", g("temperature", 1.0), lo=0.0, hi=FP32_MAX)
        k = check_int("top_k", g("top_k", 0), lo=-1)
        top_p = check_real("top_p", g("top_p", 1.0))
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        seed = g("seed", None)
        allowed = g("allowed_token_ids", None)
        return cls(
            temperature=0.0 if t < GREEDY_EPS else t, top_k=0 if (k <= 0 or k >= V) else k,
            top_p=max(top_p, FP32_TINY),   # see from_params: a top_p that is 0 in fp32 is not off
            min_p=check_real("min_p", g("min_p", 0.0), lo=0.0, hi=1.0),
            seed=None if seed is None else check_int("seed", seed, _INT64_MIN, _INT64_MAX),
            repetition_penalty=check_real("repetition_penalty", g("repetition_penalty", 1.0), lo=FP32_TINY,
                                           hi=FP32_MAX),
            frequency_penalty=check_real("frequency_penalty", g("frequency_penalty", 0.0), -2.0, 2.0),
            presence_penalty=check_real("presence_penalty", g("presence_penalty", 0.0), -2.0, 2.0),
            allowed_token_ids=None if allowed is None else _check_allowed("allowed_token_ids", allowed, V),
            num_logprobs=g("logprobs", None))


@dataclass
class SamplingMetadata:
    """Per-row sampling inputs of one step (build with `from_params`, which validates).

    Attributes
    ----------
    temperature : torch.Tensor
        [R] fp32, 0 on greedy rows.
    inv_temperature : torch.Tensor
        [R] fp32, 1 / temperature on random rows, -1 on greedy rows.
    seeds, positions : torch.Tensor
        [R] int64 generator keys (specops.rng convention).
    top_k : torch.Tensor or None
        [R] int32, 0 = off. None when no row uses it.
    top_p : torch.Tensor or None
        [R] fp32, 1 = off. None when no row uses it.
    min_p : torch.Tensor or None
        [R] fp32, 0 = off. None when no row uses it.
    repetition_penalties, frequency_penalties, presence_penalties : torch.Tensor or None
        [R] fp32 (1, 0, 0 = off). None when no row has penalties.
    prompt_mask : torch.Tensor or None
        [R, V] bool, tokens of the row's prompt (penalties).
    output_counts : torch.Tensor or None
        [R, V] int32, counts of the row's output tokens (penalties).
    allowed_token_mask : torch.Tensor or None
        [R, V] bool, True where a token may be sampled. None: all allowed.
    bad_words_token_ids : dict[int, list[list[int]]]
        Row -> banned words (token id sequences).
    output_token_ids : list[list[int]] or None
        Per-row history (outputs + drafts before the row) used by bad_words.
    max_num_logprobs : int or None
        Top-n logprobs to return (None: no logprobs).
    logitsprocs : LogitsProcessors or None
    rows : LogitsRows or None
        Request index and history of each row for the logits processors (None: row i is
        batch index i).
    all_greedy, all_random, no_penalties : bool
        Host short cuts. all_greedy / all_random describe the temperature tensors they were
        computed for: read them through `greedy_rows_hint` (a `dataclasses.replace` of
        temperature or inv_temperature turns them off).
    max_filtered_top_k : int, float or None
        Host: a bound on the top_k of the random rows with a filter (top-k, top-p or
        min-p): their largest top_k (after `expand`, of the rows expanded from), inf when
        such a row has no top-k, 0 when no random row has a filter, None when unknown.
        It describes the filter tensors it was computed for (`filters_of_hint`, by
        identity): `filter_bound` returns it only while they are this metadata's own, so
        a `dataclasses.replace` of temperature, top_k, top_p or min_p turns it off.
        `sample_options` reads it to leave out the search kernels that only wide filters
        need.
    max_search_top_k : int or None
        Host: `max_filtered_top_k` with the rows without top-k left out (top-p and / or
        min-p): a draw that needs no threshold takes them by pivot rejection, with no search
        (`sample(..., distribution=False)`). Kept and read as `max_filtered_top_k`
        (`filter_bound(min_p, pivot=True)`).
    any_pivot_row : bool or None
        Host: whether a random row has top-p or min-p and no top-k (None: unknown); kept and
        read as `max_filtered_top_k` (`pivot_rows_hint`): without such a row a tokens-only
        draw launches no pivot rounds.
    max_top_k_with_top_p : int or None
        Host: the largest top_k of the random rows that also have top-p (0 when none has
        both), None when unknown. It describes the temperature, top_k and top_p of
        `filters_of_hint` (`top_k_with_top_p_bound`; min_p plays no part, so a processor's
        min_p leaves it known); `sample_options` reads it to size the candidate capacity:
        only a row with both sorts its top_k candidates (a top-k-only row needs no sort).
    min_top_k : int, float or None
        Host: a lower bound on the top_k of the random rows with top-k (their smallest; inf
        when none has one), None when unknown; read through `min_top_k_bound` while the
        temperature and top_k of `filters_of_hint` hold. `sample_options` reads it: without
        a small top-k row the kernels fork no stream for such rows (`direct_beside`).
    request_seeds, has_seed, token_positions : torch.Tensor
        [R] int64 / bool / int64: the ingredients of seeds/positions, kept so that
        `expand` can recompute the keys of new rows.
    engine_seed : int
    step : torch.Tensor
        [] int64 engine step counter on the device.
    vocab_size : int or None
        The vocabulary the rows were checked against (top_k, allowed and banned token ids,
        penalty state); the Sampler refuses logits of another width. None: not known (built
        by hand), not checked.
    """

    temperature: torch.Tensor
    inv_temperature: torch.Tensor
    seeds: torch.Tensor
    positions: torch.Tensor
    request_seeds: torch.Tensor
    has_seed: torch.Tensor
    token_positions: torch.Tensor
    engine_seed: int
    step: torch.Tensor
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    presence_penalties: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    output_counts: torch.Tensor | None = None
    allowed_token_mask: torch.Tensor | None = None
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)
    output_token_ids: list[list[int]] | None = None
    max_num_logprobs: int | None = None
    logitsprocs: Any = None
    rows: LogitsRows | None = None
    max_filtered_top_k: int | float | None = None
    max_top_k_with_top_p: int | None = None
    min_top_k: int | float | None = None
    max_search_top_k: int | float | None = None
    any_pivot_row: bool | None = None
    filters_of_hint: tuple = field(default=(), repr=False, compare=False)
    vocab_size: int | None = None

    def check_vocab(self, vocab: int) -> None:
        """Raise ValueError when logits of `vocab` columns do not match the vocabulary the
        rows were built for (nothing to check when vocab_size is None)."""
        if self.vocab_size is not None and vocab != self.vocab_size:
            raise ValueError(f"logits has {vocab} columns but the metadata was built for vocab_size={self.vocab_size}")

    @property
    def num_rows(self) -> int:
        return self.temperature.shape[0]

    def _hints_hold(self, min_p: torch.Tensor | None) -> bool:
        """Whether the host hints still describe these rows: their temperature, top_k, top_p
        and `min_p` (the one a kernel will get) are the tensors the hints were computed for."""
        return self._top_k_top_p_hold() and min_p is self.filters_of_hint[3]

    def _top_k_top_p_hold(self) -> bool:
        """`_hints_hold` for temperature (and inv_temperature, which the kernels read), top_k
        and top_p alone."""
        filters = (self.temperature, self.top_k, self.top_p)
        return self._temperature_holds() and all(a is b for a, b in zip(filters, self.filters_of_hint))

    def _temperature_holds(self) -> bool:
        """Whether temperature and inv_temperature are the tensors the host hints (and
        `all_greedy` / `all_random`) were computed for."""
        fh = self.filters_of_hint
        return len(fh) == 5 and self.temperature is fh[0] and self.inv_temperature is fh[4]

    def greedy_rows_hint(self) -> bool | None:
        """True when every row is greedy, False when none is, None when mixed or unknown:
        `all_greedy` / `all_random` while they still describe these rows (a
        `dataclasses.replace` of temperature or inv_temperature turns them off)."""
        if not self._temperature_holds():
            return None
        return True if self.all_greedy else (False if self.all_random else None)

    def filter_bound(self, min_p: torch.Tensor | None, pivot: bool = False) -> int | float | None:
        """`max_filtered_top_k` (`pivot`: `max_search_top_k`) while it still describes these
        rows, else None (unknown)."""
        if not self._hints_hold(min_p):
            return None
        return self.max_search_top_k if pivot else self.max_filtered_top_k

    def pivot_rows_hint(self, min_p: torch.Tensor | None) -> bool | None:
        """`any_pivot_row` while it still describes these rows, else None (unknown)."""
        return self.any_pivot_row if self._hints_hold(min_p) else None

    def top_k_with_top_p_bound(self) -> int | None:
        """`max_top_k_with_top_p` while it still describes these rows, else None (unknown)."""
        return self.max_top_k_with_top_p if self._top_k_top_p_hold() else None

    def min_top_k_bound(self) -> int | float | None:
        """`min_top_k` while it still describes these rows, else None (unknown)."""
        return self.min_top_k if self._top_k_top_p_hold() else None

    @property
    def no_penalties(self) -> bool:
        return self.repetition_penalties is None

    @property
    def device(self) -> torch.device:
        return self.temperature.device

    # ---- building ---------------------------------------------------------------------

    @classmethod
    def from_params(
        cls,
        temperature: Sequence[float],
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        min_p: Sequence[float] | None = None,
        seeds: Sequence[int | None] | None = None,
        positions: Sequence[int] | None = None,
        engine_seed: int = 0,
        step: int | torch.Tensor = 0,
        repetition_penalties: Sequence[float] | None = None,
        frequency_penalties: Sequence[float] | None = None,
        presence_penalties: Sequence[float] | None = None,
        prompt_mask: torch.Tensor | None = None,
        output_counts: torch.Tensor | None = None,
        allowed_token_ids: Sequence[Sequence[int] | None] | None = None,
        bad_words_token_ids: dict[int, list[list[int]]] | None = None,
        output_token_ids: list[list[int]] | None = None,
        max_num_logprobs: int | None = None,
        logitsprocs: Any = None,
        rows: LogitsRows | None = None,
    ) -> "SamplingMetadata":
        """Validate host per-row values and move them to `device`.

        Raises ValueError / TypeError naming the first bad argument (and row) and the
        accepted range, before anything reaches the device. See the module docstring for
        the conventions. `seeds[i] = None` marks an unseeded row; `positions` are token
        positions (< 2**32) and default to 0: a seeded row's noise is keyed by (seed,
        position) only, so a seeded request must be given its token position at every step,
        or it reuses the same noise every step. `step` is the engine step counter (an int or
        a [] int64 device tensor, which is never read back).

        `bad_words_token_ids` is {row: [word, ...]}, each word a non-empty list of token ids
        in [0, vocab_size); it needs `output_token_ids`, one list of token ids per row (of a
        row with bad words, the last len(word) - 1 ids are read, and checked).
        `logitsprocs` is a `LogitsProcessors` (`build_logits_processors`) or None.
        """
        V = check_int("vocab_size", vocab_size, lo=1)
        temps = _as_list("temperature", temperature, None)
        n = len(temps)
        temps = [check_real(f"temperature[{i}]", t, lo=0.0, hi=FP32_MAX) for i, t in enumerate(temps)]
        temps = [0.0 if t < GREEDY_EPS else t for t in temps]

        ks = None
        if top_k is not None:
            ks = [check_int(f"top_k[{i}]", k, lo=-1) for i, k in enumerate(_as_list("top_k", top_k, n))]
            ks = [0 if (k <= 0 or k >= V) else k for k in ks]
            if not any(ks):
                ks = None
        ps = None
        if top_p is not None:
            ps = []
            for i, p in enumerate(_as_list("top_p", top_p, n)):
                p = check_real(f"top_p[{i}]", p)
                if not 0.0 < p <= 1.0:
                    raise ValueError(f"top_p[{i}] must be in (0, 1], got {p}")
                # under FP32_TINY, p is 0 in fp32, where the kernels' top_p <= 0 beside a top-k
                # keeps the top-k set; any p <= 1/V keeps the max's ties alone, as FP32_TINY does
                ps.append(max(p, FP32_TINY))
            if all(p >= 1.0 for p in ps):
                ps = None
        mps = None
        if min_p is not None:
            mps = [check_real(f"min_p[{i}]", m, lo=0.0, hi=1.0) for i, m in enumerate(_as_list("min_p", min_p, n))]
            if not any(mps):
                mps = None

        seed_list = _as_list("seeds", seeds, n)
        has = [s is not None for s in seed_list]
        seed_vals = [0 if s is None else check_int(f"seeds[{i}]", s, _INT64_MIN, _INT64_MAX)
                     for i, s in enumerate(seed_list)]
        pos_vals = [check_int(f"positions[{i}]", p, 0, 2**32 - 1)
                    for i, p in enumerate(_as_list("positions", positions, n, 0))]
        engine_seed = check_seed("engine_seed", engine_seed)

        rep = freq = pres = None
        if any(x is not None for x in (repetition_penalties, frequency_penalties, presence_penalties)):
            rep = [check_real(f"repetition_penalties[{i}]", r, lo=FP32_TINY, hi=FP32_MAX)
                   for i, r in enumerate(_as_list("repetition_penalties", repetition_penalties, n, 1.0))]
            freq = [check_real(f"frequency_penalties[{i}]", f, -2.0, 2.0)
                    for i, f in enumerate(_as_list("frequency_penalties", frequency_penalties, n, 0.0))]
            pres = [check_real(f"presence_penalties[{i}]", p, -2.0, 2.0)
                    for i, p in enumerate(_as_list("presence_penalties", presence_penalties, n, 0.0))]
            if all(r == 1.0 for r in rep) and not any(freq) and not any(pres):
                rep = freq = pres = None
        _check_penalty_state(rep is not None, prompt_mask, output_counts, n, V)
        allowed = None
        if allowed_token_ids is not None:
            allowed = [None if lst is None else _check_allowed(f"allowed_token_ids[{i}]", lst, V)
                       for i, lst in enumerate(_as_list("allowed_token_ids", allowed_token_ids, n))]
            if all(a is None for a in allowed):
                allowed = None
        if max_num_logprobs is not None:
            max_num_logprobs = check_int("max_num_logprobs", max_num_logprobs, 0, V)
        return cls._build(V, device, temps, ks, ps, mps, seed_vals, has, pos_vals, engine_seed, step, rep, freq,
                          pres, prompt_mask, output_counts, allowed, bad_words_token_ids, output_token_ids,
                          max_num_logprobs, logitsprocs, rows)

    @classmethod
    def from_rows(
        cls,
        params: Sequence["RowParams"],
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
        engine_seed: int = 0,
        step: int | torch.Tensor = 0,
        prompt_mask: torch.Tensor | None = None,
        output_counts: torch.Tensor | None = None,
        bad_words_token_ids: dict[int, list[list[int]]] | None = None,
        output_token_ids: list[list[int]] | None = None,
        logitsprocs: Any = None,
        rows: LogitsRows | None = None,
    ) -> "SamplingMetadata":
        """`from_sampling_params` for rows whose parameters were checked already (one
        `RowParams` per row, made once per request): the same metadata, without checking
        every row again. Token positions are 0, as in `from_sampling_params` without
        `positions`: a seeded request must be given its token position at every step (e.g.
        `expand(..., position_offsets=positions)`), or it reuses the same noise every step.
        bad_words_token_ids, output_token_ids and logitsprocs are checked as in `from_params`."""
        V = check_int("vocab_size", vocab_size, lo=1)
        n = len(params)
        temps = [r.temperature for r in params]
        ks = [0 if r.top_k >= V else r.top_k for r in params]   # a row made for a larger vocabulary: off
        ps = [r.top_p for r in params]
        mps = [r.min_p for r in params]
        rep = [r.repetition_penalty for r in params]
        freq = [r.frequency_penalty for r in params]
        pres = [r.presence_penalty for r in params]
        if all(r == 1.0 for r in rep) and not any(freq) and not any(pres):
            rep = freq = pres = None
        _check_penalty_state(rep is not None, prompt_mask, output_counts, n, V)
        allowed = [r.allowed_token_ids for r in params]
        for i, a in enumerate(allowed):   # checked when made, perhaps against a larger vocabulary
            if a and max(a) >= V:
                raise ValueError(f"allowed_token_ids of row {i}: token id {max(a)} is outside the vocabulary "
                                 f"[0, {V}) (the RowParams was made for a larger one)")
        nlp = [check_int(f"num_logprobs of row {i}", r.num_logprobs, 0, V)
               for i, r in enumerate(params) if r.num_logprobs is not None]
        seeds = [0 if r.seed is None else r.seed for r in params]
        has = [r.seed is not None for r in params]
        engine_seed = check_seed("engine_seed", engine_seed)
        return cls._build(
            V, device, temps, ks if any(ks) else None, None if all(p >= 1.0 for p in ps) else ps,
            mps if any(mps) else None, seeds, has, [0] * n, engine_seed, step, rep, freq, pres, prompt_mask,
            output_counts, allowed if any(a is not None for a in allowed) else None, bad_words_token_ids,
            output_token_ids, check_int("max_num_logprobs", max(nlp), 0, V) if nlp else None, logitsprocs, rows)

    @classmethod
    def _build(cls, V, device, temps, ks, ps, mps, seed_vals, has, pos_vals, engine_seed, step, rep, freq, pres,
               prompt_mask, output_counts, allowed, bad_words_token_ids, output_token_ids, max_num_logprobs,
               logitsprocs, rows) -> "SamplingMetadata":
        """The tensors of checked, normalised host lists: two copies to the device (all fp32
        rows in one, all int64 rows in the other), then views and a few device ops."""
        n = len(temps)
        dev = as_data_device("device", device)
        if rep is not None:
            for name, t in (("prompt_mask", prompt_mask), ("output_counts", output_counts)):
                if t.device.type != dev.type or (dev.index is not None and t.device.index != dev.index):
                    raise ValueError(f"{name} must be on {dev} (the metadata's device), got {t.device}")
        bad = {} if bad_words_token_ids is None else _check_bad_words(bad_words_token_ids, n, V)
        _check_history(output_token_ids, bad, n)
        _check_logitsprocs(logitsprocs, V)
        _check_logits_rows(rows, n, logitsprocs)
        if isinstance(step, torch.Tensor) and (step.numel() != 1 or step.dim() > 1 or step.is_floating_point()
                                               or step.is_complex() or step.dtype == torch.bool):
            raise ValueError(f"step must be an int or an integer tensor with one element ([] or [1]), got "
                             f"{step.dtype} of shape {tuple(step.shape)}")
        if isinstance(step, torch.Tensor):
            check_not_meta("step", step)
        step_t = step.to(dev, torch.int64).reshape(()) if isinstance(step, torch.Tensor) else None
        if step_t is None:
            step = check_int("step", step, 0, _INT64_MAX)   # an int64 counter; its low 32 bits key the noise

        # rows padded to a multiple of 4 values: every row view starts 16-byte aligned whatever
        # the batch, so the Triton kernels that read them are compiled for one alignment only
        pad = [0] * (-n % 4)
        floats = [list(v) + pad for v in (temps, ps, mps, rep, freq, pres) if v is not None]
        f = iter(to_device(floats, torch.float32, dev).reshape(len(floats), n + len(pad))[:, :n])  # [k, n]
        ints = [seed_vals, pos_vals, [int(h) for h in has]] + ([ks] if ks is not None else [])
        i = to_device([list(v) + pad for v in ints], torch.int64, dev).reshape(len(ints), n + len(pad))[:, :n]
        temp_t = next(f)
        opt = lambda v: next(f) if v is not None else None  # noqa: E731  (fp32 rows, in order)
        top_p, min_p, rep_t, freq_t, pres_t = opt(ps), opt(mps), opt(rep), opt(freq), opt(pres)
        req_seeds, tok_pos, has_t = i[0], i[1], i[2].bool()
        if step_t is None:
            step_t = to_device(step, torch.int64, dev)
        row_seeds, row_pos = rng.row_keys(req_seeds, has_t, tok_pos, engine_seed, step_t)
        md = cls(
            temperature=temp_t,
            inv_temperature=_inv_temperature(temp_t),
            seeds=row_seeds, positions=row_pos, request_seeds=req_seeds, has_seed=has_t,
            token_positions=tok_pos, engine_seed=engine_seed, step=step_t,
            all_greedy=all(t == 0.0 for t in temps), all_random=all(t > 0.0 for t in temps),
            top_k=i[3].to(torch.int32) if ks is not None else None,
            top_p=top_p, min_p=min_p,
            repetition_penalties=rep_t, frequency_penalties=freq_t, presence_penalties=pres_t,
            prompt_mask=prompt_mask if rep is not None else None,
            output_counts=output_counts if rep is not None else None,
            allowed_token_mask=_allowed_mask(allowed, n, V, dev) if allowed is not None else None,
            bad_words_token_ids=bad, output_token_ids=output_token_ids, max_num_logprobs=max_num_logprobs,
            logitsprocs=logitsprocs, rows=rows, max_filtered_top_k=_max_filtered_top_k(temps, ks, ps, mps),
            max_top_k_with_top_p=_max_top_k_with_top_p(temps, ks, ps),
            min_top_k=min((k for t, k in zip(temps, ks or ()) if t > 0.0 and k > 0), default=math.inf),
            max_search_top_k=_max_filtered_top_k(temps, ks, ps, mps, pivot=True),
            any_pivot_row=_any_pivot_row(temps, ks, ps, mps),
            vocab_size=V,
        )
        md.filters_of_hint = (md.temperature, md.top_k, md.top_p, md.min_p, md.inv_temperature)
        return md

    @classmethod
    def from_sampling_params(cls, params: Sequence[Any], *, vocab_size: int, device="cpu",
                             positions: Sequence[int] | None = None, **kwargs) -> "SamplingMetadata":
        """Build from objects with SamplingParams attributes (temperature, top_k, top_p, min_p,
        seed, repetition/frequency/presence_penalty, allowed_token_ids, logprobs). `positions`
        default to 0, as in `from_params` (give a seeded request its position every step);
        the other keyword arguments are `from_params`'s."""
        g = lambda name, default: [getattr(p, name, default) for p in params]  # noqa: E731
        allowed = g("allowed_token_ids", None)
        V = check_int("vocab_size", vocab_size, lo=1)
        nlp = [check_int(f"logprobs of row {i}", x, 0, V) for i, x in enumerate(g("logprobs", None)) if x is not None]
        kwargs.setdefault("max_num_logprobs", max(nlp) if nlp else None)
        return cls.from_params(
            g("temperature", 1.0), vocab_size=vocab_size, device=device, top_k=g("top_k", 0),
            top_p=g("top_p", 1.0), min_p=g("min_p", 0.0), seeds=g("seed", None), positions=positions,
            repetition_penalties=g("repetition_penalty", 1.0), frequency_penalties=g("frequency_penalty", 0.0),
            presence_penalties=g("presence_penalty", 0.0),
            allowed_token_ids=allowed if any(a is not None for a in allowed) else None, **kwargs)

    # ---- rows that are not 1:1 with requests --------------------------------------------

    def expand(
        self,
        row_req_index: Sequence[int] | torch.Tensor,
        position_offsets: Sequence[int] | torch.Tensor | None = None,
        rows: LogitsRows | None = None,
        output_token_ids: list[list[int]] | None = None,
    ) -> "SamplingMetadata":
        """Metadata for new rows, row j taking the parameters of this metadata's row
        `row_req_index[j]` (e.g. the draft and bonus rows of speculative decoding).

        Seeded rows get position = token position + `position_offsets[j]`; unseeded rows get
        fresh lanes (their new row index), so no two rows share noise. Penalty state is
        gathered (callers that need counts including earlier drafts pass their own).

        Parameters
        ----------
        row_req_index : [num_rows] ints (host list, checked; or an int32/int64 tensor, whose
            values are trusted: a device tensor is not read back)
        position_offsets : [num_rows] ints, optional (default 0)
            Host ints in [0, 2**32), checked; or an int32/int64 tensor, trusted. A seeded row's
            position is taken modulo 2**32 (`rng.row_keys`).
        rows : LogitsRows, optional
            Request index and history of every new row for the logits processors.
        output_token_ids : list[list[int]], optional
            Per-new-row history for bad_words (required if bad words are set).
        """
        dev = self.device
        host_idx = None
        if isinstance(row_req_index, torch.Tensor):
            if row_req_index.dtype not in (torch.int32, torch.int64) or row_req_index.dim() != 1:
                raise TypeError(f"row_req_index must be a 1-D int32/int64 tensor, got {row_req_index.dtype} "
                                f"of shape {tuple(row_req_index.shape)}")
            idx = row_req_index.to(dev, torch.int64)   # not range-checked: that would sync the host
        else:
            host_idx = [check_int(f"row_req_index[{j}]", i) for j, i in enumerate(row_req_index)]
            if any(not 0 <= i < self.num_rows for i in host_idx):
                raise ValueError(f"row_req_index values must be in [0, {self.num_rows})")
            idx = to_device(host_idx, torch.int64, dev)
        m = idx.shape[0]
        bad = {}
        if self.bad_words_token_ids:
            if host_idx is None or output_token_ids is None:
                raise ValueError("expanding rows with bad_words needs a host row_req_index and output_token_ids")
            bad = {j: self.bad_words_token_ids[i] for j, i in enumerate(host_idx) if i in self.bad_words_token_ids}
        _check_history(output_token_ids, bad, m, "new row")
        _check_logits_rows(rows, m, self.logitsprocs, "new rows")
        if position_offsets is None:
            offs = torch.zeros(m, dtype=torch.int64, device=dev)
        elif isinstance(position_offsets, torch.Tensor):
            if position_offsets.dtype not in (torch.int32, torch.int64):   # a float would be truncated
                raise TypeError(f"position_offsets must be an int32/int64 tensor, got {position_offsets.dtype}")
            offs = position_offsets.to(dev, torch.int64)   # values trusted: a device tensor is not read back
        else:
            offs = to_device([check_int(f"position_offsets[{j}]", o, 0, 2**32 - 1)
                              for j, o in enumerate(_as_list("position_offsets", position_offsets, m))], torch.int64, dev)
        if offs.shape != (m,):
            raise ValueError(f"position_offsets must have shape [{m}], got {tuple(offs.shape)}")
        take = lambda t: None if t is None else t.index_select(0, idx)  # noqa: E731
        req_seeds, has, tok_pos = take(self.request_seeds), take(self.has_seed), take(self.token_positions) + offs
        row_seeds, row_pos = rng.row_keys(req_seeds, has, tok_pos, self.engine_seed, self.step)
        temp, top_k, top_p, min_p, inv_temp = (take(t) for t in (self.temperature, self.top_k, self.top_p,
                                                                 self.min_p, self.inv_temperature))
        greedy = self.greedy_rows_hint()   # the new rows are some of these: it still holds
        bound = self.filter_bound(self.min_p)   # the new rows are some of these: it still bounds them
        search_bound = self.filter_bound(self.min_p, pivot=True)
        pivot_rows = self.pivot_rows_hint(self.min_p)
        k_bound = self.top_k_with_top_p_bound()
        k_low = self.min_top_k_bound()   # some of these rows: still a lower bound
        return replace(
            self, temperature=temp, inv_temperature=inv_temp, seeds=row_seeds,
            all_greedy=greedy is True, all_random=greedy is False,
            positions=row_pos, request_seeds=req_seeds, has_seed=has, token_positions=tok_pos,
            top_k=top_k, top_p=top_p, min_p=min_p, max_filtered_top_k=bound,
            max_top_k_with_top_p=k_bound, min_top_k=k_low, max_search_top_k=search_bound, any_pivot_row=pivot_rows,
            filters_of_hint=(temp, top_k, top_p, min_p, inv_temp),
            repetition_penalties=take(self.repetition_penalties), frequency_penalties=take(self.frequency_penalties),
            presence_penalties=take(self.presence_penalties), prompt_mask=take(self.prompt_mask),
            output_counts=take(self.output_counts), allowed_token_mask=take(self.allowed_token_mask),
            bad_words_token_ids=bad, output_token_ids=output_token_ids, rows=rows)


def _max_filtered_top_k(temps: list, ks: list | None, ps: list | None, mps: list | None,
                        pivot: bool = False) -> int | float:
    """SamplingMetadata.max_filtered_top_k of normalised host lists (top_k 0 = off);
    `pivot=True`: max_search_top_k (rows without top-k do not count)."""
    widest = 0
    for i, t in enumerate(temps):
        k = ks[i] if ks is not None else 0
        has_p = ps is not None and ps[i] < 1.0
        has_mp = mps is not None and mps[i] > 0.0
        if t > 0.0 and (k > 0 or ((has_mp or has_p) and not pivot)):
            widest = max(widest, k if k > 0 else math.inf)
    return widest


def _any_pivot_row(temps: list, ks: list | None, ps: list | None, mps: list | None) -> bool:
    """SamplingMetadata.any_pivot_row of normalised host lists: a random row with top-p or
    min-p and no top-k."""
    return any(t > 0.0 and (ks is None or ks[i] == 0)
               and ((ps is not None and ps[i] < 1.0) or (mps is not None and mps[i] > 0.0))
               for i, t in enumerate(temps))


def _max_top_k_with_top_p(temps: list, ks: list | None, ps: list | None) -> int:
    """SamplingMetadata.max_top_k_with_top_p of normalised host lists (top_k 0 = off, top_p
    1 = off)."""
    if ks is None or ps is None:
        return 0
    return max((k for t, k, p in zip(temps, ks, ps) if t > 0.0 and p < 1.0), default=0)


def _inv_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """[R] fp32: 1 / temperature on random rows, -1 on greedy rows (temperature 0)."""
    return torch.where(temperature > 0, 1.0 / torch.where(temperature > 0, temperature, 1.0),
                       torch.full_like(temperature, -1.0))


def inv_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """Public form of the convention: [R] temperatures -> [R] fp32 1/T, or -1 (greedy) where
    T < 1e-5, which takes negative temperatures, and where T is NaN; T = +inf gives 0, which
    the draw treats as greedy too. No value is checked (that would sync the host): check
    temperatures on the host first (`SamplingMetadata.from_params` does).

    >>> inv_temperature(torch.tensor([0.5, 0.0, -1.0, float("nan")]))
    tensor([ 2., -1., -1., -1.])
    """
    t = torch.where(temperature < GREEDY_EPS, torch.zeros_like(temperature), temperature)
    return _inv_temperature(t.to(torch.float32))
