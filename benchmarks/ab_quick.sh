#!/usr/bin/env bash
# A/B on the GPU machine: build the working tree ("new") and, for each folder in VARIANTS (default: $OLD_DIR),
# the same tree with that folder's files put back (same relative paths, named after the folder), run the GPU
# tests on new (TESTS=1; stopped after TEST_TIMEOUT seconds, a hung kernel included), then time every build in
# turn ROUNDS times with a quick script (default benchmarks/attn_quick.py; QUICK_ARGS passed on; each run stopped
# after QUICK_TIMEOUT seconds).
#   OLD_DIR=ab_old QUICK_ARGS="--head-dim 64" bash benchmarks/ab_quick.sh
#   VARIANTS="ab_old ab_mid" QUICK=benchmarks/gemm_quick.py QUICK_ARGS=--epilogue bash benchmarks/ab_quick.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashsci-out}; mkdir -p "$OUT/logs"
VARIANTS=${VARIANTS:-$OLD_DIR}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
name() { local v; v=$(basename "$1"); echo "${v#ab_}"; }  # ab_old -> old
build() { # $1: install target (emptied first: pip --target keeps what a warm machine's last run installed there)
  local t0=$(date +%s)
  rm -rf "$1"
  FLASHSCI_CUDA_ARCHS=90a python3 -m pip install --no-build-isolation --no-deps -q --target "$1" . >"$OUT/logs/build_$(basename $1).log" 2>&1 \
    || { tail -30 "$OUT/logs/build_$(basename $1).log"; exit 1; }
  echo "built $1 in $(( $(date +%s) - t0 )) s"
}
# a warm machine keeps the CMake build dir, whose objects (the last variant built) are newer than the working tree's
# sources as they arrive: touch those so that new is compiled from them
[[ -d build ]] && find kernels csrc -type f -exec touch {} +
build /tmp/ab_new
if [[ ${TESTS:-1} == 1 ]]; then
  PYTHONPATH=/tmp/ab_new timeout -k 5 ${TEST_TIMEOUT:-900} python3 -m pytest -q -x tests/ ${TEST_ARGS:-} 2>&1 | tee "$OUT/logs/tests.log" | tail -4
fi
rm -rf /tmp/ab_keep && mkdir -p /tmp/ab_keep
for dir in $VARIANTS; do  # the working tree's files that any variant replaces, kept to put back
  (cd "$dir" && find . -type f) | while read -r f; do mkdir -p "/tmp/ab_keep/$(dirname "$f")"; cp -n "$f" "/tmp/ab_keep/$f"; done
done
for dir in $VARIANTS; do
  (cd /tmp/ab_keep && find . -type f) | while read -r f; do cp "/tmp/ab_keep/$f" "$f"; done
  (cd "$dir" && find . -type f) | while read -r f; do cp "$dir/$f" "$f"; done
  build "/tmp/ab_$(name "$dir")"
done
(cd /tmp/ab_keep && find . -type f) | while read -r f; do cp "/tmp/ab_keep/$f" "$f"; done
for round in $(seq ${ROUNDS:-2}); do
  for v in $VARIANTS new; do
    v=$(name "$v")
    echo "== $v, round $round"
    PYTHONPATH=/tmp/ab_$v timeout -k 5 ${QUICK_TIMEOUT:-300} python3 -u ${QUICK:-benchmarks/attn_quick.py} ${QUICK_ARGS:-} 2>&1 | tail -${QUICK_TAIL:-10}
  done
done
