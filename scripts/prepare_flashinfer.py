"""Build FlashInfer's kernel modules ahead of time for sm_90a and pack a trimmed copy.

Run by scripts/prepare_gpu_deps.sh on the CPU machine (no GPU needed: FlashInfer >= 0.3
builds its modules against TVM-FFI, not torch, so nvcc alone is enough). Two steps:

``build``  unpacks the flashinfer-python wheel, asks FlashInfer itself for the JIT specs
           of the modules specops uses (its own nvcc flags, its own ninja files, the same
           module names its Python code looks up at run time) and runs ninja on them.
``pack``   copies the Python package, the .so files as prebuilt AOT modules
           (``flashinfer/data/aot/<name>/<name>.so``, the first place FlashInfer looks), the
           CUDA sources its spec generators read and the headers a JIT fallback would
           need into one tar.xz, then checks that the unpacked copy imports and resolves
           every module as prebuilt.

Modules (see ``module_specs``):
  sampling     softmax, sampling_from_logits/probs, top_k_mask_logits,
               top_p/top_k/min_p sampling, chain_speculative_sampling
  topk         the radix top-k that top_k_top_p_sampling_from_logits uses for an int
               top_k <= 256 at vocab >= 65536 ("top_k_first" fast path)
  batch_prefill_..._kv_stride_equal
               BatchPrefillWithPagedKVCacheWrapper, backend="fa2", no pos encoding,
               no sliding window, no soft cap, int32 indices, equal K/V strides,
               one module per (dtype, head_dim)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def log(msg: str) -> None:
    print(f"[prepare_flashinfer] {msg}", flush=True)


def unpack_wheel(wheel: Path, dest: Path) -> Path:
    """Unpack the wheel once into dest/<wheel stem>; return the folder holding `flashinfer/`."""
    root = dest / wheel.stem
    marker = root / ".unpacked"
    if not marker.exists():
        if root.exists():
            shutil.rmtree(root)
        log(f"unpacking {wheel.name} -> {root}")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root)
        marker.touch()
    return root


def setup_env(work: Path, archs: str, cuda_includes: list[str]) -> None:
    """Point FlashInfer at a private workspace and the target architectures (no GPU here).

    cuda_includes: extra header folders for nvcc (the CPU machine's CUDA toolkit has no
    cuRAND headers, which FlashInfer's sampling kernels include; they come from the
    nvidia-curand wheel). Header-only use: nothing links against cuRAND.
    """
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = archs
    if cuda_includes:
        os.environ["FLASHINFER_EXTRA_CUDAFLAGS"] = " ".join(f"-isystem {d}" for d in cuda_includes)
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(work / "ws")
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    os.environ.setdefault("FLASHINFER_DISABLE_VERSION_CHECK", "1")
    stub = Path(os.environ["CUDA_HOME"]) / "lib64" / "stubs" / "libcuda.so"
    if not stub.exists():
        os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{libcuda_stub(work)}"


def libcuda_stub(work: Path) -> Path:
    """A symbol-less libcuda.so (soname libcuda.so.1) for FlashInfer's `-lcuda` where the
    toolkit ships no driver stub (as here): a shared library may keep undefined symbols, so
    the module records NEEDED libcuda.so.1 and the real driver resolves them at load time,
    exactly as with NVIDIA's stub."""
    d = work / "cudastub"
    lib = d / "libcuda.so"
    if not lib.exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-o", str(lib), "-Wl,-soname,libcuda.so.1"],
                       check=True)
    return d


