"""Experiment: the geometry of rejection sampling's pass 1 (_rejection_sample_kernel) on one GPU.

Times pass 1 alone at V = 128256, B = 128, K in {1, 8}, fp32 target logits (randn * 2,
80% good drafts, as bench_rejection.py), no draft probs unless --probs, for chunk 4096 /
8192 / 16384, block (entries per load) <= chunk, num_warps 4 / 8 and, where a chunk takes
several blocks, the prefetching loop (block i + 1 loaded before block i is reduced: the
same reductions in the same order). Prints the kernel's median device time (from the
profiler; the finalize launch is not counted), the ratio to the floor B * K * V * 4 bytes
/ 4.2e12 B/s, and whether the chunk partials are bit-identical to the same (chunk, block,
warps) without prefetch and the output to the default geometry's.

Every geometry here is a function of V only, so any of them keeps batch invariance; the
recovered-token draw depends on the sub-chunk size (sub_chunk_size in rejection_sample.py
and the torch reference follow it), not on the chunk, so a different chunk, block or warp
count changes only the float rounding of the partials. Run from the repo root on the GPU
machine (< 90 s each, per sub-chunk size; configurations past 80 s are listed as skipped,
most likely ones first; --k=1 or --k=8 for one K only):

    python bench/exp_rejection_pass1.py [--probs] [--k=1]
    python bench/exp_rejection_pass1.py --race       # the finalize kernel's recovered-token race
    python bench/exp_rejection_pass1.py --breakdown  # every kernel of rejection_sample at issue 4's shapes
    python bench/exp_rejection_pass1.py --lanes-table  # pass 1's per-lane statistics against block reductions

--blocks (with any table) makes pass 1 reduce in blocks, as before per-lane statistics.

--race-warps=W / --recover-warps=W (with --breakdown) launch the finalize's race (default 8
warps) / the draft-probs recover race (default 8 since session 42, was 16) with W warps: speed
only, the same tokens (session 42's sweep).

--chunk=C (with --breakdown) makes rejection_sample run pass 1 in chunks of C (a power of two;
give --sub <= C with it): a function of V either way, so batch invariant; it changes speed and
the rounding of the partials only, the sub-chunk which tokens are drawn (session 43).

--vocab=V runs any table at another vocabulary (default 128256).

--sub=1024,2048,4096 (with --race or --breakdown) repeats the table for each sub-chunk size
of the recovered-token race (default: sub_chunk_size(V) only, 4096 = one sub-chunk per chunk
of chunk_size(V) = 4096). The sub-chunk size changes which tokens are drawn, not their
law: --breakdown checks each run against the torch reference at the same size.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import profiled, time_us  # noqa: E402
from specops.triton_kernels.rejection_recover import rejection_recover_pass  # noqa: E402
from specops.triton_kernels.rejection_sample import chunk_size, rejection_sample_pass, sub_chunk_size  # noqa: E402

VOCAB = 128256
BATCH = 128
KS = (1, 8)
TEMP = 0.8
BANDWIDTH = 4.2e12
DEVICE = "cuda"
# (chunk, block), most likely first: a whole chunk per load up to 8192 entries, or half of it
GEOMETRIES = [(8192, 8192), (8192, 4096), (16384, 8192), (4096, 4096), (16384, 4096), (4096, 2048)]
WARPS = (8, 4)
# the recovered-token race of the finalize kernel (no draft probs): tokens per step, warps
# (steps larger than the sub-chunk are skipped)
RACE_GEOMETRIES = [(2048, 8), (1024, 4), (1024, 8), (2048, 4), (2048, 16), (4096, 8), (4096, 16), (8192, 16)]
BUDGET_S = 80.0   # stop starting configurations after this (compiles dominate)


def make_inputs(vocab, batch, k, with_probs, device, seed=0):
    """bench_rejection.Case's inputs: [K target rows, 1 bonus row] per request."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = batch * k
    logits = torch.randn(batch * (k + 1), vocab, device=device, generator=g) * 2
    target_rows = (torch.arange(batch, device=device)[:, None] * (k + 1)
                   + torch.arange(k, device=device)[None, :]).flatten()
    good = torch.rand(n, device=device, generator=g) < 0.8
    drafts = torch.randint(0, vocab, (n,), device=device, generator=g)
    logits[target_rows[good], drafts[good]] += 15.0
    q = None
    if with_probs:
        ql = torch.randn(n, vocab, device=device, generator=g) * 2
        ql[torch.arange(n, device=device)[good], drafts[good]] += 15.0
        q = torch.softmax(ql, dim=1)
    return dict(logits=logits, target_rows=target_rows, draft_token_ids=drafts, draft_probs=q,
                cu_num_draft_tokens=torch.arange(1, batch + 1, device=device) * k,
                bonus_token_ids=torch.randint(0, vocab, (batch,), device=device, generator=g),
                temperature=torch.full((batch,), TEMP, device=device), inv_temperature=None, threshold=None,
                is_greedy=False, seeds=None, has_seed=None, positions=None,
                step=torch.tensor([3], dtype=torch.int64, device=device), engine_seed=0), batch, k


