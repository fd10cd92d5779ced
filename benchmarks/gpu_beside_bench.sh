#!/usr/bin/env bash
# The link check before the job's start against beside it (issue 33), on one machine with cores of its own for
# each node (a lent GPU machine: 16 cores), where the 2-core virtual cluster cannot show it: two launcher nodes on
# this machine's own address (so the check runs), examples' gpu_job all-reduce, alternating
#   NODEKIT_LINK_CHECK=refuse  the check before any worker starts (the same rounds and transfers as warn; a
#                              healthy pair is not refused)
#   NODEKIT_LINK_CHECK=warn    the check beside the job's start (checks.LinksBeside)
#   NODEKIT_LINK_CHECK=off     no check (MODES="off warn": what the check beside the start costs)
# REPS times each, alternating; NODES launchers (2 or 4); the figure is the seconds from the launchers' start to
# rank 0's first all-reduce.
#
#   OUT=/some/dir REPS=5 NODES=2 MODES="refuse warn" bash benchmarks/gpu_beside_bench.sh
set -u
OUT=${OUT:-/tmp/gpu-beside-out}
REPS=${REPS:-5}
NODES=${NODES:-2}
read -r -a MODES <<< "${MODES:-refuse warn}"
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/nodekit-beside.XXXXXX)
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 NODEKIT_NAME=beside-bench ALLREDUCE_BACKEND=gloo
. "$ROOT/benchmarks/gpu_job/node.sh"
MAIN=$(main_addr)
case $MAIN in 127.*) echo "gpu_beside_bench: no address but loopback here, where the link check is skipped" >&2; exit 2 ;; esac
TAG=$NODES-${MODES[0]}-${MODES[1]}
echo "main $MAIN, $(nproc) cores, $NODES nodes, ${MODES[*]}, $REPS runs each way, $(date -u +%FT%TZ)" | tee "$OUT/beside-$TAG.txt"
one() {  # one MODE I: both nodes; prints MODE seconds
  local mode=$1 i=$2 t0 pids=()
  t0=$(date +%s.%N)
  for r in $(seq 0 $((NODES - 1))); do
    launch_node "$W/$TAG/$mode$i" "$r" "$NODES" 1 "$MAIN" $((29620 + i % 20 * 2)) 120 NODEKIT_LINK_CHECK="$mode" &
    pids+=($!)
  done
  wait "${pids[@]}"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[2], round(d['first_allreduce_at'] - float(sys.argv[3]), 3))" \
    "$W/$TAG/$mode$i/out0/allreduce-${NODES}node-gloo.json" "$mode" "$t0" || { echo "$mode run $i failed:"; tail -5 "$W/$TAG/$mode$i/node0.log"; }
}
for i in $(seq 1 "$REPS"); do
  if [ $((i % 2)) -eq 1 ]; then one "${MODES[0]}" "$i"; one "${MODES[1]}" "$i"; else one "${MODES[1]}" "$i"; one "${MODES[0]}" "$i"; fi
done | tee -a "$OUT/beside-$TAG.txt"
python3 - "$OUT/beside-$TAG.txt" "${MODES[@]}" <<'PY'
import statistics, sys
a, b = sys.argv[2], sys.argv[3]
runs = {a: [], b: []}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 2 and parts[0] in runs:
        runs[parts[0]].append(float(parts[1]))
med = {k: statistics.median(v) for k, v in runs.items() if v}
print("median seconds to the first all-reduce:", med, "runs:", runs)
if len(med) == 2:
    print(f"{b} minus {a}: {med[b] - med[a]:+.2f} s")
PY
grep -h "link check" "$W/$TAG"/*1/node0.log | head -4
tar -C "$W" -czf "$OUT/beside-logs-$TAG.tar.gz" . 2>/dev/null
