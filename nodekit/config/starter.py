"""The commented starter ``nodekit.toml`` that ``nodekit init`` writes."""

from __future__ import annotations

from nodekit.config.settings import DEFAULT_TORCH


def starter_config(name: str, script: str = "train.py") -> str:
    return f'''# nodekit.toml: one file describes the image and the job; every node uses the same file.
# Precedence: command-line flags > NODEKIT_* environment variables > this file > defaults.
# Example: NODEKIT_NNODES=4 overrides nnodes below; --nnodes 4 overrides both.

# ---- the image --------------------------------------------------------------------------------------------
# Tagged nodekit/<name>:<fingerprint>; the fingerprint changes whenever the base, the lock, the Dockerfile,
# nodekit's launcher or your code changes, so every node can prove it runs the same stack.
name = "{name}"
# Base image. On a real cluster pin it by digest (e.g. "nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:...").
# Without a registry, `nodekit base` creates nodekit/base:bookworm (Debian + Python) locally.
base_image = "nodekit/base:bookworm"
# Python packages for the image, resolved on this host into nodekit.lock (hash-locked) by `nodekit lock`.
# CUDA, cuDNN and NCCL come with the CUDA builds of the torch wheel.
packages = ["{DEFAULT_TORCH}"]

# ---- the job ----------------------------------------------------------------------------------------------
# The training script, relative to this directory (or: module = "mypkg.train").
script = "{script}"
args = []
# torchrun (default) starts nproc_per_node workers per node; "env" runs the script once per node with
# MASTER_ADDR/MASTER_PORT/NODE_RANK/WORLD_SIZE set, for frameworks that start their own workers (Lightning);
# "fabric" does what `fabric run` does (Fabric() without .launch(); settings accelerator, strategy, precision);
# "torch.distributed.launch" passes each worker --local-rank (or --local_rank) for older scripts.
launcher = "torchrun"
nnodes = 2
# An integer, or "auto": the node's GPU count (1 on a CPU-only node).
nproc_per_node = "auto"
# Rendezvous port on the main node; nodekit also uses the next port (master_port + 1) for its preflight.
master_port = 29500
# Seconds every node waits for the others before giving up and naming who is missing.
rdzv_timeout = 180
# Restarts of the whole worker group by torchrun after a failure (0: fail fast).
max_restarts = 0
# Seconds without a node's heartbeat before the other nodes stop and name it (0: no watchdog).
peer_timeout = 15
# Seconds in which no rank issues a collective and no rank's main thread moves: nodekit then prints every rank's
# stack grouped by where it waits and stops the job (exit 20), or only prints with stall_action = "warn" (0: never).
stall_timeout = 300
# stall_action = "stop"
# Host directory mounted at /outputs in the job (checkpoints, results).
output_dir = "outputs"
# Host networking (default) is what lets NCCL and gloo reach other machines; "bridge" only for all-local runs.
# network = "host"
# InfiniBand: "auto" passes /dev/infiniband when present (else NCCL_IB_DISABLE=1); "on" requires it; "off".
# ib = "auto"

# Extra environment variables for the job.
[env]
# NCCL_DEBUG = "WARN"

# Per-node overrides, when detection is not what you want:
# [nodes.1]
# iface = "ens5"
'''
