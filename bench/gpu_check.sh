#!/usr/bin/env bash
# The one GPU script: on the offline GPU machine, from the repo root, with .gpu/ carried
# (prepared on the CPU machine by scripts/prepare_gpu_deps.sh):
#
#   bash bench/gpu_check.sh          # device tool: carry [".gpu"], timeout_s 600
#
# Steps (each timed, each with a timeout; a failed step never stops the later ones):
#   deps    install .gpu/whl/*.whl to /tmp/site, unpack the trimmed FlashInfer (prebuilt
#           sm_90a modules) to /tmp/flashinfer_trim, print versions
#   build   MAX_JOBS=16 pip install --no-build-isolation --no-deps -e .  (CUDA build of
#           specops._C) and check that every specops op has a CUDA kernel
#   smoke   tests/test_gpu_deps.py: FlashInfer sampling + paged prefill (head_dim 64, 128)
#           and xgrammar bitmask apply against torch references: PASSED/FAILED each, with the error
#   tests   python -m pytest tests on CUDA (junit xml), never under TRITON_INTERPRET
#   bench   every bench/bench_*.py via bench/run_all.py (own process, timeout each),
#           writing bench/results/*.md/json/png
#   pack    $OUT/results.tar.gz (bench/results + all logs), $OUT/summary.txt,
#           $OUT/pytest.log, $OUT/bench.log, $OUT/junit.xml
# and prints a short summary last.
#
# Knobs (environment):
#   SKIP_DEPS=1 SKIP_BUILD=1 SKIP_SMOKE=1 SKIP_TESTS=1 SKIP_BENCH=1   skip a step
#   ONLY_BENCH=ops,sampling      run only these benchmarks (names after bench_)
#   TESTS="tests/test_x.py"      what pytest runs (default: tests)
#   TEST_SHARD=1/2               run test files 1, 3, 5, ... of the sorted tests/test_*.py (2/2: the
#                                others): the whole suite no longer fits one 600 s call (session 26:
#                                1468 of 1469 results in 513 s with 8 workers), so two calls run it
#   TESTS_AFTER=prev_pytest.log  run only the tests (of TESTS / TEST_SHARD) that this earlier
#                                run's pytest.log ($OUT/pytest.log of a call cut by its limit; put
#                                it in the working tree, untracked, so that it travels) reports no
#                                outcome for (bench/pytest_rest.py)
#   PYTEST_ARGS="-x --maxfail=3" extra pytest arguments (split on spaces: no quoted phrase)
#   PYTEST_K="cuda or grouping"  pytest -k expression (kept whole, spaces and all)
#   PYTEST_WORKERS=8             pytest-xdist workers (0 = serial; the whole suite: over 513 s with 8)
#   GPU_CHECK_BUDGET=540         seconds for the whole script (steps shrink to fit)
#   TEST_TIMEOUT=240 BENCH_TIMEOUT=150 TEST_PER_TEST_TIMEOUT=300 BUILD_TIMEOUT=300
#                                (the statistical tests take 85-95 s each with 8 workers, more with 12)
#   FI_ALLOW_JIT=1               let FlashInfer JIT-compile a module that was not prebuilt
#                                (minutes per module); default: fail fast with its name
#   XGR_CUDA=1                   smoke-test xgrammar's CUDA bitmask backend too, and time it in
#                                bench_ops (~60 s compile on first use)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-540}
OUT=${OUT:-$ROOT/.gpu_out}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
PY=${PYTHON:-python3}
rm -rf "$WORK" && mkdir -p "$WORK/bench_logs" "$OUT"
rm -f "$OUT"/{summary.txt,pytest.log,bench.log,junit.xml,results.tar.gz}

# ---------------------------------------------------------------- environment
SITE=${GPU_SITE:-/tmp/site}
FI_DIR=${GPU_FI_DIR:-/tmp/flashinfer_trim}
export PYTHONPATH=$FI_DIR:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
# FlashInfer: the prebuilt modules lie in $FI_DIR/flashinfer/data/aot/<name>/<name>.so, where it
# looks first; its JIT workspace (only used by a fallback) goes to /tmp; sm_90a only.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer_ws}
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_DISABLE_VERSION_CHECK=1
if [ "${FI_ALLOW_JIT:-0}" != 1 ]; then export FLASHINFER_DISABLE_JIT=1; fi
export MAX_JOBS=${MAX_JOBS:-16}
# Several-GPU kinds keep NVLink multicast off (harmless on one GPU).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

declare -a STEP_ROWS=()
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(date +%s) + T0 )); }

