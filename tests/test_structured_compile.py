"""Grammar compilation off the critical path: worker pool, cache, hard timeout, failures that stay
with their own request. Times are measured, with bounds loose enough for a loaded 2-core machine
but far below the slow compilation they are compared with."""

import threading
import time

import pytest

from specops.engine.structured_output import CompilerPool, CompileStatus

WAITING, READY, FAILED = CompileStatus.WAITING, CompileStatus.READY, CompileStatus.FAILED


def _fake_compile(calls, slow_s=3.0):
    def compile_fn(spec):
        calls.append(spec)
        kind, arg = spec
        if kind == "slow":
            time.sleep(slow_s)
        elif kind == "bad":
            raise ValueError(f"bad spec {arg}")
        elif kind == "crash":
            raise MemoryError("out of memory")
        elif kind == "medium":
            time.sleep(0.2)
        else:
            time.sleep(0.01)
        return f"compiled {arg}"
    return compile_fn


def _poll_until_resolved(pool, tickets, limit_s):
    """Poll like a scheduler (never blocking) and record when each ticket resolved."""
    t0 = time.monotonic()
    resolved = {}
    while len(resolved) < len(tickets) and time.monotonic() - t0 < limit_s:
        for name, t in tickets.items():
            if name not in resolved and pool.poll(t) is not WAITING:
                resolved[name] = time.monotonic() - t0
        time.sleep(0.002)
    return resolved


def test_cache_and_shared_inflight_compilation():
    calls = []
    pool = CompilerPool(_fake_compile(calls), max_workers=2, timeout_s=10)
    a = [pool.submit(("ok", 1), ("ok", 1)) for _ in range(3)]
    b = pool.submit(("ok", 2), ("ok", 2))
    for t in a + [b]:
        assert pool.wait(t, 5) is READY
    assert [t.result for t in a] == ["compiled 1"] * 3 and b.result == "compiled 2"
    assert sorted(calls) == [("ok", 1), ("ok", 2)]  # one compilation per key
    c = pool.submit(("ok", 1), ("ok", 1))
    assert pool.poll(c) is READY  # cached: ready on the first poll
    assert pool.stats["hits"] == 3 and pool.stats["misses"] == 2
    pool.shutdown()


def test_cache_is_lru_bounded():
    calls = []
    pool = CompilerPool(_fake_compile(calls), max_workers=1, timeout_s=10, cache_size=2)
    for k in (1, 2, 3):
        assert pool.wait(pool.submit(k, ("ok", k)), 5) is READY
    assert pool.wait(pool.submit(1, ("ok", 1)), 5) is READY  # evicted: compiled again
    assert pool.wait(pool.submit(3, ("ok", 3)), 5) is READY  # still cached
    assert [c[1] for c in calls] == [1, 2, 3, 1]
    pool.shutdown()


def test_compile_error_fails_only_its_request():
    calls = []
    pool = CompilerPool(_fake_compile(calls), max_workers=2, timeout_s=10)
    bad = pool.submit("bad", ("bad", "x"))
    good = pool.submit("good", ("ok", "y"))
    assert pool.wait(bad, 5) is FAILED and pool.wait(good, 5) is READY
    assert isinstance(bad.error, ValueError) and "bad spec x" in str(bad.error)
    again = pool.submit("bad", ("bad", "x"))
    assert pool.poll(again) is FAILED and len(calls) == 2  # a spec error is cached, not recompiled
    crash = pool.submit("crash", ("crash", 0))
    assert pool.wait(crash, 5) is FAILED and isinstance(crash.error, MemoryError)
    retry = pool.submit("crash", ("crash", 0))
    assert pool.wait(retry, 5) is FAILED and len(calls) == 4  # an unexpected failure is retried
    pool.shutdown()


def test_a_grammar_queued_behind_slow_ones_gets_its_full_time():
    # every worker busy with a slow grammar: the quick one queued behind them timed out with them
    # (its deadline ran from its submission and the replacement worker came only at theirs)
    calls = []
    pool = CompilerPool(_fake_compile(calls, slow_s=3.0), max_workers=2, timeout_s=0.4)
    tickets = {f"slow{i}": pool.submit(f"s{i}", ("slow", i)) for i in range(2)}
    tickets["quick"] = pool.submit("quick", ("medium", 0))   # 0.2 s: it cannot end by 0.4 s from here
    resolved = _poll_until_resolved(pool, tickets, limit_s=2.5)
    assert set(resolved) == set(tickets), resolved
    assert tickets["quick"].status is READY and tickets["quick"].result == "compiled 0", tickets["quick"].error
    assert all(tickets[f"slow{i}"].status is FAILED for i in range(2))
    assert resolved["quick"] < 2.0, resolved   # a replacement took it when the slow ones overran
    pool.shutdown()


