#!/usr/bin/env bash
# One call on the GPU machine: build for its own architecture, GPU tests, compute-sanitizer, pytest-benchmark run,
# host overhead, benchmark.
#   STEPS="build test sanitize benchtest host bench pack" BENCH_ARGS="--sets seed,protein,sweep" bash benchmarks/gpu_check.sh
#   TEST_PATHS="tests/test_attention_backward_gpu.py" STEPS="build test" bash benchmarks/gpu_check.sh
#   TEST_ARGS="-n 4": parallel test processes (8 can run one GPU out of memory)
#   STEPS=pack bash benchmarks/gpu_check.sh: only the packing, after other commands wrote into $OUT
# Logs and results go under $OUT (the device tool brings them back); results also to benchmarks/results. The pack step
# (last) puts everything under $OUT into one $OUT/out.tar.gz, as the device tool brings back at most 8 files
# (unpack here: tar -xzf FILES_AT/out.tar.gz -C DIR).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashsci-out}
STEPS=" ${STEPS:-build test sanitize bench pack} "   # padded: steps match as whole words
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
status=0
[[ $STEPS == " pack " ]] || nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/logs/gpu.txt"

if [[ $STEPS == *" build "* ]]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  [[ $cc == 90 ]] && cc=90a   # Hopper: the wgmma kernel needs the arch-specific target
  t0=$(date +%s)
  [[ -d build ]] && find kernels csrc -type f -exec touch {} +   # a warm machine's objects may be newer than the sources
  FLASHSCI_CUDA_ARCHS=${FLASHSCI_CUDA_ARCHS:-$cc} python3 -m pip install --no-build-isolation --no-deps -q -e . \
    ${CUDA_FLAGS:+-C "cmake.define.CMAKE_CUDA_FLAGS=$CUDA_FLAGS"} \
    >"$OUT/logs/build.log" 2>&1 || { tail -40 "$OUT/logs/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s for sm_$cc"
  python3 -c "import flashsci; print(flashsci.build_info(), flashsci.device_info())"
fi
if [[ $STEPS == *" test "* ]]; then
  python3 -m pytest -q --maxfail=30 ${TEST_PATHS:-tests/} ${TEST_ARGS:-} 2>&1 | tee "$OUT/logs/tests.log" | tail -40 || status=1
fi
if [[ $STEPS == *" sanitize "* ]]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 python3 benchmarks/sanitize_cases.py >"$OUT/logs/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/logs/sanitize_$tool.log" | tail -1))"
    grep -m1 -B2 -A12 -E "Warning|Error" "$OUT/logs/sanitize_$tool.log" | head -30
  done
fi
if [[ $STEPS == *" benchtest "* ]]; then
  python3 -m pytest -q -m bench tests/test_bench.py --benchmark-json="$OUT/pytest_bench.json" \
    --benchmark-columns=median,min,max,rounds 2>&1 | tee "$OUT/logs/pytest_bench.log" | tail -40 || status=1
fi
if [[ $STEPS == *" host "* ]]; then
  nvcc -O2 -o /tmp/launch_cost benchmarks/launch_cost.cu -lcuda && /tmp/launch_cost 2>&1 | tee "$OUT/logs/launch_cost.log"
  python3 benchmarks/host_overhead.py --out "$OUT" 2>&1 | tee "$OUT/logs/host.log"
fi
if [[ $STEPS == *" bench "* ]]; then
  python3 -m flashsci.bench ${BENCH_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/logs/bench.log" | tail -60
fi
if [[ $STEPS == *" pack "* ]]; then
  tar -czf /tmp/flashsci-out.tar.gz -C "$OUT" --exclude=./out.tar.gz . && find "$OUT" -mindepth 1 -delete &&
    mv /tmp/flashsci-out.tar.gz "$OUT/out.tar.gz" && echo "packed: $OUT/out.tar.gz"
fi
exit $status
