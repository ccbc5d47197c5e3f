"""Compile the rejection-sampling kernels for sm_90 (H200) without a GPU, to catch compile errors.

    python bench/aot_check_rejection.py            # the configurations the launchers use
    python bench/aot_check_rejection.py --full     # every constexpr combination (slow)
    python bench/aot_check_rejection.py --bench    # also bench/exp_rejection_pass1.py's geometries
    python bench/aot_check_rejection.py --ptx DIR  # keep the PTX / TTGIR of each kernel there
    python bench/aot_check_rejection.py --subs 2048 4096        # the sub-chunk sizes compiled at
                                                   # V=128256 besides the default (these by default)
    python bench/aot_check_rejection.py --waves    # also the global-load round trips from the SASS

Each kernel of triton_kernels/rejection_pass1.py, rejection_finalize.py and rejection_recover.py
(launched by rejection_sample.py and rejection_recover.py) goes through
triton.compile (an ASTSource with a GPUTarget("cuda", 90, 32)) with the argument types the
launchers really pass (Python ints are i32 strides unless --i64; cu_num_draft_tokens,
draft ids and target_logits_indices as the spec metadata / RejectionSampler build them),
then through the bundled ptxas for registers and spills. One line per kernel and
configuration; exit status 1 when any compile fails. CPU only: never touches a GPU.

Pointers get the 16-byte divisibility a real launch gives them (and V-strided ints when
V % 16 == 0), so loads vectorise as on the H200. Batch invariance: on the GPU the order of a
tl.sum is set by the layout of the reduced tensor, so for each kernel and V the script also
checks that every configuration (greedy mode, seeds, temperature / threshold / target-row
modes, fuse_race, prefetch, logits dtype, K: all set by the batch) sums in one layout.
The sub-chunk size (sub_chunk_size(V)) shapes pass 1's tiles; each size is checked apart.
Kernels compile as the launchers compile them (NO_FP_FUSION), and a PTX holding an
fma.rn.f32 (a contracted multiply-add) fails the check.
"""

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)   # compile, do not interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton 3.9's default for launches, stated (no warning)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bench.sass_waves import load_waves  # noqa: E402
from specops.triton_kernels import rejection_recover as RR  # noqa: E402
from specops.triton_kernels import rejection_sample as RS  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
# the bundled ptxas that reads Triton's PTX version (ptxas-blackwell is the newer toolkit in Triton 3.9)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTXAS = next((os.path.join(_BIN, p) for p in ("ptxas-blackwell", "ptxas") if os.path.exists(os.path.join(_BIN, p))),
             "ptxas")
LOGIT = {"fp32": "*fp32", "bf16": "*bf16"}
WAVES = False         # --waves: each compile's global-load round trips from its SASS (bench/sass_waves.py)
REDUCE_LAYOUTS = {}   # (kernel, vocab, sub) -> {layouts of its f32 tensors reduced with an add: [labels]}


def add_reduce_layouts(ttgir: str) -> tuple:
    """(axis, shape, layout) of every f32 tensor that ttgir reduces with an addf: on the GPU
    the order of a tl.sum is set by that layout, so equal layouts mean equal sums."""
    lays = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    found = set()
    for op in ttgir.split('"tt.reduce"')[1:]:
        body, _, rest = op.partition("}) : (")
        m = re.match(r"tensor<((?:\d+x)+)f32, (#\w+)>", rest)
        if m and "arith.addf" in body:
            axis = re.search(r"axis = (\d+)", body).group(1)
            found.add((axis, m.group(1).rstrip("x"), lays.get(m.group(2), m.group(2))))
    return tuple(sorted(found))


def geometry(vocab: int, max_k: int, sub: int | None = None) -> dict:
    """The launchers' defaults at vocabulary `vocab` (rejection_sample_pass, rejection_recover_pass),
    with sub-chunks of `sub` tokens (default sub_chunk_size(vocab))."""
    chunk = RS.chunk_size(vocab)
    splits = triton.cdiv(vocab, chunk)
    sub = RS.sub_chunk_size(vocab) if sub is None else sub
    subs = triton.cdiv(vocab, sub)
    block = min(chunk, 4096)
    return dict(chunk=chunk, splits=splits, sub=sub, subs=subs, block=block, warps=4,
                sub_block=triton.next_power_of_2(subs),
                fix_scale=RS.fixed_sum_scale(splits, chunk),
                out_block=triton.next_power_of_2(max_k + 1), race_block=min(sub, 8192), race_warps=8, fin_warps=8,
                res_block=min(sub, 4096), max_k=max_k)


