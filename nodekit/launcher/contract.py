"""What the host side and the launcher must agree on, written once: exit codes, ports, pidfiles, phase lines.

Standard library only, and nothing imported: this module lives in nodekit/launcher/ because only
``nodekit/__init__.py`` and ``nodekit/launcher/`` are copied into the image (see
``nodekit.image.builder.tree.launcher_tree``
and images/Dockerfile), so the launcher can import it there while the host side (spec, doctor, fleet, slurm, k8s)
imports it from here too. A change made here is made for both sides at once.

The environment variables the launcher reads are listed (with their defaults) in ``nodekit/launcher/__init__.py``.
"""

from __future__ import annotations

# --- the launcher's exit codes (nodekit/launcher/__init__.py says when each is used) ---------------------------
EXIT_OK = 0
EXIT_BAD_ENV = 2  # bad environment or command: missing variable, script not found, torchrun missing
EXIT_STACK_MISMATCH = 17  # stack or launch mismatch between nodes, or a node rank claimed twice
EXIT_RENDEZVOUS = 18  # a node never arrived, main unreachable or lost, or the preflight port taken
EXIT_PEER_LOST = 19  # another node was lost or failed, and this node stopped its own part of the job
EXIT_TERMINATED = 143  # terminated during preflight, or while waiting for the other nodes after torchrun

# --- ports on main, relative to MASTER_PORT ------------------------------------------------------------------
# torchrun's store listens on MASTER_PORT; nodekit's own preflight store (stack comparison, who arrived, the peer
# watchdog's heartbeats) on the next one by default. A separate port keeps a late torchrun client from ever
# talking to the preflight store.
PREFLIGHT_PORT_OFFSET = 1

# --- the host's Docker engine ---------------------------------------------------------------------------------
# Where a Docker daemon's pid may be written (the packaged dockerd's two, and the engine nodekit's test harness
# starts): its /proc/<pid>/limits are the limits containers inherit. Read on this host (nodekit.system.host.facts) and
# by the remote facts script over SSH (nodekit.backends.fleet.remote).
DOCKER_PIDFILES = ("/var/run/docker.pid", "/run/docker.pid", "/var/run/nodekit-dockerd.pid")

# --- lines the launcher prints that the head reads as phases (nodekit/runs/ records when each node reached them) ----
PREFLIGHT_OK = "nodekit preflight: ok"  # the start of the report every node prints when preflight passed
RENDEZVOUS_DONE = "nodekit: rendezvous done"  # torchrun's agent finished its rendezvous on this node
OWN_LINES = "nodekit"  # the launcher's own lines start so; the first other line is the job's first output
# ... and its multi-line reports (preflight's table and notes, the data check): a head line starting with one of
# OWN_REPORTS, then lines indented by two spaces, and preflight's timing line "(preflight 1.2 s, ...)".
OWN_REPORTS = ("nodekit preflight:", "nodekit data check:")
OWN_CONTINUED = ("  ", "(preflight ")

__all__ = [
    "DOCKER_PIDFILES",
    "EXIT_BAD_ENV",
    "EXIT_OK",
    "EXIT_PEER_LOST",
    "EXIT_RENDEZVOUS",
    "EXIT_STACK_MISMATCH",
    "EXIT_TERMINATED",
    "OWN_CONTINUED",
    "OWN_LINES",
    "OWN_REPORTS",
    "PREFLIGHT_OK",
    "PREFLIGHT_PORT_OFFSET",
    "RENDEZVOUS_DONE",
]
