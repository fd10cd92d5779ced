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
MAIN=$(python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9)); print(s.getsockname()[0])')
echo "main $MAIN, $(nproc) cores, $REPS runs each way, $(date -u +%FT%TZ)" | tee "$OUT/beside.txt"
one() {  # one MODE I: both nodes; prints MODE seconds
  local mode=$1 i=$2 t0 pids=()
  t0=$(date +%s.%N)
  for r in 0 1; do
    mkdir -p "$W/$mode$i/out$r"
    (cd "$ROOT/benchmarks/gpu_job" && env MASTER_ADDR="$MAIN" MASTER_PORT=$((29620 + i % 20 * 2)) NODE_RANK=$r NNODES=2 \
      NPROC_PER_NODE=1 NODEKIT_JOB_SECRET=beside-secret NODEKIT_OUTPUT_DIR="$W/$mode$i/out$r" NODEKIT_LINK_CHECK=$mode \
      NODEKIT_WORKER_DIR="$W/$mode$i/w$r" NODEKIT_RDZV_TIMEOUT=60 timeout 120 python3 -m nodekit.launcher allreduce.py \
      > "$W/$mode$i/node$r.log" 2>&1) &
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
