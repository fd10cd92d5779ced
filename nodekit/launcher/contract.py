"""What the host side and the launcher must agree on, written once: exit codes, ports, pidfiles.

Standard library only, and nothing imported: this module lives in nodekit/launcher/ because only
``nodekit/__init__.py`` and ``nodekit/launcher/`` are copied into the image (see
``nodekit.image.builder.tree.launcher_tree``
and images/Dockerfile), so the launcher can import it there while the host side (spec, doctor, fleet, slurm, k8s)
imports it from here too. A change made here is made for both sides at once.

The environment variables the launcher reads are listed (with their defaults) in ``nodekit/launcher/__init__.py``.
"""

from __future__ import annotations

# --- the launcher's exit codes (nodekit/launcher/__init__.py says when each is used) ---------------------------
EXIT_OK = 0  # the job succeeded on this node (every worker exited 0)
EXIT_BAD_ENV = 2  # bad environment or command: missing variable, script not found, torchrun missing
EXIT_STACK_MISMATCH = 17  # stack or launch mismatch between nodes, or a node rank claimed twice
EXIT_RENDEZVOUS = 18  # a node never arrived, main unreachable or lost, or the preflight port taken
EXIT_PEER_LOST = 19  # another node was lost or failed, and this node stopped its own part of the job
EXIT_LINK = 20  # the link check refused: a pair could not connect, is below min_link_gbit, or (links = refuse) slow
EXIT_GPU = 21  # the GPU health check refused (gpus = "refuse"): a GPU missing, with errors, pending repair, throttled
EXIT_TERMINATED = 143  # terminated during preflight, or while waiting for the other nodes after torchrun

# --- ports on main, relative to MASTER_PORT ------------------------------------------------------------------
# torchrun's store listens on MASTER_PORT; nodekit's own preflight store (stack comparison, who arrived, the peer
# watchdog's heartbeats) on the next one by default. A separate port keeps a late torchrun client from ever
# talking to the preflight store.
PREFLIGHT_PORT_OFFSET = 1

# --- checks only -------------------------------------------------------------------------------------------
# `nodekit doctor --fleet` starts the job's containers with this set to 1: the launcher runs the preflight, the GPU
# health check and the link check, prints them, and exits with their verdict instead of starting any worker.
CHECKS_ONLY_ENV = "NODEKIT_CHECKS_ONLY"

# --- the host's Docker engine ---------------------------------------------------------------------------------
# Where a Docker daemon's pid may be written (the packaged dockerd's two, and the engine nodekit's test harness
# starts): its /proc/<pid>/limits are the limits containers inherit. Read on this host (nodekit.system.host.facts) and
# by the remote facts script over SSH (nodekit.backends.fleet.remote).
DOCKER_PIDFILES = ("/var/run/docker.pid", "/run/docker.pid", "/var/run/nodekit-dockerd.pid")

__all__ = [
    "CHECKS_ONLY_ENV",
    "DOCKER_PIDFILES",
    "EXIT_BAD_ENV",
    "EXIT_GPU",
    "EXIT_LINK",
    "EXIT_OK",
    "EXIT_PEER_LOST",
    "EXIT_RENDEZVOUS",
    "EXIT_STACK_MISMATCH",
    "EXIT_TERMINATED",
    "PREFLIGHT_PORT_OFFSET",
]
