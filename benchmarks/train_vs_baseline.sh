#!/usr/bin/env bash
# Runs the tutorial baseline (A) and `psrec bench` (B) alternately, A B A B,
# in one session on the same machine, and prints each JSON line plus the
# median of the B/A throughput ratios. Usage:
#   benchmarks/train_vs_baseline.sh [PAIRS] [extra psrec bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-3}; shift || true
baseline=${BASELINE:-../shared/bench/tutorial_baseline.py}
py=.venv/bin/python
ratios=()
for i in $(seq "$pairs"); do
  a=$($py "$baseline" "$@" 2>/dev/null | grep examples_per_sec)
  b=$($py -m psrec bench --json --model dcn "$@" 2>/dev/null | grep examples_per_sec)  # the baseline's DCN-v2
  echo "A baseline $a"
  echo "B psrec    $b"
  ratios+=("$($py -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(b['examples_per_sec']/a['examples_per_sec'])" "$a" "$b")")
done
$py -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; print(f'ratios psrec/baseline: {[round(x,3) for x in r]}  median {statistics.median(r):.3f}')" "${ratios[@]}"
