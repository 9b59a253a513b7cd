#!/usr/bin/env bash
# A/B of `psrec bench` between two checkouts on this machine, alternating
# A B A B in one session, and the median of the B/A throughput ratios.
# A is another checkout with its own .venv, e.g. the previous commit:
#   git worktree add /tmp/old HEAD~1 && (cd /tmp/old && python3.11 -m venv .venv \
#     && .venv/bin/pip install -q -e .)
# Usage: benchmarks/ab_versions.sh OLD_CHECKOUT [PAIRS] [psrec bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1; shift
pairs=${1:-3}; shift || true
py=.venv/bin/python
ratios=()
for i in $(seq "$pairs"); do
  a=$(cd "$old" && .venv/bin/psrec bench --json "$@" 2>/dev/null | grep examples_per_sec)
  b=$(.venv/bin/psrec bench --json "$@" 2>/dev/null | grep examples_per_sec)
  echo "A old $a"
  echo "B new $b"
  ratios+=("$($py -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(b['examples_per_sec']/a['examples_per_sec'])" "$a" "$b")")
done
$py -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; print(f'ratios new/old: {[round(x,3) for x in r]}  median {statistics.median(r):.3f}')" "${ratios[@]}"
