"""GPU microbenchmarks of the compiled ops against their torch references and, for the
bitmask apply, xgrammar's kernels.

* apply_token_bitmask_: V in {128256, 151936}, batch in {1, 8, 32, 128, 512}, fp32 (+ bf16
  at V=128256), two masks: "grammar" (each token allowed with p=0.01, as in a JSON state)
  and "random" (p=0.5). Floor bytes, per 32-byte DRAM sector of logits: nothing where every
  token is allowed, 32 B (a write) where every token is disallowed, 64 B (a read and a write)
  where both kinds mix, because HBM with ECC writes whole sectors: a partial write is merged
  by reading the sector first, whether the kernel or the DRAM does it; plus the bitmask read.
  Peers: xgrammar's Triton kernel (its CUDA default); its CUDA-source kernel only with
  XGR_CUDA=1 (a ~1 min JIT compile, as in bench/gpu_check.sh). Reference line: "fill
  (write-only reference)" = logits.fill_(-inf) on the same tensor, timed the same way; its
  GB/s counts every logit written (what pure writes reach here), it has no floor.
* apply_penalties_ (fused repetition + frequency + presence): same grid; floor bytes: the
  prompt mask (1 B) and output counts (4 B) read, and 64 B (a read and a write) per 32-byte
  sector of logits holding a penalised token (in the prompt or the output; about 15% of the
  sectors at the benchmark's 1% + 1% densities), as for the bitmask: the other logits need
  not move.
* apply_repetition_penalties_: fp32 grid; floor: the two bool masks read, and 64 B per
  sector of logits holding a penalised token.
* token_bincount / token_bincount_update_: V=128256, history 100 and 10000: a full rebuild
  (floor: counts written + ids read) against the incremental update of 4 accepted tokens
  per request, whose cost must not depend on the history length.

Correctness against the reference first, then bench.common.time_us (CUDA-graph replay).
Run from the repo root on the GPU machine: python bench/bench_ops.py
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Row, copy_bandwidth, floor_us, time_us, write_results  # noqa: E402
from specops.ops import (  # noqa: E402
    apply_penalties_,
    apply_penalties_torch,
    apply_repetition_penalties_,
    apply_repetition_penalties_torch,
    apply_token_bitmask_,
    apply_token_bitmask_torch,
    token_bincount,
    token_bincount_torch,
    token_bincount_update_,
    unpack_bitmask,
)

VOCABS = (128256, 151936)
BATCHES = (1, 8, 32, 128, 512)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
REF_TIMING = dict(warmup=3, iters=20, replays_per_graph=3)  # the slow references: fewer calls


def grid():
    """(vocab, batch, dtype): fp32 everywhere, bf16 at the first vocab."""
    for vocab in VOCABS:
        for dtype in (torch.float32, torch.bfloat16) if vocab == VOCABS[0] else (torch.float32,):
            for batch in BATCHES:
                yield vocab, batch, dtype


def row(op, impl, shape, us, min_bytes, **extra) -> Row:
    return Row(op=op, impl=impl, shape=shape, median_us=us, min_bytes=min_bytes, floor_us=floor_us(min_bytes), extra=extra)


# ---------------------------------------------------------------- bitmask
def xgrammar_peers() -> dict:
    try:
        import xgrammar
    except ImportError:
        print("xgrammar not installed: its rows are skipped")
        return {}

    def backend(name):
        def apply(logits, bitmask):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                xgrammar.apply_token_bitmask_inplace(logits, bitmask, backend=name)
        return apply

    peers = {"xgrammar-triton": backend("triton")}
    if os.environ.get("XGR_CUDA") == "1":
        try:  # compiles on first use; a failure drops this peer, not the benchmark
            backend("cuda")(torch.zeros(1, 64, device="cuda"), torch.zeros(1, 2, dtype=torch.int32, device="cuda"))
            peers["xgrammar-cuda"] = backend("cuda")
        except Exception as e:  # noqa: BLE001
            print(f"xgrammar CUDA-source backend unavailable, not timed: {type(e).__name__}: {e}")
    else:
        print("xgrammar CUDA-source backend not timed (set XGR_CUDA=1; ~1 min JIT)")
    return peers


def make_bitmask(batch, vocab, p_allowed) -> torch.Tensor:
    words = (vocab + 31) // 32
    bits = torch.rand(batch, words * 32, device="cuda") < p_allowed
    weights = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int64, device="cuda"), torch.arange(32, device="cuda"))
    packed = (bits.view(batch, words, 32).long() * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def bitmask_min_bytes(bitmask, vocab, dtype) -> int:
    """Bitmask read + 32 B per all-disallowed sector (write) + 64 B per mixed sector (read + write)."""
    per_sector = 32 // torch.empty(0, dtype=dtype).element_size()
    allowed = unpack_bitmask(bitmask, vocab)  # vocab is a multiple of per_sector for both V
    per = allowed.reshape(bitmask.shape[0], vocab // per_sector, per_sector).sum(-1)
    disallowed_sectors = (per == 0).sum().item()
    mixed_sectors = ((per > 0) & (per < per_sector)).sum().item()
    return bitmask.numel() * 4 + 32 * disallowed_sectors + 64 * mixed_sectors


def bench_bitmask() -> list[Row]:
    rows, peers = [], xgrammar_peers()
    impls = {"specops": apply_token_bitmask_, "torch": apply_token_bitmask_torch, **peers}
    for vocab, batch, dtype in grid():
        for mask, p_allowed in (("grammar", 0.01), ("random", 0.5)):
            logits = torch.randn(batch, vocab, device="cuda").to(dtype)
            bitmask = make_bitmask(batch, vocab, p_allowed)
            expected = logits.clone()
            apply_token_bitmask_torch(expected, bitmask)
            for name, fn in impls.items():
                out = logits.clone()
                fn(out, bitmask)
                assert torch.equal(out, expected), f"bitmask {name} wrong at {vocab=} {batch=} {dtype}"
            shape = dict(V=vocab, batch=batch, dtype=DTYPE_NAMES[dtype], mask=mask)
            nbytes = bitmask_min_bytes(bitmask, vocab, dtype)
            for name, fn in impls.items():
                kw = REF_TIMING if name == "torch" else {}
                us = time_us(lambda fn=fn: fn(logits, bitmask), **kw)
                rows.append(row("apply_token_bitmask_", name, shape, us, nbytes))
            us = time_us(lambda: logits.fill_(float("-inf")))  # last: it overwrites the logits
            rows.append(Row(op="apply_token_bitmask_", impl="fill (write-only reference)", shape=shape,
                            median_us=us, min_bytes=logits.numel() * logits.element_size()))
    return rows


# ---------------------------------------------------------------- penalties
def penalties_min_bytes(penalised: torch.Tensor, dtype: torch.dtype, per_element_reads: int) -> int:
    """`per_element_reads` bytes of inputs per logit, plus a read and a write (64 B) per 32-byte
    sector of logits that holds a penalised token (penalised: [B, V] bool)."""
    per_sector = 32 // torch.empty(0, dtype=dtype).element_size()
    B, V = penalised.shape   # V is a multiple of per_sector for both vocabularies
    touched = int(penalised.reshape(B, V // per_sector, per_sector).any(-1).sum().item())
    return B * V * per_element_reads + 64 * touched


def penalty_inputs(batch, vocab, dtype):
    logits = torch.randn(batch, vocab, device="cuda").to(dtype)
    prompt_mask = torch.rand(batch, vocab, device="cuda") < 0.01
    counts = torch.where(torch.rand(batch, vocab, device="cuda") < 0.01,
                         torch.randint(1, 4, (batch, vocab), device="cuda", dtype=torch.int32), 0).to(torch.int32)
    rep = torch.rand(batch, device="cuda") + 1.1  # every row penalised: every byte is needed
    freq = torch.rand(batch, device="cuda") * 0.5 + 0.1
    pres = torch.rand(batch, device="cuda") * 0.5 + 0.1
    return logits, prompt_mask, counts, rep, freq, pres


def bench_penalties() -> list[Row]:
    rows = []
    for vocab, batch, dtype in grid():
        logits, prompt_mask, counts, rep, freq, pres = penalty_inputs(batch, vocab, dtype)
        shape = dict(V=vocab, batch=batch, dtype=DTYPE_NAMES[dtype])
        # fused penalties
        a, b = logits.clone(), logits.clone()
        apply_penalties_(a, prompt_mask, counts, rep, freq, pres)
        apply_penalties_torch(b, prompt_mask, counts, rep, freq, pres)
        torch.testing.assert_close(a, b, **({"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {}))
        nbytes = penalties_min_bytes(prompt_mask | (counts > 0), dtype, 1 + 4)
        for name, fn, kw in (("specops", apply_penalties_, {}), ("torch", apply_penalties_torch, REF_TIMING)):
            work = logits.clone()  # penalties compound on repeated calls: time on a scratch copy
            us = time_us(lambda fn=fn, work=work: fn(work, prompt_mask, counts, rep, freq, pres), **kw)
            rows.append(row("apply_penalties_", name, shape, us, nbytes))
        # standalone repetition penalty (fp32 only)
        if dtype != torch.float32:
            continue
        output_mask = counts > 0
        a, b = logits.clone(), logits.clone()
        apply_repetition_penalties_(a, prompt_mask, output_mask, rep)
        apply_repetition_penalties_torch(b, prompt_mask, output_mask, rep)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        nbytes = penalties_min_bytes(prompt_mask | output_mask, dtype, 2)
        for name, fn, kw in (("specops", apply_repetition_penalties_, {}),
                             ("torch", apply_repetition_penalties_torch, REF_TIMING)):
            work = logits.clone()
            us = time_us(lambda fn=fn, work=work: fn(work, prompt_mask, output_mask, rep), **kw)
            rows.append(row("apply_repetition_penalties_", name, shape, us, nbytes))
    return rows


# ---------------------------------------------------------------- bincount
def bench_bincount(vocab=VOCABS[0], new_per_req=4) -> list[Row]:
    """One panel per history length: the rebuild grows with it, the update must not."""
    rows = []
    for history in (100, 10000):
        for batch in BATCHES:
            ids = torch.randint(0, vocab, (batch, history), device="cuda")
            ids[:, -7:] = -1  # padding
            counts = token_bincount(ids, vocab)
            assert torch.equal(counts, token_bincount_torch(ids, vocab)), f"bincount wrong at {batch=} {history=}"
            shape = dict(V=vocab, batch=batch, history=history)
            build_bytes = batch * vocab * 4 + ids.numel() * ids.element_size()
            for name, fn, kw in (("specops rebuild", token_bincount, {}), ("torch rebuild", token_bincount_torch, REF_TIMING)):
                us = time_us(lambda fn=fn: fn(ids, vocab), **kw)
                rows.append(row("token_bincount", name, shape, us, build_bytes))
            req = torch.arange(batch, device="cuda").repeat_interleave(new_per_req)
            tok = torch.randint(0, vocab, (batch * new_per_req,), device="cuda")
            check = counts.clone()
            token_bincount_update_(check, req, tok)
            assert torch.equal(check, token_bincount(torch.cat([ids, tok.view(batch, new_per_req)], 1), vocab))
            us = time_us(lambda: token_bincount_update_(counts, req, tok))
            # launch-bound (a few hundred bytes): no floor is drawn for it
            rows.append(Row(op="token_bincount", impl=f"specops update_ ({new_per_req} tok/req)", shape=shape,
                            median_us=us, extra=dict(new_tokens=req.numel())))
    return rows


def print_table(rows: list[Row]) -> None:
    print(f"{'op':28s} {'impl':28s} {'shape':48s} {'µs':>9s} {'GB/s':>7s} {'x floor':>8s}")
    for r in rows:
        shape = " ".join(f"{k}={v}" for k, v in r.shape.items())
        print(f"{r.op:28s} {r.impl:28s} {shape:48s} {r.median_us:9.2f} {r.gbps:7.0f} {r.floor_ratio:8.2f}")


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_ops: no CUDA device, nothing to time")
        return 0
    torch.manual_seed(0)
    print(f"copy bandwidth: {copy_bandwidth() / 1e12:.2f} TB/s")
    xgr_note = "xgrammar peers: Triton backend always; CUDA-source backend only with XGR_CUDA=1."
    results = {
        "ops_bitmask": (bench_bitmask, "Floor: bitmask read + per 32-byte sector of logits: 0 B if every "
                        "token is allowed, 32 B (write) if every token is disallowed, 64 B (read + write) "
                        "if mixed, since HBM with ECC merges a partial sector write by reading the sector. "
                        "fill (write-only reference) = logits.fill_(-inf) on the same tensor: its GB/s "
                        "counts every logit written, no floor. Masks: grammar = p(allowed) 0.01, "
                        "random = 0.5. " + xgr_note),
        "ops_penalties": (bench_penalties, "Floor: prompt mask (1 B) + output counts (4 B) per element "
                          "(repetition only: two 1 B masks) + 64 B (read + write) per 32-byte sector of "
                          "logits holding a penalised token (prompt mask or count > 0, each on 1% of the "
                          "tokens: about 15% of the fp32 sectors, 28% of the bf16 ones); the other logits "
                          "need not move. (Until 2026-12-02 the floor counted every logit read and written.)"),
        "ops_bincount": (bench_bincount, "Rebuild floor: counts written + ids read. Update: 4 new "
                         "tokens per request (launch-bound, no floor); its cost must not depend on history."),
    }
    for name, (fn, notes) in results.items():
        rows = fn()
        print_table(rows)
        print(f"wrote {write_results(name, rows, notes=notes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
