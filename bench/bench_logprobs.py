"""Logprobs benchmark: "raw_logprobs" and "processed_logprobs" of one sampled token per row, torch
path against the fused kernels.

    python bench/bench_logprobs.py        (GPU machine, repo root; LOGPROBS_OPS=raw or =processed: one table)

Implementations, same logits and tokens (specops.sampling.logprobs.compute_logprobs):

- torch: backend="torch": logits.float(), torch.logsumexp, topk, the rank count, gather;
- specops: backend="triton": one Triton pass over the logits (logsumexp, top-1, rank) and
  a combine kernel, the top n listed by the same pass (torch.topk only for n > 32).

n (top logprobs per row) in {1, 5, 20}, V in {128256, 151936}, batch in {1, 8, 32, 128, 512},
fp32 and bf16 logits (randn * 2 with 32 raised tokens per row, a peaked LLM-like row).
Ids and ranks must be equal (ties: equal values) and values within 1e-5 before timing.
Memory floor: the logits read once.

`logprobs_processed` times compute_processed_logprobs as the Sampler calls it with processed
logprobs and rows drawn by pivot rejection (widen=True): a distribution that keeps each row's
top 20..1000 values, temperature 0.8 (every 8th row greedy), and every 8th row's token below
its threshold (the rows the widening changes). torch: scale_logits into a new [R, V] tensor,
keep_drawn_tokens (a mask and a logsumexp over [R, V]) and the gathers; specops: one Triton
read of the logits and a combine kernel, the top n included.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Row, copy_bandwidth, floor_us, time_us, write_results  # noqa: E402

VOCABS = (128256, 151936)
BATCHES = (1, 8, 32, 128, 512)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
NUM_LOGPROBS = (1, 5, 20)
TIMING = dict(warmup=5, iters=50, replays_per_graph=5)


def make_inputs(B: int, V: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, V, device="cuda", generator=g) * 2.0
    hot = torch.randint(0, V, (B, 32), device="cuda", generator=g)
    x.scatter_add_(1, hot, 6.0 + 6.0 * torch.rand(B, 32, device="cuda", generator=g))
    tokens = torch.where(torch.rand(B, device="cuda", generator=g) < 0.5, hot[:, 0],
                         torch.randint(0, V, (B,), device="cuda", generator=g))
    return x.to(dtype), tokens


def check(x: torch.Tensor, tokens: torch.Tensor, n: int) -> None:
    """The fused result equals the torch path (raises otherwise)."""
    from specops.sampling.logprobs import compute_logprobs

    a = compute_logprobs("raw_logprobs", n, tokens, raw_logits=x, backend="triton")
    b = compute_logprobs("raw_logprobs", n, tokens, raw_logits=x, backend="torch")
    assert torch.equal(a.ranks, b.ranks), "ranks differ"
    assert torch.equal(a.token_ids[:, 0], b.token_ids[:, 0]), "sampled ids differ"
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    xf = x.float()
    diff = a.token_ids != b.token_ids
    assert torch.equal(xf.gather(1, a.token_ids)[diff], xf.gather(1, b.token_ids)[diff]), "top ids differ (not ties)"


def make_processed(x: torch.Tensor, seed: int):
    """(1/T [B], the draw's distribution, tokens) for processed logprobs over logits x [B, V]."""
    from specops.sampling.sampler_torch import SampleResult, scale_logits

    B, V = x.shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = torch.arange(B, device="cuda")
    inv_t = torch.where(rows % 8 == 3, -1.0, 1.0 / 0.8).float()
    xs = scale_logits(x, inv_t)
    k = torch.randint(20, 1001, (B,), device="cuda", generator=g)
    srt = xs.sort(dim=-1, descending=True).values
    thr = srt.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
    row_max = srt[:, 0]
    log_norm = torch.logsumexp(torch.where(xs >= thr.unsqueeze(1), xs - row_max.unsqueeze(1), float("-inf")), -1)
    kept = torch.randint(0, 20, (B,), device="cuda", generator=g)
    idx = xs.argsort(dim=-1, descending=True)
    tokens = idx.gather(1, kept.unsqueeze(1)).squeeze(1)
    below = idx.gather(1, k.unsqueeze(1)).squeeze(1)           # the first value under the threshold
    tokens = torch.where(rows % 8 == 5, below, tokens)
    return inv_t, SampleResult(tokens=tokens, threshold=thr, row_max=row_max, log_norm=log_norm), tokens


def check_processed(x, inv_t, res, tokens, n) -> None:
    """The fused result equals the torch path (raises otherwise)."""
    from specops.sampling.logprobs import compute_processed_logprobs

    a, ra = compute_processed_logprobs("processed_logprobs", n, tokens, x, inv_t, res, widen=True, backend="triton")
    b, rb = compute_processed_logprobs("processed_logprobs", n, tokens, x, inv_t, res, widen=True, backend="torch")
    assert torch.equal(a.ranks, b.ranks), "ranks differ"
    assert torch.equal(a.token_ids[:, 0], b.token_ids[:, 0]), "sampled ids differ"
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    assert torch.equal(ra.threshold, rb.threshold), "widened thresholds differ"
    torch.testing.assert_close(ra.log_norm, rb.log_norm, rtol=1e-5, atol=1e-5)
    xf = x.float()
    diff = a.token_ids != b.token_ids
    assert torch.equal(xf.gather(1, a.token_ids)[diff], xf.gather(1, b.token_ids)[diff]), "top ids differ (not ties)"


def bench_processed_case(rows: list[Row], V: int, B: int, dname: str, n: int) -> None:
    from specops.sampling.logprobs import compute_processed_logprobs

    x, _ = make_inputs(B, V, DTYPES[dname], seed=B * 7 + V + n)
    inv_t, res, tokens = make_processed(x, seed=B + n)
    check_processed(x, inv_t, res, tokens, n)
    min_bytes = x.numel() * x.element_size()
    shape = dict(vocab=V, batch=B, dtype=dname, n=n)
    times = {}
    for impl in ("torch", "triton"):
        us = time_us(lambda: compute_processed_logprobs("processed_logprobs", n, tokens, x, inv_t, res, widen=True,
                                                        backend=impl), **TIMING)
        times[impl] = us
        rows.append(Row(op="processed_logprobs", impl="specops" if impl == "triton" else "torch", shape=shape,
                        median_us=us, min_bytes=min_bytes, floor_us=floor_us(min_bytes),
                        extra=dict(speedup=times["torch"] / us) if impl == "triton" else {}))
    print(f"processed V={V:6d} B={B:4d} {dname} n={n}: torch {times['torch']:8.1f} us  specops "
          f"{times['triton']:8.1f} us  floor {floor_us(min_bytes):7.1f} us  x{times['torch'] / times['triton']:.2f}",
          flush=True)


def bench_case(rows: list[Row], V: int, B: int, dname: str, n: int) -> None:
    from specops.sampling.logprobs import compute_logprobs

    x, tokens = make_inputs(B, V, DTYPES[dname], seed=B * 7 + V + n)
    check(x, tokens, n)
    min_bytes = x.numel() * x.element_size()
    shape = dict(vocab=V, batch=B, dtype=dname, n=n)
    times = {}
    for impl in ("torch", "triton"):
        us = time_us(lambda: compute_logprobs("raw_logprobs", n, tokens, raw_logits=x, backend=impl), **TIMING)
        times[impl] = us
        rows.append(Row(op="raw_logprobs", impl="specops" if impl == "triton" else "torch", shape=shape,
                        median_us=us, min_bytes=min_bytes, floor_us=floor_us(min_bytes),
                        extra=dict(speedup=times["torch"] / us) if impl == "triton" else {}))
    print(f"V={V:6d} B={B:4d} {dname} n={n}: torch {times['torch']:8.1f} us  specops {times['triton']:8.1f} us  "
          f"floor {floor_us(min_bytes):7.1f} us  x{times['torch'] / times['triton']:.2f}", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_logprobs: no CUDA device, nothing to time")
        return 0
    t0 = time.time()
    torch.manual_seed(0)
    print(f"copy bandwidth: {copy_bandwidth() / 1e12:.2f} TB/s")
    ops = os.environ.get("LOGPROBS_OPS", "raw,processed").split(",")
    failed = 0
    tables = (("raw", "logprobs", bench_case,
               "raw_logprobs of the sampled token + top n. torch: logits.float(), logsumexp, topk, rank count, "
               "gather. specops: the fused Triton pass (logsumexp, top n, rank) + combine (torch.topk only for "
               "n > 32). Floor: the logits read once. speedup = torch µs / specops µs."),
              ("processed", "logprobs_processed", bench_processed_case,
               "processed_logprobs of the sampled token + top n as the Sampler asks for them when pivot rows "
               "drew the tokens (compute_processed_logprobs, widen=True): rows keep their top 20..1000 values, "
               "T = 0.8 with every 8th row greedy, every 8th row's token below its threshold. torch: scale_logits, "
               "keep_drawn_tokens, gathers ([R, V] passes); specops: one Triton read + combine, the top n "
               "included. Floor: the logits read once. speedup = torch µs / specops µs."))
    for key, name, case, notes in tables:
        if key not in ops:
            continue
        rows: list[Row] = []
        for V in VOCABS:
            for dname in DTYPES:
                for n in NUM_LOGPROBS:
                    for B in BATCHES:
                        try:
                            case(rows, V, B, dname, n)
                        except Exception as exc:  # noqa: BLE001 - report and go on with the other shapes
                            failed += 1
                            print(f"FAILED {key} V={V} B={B} {dname} n={n}: {type(exc).__name__}: {exc}", flush=True)
        print(f"wrote {write_results(name, rows, notes=notes)} in {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