def divisibility(kernel, sig: dict, ints16: set) -> dict:
    """The attributes a real launch gets (JITFunction._pack_args): "tt.divisibility" 16 on every
    pointer (torch allocations are 16-byte aligned) and on the specialised int arguments in ints16
    (values divisible by 16); do_not_specialize arguments get none."""
    attrs = {}
    for idx, n in enumerate(kernel.arg_names):
        if sig[n].startswith("*") or (n in ints16 and n not in kernel.do_not_specialize):
            attrs[(idx,)] = [["tt.divisibility", 16]]
    return attrs


def compile_one(kernel, types: dict, constexprs: dict, num_warps: int, label: str, ptx_dir: str,
                ints16: set) -> bool:
    """Compile `kernel` for sm_90 and run ptxas -v on its PTX; prints one line; True when it compiled.
    PDL (a launch option of the chain kernels) is on, as the launchers set it on the H200."""
    if "PDL" in kernel.arg_names:
        constexprs = {"PDL": True, **constexprs}
    sig = {n: ("constexpr" if n in constexprs else types[n]) for n in kernel.arg_names}
    t0 = time.time()
    try:
        k = triton.compile(ASTSource(kernel, sig, constexprs, divisibility(kernel, sig, ints16)), target=TARGET,
                           options={"num_warps": num_warps, **RS.NO_FP_FUSION})   # as the launchers
    except Exception as e:   # noqa: BLE001: report every failure, keep going
        msg = str(e).strip().splitlines()
        print(f"FAIL {kernel.__name__:28s} {label}: {type(e).__name__}: {' | '.join(msg[-6:])}", flush=True)
        return False
    name = f"{kernel.__name__}_{abs(hash(label)) % 10**8}"
    ptx = os.path.join(ptx_dir, name + ".ptx")
    with open(ptx, "w") as f:
        f.write(k.asm["ptx"])
    with open(os.path.join(ptx_dir, name + ".ttgir"), "w") as f:
        f.write(k.asm["ttgir"])
    vocab = re.search(r"V=(\d+)", label)
    sub = re.search(r"sub=(\d+)", label)
    if vocab and "bench" not in label:
        # pass 1 reduces in lanes, or in blocks with fuse_race / prefetch (flags of the engine, not the batch)
        name_path = kernel.__name__ + (" [blocks]" if constexprs.get("LANES") == 0 else "")
        REDUCE_LAYOUTS.setdefault((name_path, vocab.group(1), sub.group(1) if sub else "-"), {}).setdefault(
            add_reduce_layouts(k.asm["ttgir"]), []).append(label)
    with open(os.path.join(ptx_dir, "index.tsv"), "a") as f:
        f.write(f"{name}\t{label}\twarps={num_warps}\n")
    r = subprocess.run([PTXAS, "-v", "--fmad=false", "--gpu-name", "sm_90a", ptx, "-o", os.devnull],
                       capture_output=True, text=True)
    out = r.stdout + r.stderr
    regs = spill = "?"
    for line in out.splitlines():
        if "Used" in line and "registers" in line:
            regs = line.split("Used")[1].split("registers")[0].strip()
        if "spill stores" in line:
            parts = line.split(",")
            spill = "/".join(p.strip().split()[0] for p in parts[1:3])   # stores/loads bytes
    # NO_FP_FUSION: no float multiply-add may be contracted into an fma (batch invariance)
    fmas = k.asm["ptx"].count("fma.rn.f32")
    if fmas:
        out += f"\n{fmas} fma.rn.f32 in the PTX: compiled with contraction (see rejection_sample.NO_FP_FUSION)"
    ok = r.returncode == 0 and not fmas
    tag = "ok  " if ok else "FAIL"
    waves = ""
    if WAVES:
        w = load_waves(k.asm["cubin"])
        waves = f" ldg={w['ldg']} waves={w['waves']} after_wait={w['waves_after_wait']} bar={w['bar']}"
    print(f"{tag} {kernel.__name__:28s} {label:70s} warps={num_warps} regs={regs:>4s} spill(st/ld B)={spill:>8s} "
          f"smem={k.metadata.shared}{waves} {time.time() - t0:4.1f}s", flush=True)
    if not ok:
        print(out, flush=True)
    return ok


