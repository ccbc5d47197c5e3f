#!/usr/bin/env bash
# The GPU work owed on main (bench/unmeasured/README.md), as two device calls (call 1, the pivot_round1_collect patch, ran and merged in session 66), most wanted first:
#
#   bash bench/unmeasured/owed_calls.sh 2   # carry [".gpu"]; ~250 s: shard 2 of the suite on CUDA
#   bash bench/unmeasured/owed_calls.sh 3   # carry ["ab", ".gpu"]; ~350 s: shard 1's leftovers, then
#                                           # the pairwise-sums A/B's mixed shapes against ab/cb
#
# Call 3 needs ab/cb here first: mkdir -p ab/cb && git archive cb178bf triton_kernels | tar -x -C ab/cb
# Each call writes its outputs under $OUT as it goes. .gpu/ comes from scripts/prepare_gpu_deps.sh
# (about 16 min on two cores; needs torch, so after scripts/install.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in 2|3) ;; *) echo "usage: $0 2|3" >&2; exit 2 ;; esac
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/owed_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
case "${1:-}" in
  2)
    SKIP_SMOKE=1 SKIP_BENCH=1 TEST_SHARD=2/2 PYTEST_WORKERS=12 GPU_CHECK_BUDGET=560 TEST_TIMEOUT=480 \
      OUT="$OUT" bash bench/gpu_check.sh > "$OUT/shard2.txt" 2>&1
    tail -40 "$OUT/shard2.txt"
    ;;
  3)
    SKIP_SMOKE=1 SKIP_BENCH=1 PYTEST_WORKERS=8 GPU_CHECK_BUDGET=300 TEST_TIMEOUT=240 OUT="$OUT" \
      TESTS="tests/test_engine_default_model.py tests/test_sampling_pivot.py tests/test_structured_compile.py" \
      PYTEST_K="default_model or cuda or launch_only or slow_compile" bash bench/gpu_check.sh > "$OUT/rest1.txt" 2>&1
    tail -25 "$OUT/rest1.txt"
    timeout 250 python bench/exp_sampling_ab.py ab/cb --rounds=5 --shapes=mix:128,mix:8 2>&1 | tee "$OUT/ab_cb.txt"
    ;;
esac
