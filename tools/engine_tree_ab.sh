#!/usr/bin/env bash
# Same-call A/B of two source trees on the engine (tools/v4_real_dims_bench.sh, decode only unless NUM_PREFILL > 1):
# the tree as built (A), then with PATCH applied (`patch -p1`) and the CLI rebuilt (B), then PATCH reverted and
# rebuilt (A again), each on the same real-dimension checkpoint (made on the first run, kept after). For changes
# that are not a kernel choice (model code, zero fills, copies), where `--kernel-choice` cannot A/B them.
#   usage (device, after a build of BUILD_DIR (build-gpu), e.g. at the end of `tools/device_check.sh model`):
#     PATCH=old.patch bash tools/engine_tree_ab.sh
#   make the patch here: git diff NEW OLD -- src/ > old.patch (B = OLD); knobs: BATCHES (default "1 16"),
#   MAX_TOKENS (64), RUN_TIMEOUT per offline run, OFFLINE_FLAGS, and v4_real_dims_bench.sh's own.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ -f "${PATCH:-}" ] || { echo "[tree-ab] PATCH=file (a patch -p1 against this tree) is required" >&2; exit 2; }
out=${OUT:-/tmp}
export BATCHES=${BATCHES:-1 16} MAX_TOKENS=${MAX_TOKENS:-64} NUM_PREFILL=${NUM_PREFILL:-1} SLICE_BENCH=0
export CLI=${CLI:-build-gpu/bin/deepinfer}
rebuild() {
  cmake --build "${BUILD_DIR:-build-gpu}" -j "$(nproc)" --target deepinfer_cli >>"$out/tree_ab_build.log" 2>&1
  echo "[tree-ab] rebuild rc=$? at ${SECONDS}s"
}
run() {  # label
  echo "[tree-ab] ==== $1 at ${SECONDS}s"
  LOG_DIR="$out/tree_ab_$1" bash tools/v4_real_dims_bench.sh 2>&1 | grep -v "estimate" | sed "s/^/[tree-ab $1] /"
  export KEEP_CHECKPOINT=1
}
run A
patch -p1 <"$PATCH" && rebuild && run B
patch -R -p1 <"$PATCH" && rebuild && run A2