def _lists(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    return ([d for d in args.prefill_dtypes.split(",") if d],
            [int(x) for x in args.head_dims.split(",") if x])


def module_specs(prefill_dtypes: list[str], head_dims: list[int]):
    """FlashInfer's own JIT specs for the modules specops uses, in build order."""
    import torch
    from flashinfer.jit.attention.modules import _gen_batch_prefill_primary_module
    from flashinfer.jit.sampling import gen_sampling_module
    from flashinfer.jit.topk import gen_topk_module

    specs = [gen_sampling_module()]
    for dt in [d for d in prefill_dtypes if d]:
        dtype = getattr(torch, DTYPES[dt])
        for hd in head_dims:
            # Exactly the arguments prefill.get_batch_prefill_module("fa2", ...) passes for
            # plan(causal=True, pos_encoding_mode="NONE", window_left=-1, no soft cap,
            # use_fp16_qk_reduction=False, int32 indptr), q/kv/o of one dtype.
            specs.append(_gen_batch_prefill_primary_module(
                "fa2", dtype, dtype, dtype, torch.int32, hd, hd, 0, False, False, False))
    specs.append(gen_topk_module())
    return specs


def cmd_build(args: argparse.Namespace) -> int:
    specs = module_specs(*_lists(args))
    failed = []
    for spec in specs:
        spec.write_ninja()
        so = spec.jit_library_path
        t0 = time.time()
        log(f"building {spec.name} ({len(spec.sources)} sources, -j{args.jobs})")
        cmd = ["nice", "-n", str(args.nice), "ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path),
               "-j", str(args.jobs)]
        logf = spec.build_dir / "ninja.log.txt"
        with open(logf, "w") as fh:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
        dt = time.time() - t0
        if rc != 0 or not so.exists():
            failed.append(spec.name)
            log(f"FAILED {spec.name} after {dt:.0f}s (rc={rc}); log: {logf}")
            sys.stdout.write(logf.read_text()[-4000:])
        else:
            log(f"built {spec.name} in {dt:.0f}s: {so} ({so.stat().st_size / 2**20:.1f} MiB)")
    return 1 if failed else 0


def _needed_sources(specs) -> set[Path]:
    """CUDA/jinja files under data/csrc that the spec generators read when FlashInfer
    creates the specs at run time (it re-renders the prefill sources even when the
    module is prebuilt) plus the module sources themselves."""
    from flashinfer.jit import env as jit_env

    csrc = jit_env.FLASHINFER_CSRC_DIR.resolve()
    out = set()
    for spec in specs:
        for src in spec.sources:
            src = Path(src).resolve()
            if src.is_relative_to(csrc):
                out.add(src)
    for pattern in ("batch_prefill*", "*.jinja"):
        out.update(p.resolve() for p in csrc.glob(pattern))
    # headers included by name from csrc (e.g. tvm_ffi_utils.h, pytorch_extension_utils.h)
    out.update(p.resolve() for p in csrc.glob("*.h"))
    out.update(p.resolve() for p in csrc.glob("*.cuh"))
    return out


def _loaded_python_files(pkg_root: Path) -> set[Path]:
    """Every flashinfer .py file that `import flashinfer` and the used submodules load."""
    import flashinfer  # noqa: F401
    import flashinfer.prefill  # noqa: F401
    import flashinfer.sampling  # noqa: F401
    import flashinfer.topk  # noqa: F401

    files = set()
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and (name == "flashinfer" or name.startswith("flashinfer.")):
            p = Path(f).resolve()
            if p.is_relative_to(pkg_root):
                files.add(p)
    return files


def cmd_pack(args: argparse.Namespace) -> int:
    full = Path(args.full_root).resolve()
    pkg = full / "flashinfer"
    specs = module_specs(*_lists(args))
    missing = [s.name for s in specs if not s.jit_library_path.exists()]
    if missing:
        log(f"not built (run `build` first): {missing}")
        return 1

    files: dict[Path, Path] = {}  # source -> path inside the package

    def add(p: Path) -> None:
        files[p] = p.relative_to(full)

    py = _loaded_python_files(pkg)
    # Every .py of each folder that holds a loaded module (catches lazy imports inside
    # functions of those packages); folders of unrelated ops stay out.
    dirs = {p.parent for p in py}
    for d in dirs:
        for p in d.glob("*.py"):
            add(p.resolve())
    for p in py:
        add(p)
    # Non-Python files read at import (json/jinja templates next to loaded modules, version metadata).
    for d in dirs:
        if d.is_relative_to(pkg / "data"):
            continue
        for p in d.iterdir():
            if p.is_file() and p.suffix in (".json", ".jinja", ".txt", ".typed", ".csv", ".toml"):
                add(p.resolve())
    for p in _needed_sources(specs):
        add(p)
    data = pkg / "data"
    # Headers a JIT fallback on the GPU machine needs (another dtype or head_dim, the
    # independent-stride prefill, with FI_ALLOW_JIT=1 there): FlashInfer's include/, its
    # vendored CCCL (which takes precedence over the toolkit's) and spdlog; CUTLASS only on
    # request (the modules here do not include it). Compressed these are a few MiB.
    trees = {"include": ["include"], "cccl": ["cccl/cub", "cccl/libcudacxx/include", "cccl/thrust"],
             "spdlog": ["spdlog/include"], "cutlass": ["cutlass/include", "cutlass/tools/util/include"]}
    for key in [h for h in args.headers.split(",") if h]:
        for sub in trees[key]:
            base = data / sub
            for p in base.rglob("*") if base.exists() else []:
                if p.is_file() and not p.is_symlink():
                    add(p)
    dist_info = sorted(full.glob("flashinfer_python-*.dist-info"))
    for d in dist_info:
        for p in d.iterdir():
            if p.name in ("METADATA", "RECORD", "WHEEL", "top_level.txt", "entry_points.txt"):
                add(p)

    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    aot_names = []
    with tarfile.open(tmp, "w:xz", preset=6) as tf:
        for src, rel in sorted(files.items(), key=lambda kv: str(kv[1])):
            tf.add(src, arcname=str(rel), recursive=False)
        for spec in specs:
            rel = Path("flashinfer") / "data" / "aot" / spec.name / f"{spec.name}.so"
            tf.add(spec.jit_library_path, arcname=str(rel), recursive=False)
            aot_names.append(spec.name)
    tmp.replace(out)
    log(f"packed {len(files)} files + {len(aot_names)} AOT modules -> {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    manifest = out.with_name("flashinfer_modules.txt")
    manifest.write_text("".join(f"{n}\n" for n in aot_names))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """In a fresh process with only the unpacked trimmed copy on the path: import flashinfer,
    check that every module resolves to a prebuilt AOT .so, and load each one through
    FlashInfer's own run-time getters with JIT disabled (dlopen through TVM-FFI works without
    a GPU, given libcudart.so.13 on LD_LIBRARY_PATH): nothing would compile on the GPU machine."""
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    import torch
    import flashinfer
    import flashinfer.prefill
    import flashinfer.sampling
    import flashinfer.topk
    from flashinfer.jit.attention.modules import _gen_batch_prefill_independent_paged_module

    log(f"flashinfer {flashinfer.__version__} from {flashinfer.__file__}")
    dtypes, head_dims = _lists(args)
    bad = 0
    for spec in module_specs(dtypes, head_dims):
        ok = spec.is_aot and spec.aot_path.exists()
        bad += not ok
        log(f"{'prebuilt' if ok else 'NOT PREBUILT'}: {spec.name}")

    def load(what, fn, names):
        nonlocal bad
        try:
            mod = fn()
            missing = [n for n in names if getattr(mod, n, None) is None]
            if missing:
                raise RuntimeError(f"missing functions {missing}")
            log(f"loaded: {what} ({', '.join(names)})")
        except Exception as e:  # noqa: BLE001 - report every module
            bad += 1
            log(f"LOAD FAILED: {what}: {type(e).__name__}: {str(e)[:400]}")

    load("sampling", flashinfer.sampling.get_sampling_module,
         ["softmax", "sampling_from_logits", "top_k_mask_logits", "top_p_sampling_from_probs",
          "top_k_top_p_sampling_from_probs", "chain_speculative_sampling"])
    load("topk", flashinfer.topk.get_topk_module, ["radix_topk"])
    for dt in dtypes:
        dtype = getattr(torch, DTYPES[dt])
        for hd in head_dims:
            cfg = ("fa2", dtype, dtype, dtype, torch.int32, hd, hd, 0, False, False, False)
            load(f"batch prefill fa2 {dt} head_dim {hd}",
                 lambda cfg=cfg: flashinfer.prefill.get_batch_prefill_module(*cfg),
                 ["plan", "paged_run", "ragged_run"])
            # Lazy variant for K/V caches of different strides: its spec must still be
            # creatable (FlashInfer renders it at plan time), though it is not prebuilt.
            try:
                lazy = _gen_batch_prefill_independent_paged_module(*cfg)
                log(f"spec ok, not prebuilt (used only if K and V strides differ): {lazy.name}")
            except Exception as e:  # noqa: BLE001
                bad += 1
                log(f"SPEC FAILED: independent-stride prefill {dt} {hd}: {type(e).__name__}: {e}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["build", "pack", "verify"])
    ap.add_argument("--full-root", help="folder holding the unpacked wheel's flashinfer/ (build, pack)")
    ap.add_argument("--wheel", help="flashinfer-python wheel to unpack into --work (build, pack)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "specops-gpu-prep"))
    ap.add_argument("--out", default=".gpu/flashinfer.tar.xz")
    ap.add_argument("--archs", default="9.0a")
    ap.add_argument("--prefill-dtypes", default="bf16", help="comma list of bf16,fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", "1")))
    ap.add_argument("--nice", type=int, default=19)
    ap.add_argument("--headers", default="include,cccl,spdlog",
                    help="header trees to pack for a JIT fallback: include,cccl,spdlog,cutlass (or empty)")
    ap.add_argument("--cuda-include", action="append", default=[],
                    help="extra nvcc include folder (repeatable), e.g. the cuRAND headers")
    args = ap.parse_args()

    work = Path(args.work).resolve()
    if args.step in ("build", "pack"):
        if args.wheel:
            args.full_root = str(unpack_wheel(Path(args.wheel), work / "unpacked"))
        if not args.full_root:
            ap.error("build/pack need --wheel or --full-root")
        sys.path.insert(0, args.full_root)
    setup_env(work, args.archs, [str(Path(d).resolve()) for d in args.cuda_include])
    return {"build": cmd_build, "pack": cmd_pack, "verify": cmd_verify}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