# step NAME TIMEOUT FUNCTION: run FUNCTION in a child bash under `timeout`, log to $WORK/NAME.log
# (and stdout), record status and seconds. The timeout shrinks to the budget left (minus 25 s
# kept for packing).
step() {
  local name=$1 want=$2 fn=$3 skipvar="SKIP_${1^^}"
  if [ "${!skipvar:-0}" = 1 ]; then STEP_ROWS+=("$(printf '%-6s %-22s %5s' "$name" "skipped (SKIP)" "-")"); return; fi
  local t=$(( $(left) - 25 )); [ "$t" -gt "$want" ] && t=$want
  if [ "$t" -lt 10 ]; then
    echo "=== [$name] skipped: no time left"
    STEP_ROWS+=("$(printf '%-6s %-22s %5s' "$name" "skipped (no time)" "-")"); return
  fi
  echo; echo "=== [$name] start at +$(elapsed)s, timeout ${t}s"
  local s0=$(date +%s) rc
  timeout -k 10 "$t" bash -c "$fn" > >(tee "$WORK/$name.log") 2>&1
  rc=$?
  sleep 0.2  # let tee flush
  local st=ok
  if [ $rc = 124 ] || [ $rc = 137 ]; then st="TIMEOUT (${t}s)"; elif [ $rc != 0 ]; then st="FAILED (rc=$rc)"; fi
  echo "=== [$name] $st in $(( $(date +%s) - s0 ))s"
  STEP_ROWS+=("$(printf '%-6s %-22s %5s' "$name" "$st" "$(( $(date +%s) - s0 ))")")
}

# ---------------------------------------------------------------- 1. deps
deps() {
  local rc=0
  if ls .gpu/whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/whl/*.whl \
      && echo "wheels installed to $SITE: $(ls .gpu/whl | tr '\n' ' ')" || { echo "FAILED: wheel install"; rc=1; }
  else
    echo "FAILED: no .gpu/whl/*.whl (run scripts/prepare_gpu_deps.sh here and carry .gpu)"; rc=1
  fi
  if [ -f .gpu/flashinfer.tar.xz ]; then
    rm -rf "$FI_DIR" && mkdir -p "$FI_DIR" && { tar -xJf .gpu/flashinfer.tar.xz -C "$FI_DIR" 2>/dev/null \
      || $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .gpu/flashinfer.tar.xz "$FI_DIR"; } \
      && echo "flashinfer unpacked to $FI_DIR; prebuilt: $(ls "$FI_DIR/flashinfer/data/aot" \
         | sed -E 's/^batch_prefill_with_kv_cache_dtype_q_([a-z0-9]+)_.*head_dim_qk_([0-9]+)_.*/prefill_\1_hd\2/' | tr '\n' ' ')" \
      || { echo "FAILED: unpacking .gpu/flashinfer.tar.xz"; rc=1; }
  else
    echo "FAILED: no .gpu/flashinfer.tar.xz"; rc=1
  fi
  echo "--- versions"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || rc=1
  nvcc --version 2>/dev/null | grep release || echo "nvcc: not found"
  $PY - <<'EOF' || rc=1
import platform, sys, importlib
print(f"python {platform.python_version()} ({sys.executable})")
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}"
      f", capability {torch.cuda.get_device_capability() if torch.cuda.is_available() else '-'}")
bad = 0
for name in ("triton", "flashinfer", "xgrammar", "tvm_ffi", "pydantic", "gguf"):
    try:
        m = importlib.import_module(name)
        ver = getattr(m, "__version__", None)
        if ver is None:
            try:
                from importlib.metadata import version
                ver = version(name)
            except Exception:  # noqa: BLE001
                ver = "?"
        print(f"{name} {ver} ({m.__file__})")
    except Exception as e:  # noqa: BLE001
        bad += 1
        print(f"{name}: IMPORT FAILED: {type(e).__name__}: {e}")
sys.exit(1 if bad or not torch.cuda.is_available() else 0)
EOF
  return $rc
}

