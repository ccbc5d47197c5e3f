#!/usr/bin/env bash
# Compile-checks every CUDA kernel file (they include no torch header) and the CUDA
# experiments in bench/ with the machine's nvcc for sm_90, then builds and runs
# csrc/emulate/emulate_kernels.cu, which executes every kernel body on the CPU with the
# launchers' grid configuration and compares it bit for bit with plain loops. Any failure
# fails CI. Skips with a note where nvcc is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then echo "check_cuda_compile: no nvcc, skipped"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shopt -s nullglob
files=(csrc/cuda/*.cu)
for f in "${files[@]}"; do
  "$NVCC" -std=c++17 -arch=sm_90 -Icsrc --expt-relaxed-constexpr -Werror all-warnings -c "$f" -o "$tmp/kernel.o"
  echo "nvcc ok: $f"
done
echo "check_cuda_compile: ${#files[@]} file(s) compiled"
# The CUDA experiments under bench/ (GPU programs built from the same headers): compiled only.
for f in bench/exp_*.cu; do
  "$NVCC" -std=c++17 -arch=sm_90 -Icsrc --expt-relaxed-constexpr -Werror all-warnings "$f" -o "$tmp/exp"
  echo "nvcc ok: $f"
done
"$NVCC" -std=c++17 -arch=sm_90 -O2 -Icsrc --expt-relaxed-constexpr csrc/emulate/emulate_kernels.cu -o "$tmp/emulate"
"$tmp/emulate"
