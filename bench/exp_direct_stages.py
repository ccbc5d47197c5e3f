"""Experiment: where the one-program small top-k path of the plan (`_direct_top_k`) spends its time.

    python bench/exp_direct_stages.py [--sweep]   (GPU machine, repo root; exits 0 without CUDA)

At batch 1 the plan kernel takes about 15 of the sampler's 19 µs on bench_sampling's first
mixed row (T 0.8, top-k 40, top-p 0.95; V = 128256 fp32 "llm" logits). This script runs the
stages of that path alone, each as a one-program kernel built from the same jit helpers, on
that row (tile maxima, row max and normaliser computed here in torch), and times each in a
CUDA graph of back-to-back launches (µs per launch, minus an empty kernel's):

  empty     stores one value (the launch itself)
  sort      the 1024 tile maxima sorted: t_k and the number of tiles reaching it
  topk      the same from one tl.topk of (max, id) keys (`_top_tiles`, TOPT 128)
  select    sort + the reaching tiles listed (`_select_tiles`)
  collect   sort + list + their tokens >= t_k stored as candidates (`_collect`)
  finish    `_finish_direct` alone on those candidates (sort of 256 keys, top-p, draw)
  finish64  the same as a sort of 64 keys
  sort256   the candidates' sort of 256 keys alone
  noise256  the Exp(1) noise of 256 candidates alone
  direct    the whole `_direct_top_k` (what the plan runs: the counted bound, tiles 16 a group)
  bound     the counted lower bound of t_k alone (`_tile_bound`)
  collect-b bound + its tiles listed and their tokens stored (16 tiles a group; -b64: 64)
  direct-g64 / -ds64 / -g64-ds64   `_direct_top_k` reading 64 tiles a group / sorting <= 64
            candidates as 64 keys / both (the default became ds64 after this experiment)
  bound-PxR the counted bound with P probes a round, R rounds, every round run (16 x 2 was the
            default of session 19)
  direct-ds64-2r  direct-ds64 (the default) with both rounds of the bound always run (session 19);
            `bound` and the direct stages run the second round only while more than k + 16 tiles
            reach the first round's bound (the default since session 20)
  plan      the plan kernel of sample() at batch 1 (torch.profiler, the real launch)

--sweep [--slacks -1,16] adds direct-ds64 at several SLACK values of the bound (SLACKS) on llm and flat rows,
two temperatures and k in {1, 20, 40, 50, 128}.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specops.triton_kernels.sampling_common import token_noise  # noqa: E402
from specops.triton_kernels.sampling_candidates import _sorted_candidates  # noqa: E402
from specops.triton_kernels.sampling_direct import _direct_top_k, _finish_direct, _tile_bound, _top_tiles  # noqa: E402
from specops.triton_kernels.sampling_tiles import _collect, _select_tiles  # noqa: E402

V = 128256
TILE = 128
G = 2048 // TILE
CAP = 1024
SMALL = 256
STAGES = ("empty", "sort", "topk", "select", "collect", "finish", "finish64", "sort256", "noise256", "direct",
          "bound", "collect-b", "collect-b64", "direct-g64", "direct-ds64", "direct-g64-ds64",
          "bound-8x3", "bound-32x1", "bound-32x2", "bound-64x1", "bound-16x1", "direct-ds64-2r", "bound-16x2")
BOUND_SHAPES = {16: (8, 3), 17: (32, 1), 18: (32, 2), 19: (64, 1), 20: (16, 1), 22: (16, 2)}   # stage -> (probes,
# rounds), every round run (SLACK -1)


@triton.jit
def _stage_kernel(row, tm_row, list_row, cand_row, out_f, out_i, key_ptr, V, NT, n_cand, scale, m, z, k, p,
                  STAGE: tl.constexpr, TILE: tl.constexpr, G: tl.constexpr, NT_P2: tl.constexpr,
                  CAP: tl.constexpr, SMALL: tl.constexpr, BP: tl.constexpr = 16, BR: tl.constexpr = 2,
                  BS: tl.constexpr = 16):
    tau_min = tl.full([], float("-inf"), tl.float32)
    seed = tl.load(key_ptr)          # int64, as the plan loads them
    pos = tl.load(key_ptr + 1)
    if STAGE == 0:
        tl.store(out_i, k)
    elif STAGE == 1 or STAGE == 3 or STAGE == 4:
        t = tl.arange(0, NT_P2)
        stm = tl.sort(tl.load(tm_row + t, mask=t < NT, other=float("-inf")), 0, True)
        lo = tl.max(tl.where(t == k - 1, stm, float("-inf")), axis=0)
        n_sel = tl.sum((stm >= tl.maximum(lo, -3.4028234663852886e38)).to(tl.int32), axis=0)
        lo_fin = tl.maximum(lo, -3.4028234663852886e38)
        if STAGE == 3:
            n_sel = _select_tiles(tm_row, list_row, NT, lo_fin, NT_P2)
        if STAGE == 4:
            n_sel, _, _ = _collect(row, tm_row, list_row, cand_row, V, NT, scale, m, lo_fin, float("inf"),
                                   TILE, G, NT_P2, CAP, False)
        tl.store(out_f, lo)
        tl.store(out_i, n_sel)
    elif STAGE == 2:
        lo, tid, n_sel = _top_tiles(tm_row, NT, k, 128, NT_P2)
        tl.store(out_f, lo + tl.sum(tid, axis=0).to(tl.float32))
        tl.store(out_i, n_sel)
    elif STAGE == 5 or STAGE == 6:
        lo = tl.load(out_f + 1)
        ok, tau, tok, mass = _finish_direct(cand_row, n_cand, m, z, k, p, tau_min, lo, p < 1.0, seed, pos, 0,
                                            SMALL if STAGE == 5 else 64)
        tl.store(out_f + 2, tau + mass)
        tl.store(out_i + 1, tok + ok.to(tl.int32))
    elif STAGE == 7:
        sx, sidx, valid, i = _sorted_candidates(cand_row, n_cand, SMALL)
        tl.store(out_f + 2, tl.sum(tl.where(valid, sx, 0.0), axis=0))
        tl.store(out_i + 1, tl.sum(sidx, axis=0))
    elif STAGE == 8:
        i = tl.arange(0, SMALL)
        e = token_noise(seed, pos, 0, i * 37)
        tl.store(out_f + 2, tl.max(e, axis=0))
    elif STAGE == 10 or STAGE == 11 or STAGE == 12:
        lo, n_sel = _tile_bound(tm_row, NT, m, k, NT_P2, SLACK=BS)
        if STAGE == 11:
            n_sel, _, _ = _collect(row, tm_row, list_row, cand_row, V, NT, scale, m,
                                   tl.maximum(lo, -3.4028234663852886e38), float("inf"), TILE, G, NT_P2, CAP, False)
        if STAGE == 12:
            n_sel, _, _ = _collect(row, tm_row, list_row, cand_row, V, NT, scale, m,
                                   tl.maximum(lo, -3.4028234663852886e38), float("inf"), TILE, 64, NT_P2, CAP, False)
        tl.store(out_f + 3, lo)
        tl.store(out_i + 2, n_sel)
    elif STAGE >= 16 and STAGE != 21:
        lo, n_sel = _tile_bound(tm_row, NT, m, k, NT_P2, BP, BR, -1)
        tl.store(out_f + 3, lo)
        tl.store(out_i + 2, n_sel)
    else:
        ok, tau, tok, mass = _direct_top_k(row, tm_row, list_row, cand_row, V, NT, scale, m, z, k, p, tau_min,
                                           p < 1.0, 256, seed, pos, 0, TILE, G, NT_P2, CAP, SMALL, 0,
                                           64 if STAGE == 13 or STAGE == 15 else G, False,
                                           64 if STAGE == 14 or STAGE == 15 or STAGE == 21 else 0,
                                           -1 if STAGE == 21 else BS)
        tl.store(out_f + 2, tau + mass)
        tl.store(out_i + 1, tok + ok.to(tl.int32))


def _row(make_logits, kind: str, temp: float, seed: int = 1):
    """One fp32 row of bench_sampling's logits of `kind` and what the stages read: (logits, tile
    maxima, row max, normaliser, 1/T, tile list, candidates, out_f, out_i, keys, NT, NT_P2)."""
    logits = make_logits(1, V, torch.float32, kind, seed=seed)
    scale = 1.0 / temp
    x = logits[0] * torch.tensor(scale, dtype=torch.float32, device="cuda")
    NT = -(-V // TILE)
    NT_P2 = triton.next_power_of_2(NT)
    padded = torch.full((NT * TILE,), float("-inf"), device="cuda")
    padded[:V] = x
    tm = padded.view(NT, TILE).amax(1).contiguous()
    m = float(x.max())
    z = float(torch.exp(x - m).sum())
    lst = torch.zeros(NT_P2, dtype=torch.int32, device="cuda")
    cand = torch.zeros(CAP, dtype=torch.int64, device="cuda")
    out_f = torch.zeros(4, device="cuda")
    out_i = torch.zeros(4, dtype=torch.int32, device="cuda")
    keys = torch.tensor([1000, 17], dtype=torch.int64, device="cuda")
    return logits, tm, m, z, scale, lst, cand, out_f, out_i, keys, NT, NT_P2


SLACKS = (-1, 0, 8, 16, 32)   # --slacks -1,16 for fewer (each value compiles two kernels)


def _sweep(make_logits, time_us, timing, slacks=SLACKS) -> None:
    """direct-ds64 (what the plan runs) with the bound's SLACK in SLACKS (-1: both rounds
    always, as in session 19) over logits kinds, temperatures and k: µs per launch, tiles
    reaching the bound, and whether tau + mass and the token are those of SLACK -1."""
    print(f"  sweep of SLACK {slacks}: kind T k | tiles | us per launch | same result as -1", flush=True)
    for kind in ("llm", "flat"):
        for temp in (0.8, 1.0):
            for k in (1, 20, 40, 50, 128):
                logits, tm, m, z, scale, lst, cand, out_f, out_i, keys, NT, NT_P2 = _row(make_logits, kind, temp)
                tiles, us, res = [], [], []
                for bs in slacks:
                    for stage in (10, 14):
                        launch = (lambda stage=stage, bs=bs: _stage_kernel[(1,)](
                            logits, tm, lst, cand, out_f, out_i, keys, V, NT, 0, scale, m, z, k, 0.95,
                            STAGE=stage, TILE=TILE, G=G, NT_P2=NT_P2, CAP=CAP, SMALL=SMALL, BS=bs, num_warps=8))
                        launch()
                        torch.cuda.synchronize()
                        if stage == 10:
                            tiles.append(int(out_i[2]))
                        else:
                            res.append((float(out_f[2]), int(out_i[1])))
                            us.append(time_us(launch, **timing))
                print(f"  {kind:4s} {temp} {k:3d} | " + " ".join(f"{n:4d}" for n in tiles) + " | "
                      + " ".join(f"{u:6.2f}" for u in us) + " | " + " ".join(str(r == res[0]) for r in res),
                      flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("exp_direct_stages: no CUDA device, nothing measured")
        return 0
    from bench.bench_sampling import MIX, make_logits, metadata
    from bench.common import kernel_us, time_us
    from specops.sampling import sample

    temp, k, p, _ = MIX[0]
    logits, tm, m, z, scale, lst, cand, out_f, out_i, keys, NT, NT_P2 = _row(make_logits, "llm", temp)

    def launch(stage: int, n_cand: int = 0):
        bp, br = BOUND_SHAPES.get(stage, (16, 2))
        _stage_kernel[(1,)](logits, tm, lst, cand, out_f, out_i, keys, V, NT, n_cand, scale, m, z, k, p,
                            STAGE=stage, TILE=TILE, G=G, NT_P2=NT_P2, CAP=CAP, SMALL=SMALL, BP=bp, BR=br,
                            num_warps=8)

    launch(4)                                       # candidates and t_k for the finish stages
    torch.cuda.synchronize()
    t_k, n_cand = float(out_f[0]), int(out_i[0])
    out_f[1] = t_k
    launch(3)
    n_sel = int(out_i[0])
    launch(11)
    lo, n_b = float(out_f[3]), int(out_i[2])
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}; V={V} fp32 llm row, T={temp} k={k} p={p}:"
          f" t_k={t_k:.3f}, {n_sel} tiles reach it, {n_cand} candidates; counted bound {lo:.3f}: {n_b} candidates",
          flush=True)
    launch(4)                                       # the finish stages sort t_k's candidates
    torch.cuda.synchronize()
    directs = {}
    for i in (9, 13, 14, 15, 21):
        launch(i)
        torch.cuda.synchronize()
        directs[STAGES[i]] = (float(out_f[2]), int(out_i[1]))
    print(f"  direct variants (tau + mass, token + ok): {directs}", flush=True)
    for i, (bp, br) in BOUND_SHAPES.items():
        launch(i)
        torch.cuda.synchronize()
        print(f"  bound with {bp} probes x {br} rounds: {float(out_f[3]):.4f}, {int(out_i[2])} tiles", flush=True)
    timing = dict(warmup=3, iters=30, replays_per_graph=20)
    rows = {}
    for i, name in enumerate(STAGES):
        rows[name] = time_us(lambda i=i: launch(i, n_cand), **timing)
    base = rows["empty"]
    for name in STAGES:
        print(f"  {name:9s} {rows[name]:6.2f} us per launch, {rows[name] - base:6.2f} over an empty launch",
              flush=True)
    md = metadata(1, V, seeded=True)
    args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    sample(*args, backend="triton", search=False)
    ku = kernel_us(lambda: sample(*args, backend="triton", search=False), n=20)
    print("  sample() at batch 1, per kernel: " + ", ".join(f"{n[:28]} {v:.2f}" for n, v in ku.items()), flush=True)
    for opts in ({}, dict(direct_group=64), dict(direct_small=64), dict(direct_group=64, direct_small=64)):
        us = time_us(lambda: sample(*args, backend="triton", search=False, **opts))
        print(f"  sample() at batch 1, graph, {opts or 'default'}: {us:.2f} us", flush=True)
    if "--sweep" in sys.argv:
        slacks = SLACKS
        if "--slacks" in sys.argv:
            slacks = tuple(int(v) for v in sys.argv[sys.argv.index("--slacks") + 1].split(","))
        _sweep(make_logits, time_us, timing, slacks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
