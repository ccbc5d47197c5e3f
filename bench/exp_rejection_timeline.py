"""Experiment: where the time after rejection pass 1 goes, from %globaltimer stamps (H200).

Issue 4 misses its 1.5x floor target at K = 1, B = 128 and K = 4, B = 32 (no draft probs) by
1.0-1.3 us; pass 1 reads the rows within 5% of a pure read, the finalize kernel (one program a
request) takes the other 6-7 us. This script builds an instrumented copy of the rejection
modules (triton_kernels/rejection_sample.py, the launcher, and the modules it imports:
rejection_pass1.py, rejection_finalize.py, rejection_common.py; string patches, each checked
to apply exactly once in them all; the modules on disk are untouched) whose kernels write
%globaltimer stamps (device-wide ns):

    pass 1, each program: start (after its PDL wait), end (once its partials are computed)
    finalize, each program: t0 start, t1 after the PDL wait, t2 acceptance known, t3 level-1
    sub-chunk known, t4 level-2 token known (rejected random rows only), t5 output row written

It captures 3 calls of rejection_sample_pass in one CUDA graph (each call its own stamp
buffers), replays it, and for the middle call prints, in us from its pass 1's first start:
pass 1's end (p50 / p90 / max of its programs), the finalize programs' starts, the wait
release after pass 1's last end, acceptance, level 1 and level 2 (rejected rows), the last
output row, and the next call's pass 1 start (the cycle bench_rejection times). The
instrumented tokens are checked equal to the module's own.

    python bench/exp_rejection_timeline.py [--replays=5] [--race-warps=8] [--variant=PATH]
    python bench/exp_rejection_timeline.py --sm90 [--variant=PATH]   # no GPU: compile the instrumented
                                        # kernels for sm_90 (scripts/triton_resources.py's stand-in driver)

--variant=PATH adds another copy of rejection_sample.py, with the rejection modules it imports
taken from beside PATH where there, else from the tree (e.g. a branch's, written with
`mkdir -p DIR && git archive BRANCH triton_kernels | tar -x -C DIR` before the device call:
PATH = DIR/triton_kernels/rejection_sample.py; a rejection_sample.py from before the split into
rejection_pass1 / rejection_finalize / rejection_common imports none of them), timed and
instrumented beside the tree's in the same run; its tokens are checked equal to the tree's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import _median_events  # noqa: E402
from bench.exp_rejection_pass1 import make_inputs  # noqa: E402
from specops.triton_kernels import rejection_sample as rs  # noqa: E402

VOCAB = 128256
CASES = [(1, 128), (4, 32), (4, 8), (8, 32)]

STAMPS = '''

@triton.jit
def _stamp():
    """%globaltimer now (ns)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _stamp_after(dep):
    """%globaltimer once the int32 scalar dep is known."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep.to(tl.int32)], dtype=tl.int64,
                                     is_pure=False, pack=1)


TL_BUF = [None, None]
'''

# (old, new) or a list of alternatives of which exactly one must apply (main's text, a variant's)
PATCHES = [
    # pass 1: signature, start stamp, end stamp + stores
    ("    num_target_rows, num_logits, vocab_size,\n    MAX_K: tl.constexpr, GRID_K",
     "    num_target_rows, num_logits, vocab_size, TL_PTR,\n    MAX_K: tl.constexpr, GRID_K"),
    ("    pdl_start(PDL)\n    pid = tl.program_id(0)\n    split = tl.program_id(1)\n",
     "    pdl_start(PDL)\n    _ts = _stamp()\n    pid = tl.program_id(0)\n    split = tl.program_id(1)\n"),
    ("                tl.store(part_sx_ptr + j + ls * 0, sx, mask=ls == (x % CHUNK) // SUB)\n    else:\n",
     "                tl.store(part_sx_ptr + j + ls * 0, sx, mask=ls == (x % CHUNK) // SUB)\n"
     "        _te = _stamp_after((m > 0.0).to(tl.int32) + am)\n"
     "        _slot = (split * tl.num_programs(0) + pid).to(tl.int64) * 2\n"
     "        tl.store(TL_PTR + _slot, _ts)\n"
     "        tl.store(TL_PTR + _slot + 1, _te)\n"
     "    else:\n"),
    ("        num_target_rows, logits.shape[0], vocab,\n        MAX_K=max_k, GRID_K=",
     "        num_target_rows, logits.shape[0], vocab, TL_BUF[0],\n        MAX_K=max_k, GRID_K="),
    # finalize
    ("    num_target_rows, vocab_size,\n    MAX_K: tl.constexpr, NUM_SPLITS",
     "    num_target_rows, vocab_size, TL_PTR,\n    MAX_K: tl.constexpr, NUM_SPLITS"),
    [("    req = tl.program_id(0)\n    rr, start, n, rmask, jj, x = _request_rows(",
      "    req = tl.program_id(0)\n    _t0 = _stamp()\n    rr, start, n, rmask, jj, x = _request_rows("),
     ("    req = tl.program_id(0)\n    rr, start, n, rmask, jj, x, too_many = _request_rows(",
      "    req = tl.program_id(0)\n    _t0 = _stamp()\n    rr, start, n, rmask, jj, x, too_many = _request_rows(")],
    ("    pdl_wait(PDL)\n    pdl_launch(PDL)\n    if n > 0:\n",
     "    pdl_wait(PDL)\n    _t1 = _stamp()\n    pdl_launch(PDL)\n    _t2 = _t1\n    _t3 = _t1\n    _t4 = _t1\n"
     "    if n > 0:\n"),
    [("            NUM_SPLITS, SPLIT_BLOCK, OUT_BLOCK, GREEDY_MODE)\n        at_rej = rr == first_rej\n",
      "            NUM_SPLITS, SPLIT_BLOCK, OUT_BLOCK, GREEDY_MODE)\n        _t2 = _stamp_after(num_accepted)\n"
      "        at_rej = rr == first_rej\n"),
     ("            NUM_SPLITS, OUT_BLOCK, GREEDY_MODE)\n",
      "            NUM_SPLITS, OUT_BLOCK, GREEDY_MODE)\n        _t2 = _stamp_after(num_accepted)\n"),
     ("            pm, ps, pidx, rr, n, rmask, x, lx, q_x, u, greedy, FIX_SCALE, OUT_BLOCK, GREEDY_MODE)\n",
      "            pm, ps, pidx, rr, n, rmask, x, lx, q_x, u, greedy, FIX_SCALE, OUT_BLOCK, GREEDY_MODE)\n"
      "        _t2 = _stamp_after(num_accepted)\n")],
    [("                c, best = _race_chunks(log_mass, kk, seed_j, pos_j)\n",
      "                c, best = _race_chunks(log_mass, kk, seed_j, pos_j)\n                _t3 = _stamp_after(c)\n"),
     ("                best, c = _argmax_lowest(tl.max(log_mass - log_noise, 0), kk, 0)\n",
      "                best, c = _argmax_lowest(tl.max(log_mass - log_noise, 0), kk, 0)\n"
      "                _t3 = _stamp_after(c)\n")],
    [("seed_j, pos_j, vocab_size, SUB, RACE_BLOCK, HAS_THRESHOLD)\n",
      "seed_j, pos_j, vocab_size, SUB, RACE_BLOCK, HAS_THRESHOLD)\n                        _t4 = _stamp_after(recovered)\n"),
     ("                                                       HAS_THRESHOLD)\n        token = ",
      "                                                       HAS_THRESHOLD)\n"
      "                        _t4 = _stamp_after(recovered)\n        token = ")],
    ("        _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K)\n",
     "        _write_row(out_ptr, out_stride, req, rr, x, num_accepted, rejected, token, bonus, MAX_K)\n"
     "        _t5 = _stamp_after(recovered + num_accepted)\n"   # scalars: token may be a row
     "        _b = TL_PTR + req.to(tl.int64) * 8\n"
     "        tl.store(_b + 0, _t0)\n        tl.store(_b + 1, _t1)\n        tl.store(_b + 2, _t2)\n"
     "        tl.store(_b + 3, _t3)\n        tl.store(_b + 4, _t4)\n        tl.store(_b + 5, _t5)\n"),
    ("        num_target_rows, vocab,\n        MAX_K=max_k, NUM_SPLITS=",
     "        num_target_rows, vocab, TL_BUF[1],\n        MAX_K=max_k, NUM_SPLITS="),
]


# an import of one rejection module by another (the launcher of its kernels, the kernels of rejection_common)
IMPORT = re.compile(r"^from specops\.triton_kernels\.(rejection_\w+) import", re.M)


def module_sources(path: str | None = None) -> dict[str, str]:
    """{name: source} of rejection_sample.py at `path` (default: the tree's) and of the rejection
    modules it imports, transitively: each from beside `path` where there, else the tree's."""
    path = path or rs.__file__
    srcs, todo = {"rejection_sample": open(path).read()}, ["rejection_sample"]
    while todo:
        for dep in IMPORT.findall(srcs[todo.pop()]):
            if dep not in srcs:
                own = os.path.join(os.path.dirname(path), dep + ".py")
                tree = os.path.join(os.path.dirname(rs.__file__), dep + ".py")
                srcs[dep] = open(own if os.path.exists(own) else tree).read()
                todo.append(dep)
    return srcs


def load_modules(srcs: dict[str, str], prefix: str, roots: tuple[str, ...] | None = None):
    """Import the sources of module_sources as modules prefix + name, each from a temp file (Triton
    reads the source), their imports of each other redirected to these copies. Returns the
    rejection_sample copy, or with `roots` {name: copy} of those modules."""
    folder = tempfile.mkdtemp()
    mods = {}

    def load(name):
        if name not in mods:
            for dep in IMPORT.findall(srcs[name]):
                load(dep)
            path = os.path.join(folder, prefix + name + ".py")
            with open(path, "w") as f:
                f.write(IMPORT.sub(lambda m: f"from {prefix}{m.group(1)} import", srcs[name]))
            spec = importlib.util.spec_from_file_location(prefix + name, path)
            mods[name] = sys.modules[prefix + name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mods[name])
        return mods[name]
    if roots is None:
        return load("rejection_sample")
    return {name: load(name) for name in roots}


def instrumented_module(path: str | None = None, prefix: str = "timeline_"):
    """The rejection_sample module at `path` (default: the tree's), and the kernel modules it
    imports (module_sources), with the stamps patched in: each patch applies once in them all."""
    srcs = module_sources(path)
    for patch in PATCHES:
        options = patch if isinstance(patch, list) else [patch]
        counts = [sum(src.count(old) for src in srcs.values()) for old, _ in options]
        hits = [opt for opt, n in zip(options, counts) if n == 1]
        if len(hits) != 1 or max(counts) > 1:
            raise SystemExit(f"{len(hits)} of the alternatives apply once (want 1): {options[0][0][:70]!r}")
        name = next(name for name, src in srcs.items() if hits[0][0] in src)
        srcs[name] = srcs[name].replace(*hits[0]) + ("" if srcs[name].endswith(STAMPS) else STAMPS)
    return load_modules(srcs, prefix)


def pct(values: torch.Tensor, q: float) -> float:
    return float(torch.quantile(values.double(), q))


def analyse(p1, fz, next_p1_start, k, batch):
    """One call's stamps -> a dict of us from its pass 1's first start."""
    p1 = p1.view(-1, 2).double()
    s0 = p1[:, 0].min()
    us = lambda t: (t - s0) / 1000.0  # noqa: E731
    p1_end = us(p1[:, 1])
    fz = fz.view(batch, 8)[:, :6].double()
    f = [us(fz[:, i]) for i in range(6)]
    raced = fz[:, 4] != fz[:, 1]
    p1e = float(p1_end.max())
    row = dict(p1_end50=pct(p1_end, 0.5), p1_end90=pct(p1_end, 0.9), p1_end=p1e,
               f_start_min=float(f[0].min()), f_start_max=float(f[0].max()),
               wait_min=float(f[1].min()) - p1e, wait_max=float(f[1].max()) - p1e,
               accept=pct(f[2] - f[1], 0.5), accept_max=float((f[2] - f[1]).max()),
               raced=int(raced.sum()),
               level1=pct((f[3] - f[2])[raced], 0.5) if raced.any() else float("nan"),
               level2=pct((f[4] - f[3])[raced], 0.5) if raced.any() else float("nan"),
               level2_max=float((f[4] - f[3])[raced].max()) if raced.any() else float("nan"),
               write=pct(f[5] - torch.where(raced, f[4], f[2]), 0.5),
               f_end=float(f[5].max()), next_p1=float(us(next_p1_start)))
    return row


def variants() -> list[tuple[str, object, object]]:
    """[(name, plain module, instrumented module)]: the tree's rejection_sample, and --variant's."""
    out = [("tree", rs, instrumented_module())]
    path = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--variant=")), None)
    if path:
        out.append(("variant", load_modules(module_sources(path), "variant_"),
                    instrumented_module(path, "variant_timeline_")))
    return out


def compile_for_sm90() -> None:
    """Compile the instrumented pass 1 and finalize for sm_90 without a GPU (launches compiled,
    never run) and print their registers: checks that the patches still apply and compile."""
    os.environ.pop("TRITON_INTERPRET", None)
    from scripts.triton_resources import record_compiles, resource_usage
    compiled = record_compiles()
    batch, k = 8, 4
    a = dict(target_rows=torch.arange(batch * k), draft_token_ids=torch.zeros(batch * k, dtype=torch.int64),
             draft_probs=None, cu_num_draft_tokens=torch.arange(1, batch + 1) * k,
             bonus_token_ids=torch.zeros(batch, dtype=torch.int64), temperature=torch.ones(batch),
             inv_temperature=None, threshold=None, is_greedy=False, seeds=None, has_seed=None, positions=None,
             step=torch.zeros(1, dtype=torch.int64), engine_seed=0)
    for name, _, mod in variants():
        compiled.clear()
        mod.TL_BUF[:] = [torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)]
        out = torch.empty(batch, k + 1, dtype=torch.int32)
        mod.rejection_sample_pass(out, torch.zeros(batch * (k + 1), VOCAB), fuse_race=False,
                                  chunk=rs.chunk_size(VOCAB), **a)
        for kernel_name, kernel in compiled:
            print(f"{name:8s} {kernel_name:28s} {resource_usage(kernel.asm['cubin'])}  globaltimer reads in the "
                  f"PTX: {kernel.asm['ptx'].count('%globaltimer')}")