def test_a_queued_grammar_fails_once_no_worker_can_be_started():
    # one worker, no replacement allowed: the queued grammar cannot start while the slow one
    # runs, so it fails after timeout_s in the queue, with the reason
    pool = CompilerPool(_fake_compile([], slow_s=3.0), max_workers=1, timeout_s=0.4, max_abandoned=0)
    slow = pool.submit("s", ("slow", 0))
    time.sleep(0.05)
    queued = pool.submit("q", ("ok", 0))
    resolved = _poll_until_resolved(pool, {"slow": slow, "queued": queued}, limit_s=2.5)
    assert queued.status is FAILED and "in the queue: every compile worker is busy, 1 of them past" in str(queued.error)
    assert 0.3 <= resolved["queued"] < 2.0 and slow.status is FAILED
    pool.shutdown()


@pytest.mark.parametrize("max_workers", [1, 2])
def test_slow_compile_times_out_and_others_do_not_wait(max_workers):
    """A compilation stuck past the timeout fails its request at the deadline; requests
    submitted after it (even behind it in a one-worker pool) are ready long before it ends."""
    slow_s, timeout_s = 3.0, 0.4
    calls = []
    pool = CompilerPool(_fake_compile(calls, slow_s=slow_s), max_workers=max_workers, timeout_s=timeout_s)
    t0 = time.monotonic()
    tickets = {"slow": pool.submit("slow", ("slow", 0))}
    time.sleep(0.05)  # the slow one has started
    tickets.update({f"ok{i}": pool.submit(f"k{i}", ("ok", i)) for i in range(4)})
    tickets["bad"] = pool.submit("bad", ("bad", 0))
    resolved = _poll_until_resolved(pool, tickets, limit_s=slow_s - 0.5)
    print({k: round(v, 3) for k, v in resolved.items()})
    assert set(resolved) == set(tickets), f"unresolved: {set(tickets) - set(resolved)}"
    assert tickets["slow"].status is FAILED and isinstance(tickets["slow"].error, TimeoutError)
    assert "timed out after 0.4 s" in str(tickets["slow"].error)
    slow = tickets["slow"]
    assert timeout_s <= slow.resolved_at - slow.submitted < timeout_s + 1.0  # at its deadline, not at its end
    assert tickets["bad"].status is FAILED
    ok_times = [resolved[f"ok{i}"] for i in range(4)]
    assert all(tickets[f"ok{i}"].status is READY for i in range(4))
    if max_workers > 1:
        # a free worker takes them at once: they do not wait for the slow one at all
        assert max(ok_times) < timeout_s, ok_times
    else:
        # the only worker is stuck: a replacement takes over at the deadline, not at the end
        assert max(ok_times) < timeout_s + 1.0, ok_times
    assert max(ok_times) < slow_s / 2
    # the stuck compilation still finishes in the background and fills the cache (polled, not
    # slept for: on a loaded machine its thread may start or wake late)
    time.sleep(max(0.0, slow_s - (time.monotonic() - t0)))
    until = time.monotonic() + 10.0
    late = pool.submit("slow", ("slow", 0))
    while pool.poll(late) is not READY and time.monotonic() < until:
        time.sleep(0.02)
        late = pool.submit("slow", ("slow", 0))  # joins the same in-flight compilation: no new call
    assert pool.poll(late) is READY and late.result == "compiled 0"
    assert len(calls) == 6
    pool.shutdown()


def test_poll_never_blocks():
    gate = threading.Event()
    pool = CompilerPool(lambda spec: gate.wait(5) and "done", max_workers=1, timeout_s=10)
    t = pool.submit("k", None)
    t0 = time.perf_counter()
    for _ in range(100):
        assert pool.poll(t) is WAITING
    assert (time.perf_counter() - t0) / 100 < 0.01
    gate.set()
    assert pool.wait(t, 5) is READY and t.result == "done"
    pool.shutdown()


