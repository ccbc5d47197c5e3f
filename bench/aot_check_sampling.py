"""Compile every Triton kernel of the sampler for an H200 (sm_90a) on a machine without a GPU.

    python bench/aot_check_sampling.py [--quick] [--only NAME] [--vocab V ...]

The launchers themselves (`sample_top_k_top_p_triton`, `logprob_stats`) are run on meta
tensors at the shapes the engine uses (V = 128256 and 151936; fp32, bf16, fp16 logits)
with `JITFunction.run` replaced by a recorder, so every launch is seen with the exact
arguments, constexprs, num_warps and maxnreg the launcher passes. Each distinct launch is
then specialised the way Triton's own launch path does it (its binder: int32 / int64
integers, divisibility-by-16 attributes, `do_not_specialize`) and compiled with
`triton.compile` for GPUTarget("cuda", 90, 32): frontend, LLVM and ptxas, so a compile
error shows here instead of on the GPU. The PTX is then given again to the bundled ptxas
with Triton's flags for the register / spill / stack report.

Prints one line per kernel and configuration; exits 1 when anything fails to compile.
`--quick`: fp32 at V = 128256 only (plus the test knobs and the direct path's latency
variants, compiled at the first vocabulary and dtype only); `--only`: kernels whose name
contains NAME; `--vocab`: other vocabularies instead of 128256 and 151936; `--digest FILE`:
write one line per compile (kernel, config, SHA-256 of its PTX without the debug and line
information), so that two trees' files show whether a change that should only move code
(a refactor) changed any compiled kernel: `diff` them; `--waves`: each compile's global-load
round trips as its SASS issues them (bench/sass_waves.py). `AOT_ROWS=512` (environment) records
the launches at that batch instead of 4, for the launch configurations of big batches (e.g. the
collect launch's 64-register cap from `later_maxnreg`, which spills: 68 / 60 bytes of spill
stores / loads at fp32 V = 128256, against 8 / 4 at the 80 of small batches).
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

os.environ["TRITON_INTERPRET"] = "0"          # compile, do not interpret (tests set it to 1)

import torch                                    # noqa: E402
import triton                                   # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource, make_backend    # noqa: E402
from triton.runtime import jit as _jit          # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from bench.sass_waves import load_waves                                      # noqa: E402
from specops.triton_kernels.logprob_stats import logprob_stats              # noqa: E402
from specops.triton_kernels.sampling_topk_topp import sample_top_k_top_p_triton  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DIRECT_VARIANTS = [   # latency knobs of the direct top-k path (bench/exp_plan_direct.py)
    dict(plan_warps=4), dict(plan_warps=16),
    dict(direct_top=True), dict(direct_top=True, direct_group=32), dict(direct_top=True, direct_group=128),
    dict(direct_top=True, plan_warps=4), dict(direct_top=True, plan_warps=16),
    dict(direct_in="collect"), dict(direct_in="collect", direct_top=True),
    dict(direct_pipe=True), dict(direct_group=64), dict(direct_group=64, direct_pipe=True),
    dict(direct_small=64), dict(direct_top=True, direct_small=64),
    dict(direct_small=128), dict(direct_top=True, direct_small=128),
    dict(direct_in="spread"), dict(direct_in="spread", direct_top=True),
    dict(direct_in="beside"), dict(direct_in="beside", direct_top=True),
]
VOCABS = (128256, 151936)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _Recorder:
    """Stands in for JITFunction.run: records (kernel, args, kwargs) instead of launching."""

    def __init__(self):
        self.launches = []

    def __call__(self, fn, *args, grid, warmup, **kwargs):
        self.launches.append((fn, args, dict(kwargs)))


def record_launches(vocabs, dtypes, rows=4):
    """Every launch (kernel, args, kwargs, label) of the sampler and logprob launchers."""
    rec = _Recorder()
    saved = _jit.JITFunction.run
    _jit.JITFunction.run = lambda self, *a, **kw: rec(self, *a, **kw)
    out = []
    try:
        for V in vocabs:
            for dt in dtypes:
                name = str(dt).replace("torch.", "")
                meta = dict(device="meta")
                logits = torch.empty(rows, V, dtype=dt, **meta)
                f32 = torch.empty(rows, dtype=torch.float32, **meta)
                i32 = torch.empty(rows, dtype=torch.int32, **meta)
                i64 = torch.empty(rows, dtype=torch.int64, **meta)
                runs = [("", {})]
                # several blocks per pass-1 program (big launches; `rows` is a small batch)
                runs.append(("blocks_per_program=4", dict(blocks_per_program=4)))
                if V == vocabs[0] and dt == dtypes[0]:     # test knobs, cheap to keep compiling
                    runs += [("select=False", dict(select=False)), ("guess=False", dict(guess=False))]
                    runs += [(" ".join(f"{n}={v}" for n, v in kw.items()), kw) for kw in DIRECT_VARIANTS]
                for tag, kw in runs:
                    n0 = len(rec.launches)
                    sample_top_k_top_p_triton(logits, f32, i32, f32, f32, i64, i64, 2, **kw)
                    out += [(*l, f"V={V} {name} {tag}".strip()) for l in rec.launches[n0:]]
                for log_norm in (False, True):
                    for top1 in (False, True):
                        n0 = len(rec.launches)
                        ids = torch.empty(rows, 2, dtype=torch.int64, **meta)
                        vals = torch.empty(rows, 2, dtype=torch.float32, **meta)
                        logprob_stats(logits, i64, ids, vals, i64, f32, log_norm=log_norm, top1=top1)
                        out += [(*l, f"V={V} {name}") for l in rec.launches[n0:]]
    finally:
        _jit.JITFunction.run = saved
    return out


def specialise(fn, args, kwargs, backend):
    """(signature, constexprs, attrs, options) exactly as JITFunction.run would build them."""
    binder = _jit.create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = triton.knobs.compilation.fpsan_homomorphic_casts
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    return signature, constexprs, attrs, options


def ptxas_report(ptx, options):
    """(registers, spill store bytes, spill load bytes, stack bytes) from ptxas -v, Triton's flags."""
    ptxas = get_ptxas(TARGET.arch).path
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        fmad = [] if options.enable_fp_fusion else ["--fmad=false"]
        cmd = [ptxas, "-lineinfo", *fmad, "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", src,
               "-o", os.path.join(d, "k.o")]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr

    def grab(pat):
        mt = re.search(pat, log)
        return int(mt.group(1)) if mt else -1

    return (grab(r"Used (\d+) registers"), grab(r"(\d+) bytes spill stores"), grab(r"(\d+) bytes spill loads"),
            grab(r"(\d+) bytes stack frame"))


