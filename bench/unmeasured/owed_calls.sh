#!/usr/bin/env bash
# The default model on CUDA in three chained calls, and the issue 3 table (bench/unmeasured/README.md):
#
#   bash bench/unmeasured/owed_calls.sh 1   # carry [".gpu", ".m1"]; ~150 s: deps, build, session 67's
#                                           # changed CUDA tests (logprobs dispatch, top-n ids)
#   bash bench/unmeasured/owed_calls.sh 2   # carry [".m2"]; seconds: brings the model's 2nd part
#   bash bench/unmeasured/owed_calls.sh 3   # carry [".m3"]; ~150 s: the default model's tests on CUDA
#   bash bench/unmeasured/owed_calls.sh 4   # carry [".gpu"]; ~460 s on an H100: the issue 3 table (sampling.md)
#
# Calls 1-3 run on one warm machine, each within idle_release_s (30 s) of the last; first, here:
# bash scripts/split_default_model.sh (the parts .m1/ .m2/ .m3/ of the 98 MB default model).
# Each call writes its outputs under $OUT. .gpu/ comes from scripts/prepare_gpu_deps.sh (about
# 16 min on two cores; needs torch, so after scripts/install.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in 1|2|3|4) ;; *) echo "usage: $0 1|2|3|4" >&2; exit 2 ;; esac
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/owed_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
case "${1:-}" in
  1)
    SKIP_SMOKE=1 SKIP_BENCH=1 PYTEST_WORKERS=8 GPU_CHECK_BUDGET=260 TEST_TIMEOUT=200 OUT="$OUT" \
      TESTS="tests/test_logprob_stats.py tests/test_sampling_sampler.py" PYTEST_K="auto or cuda" \
      bash bench/gpu_check.sh > "$OUT/call1.txt" 2>&1
    tail -22 "$OUT/call1.txt"
    ;;
  2)
    ls -la .m1 .m2
    ;;
  3)
    GPU_CHECK_BUDGET=300 TEST_TIMEOUT=250 OUT="$OUT" bash bench/default_model_cuda.sh > "$OUT/call3.txt" 2>&1
    tail -30 "$OUT/call3.txt"
    ;;
  4)
    SKIP_SMOKE=1 SKIP_TESTS=1 GPU_CHECK_BUDGET=560 BENCH_TIMEOUT=500 ONLY_BENCH=sampling SAMPLING_ALONE=0 \
      OUT="$OUT" bash bench/gpu_check.sh > "$OUT/call4.txt" 2>&1
    tail -40 "$OUT/call4.txt"
    ;;
esac
