#!/usr/bin/env bash
# The link check before the job's start against beside it (issue 33), on one machine with cores of its own for
# each node (a lent GPU machine: 16 cores), where the 2-core virtual cluster cannot show it: two launcher nodes on
# this machine's own address (so the check runs), examples' gpu_job all-reduce, alternating
#   NODEKIT_LINK_CHECK=refuse  the check before any worker starts (the same rounds and transfers as warn; a
#                              healthy pair is not refused)
#   NODEKIT_LINK_CHECK=warn    the check beside the job's start (checks.LinksBeside)
# REPS times each; the figure is the seconds from the launchers' start to rank 0's first all-reduce.
#
#   OUT=/some/dir REPS=5 bash benchmarks/gpu_beside_bench.sh
set -u
OUT=${OUT:-/tmp/gpu-beside-out}
REPS=${REPS:-5}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/nodekit-beside.XXXXXX)
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 NODEKIT_NAME=beside-bench ALLREDUCE_BACKEND=gloo
. "$ROOT/benchmarks/gpu_job/node.sh"
MAIN=$(main_addr)
case $MAIN in 127.*) echo "gpu_beside_bench: no address but loopback here, where the link check is skipped" >&2; exit 2 ;; esac
echo "main $MAIN, $(nproc) cores, $REPS runs each way, $(date -u +%FT%TZ)" | tee "$OUT/beside.txt"
one() {  # one MODE I: both nodes; prints MODE seconds
  local mode=$1 i=$2 t0 pids=()
  t0=$(date +%s.%N)
  for r in 0 1; do
    launch_node "$W/$mode$i" "$r" 2 1 "$MAIN" $((29620 + i % 20 * 2)) 120 NODEKIT_LINK_CHECK="$mode" &
    pids+=($!)
  done
  wait "${pids[@]}"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], round(d['first_allreduce_at'] - float(sys.argv[3]), 3))" \
    "$W/$mode$i/out0/allreduce-2node-gloo.json" "$mode" "$t0" || { echo "$mode run $i failed:"; tail -5 "$W/$mode$i/node0.log"; }
}
for i in $(seq 1 "$REPS"); do
  if [ $((i % 2)) -eq 1 ]; then one refuse "$i"; one warn "$i"; else one warn "$i"; one refuse "$i"; fi
done | tee -a "$OUT/beside.txt"
python3 - "$OUT/beside.txt" <<'PY'
import statistics, sys
runs = {"refuse": [], "warn": []}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 2 and parts[0] in runs:
        runs[parts[0]].append(float(parts[1]))
med = {k: statistics.median(v) for k, v in runs.items() if v}
print("median seconds to the first all-reduce:", med, "runs:", runs)
if len(med) == 2:
    print(f"beside saves {med['refuse'] - med['warn']:.2f} s")
PY
grep -h "link check" "$W"/warn1/node0.log "$W"/refuse1/node0.log | head -4
tar -C "$W" -czf "$OUT/beside-logs.tar.gz" . 2>/dev/null