def code_digest(ptx: str) -> str:
    """SHA-256 of the PTX's code: without the .file / .loc directives, the debug-scope labels
    and the DWARF sections, which name source files and lines."""
    code = ptx.split("\t.section\t.debug", 1)[0]
    keep = [ln for ln in code.splitlines()
            if not re.match(r"\s*(\.file|\.loc)\b", ln) and not re.match(r"\$L__(tmp|func_end)\d*:", ln)]
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()


def short(constexprs, signature):
    """A compact config: the constexprs, and the pointer / integer types passed."""
    names = list(signature)
    ce = " ".join(f"{names[p[0]]}={v}" for p, v in constexprs.items() if signature[names[p[0]]] == "constexpr")
    ints = ",".join(f"{n}:{t}" for n, t in signature.items() if t in ("i64",))
    return ce + (f" i64[{ints}]" if ints else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--vocab", type=int, action="append")
    ap.add_argument("--digest", default="", help="write each compile's code digest to this file")
    ap.add_argument("--waves", action="store_true",
                    help="also the global-load round trips read from the SASS (bench/sass_waves.py)")
    a = ap.parse_args()
    vocabs = tuple(a.vocab) if a.vocab else VOCABS[:1] if a.quick else VOCABS
    dtypes = DTYPES[:1] if a.quick else DTYPES
    backend = make_backend(TARGET)
    seen = {}
    for fn, args, kwargs, label in record_launches(vocabs, dtypes, rows=int(os.environ.get("AOT_ROWS", 4))):
        if a.only and a.only not in fn.__name__:
            continue
        signature, constexprs, attrs, options = specialise(fn, args, kwargs, backend)
        key = (fn.__name__, str(signature), str(constexprs), str(attrs), str(options.__dict__))
        if key not in seen:
            seen[key] = (fn, signature, constexprs, attrs, options, [label])
        elif label not in seen[key][5]:
            seen[key][5].append(label)
    failed = 0
    digests = []
    print(f"triton {triton.__version__}, target sm_90a, {len(seen)} distinct compiles", flush=True)
    print(f"{'kernel':<24} {'warps':>5} {'maxnreg':>7} {'regs':>4} {'spill st/ld':>11} {'stack':>5} "
          f"{'smem':>6} {'s':>5}  config / used by", flush=True)
    for fn, signature, constexprs, attrs, options, labels in seen.values():
        t0 = time.time()
        try:
            k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
            regs, st, ld, stack = ptxas_report(k.asm["ptx"], options)
            digests.append(f"{fn.__name__} {options.num_warps} {options.maxnreg} {short(constexprs, signature)} "
                           f"{str(attrs)} {code_digest(k.asm['ptx'])}")
            res = f"{regs:>4} {f'{st}/{ld}':>11} {stack:>5} {k.metadata.shared:>6}"
            if a.waves:
                w = load_waves(k.asm["cubin"])
                res += f" ldg={w['ldg']} waves={w['waves']} after_wait={w['waves_after_wait']} bar={w['bar']}"
        except Exception as e:     # noqa: BLE001: report every kernel, fail at the end
            failed += 1
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            res = f"FAILED {type(e).__name__}: {lines[0][:80]} ... {lines[-1][:160]}"
            print(f"--- {fn.__name__} ({'; '.join(labels)}):", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        print(f"{fn.__name__:<24} {options.num_warps:>5} {str(options.maxnreg):>7} {res} {time.time() - t0:5.1f}  "
              f"{short(constexprs, signature)} | {'; '.join(labels)}", flush=True)
    if a.digest:
        with open(a.digest, "w") as f:
            f.write("".join(line + "\n" for line in sorted(digests)))
    print("FAILED: %d" % failed if failed else "all compiled", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