# ---------------------------------------------------------------- 2. build
build() {
  # Skipped when this machine already holds a CUDA build of exactly these sources (a warm
  # machine keeps ignored build outputs between calls); FORCE_BUILD=1 rebuilds anyway.
  local hash stamp=build/.gpu_build_hash
  hash=$(find csrc CMakeLists.txt setup.py pyproject.toml -type f 2>/dev/null | sort | xargs sha1sum | sha1sum | cut -c1-16)
  if [ "${FORCE_BUILD:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ] && check_ops >/dev/null 2>&1; then
    echo "specops._C is up to date (sources $hash): build skipped"
    check_ops; return
  fi
  rm -f "$stamp"
  echo "MAX_JOBS=$MAX_JOBS pip install --no-build-isolation --no-deps --no-index -e ."
  if ! $PY -m pip install --no-build-isolation --no-deps --no-index -e . > "$WORK/build_pip.log" 2>&1; then
    echo "FAILED: pip install -e . (last 60 lines of $WORK/build_pip.log):"; tail -n 60 "$WORK/build_pip.log"
    return 1
  fi
  tail -n 2 "$WORK/build_pip.log"
  check_ops && mkdir -p build && echo "$hash" > "$stamp"
}

check_ops() {  # every specops:: op must have a CUDA kernel
  (cd /tmp && $PY - <<'EOF')
import sys
import torch
import specops
import specops._C  # noqa: F401  (registers the ops)
print(f"specops from {specops.__file__}, _C from {specops._C.__file__}")
names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("specops::"))
if not names:
    print("FAILED: no specops:: ops registered"); sys.exit(1)
missing = [n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA")]
for n in names:
    print(f"  {n:<40} CUDA kernel: {'yes' if n not in missing else 'NO'}")
print(f"{len(names) - len(missing)}/{len(names)} specops ops have a CUDA kernel")
sys.exit(1 if missing else 0)
EOF
}

# ---------------------------------------------------------------- 3. smoke
smoke() {
  # tests/test_gpu_deps.py: FlashInfer sampling (+ the topk fast path), chain speculative
  # sampling, paged prefill at head_dim 64 and 128, xgrammar bitmask apply (triton; cuda with
  # XGR_CUDA=1) and grammar compile, each against a torch reference. -rA lists every result.
  $PY -c "import torch, sys; print('CUDA available:', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)" || return 1
  $PY -m pytest tests/test_gpu_deps.py -q -rA --tb=short --noconftest -p no:cacheprovider
}

# ---------------------------------------------------------------- 4. tests
tests() {
  # -v: one line per test as it ends, so that a run cut by its time limit (no junit.xml, no
  # summary) still names its failures (the summary below lists the FAILED / ERROR lines)
  local args=(-v -rfE -p no:cacheprovider --junitxml="$WORK/junit.xml" --durations=15)
  $PY -c "import pytest_timeout" 2>/dev/null && args+=(--timeout="${TEST_PER_TEST_TIMEOUT:-300}")
  if [ -n "${PYTEST_K:-}" ]; then args+=(-k "$PYTEST_K"); fi
  local workers=${PYTEST_WORKERS:-8}
  if [ "$workers" != 0 ] && $PY -c "import xdist" 2>/dev/null; then args+=(-n "$workers"); fi
  local what=${TESTS:-tests}
  if [ -n "${TEST_SHARD:-}" ]; then
    # shard i of n: every n-th file of the sorted test files, starting at the i-th
    local i=${TEST_SHARD%/*} n=${TEST_SHARD#*/}
    what=$(ls tests/test_*.py | sort | awk -v i="$i" -v n="$n" '(NR - i) % n == 0' | tr '\n' ' ')
  fi
  local targets
  # shellcheck disable=SC2206
  targets=($what)
  if [ -n "${TESTS_AFTER:-}" ]; then
    # only what an earlier, cut run did not report (bench/pytest_rest.py), one id a line: an id
    # may hold spaces ("test_readme_example_runs[Using the ops]"), so no word splitting
    local rest
    rest=$($PY bench/pytest_rest.py "$TESTS_AFTER" "${targets[@]}") || { echo "FAILED: bench/pytest_rest.py"; return 1; }
    if [ -z "$rest" ]; then echo "nothing left after $TESTS_AFTER"; return 0; fi
    mapfile -t targets <<< "$rest"
  fi
  echo "python -m pytest ${targets[*]} ${args[*]} ${PYTEST_ARGS:-}"
  # shellcheck disable=SC2086
  $PY -m pytest "${targets[@]}" "${args[@]}" ${PYTEST_ARGS:-}
}

# ---------------------------------------------------------------- 5. bench
bench() {
  local b=$(( $(left) - 30 ))
  $PY bench/run_all.py --budget "$b" --timeout "${BENCH_TIMEOUT:-150}" ${ONLY_BENCH:+--only "$ONLY_BENCH"} \
    --log-dir "$WORK/bench_logs" --summary-json "$WORK/bench_summary.json"
}

export -f deps build check_ops smoke tests bench left elapsed
export PY ROOT WORK SITE FI_DIR T0 BUDGET
step deps 150 deps
step build "${BUILD_TIMEOUT:-300}" build
step smoke 150 smoke
step tests "${TEST_TIMEOUT:-240}" tests
step bench 1000000 bench

# ---------------------------------------------------------------- 6. summary + pack
summarize() {
  $PY - "$WORK" "$ROOT" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
work, root = Path(sys.argv[1]), Path(sys.argv[2])
out = []
res = root / "bench" / "results"
# key table lines of the result files this run wrote (the header row and the data rows)
summ = work / "bench_summary.json"
benches = json.loads(summ.read_text()) if summ.exists() else []
budget = 4000
for b in benches:
    for f in b.get("files", []):
        if not f.endswith(".md"):
            continue
        lines = (res / f).read_text().splitlines()
        table = [ln for ln in lines if ln.startswith("|") and not ln.startswith("| date")]
        keep = table[:2] + table[2:][:14]
        more = len(table) - len(keep)
        block = [f"--- {f}"] + keep + ([f"... {more} more rows in bench/results/{f}"] if more > 0 else [])
        text = "\n".join(block)
        if budget - len(text) < 0:
            out.append(f"--- {f}: (see results.tar.gz)")
            continue
        budget -= len(text)
        out.append(text)
if benches:
    out.append("--- benchmarks")
    out += [f"{b['name']:<14} {b['status']:<24} {b['seconds']:>6.1f}s  {' '.join(b['files'])}" for b in benches]
smoke = work / "smoke.log"
if smoke.exists():
    lines = [ln for ln in smoke.read_text().splitlines()
             if ln.split(" ", 1)[0] in ("PASSED", "FAILED", "ERROR", "SKIPPED")]
    out.append("--- smoke (tests/test_gpu_deps.py)")
    out += [ln[:220] for ln in lines] or ["  no results (see smoke.log)"]
junit = work / "junit.xml"
if junit.exists():
    try:
        r = ET.parse(junit).getroot()
        suites = [r] if r.tag == "testsuite" else list(r)
        tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        t = sum(float(s.get("time", 0)) for s in suites)
        passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
        out.append(f"--- pytest: {passed} passed, {tot['failures']} failed, {tot['errors']} errors, "
                   f"{tot['skipped']} skipped in {t:.0f}s")
        bad = []
        for case in r.iter("testcase"):
            for kind in ("failure", "error"):
                e = case.find(kind)
                if e is not None:
                    msg = (e.get("message") or "").splitlines()[0][:160] if e.get("message") else ""
                    bad.append(f"  {'FAIL' if kind == 'failure' else 'ERR '} {case.get('classname')}::{case.get('name')}  {msg}")
        out += bad[:25] + ([f"  ... {len(bad) - 25} more"] if len(bad) > 25 else [])
    except Exception as e:  # noqa: BLE001
        out.append(f"--- pytest: junit.xml unreadable: {e}")
else:
    log = work / "tests.log"
    cut = [ln.strip()[:220] for ln in (log.read_text(errors="replace").splitlines() if log.exists() else [])
           if " FAILED " in ln or " ERROR " in ln or ln.startswith(("FAILED ", "ERROR "))]
    out.append("--- pytest: no junit.xml (tests cut by their time limit, skipped or not started)"
               + (f"; failures so far: {len(cut)}" if cut else ""))
    out += [f"  {ln}" for ln in cut[:25]]
print("\n".join(out))
EOF
}

{
  echo "=== gpu_check summary: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed)s"
  summarize
  echo "--- steps"
  printf '%s\n' "${STEP_ROWS[@]}"
} > "$WORK/summary.txt" 2>&1

# Pack: bench/results (md/json/png) + every log, one tarball; a few key files beside it.
cp "$WORK/summary.txt" "$OUT/summary.txt"
for f in tests.log bench.log; do
  [ -f "$WORK/$f" ] && tail -c $(( 15 * 1024 * 1024 )) "$WORK/$f" > "$OUT/${f/tests/pytest}"
done
[ -f "$WORK/junit.xml" ] && cp "$WORK/junit.xml" "$OUT/junit.xml"
tar -czf "$OUT/results.tar.gz" -C "$ROOT" bench/results -C "$WORK" . 2>/dev/null \
  || tar -czf "$OUT/results.tar.gz" -C "$WORK" .
echo
echo "files in \$OUT: $(cd "$OUT" && ls -l | awk 'NR>1{printf "%s (%d KiB)  ", $NF, $5/1024}')"
echo
cat "$WORK/summary.txt"
