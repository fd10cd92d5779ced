# Sourced by benchmarks/gpu_device_run.sh and benchmarks/gpu_beside_bench.sh (ROOT set to the repository root).

# This machine's own address toward the world (a route is enough, nothing is sent), else 127.0.0.1.
main_addr() {
  python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9)); print(s.getsockname()[0])' 2>/dev/null || echo 127.0.0.1
}

# launch_node DIR RANK NNODES NPROC MAIN PORT DEADLINE_S [VAR=VALUE...]: one launcher running allreduce.py, with the
# environment a compose file gives a node, ended after DEADLINE_S; its output in DIR/node<RANK>.log, the job's in
# DIR/out<RANK>. Returns the launcher's exit code (124: the deadline).
launch_node() {
  local dir=$1 rank=$2 nnodes=$3 nproc=$4 main=$5 port=$6 deadline=$7
  shift 7
  mkdir -p "$dir/out$rank"
  # Exported in a subshell, not given to env(1): the job secret is in no process's arguments.
  (cd "$ROOT/benchmarks/gpu_job" && export MASTER_ADDR="$main" MASTER_PORT="$port" NODE_RANK="$rank" \
    NNODES="$nnodes" NPROC_PER_NODE="$nproc" NODEKIT_JOB_SECRET=gpu-check-secret NODEKIT_OUTPUT_DIR="$dir/out$rank" \
    NODEKIT_WORKER_DIR="$dir/workers$rank" NODEKIT_RDZV_TIMEOUT=90 "$@" &&
    exec timeout "$deadline" python3 -m nodekit.launcher allreduce.py > "$dir/node$rank.log" 2>&1)
}