def common_types(dtype: str, dp_dtype: str, ids: str, rows: str, stride: str, tr: bool, tm: int, thr: bool,
                 seeds: bool, gm: int, dp: bool) -> dict:
    """Pointer / int types of the arguments shared by the kernels, as rejection_sample_pass passes them
    (unused pointers get the dummy the launcher passes: draft ids, logits or step)."""
    return dict(
        out_ptr="*i32", out_stride="i32",
        logits_ptr=LOGIT[dtype], logits_stride=stride,
        target_rows_ptr=rows if tr else ids, draft_ids_ptr=ids,
        draft_probs_ptr=LOGIT[dp_dtype] if dp else LOGIT[dtype], draft_probs_stride=stride,
        cu_ptr="*i32", bonus_ptr="*i64",
        temp_ptr="*fp32" if tm else LOGIT[dtype], threshold_ptr="*fp32" if thr else LOGIT[dtype],
        greedy_ptr="*i1" if gm == 0 else ids,
        seeds_ptr="*i64", has_seed_ptr="*i1" if seeds else "*i64", positions_ptr="*i64",
        step_ptr="*i64", engine_seed="i32",   # the usual small seed (i64 past 2**31)
        part_m_ptr="*fp32", part_s_ptr="*fp32", part_idx_ptr="*i32", part_sub_ptr="*fp32", part_lx_ptr="*fp32",
        part_kidx_ptr="*i32",
        part_sx_ptr="*fp32", rec_j_ptr="*i32", rec_ms_ptr="*fp32", part_res_ptr="*fp32", part_px_ptr="*fp32",
        num_target_rows="i32", num_logits="i32", vocab_size="i32",
        PDL="constexpr",   # set by compile_one
    )


def configs(full: bool, brief: bool = False):
    """(dp, gm, fuse, prefetch, tr, tm, thr, seeds, dtype, ids) combinations the launchers can produce.

    RejectionSampler passes either target_rows (int64) + per-request temperature (no threshold) on
    bf16/fp32 model logits, or processed fp32 rows + per-row 1/T + threshold; fuse_race only without
    draft probs and with random rows. The default list crosses the kernel-shaping flags (dp, gm, fuse,
    prefetch) with both call shapes; --full crosses everything; brief: the engine's call shape only.
    """
    core = []
    for dp, gm in itertools.product((False, True), (0, 1, 2)):
        for fuse in ((False, True) if not dp and gm != 1 else (False,)):
            for pf in (False, True):
                core.append((dp, gm, fuse, pf))
    if full:
        for c in core:
            for tr, tm, thr, seeds, dtype, ids in itertools.product((False, True), (0, 1, 2), (False, True),
                                                                    (False, True), ("fp32", "bf16"),
                                                                    ("*i32", "*i64")):
                yield (*c, tr, tm, thr, seeds, dtype, ids)
        return
    for i, c in enumerate(core):
        gm = c[1]
        yield (*c, True, 0 if gm == 1 else 1, False, True, "bf16", "*i32")     # engine, temperature only
        if brief:
            continue
        yield (*c, False, 2, True, i % 2 == 0, "fp32", "*i64" if i % 2 else "*i32")   # processed rows
        if i % 4 == 0:
            yield (*c, False, 0, False, False, "fp32", "*i32")                  # bare call


