"""CompilerPool: grammar compilation off the engine's critical path.

A request's grammar is submitted the moment the request arrives and compiles on a worker
thread (xgrammar releases the GIL while compiling, so the engine loop keeps running).
The scheduler polls with ``poll(ticket)``, which never blocks. Results are cached by the
grammar's key, and concurrent requests with the same key share one compilation.

Every ticket has a hard deadline of timeout_s of compilation, counted from when its grammar
starts compiling (from its submission when it joins a compilation already running): past it
the ticket fails with a timeout, whatever the compilation is doing. Time spent queued is not
counted, so requests queued behind a slow grammar get their full time. A thread cannot be
killed, so a compilation that overruns keeps its worker until it returns; that worker stops
counting as available and a replacement is started (up to max_abandoned of them), so a slow
grammar never holds up the others. Once that many are stuck, a ticket queued for timeout_s
fails too. If a stuck compilation does finish, its result still fills the cache. A compile
error fails the requests waiting for that grammar and nothing else.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
import weakref
from typing import Callable, Hashable

_POOLS: "weakref.WeakSet[CompilerPool]" = weakref.WeakSet()


def compiling_now() -> bool:
    """Whether some pool still has a compilation running (a worker that cannot be stopped,
    e.g. past its ticket's timeout). The interpreter's normal exit aborts (SIGABRT, from
    xgrammar's threads) while one runs: a program that must exit then can flush its output
    and leave with os._exit."""
    return any(pool._running for pool in list(_POOLS))


class CompileStatus(enum.Enum):
    WAITING = "waiting"
    READY = "ready"
    FAILED = "failed"


class _Job:
    __slots__ = ("key", "spec", "result", "error", "done", "submitted", "started", "finished")

    def __init__(self, key, spec):
        self.key, self.spec = key, spec
        self.result = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.submitted = time.monotonic()
        self.started: float | None = None
        self.finished: float | None = None


class CompileTicket:
    """One request's claim on a compilation: its job, its own deadline, its final status."""

    __slots__ = ("job", "deadline", "status", "result", "error", "submitted", "resolved_at")

    def __init__(self, job: _Job, deadline: float):
        self.job = job
        self.deadline = deadline
        self.submitted = time.monotonic()
        self.status = CompileStatus.WAITING
        self.result = None
        self.error: BaseException | None = None
        self.resolved_at: float | None = None


class CompilerPool:
    """Worker threads compiling grammars, a cache keyed by grammar, a hard timeout per request.

    Parameters
    ----------
    compile_fn : callable(spec) -> compiled
        Runs on a worker thread; an exception fails the requests waiting for that spec.
    max_workers : int
        Workers that may compile at once, not counting those stuck past the timeout.
    timeout_s : float
        Hard limit on a ticket's compilation (from its start, or from the ticket's submission
        when it joins a running one); queued time is not counted while a worker can be started.
    cache_size : int
        Finished compilations kept (least recently used dropped first).
    max_abandoned : int
        At most this many overrunning workers are replaced; past that, new work waits.
    """

    def __init__(self, compile_fn: Callable, max_workers: int = 2, timeout_s: float = 30.0,
                 cache_size: int = 256, max_abandoned: int = 8):
        if not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be an int >= 1, got {max_workers!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got {cache_size!r}")
        self.compile_fn = compile_fn
        self.max_workers = max_workers
        self.timeout_s = float(timeout_s)
        self.cache_size = cache_size
        self.max_abandoned = max_abandoned
        self._cv = threading.Condition()
        self._queue: collections.deque[_Job] = collections.deque()
        self._cache: collections.OrderedDict[Hashable, _Job] = collections.OrderedDict()
        self._running: dict[int, _Job] = {}  # worker id -> job it is compiling
        _POOLS.add(self)
        self._num_workers = 0
        self._idle = 0
        self._next_id = 0
        self._closed = False
        self.stats = collections.Counter()  # hits, misses, timeouts, errors, workers_started

    # ---- engine side --------------------------------------------------------------------
    def submit(self, key: Hashable, spec) -> CompileTicket:
        """Start compiling ``spec`` (or join the cached/in-flight compilation of ``key``)."""
        with self._cv:
            if self._closed:
                raise RuntimeError("CompilerPool is shut down")
            job = self._cache.get(key)
            if job is not None and job.done.is_set() and not isinstance(job.error, (ValueError, type(None))):
                job = None  # an unexpected failure (e.g. MemoryError) is retried, a spec error is not
            if job is None:
                self.stats["misses"] += 1
                job = _Job(key, spec)
                self._cache[key] = job
                self._queue.append(job)
                self._evict()
                self._maybe_spawn()
                self._cv.notify()
            else:
                self.stats["hits"] += 1
                self._cache.move_to_end(key)
            return CompileTicket(job, time.monotonic() + self.timeout_s)

    def poll(self, ticket: CompileTicket) -> CompileStatus:
        """The ticket's status now; never blocks. Once READY or FAILED it stays so."""
        if ticket.status is not CompileStatus.WAITING:
            return ticket.status
        job = ticket.job
        now = time.monotonic()
        if job.done.is_set():
            if job.error is None:
                ticket.status, ticket.result = CompileStatus.READY, job.result
            else:
                ticket.status, ticket.error = CompileStatus.FAILED, job.error
                self.stats["errors"] += 1
        elif job.started is not None and now >= max(ticket.deadline, job.started + self.timeout_s):
            ticket.status = CompileStatus.FAILED
            ticket.error = TimeoutError(f"grammar compilation timed out after {self.timeout_s:g} s")
            self.stats["timeouts"] += 1
            with self._cv:
                self._maybe_spawn()  # its worker is stuck: let a replacement take the queue
        elif job.started is None:
            with self._cv:
                self._maybe_spawn()  # still queued: a worker may have become stuck since
                saturated = self._num_workers >= self.max_workers + self.max_abandoned
                if saturated and now >= ticket.deadline and job.started is None:
                    ticket.status = CompileStatus.FAILED
                    ticket.error = TimeoutError(
                        f"grammar compilation timed out after {self.timeout_s:g} s in the queue: every "
                        f"compile worker is busy, {self._stuck(now)} of them past the timeout")
                    self.stats["timeouts"] += 1
        if ticket.status is not CompileStatus.WAITING:
            ticket.resolved_at = now
        return ticket.status

    def wait(self, ticket: CompileTicket, timeout: float | None = None) -> CompileStatus:
        """Block until the ticket resolves (or ``timeout`` s pass); for tests and offline use.
        Without ``timeout`` it returns by the ticket's deadline once its compilation has started."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll(ticket) is CompileStatus.WAITING:
            left = 0.05 if end is None else end - time.monotonic()
            if left <= 0:
                break
            ticket.job.done.wait(min(left, 0.05))
        return self.poll(ticket)

    def clear_cache(self) -> None:
        with self._cv:
            self._cache.clear()

    def shutdown(self) -> None:
        """Stop the workers once their current job ends; queued jobs are dropped."""
        with self._cv:
            self._closed = True
            for job in self._queue:
                job.error = RuntimeError("CompilerPool shut down before compiling")
                job.done.set()
            self._queue.clear()
            self._cv.notify_all()

    @property
    def num_workers(self) -> int:
        return self._num_workers

    # ---- internals ---------------------------------------------------------------------
    def _evict(self) -> None:
        excess = len(self._cache) - self.cache_size
        if excess <= 0:
            return
        for key in [k for k, j in self._cache.items() if j.done.is_set()][:excess]:
            del self._cache[key]

    def _stuck(self, now: float) -> int:
        return sum(1 for j in self._running.values() if j.started is not None and now - j.started >= self.timeout_s)

    def _maybe_spawn(self) -> None:
        """Start workers while jobs wait, keeping ``max_workers`` of them not stuck past the timeout."""
        stuck = self._stuck(time.monotonic())
        while (len(self._queue) > self._idle and self._num_workers - stuck < self.max_workers
               and self._num_workers < self.max_workers + min(stuck, self.max_abandoned)):
            self._spawn()

    def _spawn(self) -> None:
        wid = self._next_id
        self._next_id += 1
        self._num_workers += 1
        self._idle += 1  # idle until it takes a job, so one queued job starts one worker
        self.stats["workers_started"] += 1
        threading.Thread(target=self._work, args=(wid,), name=f"grammar-compiler-{wid}", daemon=True).start()

    def _work(self, wid: int) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    # Leave when shut down, or when a replacement is no longer needed.
                    if self._closed or self._num_workers - self._stuck(time.monotonic()) > self.max_workers:
                        self._num_workers -= 1
                        self._idle -= 1
                        return
                    self._cv.wait(timeout=1.0)
                job = self._queue.popleft()
                self._idle -= 1
                job.started = time.monotonic()
                self._running[wid] = job
            try:
                job.result = self.compile_fn(job.spec)
            except Exception as e:  # noqa: BLE001 - reported to the requests waiting for this grammar
                job.error = e
            job.finished = time.monotonic()
            with self._cv:
                del self._running[wid]
                job.done.set()
                self._idle += 1
