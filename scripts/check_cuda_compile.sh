#!/usr/bin/env bash
# Compile-checks every CUDA kernel file (they include no torch header) with the
# machine's nvcc for sm_90. Any failure fails CI. Skips with a note where nvcc is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then echo "check_cuda_compile: no nvcc, skipped"; exit 0; fi
shopt -s nullglob
files=(csrc/cuda/*.cu)
for f in "${files[@]}"; do
  "$NVCC" -std=c++17 -arch=sm_90 -Icsrc --expt-relaxed-constexpr -c "$f" -o /tmp/specops_check.o
  echo "nvcc ok: $f"
done
echo "check_cuda_compile: ${#files[@]} file(s) compiled"
