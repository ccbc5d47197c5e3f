#!/usr/bin/env bash
# Prepares .gpu/, the folder that travels to the offline GPU machine (carry [".gpu"]),
# on this CPU machine, reproducibly (pinned versions; downloads cached under
# $SPECOPS_GPU_PREP_CACHE, default ~/.cache/specops-gpu-prep):
#
#   .gpu/whl/*.whl             cp312 manylinux wheels the GPU image lacks: xgrammar and its
#                              needs (apache-tvm-ffi, pydantic, pydantic-core, typing-extensions,
#                              annotated-types, typing-inspection) and gguf (the engine's GGUF loader)
#   .gpu/flashinfer.tar.xz     a trimmed flashinfer-python: its Python package, the CUDA
#                              sources its spec generators read, the headers a JIT fallback
#                              needs, and the modules specops uses built AHEAD OF TIME here
#                              for sm_90a (flashinfer/data/aot/<name>/<name>.so), so nothing
#                              compiles on the GPU machine
#   .gpu/flashinfer_modules.txt  the prebuilt module names
#   .gpu/MANIFEST.txt          versions, sizes, SASS architectures, date
#
# bench/gpu_check.sh installs and uses all of it there. Usage:
#   bash scripts/prepare_gpu_deps.sh            # everything (the FlashInfer build takes a while)
#   SKIP_FLASHINFER=1 bash scripts/prepare_gpu_deps.sh   # wheels only
#   MAX_JOBS=2 FI_PREFILL_DTYPES=bf16,fp16 bash scripts/prepare_gpu_deps.sh
# Each step prints what it does; a failed step is reported and the later steps still run;
# the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

GPU_DIR=${GPU_DIR:-$ROOT/.gpu}
CACHE=${SPECOPS_GPU_PREP_CACHE:-$HOME/.cache/specops-gpu-prep}
PY=${PYTHON:-python3}
MAX_JOBS=${MAX_JOBS:-1}

FLASHINFER_VERSION=0.7.4
XGRAMMAR_VERSION=0.2.9
TVM_FFI_VERSION=0.1.15.post2      # one version for both: the AOT modules are built against its headers
CURAND_VERSION=10.4.0.35          # CUDA 13.0's cuRAND: headers only, for the sampling kernels
GPU_WHEELS=(
  "xgrammar==$XGRAMMAR_VERSION"
  "apache-tvm-ffi==$TVM_FFI_VERSION"
  "pydantic==2.13.4"
  "pydantic-core==2.46.4"
  "typing-extensions==4.16.0"
  "annotated-types==0.7.0"
  "typing-inspection==0.4.2"
  "gguf==0.19.0"
)
# Pure-Python packages FlashInfer imports at `import flashinfer` that are not needed on the
# GPU image (it has them) but may be absent here: installed to a private folder for the build.
BUILD_PY_DEPS=("apache-tvm-ffi==$TVM_FFI_VERSION" "nvidia-ml-py" "einops" "tabulate")
FI_PREFILL_DTYPES=${FI_PREFILL_DTYPES:-bf16}
FI_HEAD_DIMS=${FI_HEAD_DIMS:-64,128}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

mkdir -p "$GPU_DIR/whl" "$CACHE/dl" "$CACHE/logs"
declare -a SUMMARY=()
FAILED=0
T_START=$(date +%s)

step() {  # step NAME FUNCTION: run, time and record one step; never abort the script
  local name=$1; shift
  local t0=$(date +%s)
  echo; echo "=== [$name] start $(date -u +%H:%M:%S)"
  if "$@"; then local st=ok; else local st=FAILED; FAILED=1; fi
  local dt=$(( $(date +%s) - t0 ))
  echo "=== [$name] $st (${dt}s)"
  SUMMARY+=("$(printf '%-14s %-7s %6ss' "$name" "$st" "$dt")")
}

pip_download() {  # pip_download DEST SPEC...: cp312 manylinux x86_64 binaries, no deps
  local dest=$1; shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$dest" "$@"
}