def bench_geometries(ptx_dir: str) -> tuple[int, int]:
    """Pass 1 and the finalize kernel at the geometries bench/exp_rejection_pass1.py times
    (V=128256, fp32, its argument types: int64 ids / rows / cu, temperature, unseeded, all random).
    Returns (compiled, failed)."""
    from bench.exp_rejection_pass1 import GEOMETRIES, RACE_GEOMETRIES, VOCAB, WARPS
    types = common_types("fp32", "fp32", "*i64", "*i64", "i32", True, 1, False, False, 2, False)
    types["cu_ptr"] = "*i64"
    ints16 = {"logits_stride", "draft_probs_stride", "vocab_size"} if VOCAB % 16 == 0 else set()
    n = failed = 0
    for max_k in (1, 8):
        for dp in (False, True):
            for chunk, block in GEOMETRIES:
                splits = triton.cdiv(VOCAB, chunk)
                for warps in WARPS:
                    for pf in ((False, True) if chunk > block else (False,)):
                        sub = RS.sub_chunk_size(VOCAB)
                        cx = dict(MAX_K=max_k, GRID_K=max_k, NUM_SPLITS=splits, CHUNK=chunk, BLOCK=block,
                                  SUB=sub, NUM_SUBS=triton.cdiv(VOCAB, sub),
                                  OUT_BLOCK=triton.next_power_of_2(max_k + 1),
                                  HAS_TARGET_ROWS=True,
                                  TEMP_MODE=1, HAS_THRESHOLD=False, GREEDY_MODE=2,
                                  HAS_SEEDS=False, FUSE_RACE=False, NEED_SX=not dp, PREFETCH=pf,
                                  WRITE_REC=dp, LANES=128 * warps if RS.LANE_STATS and not pf else 0)
                        kern = RS._rejection_sample_kernel
                        kt = {a: types[a] for a in kern.arg_names if a not in cx}
                        label = f"bench V={VOCAB} K={max_k} dp={int(dp)} chunk={chunk} block={block} pf={int(pf)}"
                        n += 1
                        failed += not compile_one(kern, kt, cx, warps, label, ptx_dir, ints16)
        g = geometry(VOCAB, max_k)
        for race_block, race_warps in RACE_GEOMETRIES:
            if race_block > g["sub"]:
                continue
            cx = dict(MAX_K=max_k, NUM_SPLITS=g["splits"], CHUNK=g["chunk"], SUB=g["sub"], NUM_SUBS=g["subs"],
                      OUT_BLOCK=g["out_block"], SUB_BLOCK=g["sub_block"],
                      FIX_SCALE=g["fix_scale"],
                      GREEDY_MODE=2, HAS_DRAFT_PROBS=False,
                      HAS_SEEDS=False, FUSE_RACE=False, RACE=True, RACE_BLOCK=race_block, HAS_TARGET_ROWS=True,
                      TEMP_MODE=1, HAS_THRESHOLD=False)
            kern = RS._rejection_finalize_kernel
            kt = {a: types[a] for a in kern.arg_names if a not in cx}
            n += 1
            failed += not compile_one(kern, kt, cx, race_warps, f"bench V={VOCAB} K={max_k} race_block={race_block}",
                                      ptx_dir, ints16)
    return n, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every constexpr combination")
    ap.add_argument("--vocab", type=int, nargs="*", default=[151936, 128256],
                    help="vocabularies (default 151936 128256: 19 and 16 chunks)")
    ap.add_argument("--k", type=int, nargs="*", default=[1, 8], help="max_spec_len values (default 1 8)")
    ap.add_argument("--i64", action="store_true", help="int64 strides (a stride >= 2^31 elements)")
    ap.add_argument("--ptx", default=None, help="directory to keep the PTX / TTGIR in")
    ap.add_argument("--only", default=None, help="kernel name substring")
    ap.add_argument("--bench", action="store_true",
                    help="also the geometries of bench/exp_rejection_pass1.py (chunk, block, warps, race block)")
    ap.add_argument("--subs", type=int, nargs="*", default=[2048, 4096],
                    help="sub-chunk sizes also compiled at V=128256 (engine call shape; default 2048 4096)")
    ap.add_argument("--waves", action="store_true",
                    help="also each compile's global-load round trips read from its SASS (bench/sass_waves.py)")
    args = ap.parse_args()
    global WAVES
    WAVES = args.waves
    ptx_dir = args.ptx or tempfile.mkdtemp(prefix="aot_rej_")
    os.makedirs(ptx_dir, exist_ok=True)
    stride = "i64" if args.i64 else "i32"
    failed = 0
    n = 0
    seen = set()
    runs = [(vocab, max_k, None) for vocab, max_k in itertools.product(args.vocab, args.k)]
    runs += [(128256, max_k, sub) for sub in args.subs for max_k in args.k if sub != RS.sub_chunk_size(128256)]
    for vocab, max_k, sub in runs:
        g = geometry(vocab, max_k, sub)
        # int arguments divisible by 16 (the row strides of contiguous [*, V] tensors are V)
        ints16 = {n for n, v in (("logits_stride", vocab), ("draft_probs_stride", vocab), ("vocab_size", vocab),
                                 ("out_stride", max_k + 1)) if v % 16 == 0}
        print(f"# V={vocab} K={max_k}: {g}", flush=True)
        for dp, gm, fuse, pf, tr, tm, thr, seeds, dtype, ids in configs(args.full, brief=sub is not None):
            types = common_types(dtype, dtype, ids, "*i64", stride, tr, tm, thr, seeds, gm, dp)
            flags = dict(HAS_TARGET_ROWS=tr, TEMP_MODE=tm, HAS_THRESHOLD=thr)
            label = (f"V={vocab} sub={g['sub']} K={max_k} {dtype} dp={int(dp)} gm={gm} fuse={int(fuse)} pf={int(pf)} "
                     f"tr={int(tr)} tm={tm} thr={int(thr)} seeds={int(seeds)} ids={ids[1:]}")
            jobs = []
            # pass 1
            jobs.append((RS._rejection_sample_kernel, dict(
                MAX_K=max_k, GRID_K=max(max_k, 1), NUM_SPLITS=g["splits"], CHUNK=g["chunk"], BLOCK=g["block"],
                SUB=g["sub"], NUM_SUBS=g["subs"],
                OUT_BLOCK=g["out_block"], GREEDY_MODE=gm,
                HAS_SEEDS=seeds, FUSE_RACE=fuse, NEED_SX=not dp and gm != 1, PREFETCH=pf,
                WRITE_REC=dp and gm != 1, LANES=128 * g["warps"] if RS.LANE_STATS and not fuse and not pf else 0,
                **flags), g["warps"], label))
            # finalize (does not depend on the prefetch flag)
            race = not dp and gm != 1
            fin = dict(MAX_K=max_k, NUM_SPLITS=g["splits"], CHUNK=g["chunk"], SUB=g["sub"], NUM_SUBS=g["subs"],
                       OUT_BLOCK=g["out_block"], SUB_BLOCK=g["sub_block"],
                       FIX_SCALE=g["fix_scale"],
                       GREEDY_MODE=gm, HAS_SEEDS=seeds, HAS_DRAFT_PROBS=dp,
                       FUSE_RACE=fuse, RACE=race, RACE_BLOCK=g["race_block"], **flags)
            fkey = ("fin", vocab, g["sub"], max_k, dp, gm, fuse, tr, tm, thr, seeds, dtype, ids)
            if fkey not in seen:
                seen.add(fkey)
                jobs.append((RS._rejection_finalize_kernel, fin, g["fin_warps"] if race and not fuse else 4,
                             label.replace(f" pf={int(pf)}", "")))
            # recover pass: draft probs and random rows only (no prefetch / fuse / greedy-mode flags)
            if dp and gm != 1:
                rkey = ("rec", vocab, g["sub"], tr, tm, thr, seeds, dtype, ids)
                if rkey not in seen:
                    seen.add(rkey)
                    rl = (f"V={vocab} sub={g['sub']} {dtype} dp=1 tr={int(tr)} tm={tm} thr={int(thr)} "
                          f"seeds={int(seeds)} ids={ids[1:]}")
                    jobs.append((RR._residual_mass_kernel, dict(
                        NUM_SUBS=g["subs"], SUB=g["sub"], BLOCK=g["res_block"], **flags),
                        8 if g["res_block"] >= 4096 else 4, rl))
                    jobs.append((RR._recover_race_kernel, dict(
                        NUM_SPLITS=g["splits"], CHUNK=g["chunk"], SUB=g["sub"], NUM_SUBS=g["subs"],
                        BLOCK=g["race_block"], SUB_BLOCK=g["sub_block"], HAS_SEEDS=seeds, **flags),
                        g["race_warps"], rl))
            for kernel, cx, warps, lab in jobs:
                if args.only and args.only not in kernel.__name__:
                    continue
                kt = {a: types[a] for a in kernel.arg_names if a not in cx}
                n += 1
                failed += not compile_one(kernel, kt, cx, warps, lab, ptx_dir, ints16)
    # batch invariance: a row's sums must not depend on the flags the batch sets (greedy mode,
    # seeds, temperature / threshold / target-row modes, fuse_race, prefetch, logits dtype)
    for (name, vocab, sub), groups in sorted(REDUCE_LAYOUTS.items()):
        with_sums = {lay: labels for lay, labels in groups.items() if lay}
        if len(with_sums) > 1:
            failed += 1
            print(f"FAIL {name} V={vocab} sub={sub}: the sums' layouts differ between configurations:")
            for lay, labels in with_sums.items():
                print(f"     {lay}: {labels[0]} (+{len(labels) - 1} more)")
        elif with_sums:
            (lay, labels), = with_sums.items()
            print(f"# {name} V={vocab} sub={sub}: every configuration with sums ({len(labels)}) reduces in one "
                  f"layout {lay}")
    if args.bench:
        print("# bench/exp_rejection_pass1.py geometries", flush=True)
        bn, bf = bench_geometries(ptx_dir)
        n, failed = n + bn, failed + bf
    print(f"# {n - failed}/{n} compiled; PTX / TTGIR in {ptx_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
