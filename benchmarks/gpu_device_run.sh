#!/usr/bin/env bash
# The GPU device check (docs/benchmarks.md, "GPU checks on a lent GPU machine"): one prepared run on a machine with
# an NVIDIA GPU and torch, from the repository root, nothing installed (the launcher is standard library + torch):
#
#   OUT=/some/dir bash benchmarks/gpu_device_run.sh
#
# 1. GPU facts: nvidia-smi -L, torch, CUDA, NCCL as torch reports them; the preflight's own facts
#    (benchmarks/gpu_facts_check.py: nvidia-smi and /proc read, cross-checked against torch's CUDA view).
# 2. GPU health through the launcher's code (benchmarks/gpu_device_check.py): nvidia-smi -q, dmesg, dcgmi where
#    installed, parsed and judged, cross-checked against nvidia-smi's CSV query; each tool's seconds.
# 3. One node through the launcher: python -m nodekit.launcher allreduce.py, nproc_per_node = every GPU: the
#    launcher's own GPU health check, torchrun in its process, NCCL init and all-reduce (benchmarks/gpu_job).
# 4. Two nodes on this machine through the launcher (this machine's own address as main): the preflight exchanges
#    both nodes' stack facts (GPU model, driver, count, CUDA, cuDNN, NCCL) and GPU health, the link check runs
#    between them, then the all-reduce over gloo on the GPU (the two nodes share the GPU, which NCCL refuses).
# 5. The same with NCCL: what a user sees when two ranks land on one GPU (expected to fail, named).
# Everything lands in $OUT/log.txt and $OUT/gpu-check.tar.gz (raw outputs, the launchers' logs, results).
set -u
OUT=${OUT:-/tmp/gpu-device-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/nodekit-gpu.XXXXXX)
exec > >(tee "$OUT/log.txt") 2>&1
stamp() { date -u +%H:%M:%S.%N | cut -c1-12; }
step() { echo; echo "== $(stamp) $*"; }
finish() { tar -C "$W" -czf "$OUT/gpu-check.tar.gz" . 2>/dev/null; echo "== $(stamp) done"; }
trap finish EXIT
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 NODEKIT_NAME=gpu-check
. "$ROOT/benchmarks/gpu_job/node.sh"

step "1. GPU facts"
date -u; uname -r; nproc; (nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv) | tee "$W/facts.txt"
python3 -c 'import sys, torch; g = torch.cuda.is_available(); print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version() if g else "-",
  "gpus", torch.cuda.device_count())' | tee -a "$W/facts.txt"

TIMEFORMAT="import torch: %R s"; time python3 -c "import torch"; time python3 -c "import torch"
echo "the preflight's facts (benchmarks/gpu_facts_check.py):"
timeout 120 python3 "$ROOT/benchmarks/gpu_facts_check.py" | tee "$W/facts.json"; echo "rc=${PIPESTATUS[0]}"

step "2. GPU health (benchmarks/gpu_device_check.py)"
timeout 300 python3 "$ROOT/benchmarks/gpu_device_check.py" --out "$W/health"; echo "rc=$?"

GPUS=$(python3 -c 'import torch; print(max(1, torch.cuda.device_count()))')
node() {  # node RANK NNODES NPROC MAIN TAG [VAR=VALUE...]: one launcher, as the compose file's environment starts it
  local rank=$1 nnodes=$2 nproc=$3 main=$4 tag=$5; shift 5
  launch_node "$W/$tag" "$rank" "$nnodes" "$nproc" "$main" 29611 240 "$@"
  local rc=$?
  echo "node $rank exit $rc"; sed "s/^/  [$tag node $rank] /" "$W/$tag/node$rank.log" | tail -n 60
  return $rc
}
pair() {  # pair TAG [VAR=VALUE...]: two nodes on this machine at once
  local tag=$1; shift
  t0=$(date +%s.%N)
  node 0 2 1 "$MAIN" "$tag" "$@" > "$W/$tag.n0" 2>&1 & local p0=$!
  node 1 2 1 "$MAIN" "$tag" "$@" > "$W/$tag.n1" 2>&1 & local p1=$!
  wait $p0; local r0=$?; wait $p1; local r1=$?
  cat "$W/$tag.n0" "$W/$tag.n1"
  echo "$tag: exits $r0 $r1, $(python3 -c "import time; print(round(time.time() - $t0, 2))") s"
}

step "3. one node, $GPUS GPU(s): launcher -> torchrun -> NCCL all-reduce"
t0=$(date +%s.%N); node 0 1 "$GPUS" 127.0.0.1 one; echo "one: $(python3 -c "import time; print(round(time.time() - $t0, 2))") s"

MAIN=$(main_addr)
step "4. two nodes on this machine (main $MAIN): preflight with GPU facts, GPU health, link check, gloo all-reduce on the GPU"
pair two ALLREDUCE_BACKEND=gloo

step "5. two nodes sharing one GPU with NCCL (expected to fail, named)"
pair nccl2 ALLREDUCE_BACKEND=nccl NODEKIT_LINK_CHECK=off NODEKIT_PEER_TIMEOUT=5