def test_pool_arguments_and_shutdown():
    with pytest.raises(ValueError, match="max_workers"):
        CompilerPool(lambda s: s, max_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        CompilerPool(lambda s: s, timeout_s=0)
    pool = CompilerPool(lambda s: s, max_workers=1)
    assert pool.wait(pool.submit(1, 1), 5) is READY
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(2, 2)


def test_manager_slow_and_failing_grammars_do_not_delay_others():
    """The same with real xgrammar compilations behind the manager: a grammar that compiles
    slowly or fails does not delay the other requests' readiness, and reports its error."""
    xgr = pytest.importorskip("xgrammar")  # noqa: F841
    from specops.engine.structured_output import StructuredOutputManager, StructuredOutputOptions, XgrammarBackend
    from specops.engine.structured_output.testing import small_tokenizer

    class SlowBackend(XgrammarBackend):
        def compile(self, options):
            if options.kind == "regex" and options.regex == "slow+":
                time.sleep(3.0)
            return super().compile(options)

    backend = SlowBackend.from_tokenizer(small_tokenizer())
    so = StructuredOutputManager(backend=backend, max_workers=2, compile_timeout_s=0.8)
    schemas = [{"type": "object", "properties": {f"k{i}": {"type": "integer", "minimum": 0, "maximum": 9 + i}},
                "required": [f"k{i}"]} for i in range(4)]
    # baseline: ready times of the four schemas alone
    for i, s in enumerate(schemas):
        so.add_request(f"base{i}", StructuredOutputOptions(json_schema=s))
    base = _poll_manager(so, [f"base{i}" for i in range(4)], 5)
    base_max = max(base.values())
    so.pool.clear_cache()
    so.backend.compiler.clear_cache()
    # now behind a slow and a failing grammar
    so.add_request("slow", StructuredOutputOptions(regex="slow+"))
    so.add_request("fails", StructuredOutputOptions(regex=r"[^\s\S]"))  # valid syntax, empty language
    so.add_request("error", StructuredOutputOptions(json_schema={"type": "integer", "minimum": 5, "maximum": 2}))
    for i, s in enumerate(schemas):
        so.add_request(f"r{i}", StructuredOutputOptions(json_schema=s))
    got = _poll_manager(so, ["slow", "fails", "error"] + [f"r{i}" for i in range(4)], 2.5)
    print("baseline", {k: round(v, 3) for k, v in base.items()},
          "with slow+failing", {k: round(v, 3) for k, v in got.items()})
    assert so.poll("slow") is FAILED and "timed out" in so.error("slow")
    assert so.poll("fails") is FAILED and "accepts no output" in so.error("fails")
    assert so.poll("error") is FAILED and "minimum greater than maximum" in so.error("error")
    slow = so._entries["slow"].ticket
    assert 0.8 <= slow.resolved_at - slow.submitted < 2.0  # failed at its deadline, not after its 3 s
    for i in range(4):
        assert so.poll(f"r{i}") is READY and so.error(f"r{i}") is None
    others = max(got[f"r{i}"] for i in range(4))
    assert others < 0.8, (others, base_max)  # before the slow one's deadline, let alone its end
    so.shutdown()


def _poll_manager(so, ids, limit_s):
    t0 = time.monotonic()
    out = {}
    while len(out) < len(ids) and time.monotonic() - t0 < limit_s:
        for rid in ids:
            if rid not in out and so.poll(rid) is not WAITING:
                out[rid] = time.monotonic() - t0
        time.sleep(0.002)
    return out


def test_manager_bad_specs_sync_and_async():
    """Cheap checks raise on arrival; the meta-schema check and compile errors fail the request
    in the pool, with the reason."""
    pytest.importorskip("xgrammar")
    pytest.importorskip("jsonschema")
    from specops.engine.structured_output import StructuredOutputManager, StructuredOutputOptions
    from specops.engine.structured_output.testing import small_tokenizer

    so = StructuredOutputManager(small_tokenizer(), compile_timeout_s=20)
    with pytest.raises(ValueError, match="choice must not be an empty list"):
        so.add_request("a", StructuredOutputOptions(choice=[]))
    with pytest.raises(ValueError, match="regex '\\(x' is invalid"):
        so.add_request("b", StructuredOutputOptions(regex="(x"))
    with pytest.raises(ValueError, match="not valid JSON"):
        so.add_request("c", StructuredOutputOptions(json_schema="{'type': 'object'}"))
    with pytest.raises(TypeError, match="options must be a StructuredOutputOptions"):
        so.add_request("d", {"regex": "x"})
    assert "a" not in so and "b" not in so
    so.add_request("meta", StructuredOutputOptions(json_schema={"type": "object", "properties": {"x": {"type": 5}}}))
    assert so.wait("meta", 10) is FAILED
    assert "json_schema is malformed at properties/x/type" in so.error("meta")
    so.add_request("ok", StructuredOutputOptions(regex="x+"))
    assert so.wait("ok", 10) is READY and so.error("ok") is None
    with pytest.raises(ValueError, match="already has structured output"):
        so.add_request("ok", StructuredOutputOptions(regex="x+"))
    so.remove_request("ok")
    with pytest.raises(KeyError, match="^'ok'$"):   # the removed request is unknown
        so.poll("ok")
    so.shutdown()
