"""Compile the sampler's Triton kernels for the H200 (sm_90) on a machine without a GPU, and
print each kernel's registers, stack and local memory (spills) per thread.

    python scripts/triton_resources.py [--cap 1024] [--batch 8] [--vocab 128256] [--dtype fp32]

Why: device time is short; a change that only moves registers (a larger `cap`, another sort
size) can be checked here first. How: a stand-in driver reports an sm_90 target, every
launch compiles (`JITFunction.run(.., warmup=True)`) instead of running, and cuobjdump (in
Triton's wheel) reads the cubin's resource usage. The local Triton may not be the GPU
machine's (3.6 there), so its numbers are a guide, never a measurement; nothing here runs a
kernel. Launch arguments are CPU tensors; outputs are never read.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402
from triton.runtime import driver as triton_driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Sm90Driver(CudaDriver):
    """CudaDriver without libcuda: an sm_90 target, device 0, stream 0."""

    def __init__(self):  # noqa: D107 (CudaDriver's own __init__ loads libcuda)
        self.utils = None

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def resource_usage(cubin: bytes) -> str:
    """cuobjdump's 'REG:.. STACK:.. SHARED:.. LOCAL:..' line of the cubin's one function."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    line = next((ln.strip() for ln in out.splitlines() if ln.strip().startswith("REG:")), "?")
    return " ".join(line.split()[:5])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    a = ap.parse_args()

    triton_driver.set_active(Sm90Driver())
    compiled = []
    original_run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kwargs.get("num_warps"), kernel))
        return kernel

    JITFunction.run = compile_only
    from specops.triton_kernels.sampling_topk_topp import sample_top_k_top_p_triton

    R, V = a.batch, a.vocab
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    logits = torch.zeros(R, V, dtype=dtype)
    rows = torch.arange(R)
    sample_top_k_top_p_triton(logits, torch.ones(R), (rows % 3 * 20).to(torch.int32), torch.full((R,), 0.9),
                              torch.full((R,), 0.02), rows.long(), rows.long(), cap=a.cap)
    print(f"triton {triton.__version__}, sm_90, cap={a.cap}, R={R}, V={V}, {a.dtype}")
    for name, warps, kernel in compiled:
        print(f"  {name:32s} warps {kernel.metadata.num_warps:2d}  {resource_usage(kernel.asm['cubin'])}")


if __name__ == "__main__":
    main()
