#!/usr/bin/env bash
# A/B on the GPU machine: build the working tree ("new") and, for each folder in VARIANTS (default: $OLD_DIR), a copy
# of the tree with that folder's files put in (same relative paths, named after the folder), all at once, each from
# a fresh CMake build folder into /tmp/ab_<name>; print each library's kernel symbols matching SYMBOL as a check of
# what was built; run the GPU tests on new (TESTS=1: TEST_PATHS, default tests/; stopped after TEST_TIMEOUT seconds, a
# hung kernel included), then time every build in turn ROUNDS times with a quick script (default
# benchmarks/attn_quick.py; QUICK_ARGS passed on; each run stopped after QUICK_TIMEOUT seconds). BUILD=0 times the
# builds a previous call left on a machine still warm; TIMED="old new" times only those.
#   OLD_DIR=ab_old QUICK_ARGS="--head-dim 64" bash benchmarks/ab_quick.sh
#   VARIANTS="ab_old ab_mid" QUICK=benchmarks/gemm_quick.py QUICK_ARGS=--epilogue bash benchmarks/ab_quick.sh
#   OLD_DIR=ab_old QUICK=benchmarks/kpm_quick.py QUICK_ARGS="--fasta data/uniprot20k.fasta.gz" SYMBOL=kpm_prepare ...
# Two ways earlier versions of this script timed one build as every variant: a shared CMake build
# folder whose objects were newer than the sources, and gpu_check.sh's editable install, whose import hook comes
# before PYTHONPATH. So builds share no folder, an installed flashsci is removed first, and each run's import is
# checked to come from its own build.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashsci-out}; mkdir -p "$OUT/logs"
VARIANTS=${VARIANTS:-$OLD_DIR}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -m pip uninstall -y -q flashsci >/dev/null 2>&1
name() { local v; v=$(basename "$1"); echo "${v#ab_}"; }  # ab_old -> old
build() { # $1: name, $2: source tree
  local t0=$(date +%s)
  rm -rf "/tmp/ab_$1" "/tmp/abbuild_$1"
  (cd "$2" && FLASHSCI_CUDA_ARCHS=90a python3 -m pip install --no-build-isolation --no-deps -q --target "/tmp/ab_$1" \
    -C build-dir="/tmp/abbuild_$1" . >"$OUT/logs/build_$1.log" 2>&1) || { tail -30 "$OUT/logs/build_$1.log"; return 1; }
  local syms
  syms=$(cuobjdump -symbols /tmp/ab_$1/flashsci/*.so | grep -o "_Z[0-9]*[A-Za-z0-9_]*${SYMBOL:-attention_fwd_sm90}[A-Za-z0-9_]*" | sort -u)
  echo "built $1 in $(( $(date +%s) - t0 )) s; ${SYMBOL:-attention_fwd_sm90}: $(echo "$syms" | grep -c .) symbols, e.g. $(echo "$syms" | head -1 | cut -c1-70)"
}
names=new
[[ ${BUILD:-1} == 1 ]] && build new . &
for dir in $VARIANTS; do
  v=$(name "$dir"); names="$names $v"
  [[ ${BUILD:-1} == 1 ]] || continue
  rm -rf "/tmp/src_$v" && mkdir -p "/tmp/src_$v"
  tar --exclude=./build --exclude='./ab_*' --exclude=./data --exclude=./.git -cf - . | tar -xf - -C "/tmp/src_$v"
  (cd "$dir" && find . -type f) | while read -r f; do cp "$dir/$f" "/tmp/src_$v/$f"; done
  build "$v" "/tmp/src_$v" &
done
wait
for v in $names; do
  [[ $(PYTHONPATH=/tmp/ab_$v python3 -c "import flashsci; print(flashsci.__file__)") == /tmp/ab_$v/* ]] ||
    { echo "flashsci for $v does not import from /tmp/ab_$v"; exit 1; }
done
if [[ ${TESTS:-1} == 1 ]]; then
  PYTHONPATH=/tmp/ab_new timeout -k 5 ${TEST_TIMEOUT:-900} python3 -m pytest -q -x ${TEST_PATHS:-tests/} ${TEST_ARGS:-} 2>&1 | tee "$OUT/logs/tests.log" | tail -4
fi
for round in $(seq ${ROUNDS:-2}); do
  for v in ${TIMED:-${names#new } new}; do
    echo "== $v, round $round"
    PYTHONPATH=/tmp/ab_$v timeout -k 5 ${QUICK_TIMEOUT:-300} python3 -u ${QUICK:-benchmarks/attn_quick.py} ${QUICK_ARGS:-} 2>&1 | tail -${QUICK_TAIL:-10}
  done
done