def median_us(g, calls: int, iters: int = 50) -> float:
    """Median µs of one call in graph g of `calls` calls (CUDA events around each replay)."""
    return _median_events(g.replay, iters) / calls


def main() -> None:
    if "--sm90" in sys.argv:
        compile_for_sm90()
        return
    if not torch.cuda.is_available():
        print("exp_rejection_timeline needs CUDA: nothing to do")
        return
    replays = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--replays=")), 5)
    race_warps = next((int(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--race-warps=")), 8)
    mods = variants()
    chunk = rs.chunk_size(VOCAB)
    print(f"{torch.cuda.get_device_name()}, V={VOCAB}, fp32, no draft probs, chunk {chunk}, race warps {race_warps}")
    print("us from the middle call's pass-1 first start; wait = finalize's t1 - pass 1's last end (min / max);\n"
          "accept = t2 - t1, level1 = t3 - t2, level2 = t4 - t3 (raced rows, median); cycle = next pass-1 start;\n"
          "graph = plain kernels, one call in a graph of 3 (median of 50 replays), instr = instrumented")
    cols = ["p1_end50", "p1_end90", "p1_end", "f_start_min", "f_start_max", "wait_min", "wait_max", "accept",
            "accept_max", "raced", "level1", "level2", "level2_max", "write", "f_end", "next_p1"]
    print(f"{'module':>8} {'K':>2} {'B':>4} {'graph':>6} {'instr':>6} " + " ".join(f"{c:>11}" for c in cols))
    for k, batch in CASES:
        a, batch, k = make_inputs(VOCAB, batch, k, False, "cuda")
        grid_programs = batch * k * triton_cdiv(VOCAB, chunk)
        bufs = [(torch.zeros(grid_programs * 2, dtype=torch.int64, device="cuda"),
                 torch.zeros(batch * 8, dtype=torch.int64, device="cuda")) for _ in range(3)]

        def call(module, out):
            module.rejection_sample_pass(out, fuse_race=False, chunk=chunk, race_warps=race_warps, **a)

        out_ref = torch.empty(batch, k + 1, dtype=torch.int32, device="cuda")
        call(rs, out_ref)

        def graph_of(module, ins=None):
            outs = [torch.empty_like(out_ref) for _ in range(3)]
            for _ in range(2):
                for c in range(3):
                    if ins is not None:
                        ins.TL_BUF[:] = bufs[c]
                    call(module, outs[c])
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for c in range(3):
                    if ins is not None:
                        ins.TL_BUF[:] = bufs[c]
                    call(module, outs[c])
            return g, outs

        for name, plain_mod, ins_mod in mods:
            g_plain, outs_plain = graph_of(plain_mod)
            g_ins, outs_ins = graph_of(ins_mod, ins_mod)
            plain, ins = median_us(g_plain, 3), median_us(g_ins, 3)
            same = all(torch.equal(out_ref, o) for o in outs_plain + outs_ins)
            for _ in range(replays):
                g_ins.replay()
                torch.cuda.synchronize()
                next_start = bufs[2][0].view(-1, 2)[:, 0].min()
                row = analyse(bufs[1][0], bufs[1][1], next_start, k, batch)
                print(f"{name:>8} {k:>2} {batch:>4} {plain:6.2f} {ins:6.2f} " + " ".join(
                    f"{row[c]:>11.2f}" if isinstance(row[c], float) else f"{row[c]:>11}" for c in cols)
                    + ("" if same else "  TOKENS DIFFER"), flush=True)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    main()