def run_pass1(inputs, batch, k, chunk, block, warps, prefetch, race_block=None, race_warps=8, sub=None,
              recover=None, lanes=None):
    """Pass 1 and the finalize kernel, then with draft probs the recover pass (its knobs:
    `recover`, a dict of rejection_recover_pass's race_block / race_warps)."""
    out = torch.empty(batch, k + 1, dtype=torch.int32, device=inputs["logits"].device)
    res = rejection_sample_pass(out, fuse_race=False, chunk=chunk, sub_chunk=sub, block=block, num_warps=warps,
                                prefetch=prefetch, race_block=race_block, race_warps=race_warps, lanes=lanes,
                                **inputs)
    if inputs["draft_probs"] is not None:
        args = {n: v for n, v in inputs.items() if n not in ("logits", "bonus_token_ids", "is_greedy")}
        rejection_recover_pass(out, inputs["logits"], pass1=res, chunk=chunk, sub_chunk=sub, **args,
                               **(recover or {}))
    return out, res


def profiled_events(fn, iters: int):
    """The profiler's CUDA events of `iters` calls of fn, after 3 warm-up calls."""
    return profiled(fn, iters, warmup=3).events()


def kernel_us(fn, name="_rejection_sample_kernel", iters=20) -> float:
    """Median device time of the kernel `name` over `iters` calls of fn, from the profiler."""
    times = sorted(e.device_time for e in profiled_events(fn, iters) if name in e.name and e.device_time > 0)
    return times[len(times) // 2] if times else float("nan")


def pass1_table(with_probs, ks, t0) -> None:
    print("out: the output equals the default geometry's (every geometry races the same sub-chunks of\n"
          "sub_chunk_size(V) tokens, so the tokens are the same whatever the chunk; NO means an acceptance\n"
          "decision or a sub-chunk race flipped on the rounding of the partials)")
    print(f"{'K':>2} {'chunk':>6} {'block':>6} {'warps':>5} {'prefetch':>8} {'us':>8} {'x floor':>8} "
          f"{'floor us':>8}  bit-identical")
    for k in ks:
        inputs, batch, k = make_inputs(VOCAB, BATCH, k, with_probs, DEVICE)
        floor = batch * k * VOCAB * 4 / BANDWIDTH * 1e6
        sub = sub_chunk_size(VOCAB)
        default_out, _ = run_pass1(inputs, batch, k, chunk_size(VOCAB), None, None, False, sub=sub)
        for chunk, block in GEOMETRIES:
            for warps in WARPS:
                plain = None
                for prefetch in ((False, True) if chunk > block else (False,)):
                    if time.time() - t0 > BUDGET_S:
                        print(f"{k:>2} {chunk:>6} {block:>6} {warps:>5} {str(prefetch):>8}  skipped (time budget)")
                        continue

                    def fn(chunk=chunk, block=block, warps=warps, prefetch=prefetch):
                        return run_pass1(inputs, batch, k, chunk, block, warps, prefetch, sub=sub)
                    out, res = fn()
                    parts = torch.cat([res.part_m, res.part_s, res.part_sub])
                    same = [f"out={'yes' if torch.equal(out, default_out) else 'NO'}"]
                    if prefetch and plain is not None:
                        same.append(f"partials vs no prefetch={'yes' if torch.equal(parts, plain) else 'NO'}")
                    plain = parts
                    us = kernel_us(fn)
                    print(f"{k:>2} {chunk:>6} {block:>6} {warps:>5} {str(prefetch):>8} {us:8.1f} {us / floor:8.2f} "
                          f"{floor:8.1f}  {', '.join(same)}", flush=True)


def race_table(ks, subs, t0) -> None:
    """The finalize kernel (acceptance + the recovered-token race of one sub-chunk per request),
    no draft probs, at the default pass-1 geometry, and pass 1 itself (it writes the sub-chunk
    sums). "same tokens": as the same sub-chunk size's default race step."""
    print(f"{'K':>2} {'sub':>5} {'race block':>10} {'warps':>5} {'finalize us':>11} {'pass 1 us':>9}  same tokens")
    for k in ks:
        inputs, batch, k = make_inputs(VOCAB, BATCH, k, False, DEVICE)
        chunk = chunk_size(VOCAB)
        for sub in subs:
            ref, _ = run_pass1(inputs, batch, k, chunk, None, None, False, sub=sub)
            print(f"   ({int(((ref >= 0).sum(1) < k + 1).sum())} of {batch} requests draw a recovered token)")
            for race_block, race_warps in RACE_GEOMETRIES:
                if race_block > sub:
                    continue
                if time.time() - t0 > BUDGET_S * len(subs):
                    print(f"{k:>2} {sub:>5} {race_block:>10} {race_warps:>5}  skipped (time budget)")
                    continue

                def fn(race_block=race_block, race_warps=race_warps, sub=sub):
                    return run_pass1(inputs, batch, k, chunk, None, None, False, race_block, race_warps, sub)
                out, _ = fn()
                us = kernel_us(fn, name="_rejection_finalize_kernel")
                p1 = kernel_us(fn)
                print(f"{k:>2} {sub:>5} {race_block:>10} {race_warps:>5} {us:11.1f} {p1:9.1f}  "
                      f"{'yes' if torch.equal(out, ref) else 'NO'}", flush=True)


def lanes_table(t0) -> None:
    """Pass 1 with per-lane running statistics (LANES) against the block reductions, at B = 128,
    all-random, with draft probs, and a batch mixing greedy and random requests."""
    print("out: the output equals the block reductions' at chunk 8192 (NO: a near-tie flipped on rounding)")
    print(f"{'case':>16} {'chunk':>6} {'warps':>5} {'lanes':>5} {'us':>8} {'x floor':>8}  out")
    for name, k, with_probs, mixed in [("K=1 random", 1, False, False), ("K=1 probs", 1, True, False),
                                       ("K=1 mixed", 1, False, True), ("K=8 random", 8, False, False)]:
        inputs, batch, k = make_inputs(VOCAB, BATCH, k, with_probs, DEVICE)
        if mixed:
            inputs["is_greedy"] = torch.arange(batch, device=DEVICE) % 2 == 0
        floor = batch * k * VOCAB * 4 / BANDWIDTH * 1e6
        ref, _ = run_pass1(inputs, batch, k, 8192, None, 4, False, lanes=False)
        for chunk, warps, lanes in [(8192, 4, False), (8192, 4, True), (8192, 8, True), (4096, 4, False),
                                    (4096, 4, True), (16384, 4, True)]:
            if time.time() - t0 > BUDGET_S:
                print(f"{name:>16} {chunk:>6} {warps:>5} {str(lanes):>5}  skipped (time budget)")
                continue

            def fn(chunk=chunk, warps=warps, lanes=lanes):
                return run_pass1(inputs, batch, k, chunk, None, warps, False, sub=4096, lanes=lanes)
            out, _ = fn()
            us = kernel_us(fn)
            print(f"{name:>16} {chunk:>6} {warps:>5} {str(lanes):>5} {us:8.1f} {us / floor:8.2f}  "
                  f"{'yes' if torch.equal(out, ref) else 'NO'}", flush=True)


def breakdown_table(subs, t0) -> None:
    """Device time per kernel of one rejection_sample call (default geometry, each sub-chunk
    size) at the shapes of issue 4's table, and the floor: target rows once + the draft-prob
    rows of rejected requests. "ref": the tokens equal the torch reference's at that size
    (float near-ties aside)."""
    from collections import defaultdict

    from specops.spec_decode import rejection_sample
    print("graph us: one call's time in a CUDA graph of 10 (bench_rejection's timing; launches overlap with\n"
          "PDL); kernels us: the sum of the kernels' own device times (profiler, eager)")
    print(f"{'K':>2} {'B':>4} {'probs':>5} {'sub':>5} {'ref':>3}  {'graph us':>8} {'kernels us':>10} {'floor us':>8} "
          f"{'x floor':>7}  per kernel (us)")
    cases = [(1, 128, False), (1, 128, True), (4, 32, False), (4, 32, True), (8, 32, False), (8, 32, True),
             (4, 128, False), (4, 128, True), (8, 128, False), (8, 128, True)]
    for (k, batch, with_probs), sub in [(case, sub) for case in cases for sub in subs]:
        if time.time() - t0 > BUDGET_S * len(subs):
            print(f"{k:>2} {batch:>4} {str(with_probs):>5} {sub:>5}  skipped (time budget)")
            continue
        a, batch, k = make_inputs(VOCAB, batch, k, with_probs, DEVICE)

        def fn(a=a, k=k, sub=sub, backend="triton"):
            return rejection_sample(a["logits"], a["draft_token_ids"], a["cu_num_draft_tokens"], k,
                                    a["bonus_token_ids"], target_rows=a["target_rows"], draft_probs=a["draft_probs"],
                                    temperature=a["temperature"], step=a["step"], sub_chunk=sub, backend=backend)
        out = fn()
        same = "yes" if torch.equal(out, fn(backend="torch")) else "NO"
        rejected = int(((out >= 0).sum(1) < k + 1).sum())
        floor = (batch * k + (rejected if with_probs else 0)) * VOCAB * 4 / BANDWIDTH * 1e6
        iters = 20
        per = defaultdict(float)
        for e in profiled_events(fn, iters):
            if e.device_time > 0 and "kernel" in e.name.lower():
                per[e.name] += e.device_time / iters
        total = sum(per.values())
        wall = time_us(fn)
        parts = ", ".join(f"{name} {us:.1f}" for name, us in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"{k:>2} {batch:>4} {str(with_probs):>5} {sub:>5} {same:>3}  {wall:8.1f} {total:10.1f} {floor:8.1f} "
              f"{wall / floor:7.2f}  {parts}", flush=True)


def set_race_warps(race_warps: int | None, recover_warps: int | None) -> None:
    """Make specops.spec_decode.rejection launch its races with these warps (None: the default)."""
    import functools

    import specops.spec_decode.rejection as rej
    if race_warps is not None:
        rej.rejection_sample_pass = functools.partial(rejection_sample_pass, race_warps=race_warps)
    if recover_warps is not None:
        rej.rejection_recover_pass = functools.partial(rejection_recover_pass, race_warps=recover_warps)
    print(f"race warps: finalize {race_warps or 'default'}, recover {recover_warps or 'default'}")


def main() -> None:
    if not torch.cuda.is_available():
        print("exp_rejection_pass1 needs CUDA: nothing to do")
        return
    global VOCAB
    VOCAB = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--vocab=")), VOCAB)
    with_probs = "--probs" in sys.argv
    ks = tuple(int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--k=")) or KS
    subs = [int(v) for a in sys.argv[1:] if a.startswith("--sub=") for v in a.split("=")[1].split(",")]
    subs = subs or [sub_chunk_size(VOCAB)]
    t0 = time.time()
    print(f"{torch.cuda.get_device_name()}, V={VOCAB}, B={BATCH}, draft probs: {with_probs}, "
          f"default chunk {chunk_size(VOCAB)}, default sub-chunk {sub_chunk_size(VOCAB)}")
    if "--blocks" in sys.argv:
        import specops.triton_kernels.rejection_sample as rs
        rs.LANE_STATS = False
        print("pass 1 reduces in blocks (LANE_STATS = False)")
    if "--lanes-table" in sys.argv:
        lanes_table(t0)
    elif "--breakdown" in sys.argv:
        warps = {a.split("=")[0]: int(a.split("=")[1]) for a in sys.argv[1:]
                 if a.startswith(("--race-warps=", "--recover-warps="))}
        set_race_warps(warps.get("--race-warps"), warps.get("--recover-warps"))
        chunk = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--chunk=")), None)
        if chunk is not None:
            import specops.spec_decode.rejection as rej
            rej.chunk_size = lambda vocab: chunk
            print(f"pass 1 in chunks of {chunk} (rejection_sample's chunk_size replaced)")
        breakdown_table(subs, t0)
    elif "--race" in sys.argv:
        race_table(ks, subs, t0)
    else:
        pass1_table(with_probs, ks, t0)
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