gpu_wheels() {
  # Keep exactly one version of each package: remove wheels not in the pinned list.
  local keep=() spec name ver
  pip_download "$GPU_DIR/whl" "${GPU_WHEELS[@]}" || return 1
  for spec in "${GPU_WHEELS[@]}"; do
    name=${spec%%==*}; ver=${spec##*==}
    keep+=("$(echo "$name" | tr '-' '_')-$ver-")
  done
  for f in "$GPU_DIR"/whl/*.whl; do
    local base=$(basename "$f") ok=0
    for k in "${keep[@]}"; do [[ ${base,,} == ${k,,}* ]] && ok=1; done
    if [ $ok = 0 ]; then echo "removing stale $base"; rm -f "$f"; fi
  done
  ls -l "$GPU_DIR/whl"
  [ "$(ls "$GPU_DIR"/whl/*.whl | wc -l)" -eq "${#GPU_WHEELS[@]}" ]
}

build_deps() {
  # Host-Python copies of what `import flashinfer` needs here; tvm-ffi pinned to the GPU's version.
  local site=$CACHE/cpu-site
  if [ -f "$site/.ok-$TVM_FFI_VERSION" ]; then echo "cached: $site"; return 0; fi
  rm -rf "$site" && mkdir -p "$site"
  "$PY" -m pip install -q --no-deps --no-compile --target "$site" "${BUILD_PY_DEPS[@]}" || return 1
  touch "$site/.ok-$TVM_FFI_VERSION"
}

curand_headers() {
  local inc=$CACHE/curand/nvidia/cu13/include
  if [ -f "$inc/curand_kernel.h" ]; then echo "cached: $inc"; return 0; fi
  pip_download "$CACHE/dl" "nvidia-curand==$CURAND_VERSION" || return 1
  mkdir -p "$CACHE/curand"
  (cd "$CACHE/curand" && unzip -q -o "$CACHE"/dl/nvidia_curand-"$CURAND_VERSION"-*.whl 'nvidia/cu13/include/*') || return 1
  ls "$inc"
}

flashinfer_wheel() {
  ls "$CACHE"/dl/flashinfer_python-"$FLASHINFER_VERSION"-py3-none-any.whl 2>/dev/null \
    || pip_download "$CACHE/dl" "flashinfer-python==$FLASHINFER_VERSION"
}

fi_args() {
  echo --wheel "$CACHE/dl/flashinfer_python-$FLASHINFER_VERSION-py3-none-any.whl" --work "$CACHE" \
    --prefill-dtypes "$FI_PREFILL_DTYPES" --head-dims "$FI_HEAD_DIMS" \
    --cuda-include "$CACHE/curand/nvidia/cu13/include"
}

flashinfer_build() {
  # FlashInfer's own specs and ninja files; nice'd, MAX_JOBS parallel compiles (the machine is shared).
  echo "MAX_JOBS=$MAX_JOBS; log: $CACHE/logs/flashinfer_build.log"
  PYTHONPATH=$CACHE/cpu-site "$PY" scripts/prepare_flashinfer.py build $(fi_args) --jobs "$MAX_JOBS" \
    2>&1 | tee "$CACHE/logs/flashinfer_build.log" | grep '^\[prepare_flashinfer\]'
}

flashinfer_pack() {
  PYTHONPATH=$CACHE/cpu-site "$PY" scripts/prepare_flashinfer.py pack $(fi_args) --out "$GPU_DIR/flashinfer.tar.xz"
}

flashinfer_verify() {
  # Unpack the trimmed copy as gpu_check.sh does and import it with nothing else of FlashInfer
  # on the path (CPU torch here); every module must resolve to its prebuilt .so.
  local tmp rc=0
  tmp=$(mktemp -d)
  tar -xJf "$GPU_DIR/flashinfer.tar.xz" -C "$tmp" || return 1
  echo "unpacked: $(du -sh "$tmp" | cut -f1) in $(find "$tmp" -type f | wc -l) files"
  (cd /tmp && LD_LIBRARY_PATH=${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      PYTHONPATH=$tmp:$CACHE/cpu-site "$PY" "$ROOT/scripts/prepare_flashinfer.py" verify \
      --work "$tmp/work" --prefill-dtypes "$FI_PREFILL_DTYPES" --head-dims "$FI_HEAD_DIMS") || rc=1
  # SASS architecture of every prebuilt module.
  local cuobjdump so
  cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null \
    || "$PY" -c "import triton,os;print(os.path.join(os.path.dirname(triton.__file__),'backends/nvidia/bin/cuobjdump'))")
  : > "$CACHE/sass_archs.txt"
  for so in "$tmp"/flashinfer/data/aot/*/*.so; do
    local archs
    archs=$("$cuobjdump" --list-elf "$so" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
    printf '%-8s %6s KiB  %s\n' "${archs:-NONE}" "$(( $(stat -c %s "$so") / 1024 ))" "$(basename "$so")" \
      | tee -a "$CACHE/sass_archs.txt"
    [[ $archs == *sm_90a* ]] || rc=1
  done
  rm -rf "$tmp"
  return $rc
}

manifest() {
  local m=$GPU_DIR/MANIFEST.txt
  {
    echo "specops GPU payload, prepared $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -m) by scripts/prepare_gpu_deps.sh"
    echo "flashinfer-python $FLASHINFER_VERSION (trimmed, AOT sm_90a, nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2))"
    echo "prefill dtypes: $FI_PREFILL_DTYPES; head dims: $FI_HEAD_DIMS"
    echo "--- prebuilt modules (SASS arch, size, name)"
    cat "$CACHE/sass_archs.txt" 2>/dev/null
    echo "--- files"
    (cd "$GPU_DIR" && find . -type f ! -name MANIFEST.txt -printf '%10s  %p\n' | sort -k2)
    echo "--- total: $(du -sb "$GPU_DIR" | cut -f1) bytes"
  } > "$m"
  cat "$m"
  local total; total=$(du -sb "$GPU_DIR" | cut -f1)
  [ "$total" -lt $(( 45 * 1024 * 1024 )) ] || { echo "TOO BIG: .gpu is over 45 MiB"; return 1; }
}

step gpu_wheels gpu_wheels
if [ "${SKIP_FLASHINFER:-0}" != 1 ] && ! "$PY" -c "import torch" 2>/dev/null; then
  # FlashInfer's build specs import torch (its CPU build will do): without it every FlashInfer
  # step below would fail with a traceback.
  echo "FAILED: $PY cannot import torch; the FlashInfer steps need it (run scripts/install.sh first)"
  SUMMARY+=("$(printf '%-14s %-7s %6s' flashinfer "FAILED" "-") (no torch for $PY)")
  FAILED=1
elif [ "${SKIP_FLASHINFER:-0}" != 1 ]; then
  step build_deps build_deps
  step curand curand_headers
  step fi_wheel flashinfer_wheel
  step fi_build flashinfer_build
  step fi_pack flashinfer_pack
  step fi_verify flashinfer_verify
fi
step manifest manifest

echo
echo "=== prepare_gpu_deps summary ($(( $(date +%s) - T_START ))s total)"
printf '%s\n' "${SUMMARY[@]}"
echo ".gpu: $(du -sh "$GPU_DIR" | cut -f1)"
exit $FAILED
