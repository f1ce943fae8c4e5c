#!/usr/bin/env bash
# A/B on the GPU machine: build the working tree ("new") and the same tree with the files under $OLD_DIR put back
# ("old", same relative paths), run the GPU tests on new (TESTS=1), then time both alternately ROUNDS times with
# a quick script (default benchmarks/attn_quick.py; QUICK_ARGS passed on).
#   OLD_DIR=ab_old QUICK_ARGS="--head-dim 64" bash benchmarks/ab_quick.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashsci-out}; mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
build() { # $1: install target
  local t0=$(date +%s)
  FLASHSCI_CUDA_ARCHS=90a python3 -m pip install --no-build-isolation --no-deps -q --target "$1" . >"$OUT/logs/build_$(basename $1).log" 2>&1 \
    || { tail -30 "$OUT/logs/build_$(basename $1).log"; exit 1; }
  echo "built $1 in $(( $(date +%s) - t0 )) s"
}
build /tmp/ab_new
if [[ ${TESTS:-1} == 1 ]]; then
  PYTHONPATH=/tmp/ab_new python3 -m pytest -q -x tests/ ${TEST_ARGS:-} 2>&1 | tee "$OUT/logs/tests.log" | tail -4
fi
mkdir -p /tmp/ab_keep
(cd "$OLD_DIR" && find . -type f) | while read -r f; do mkdir -p "/tmp/ab_keep/$(dirname "$f")"; cp "$f" "/tmp/ab_keep/$f"; cp "$OLD_DIR/$f" "$f"; done
build /tmp/ab_old
(cd /tmp/ab_keep && find . -type f) | while read -r f; do cp "/tmp/ab_keep/$f" "$f"; done
for round in $(seq ${ROUNDS:-2}); do
  for v in old new; do
    echo "== $v, round $round"
    PYTHONPATH=/tmp/ab_$v python3 ${QUICK:-benchmarks/attn_quick.py} ${QUICK_ARGS:-} 2>&1 | tail -${QUICK_TAIL:-10}
  done
done
