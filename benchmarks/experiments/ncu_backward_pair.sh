#!/usr/bin/env bash
# Nsight Compute of flashsci's Hopper attention backward and cuDNN's (SDPA) on one shape of backward_sm90_quick.py's
# SHAPES (index $1; 5 = 4 x 16 x 4096 x 128): each run's longest kernel found by a first pass over every kernel's
# duration, then profiled with the sections that compare them (clocks locked by ncu's default), the headline figures
# printed; with FULL=1 flashsci's kernel also with --set full and its SASS page summarised (ncu_sass_summary.py).
# SM80=1: the portable kernel forced, against SDPA's FlashAttention-2 backward.
#   OUT=/tmp/ncu bash benchmarks/experiments/ncu_backward_pair.sh 5
set -uo pipefail
cd "$(dirname "$0")/../.."
i=${1:-5}
OUT=${OUT:-/tmp/flashsci-ncu}; mkdir -p "$OUT"
quick="python3 benchmarks/experiments/backward_sm90_quick.py --one $i"
peer=cudnn arch=90
[[ ${SM80:-0} == 1 ]] && { quick="$quick --sm80"; peer=flash; arch=80; }
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy
  --section LaunchStats --section WarpStateStats --section InstructionStats --section SchedulerStats"
for who in flashsci $peer; do
  flag=""; [[ $who == "$peer" ]] && flag="--$peer"
  ncu --csv --metrics gpu__time_duration.sum -k regex:. $quick $flag > "$OUT/durations_$who.csv" 2>&1
  name=$(python3 - "$OUT/durations_$who.csv" <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
col = {h: i for i, h in enumerate(rows[0])}
longest = max(rows[1:], key=lambda r: float(r[col["Metric Value"]].replace(",", "")))
print(longest[col["Kernel Name"]].split("(")[0].split("<")[0].split()[-1])
PY
)
  echo "== $who: $name"
  ncu -k regex:"$name" -c 1 $sections $quick $flag > "$OUT/ncu_${who}_$i.txt" 2>&1
  grep -E "Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Local Memory Spilling|Grid Size|Executed Instructions  " \
    "$OUT/ncu_${who}_$i.txt" | head -16
done
if [[ ${FULL:-0} == 1 ]]; then
  ncu -k regex:attention_bwd_sm$arch -c 1 --set full --import-source no -o "$OUT/flashsci_$i" -f $quick \
    > "$OUT/ncu_full_$i.log" 2>&1
  ncu --import "$OUT/flashsci_$i.ncu-rep" --page source --csv --print-source sass > "$OUT/flashsci_${i}_sass.csv"
  python3 benchmarks/experiments/ncu_sass_summary.py "$OUT/flashsci_${i}_sass.csv" --top 25
fi
