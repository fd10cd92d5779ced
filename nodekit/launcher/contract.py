"""What the host side and the launcher must agree on, written once: launch modes, variable names, labels, exit
codes, ports, pidfiles, phase lines.

Standard library only, and nothing imported: this module lives in nodekit/launcher/ because only
``nodekit/__init__.py`` and ``nodekit/launcher/`` are copied into the image (see
``nodekit.image.builder.tree.launcher_tree`` and images/Dockerfile), so the launcher can import it there while the
host side (spec, planning, doctor, fleet, slurm, k8s) imports it from here too. A change made here is made for both
sides at once; ``tests/unit/launcher/test_contract_names.py`` fails when a name written here is written out as a
literal anywhere else in nodekit/.

The environment variables the launcher reads are listed (with their defaults) in ``nodekit/launcher/__init__.py``.
"""

from __future__ import annotations

# --- launch modes (nodekit.toml's ``launcher``, NODEKIT_LAUNCHER) ------------------------------------------------
# Adding one: its name here and in LAUNCH_MODES, and its exec plan in nodekit/launcher/plan.py (STYLES). Nothing else
# names a mode, unless it has settings of its own (as fabric has), which the host side renders (job/env.py).


class LaunchMode:
    TORCHRUN = "torchrun"  # torchrun starts nproc_per_node workers (the default)
    FABRIC = "fabric"  # what `fabric run` does: torchrun plus Lightning's LT_* variables
    ENV = "env"  # the command once per node; the framework (Lightning Trainer) starts its own workers
    DISTRIBUTED_LAUNCH = "torch.distributed.launch"  # torchrun, each worker given --local-rank
    MPIRUN = "mpirun"  # nproc_per_node processes with Open MPI's OMPI_COMM_WORLD_* variables (no MPI runtime)


LAUNCH_MODES = (LaunchMode.TORCHRUN, LaunchMode.FABRIC, LaunchMode.ENV, LaunchMode.DISTRIBUTED_LAUNCH,
                LaunchMode.MPIRUN)  # fmt: skip
DEFAULT_LAUNCH_MODE = LaunchMode.TORCHRUN


# --- environment variable names --------------------------------------------------------------------------------
class Env:
    """The variables the host side sets in a node's container (nodekit/job/env.py) and the launcher reads
    (nodekit/launcher/config.py), or that nodekit sets for the job's own processes."""

    # torch's rendezvous variables, set by nodekit for every mode
    MASTER_ADDR = "MASTER_ADDR"
    MASTER_PORT = "MASTER_PORT"
    NODE_RANK = "NODE_RANK"
    NNODES = "NNODES"
    NPROC_PER_NODE = "NPROC_PER_NODE"
    WORLD_SIZE = "WORLD_SIZE"
    # torch's per-process variables: torchrun sets them per worker; nobody else may (settings refuse them in env)
    RANK = "RANK"
    LOCAL_RANK = "LOCAL_RANK"
    GROUP_RANK = "GROUP_RANK"
    LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
    # nodekit's own
    NAME = "NODEKIT_NAME"
    LAUNCHER = "NODEKIT_LAUNCHER"
    MAX_RESTARTS = "NODEKIT_MAX_RESTARTS"
    RDZV_TIMEOUT = "NODEKIT_RDZV_TIMEOUT"
    PEER_TIMEOUT = "NODEKIT_PEER_TIMEOUT"
    PREFLIGHT = "NODEKIT_PREFLIGHT"
    PREFLIGHT_PORT = "NODEKIT_PREFLIGHT_PORT"
    OUTPUT_DIR = "NODEKIT_OUTPUT_DIR"
    NPROC_DECLARED = "NODEKIT_NPROC_DECLARED"
    GPUS_DECLARED = "NODEKIT_GPUS_DECLARED"
    DATA_CHECK = "NODEKIT_DATA_CHECK"
    ACCELERATOR = "NODEKIT_ACCELERATOR"
    STRATEGY = "NODEKIT_STRATEGY"
    PRECISION = "NODEKIT_PRECISION"
    IMAGE_ID = "NODEKIT_IMAGE_ID"
    JOB_SECRET = "NODEKIT_JOB_SECRET"
    RESOLVE_MAIN = "NODEKIT_RESOLVE_MAIN"
    EXIT_GUARD = "NODEKIT_EXIT_GUARD"
    ALLOW_HETEROGENEOUS_GPUS = "NODEKIT_ALLOW_HETEROGENEOUS_GPUS"
    RESTART_COUNT = "NODEKIT_RESTART_COUNT"  # nodekit run's attempt, for the training script
    # the stall watch (watchdog/stall.py): no progress on any rank for this long, then stop (or warn)
    STALL_TIMEOUT = "NODEKIT_STALL_TIMEOUT"
    STALL_ACTION = "NODEKIT_STALL_ACTION"
    # where each job process's stack dump and progress record live (stacks/hook.py)
    WORKER_DIR = "NODEKIT_WORKER_DIR"
    # `nodekit doctor --fleet` starts the job's containers with this set to 1: the launcher runs the preflight, the
    # GPU health check and the link check, prints them, and exits with their verdict instead of starting any worker.
    CHECKS_ONLY = "NODEKIT_CHECKS_ONLY"
    # the checks before the job ([health]): the link check between every pair of nodes, and GPU health
    LINK_CHECK = "NODEKIT_LINK_CHECK"
    MIN_LINK_GBIT = "NODEKIT_MIN_LINK_GBIT"
    LINK_SECONDS = "NODEKIT_LINK_SECONDS"
    GPU_HEALTH = "NODEKIT_GPU_HEALTH"
    DCGM = "NODEKIT_DCGM"
    # the image's own ENV (images/Dockerfile's metadata arguments; the launcher compares the fingerprint)
    FINGERPRINT = "NODEKIT_FINGERPRINT"
    LOCK_SHA256 = "NODEKIT_LOCK_SHA256"
    TORCH = "NODEKIT_TORCH"
    PYTHON = "NODEKIT_PYTHON"
    BASE = "NODEKIT_BASE"
    BASE_ID = "NODEKIT_BASE_ID"
    VERSION = "NODEKIT_VERSION"
    # the socket interface toward main (NCCL's and gloo's own names), shown in the launcher's start line
    GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
    NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"


# --- labels --------------------------------------------------------------------------------------------------
class Label:
    """Docker labels: on every node's container (who it is) and on the image nodekit builds (what it holds)."""

    NAME = "org.nodekit.name"
    RANK = "org.nodekit.rank"
    NNODES = "org.nodekit.nnodes"
    VERSION = "org.nodekit.version"
    SLURM_JOB = "org.nodekit.slurm-job"  # a Slurm job's containers, removed by it (or a site epilog)
    FINGERPRINT = "org.nodekit.fingerprint"
    LOCK = "org.nodekit.lock-sha256"
    TORCH = "org.nodekit.torch"
    PYTHON = "org.nodekit.python"
    BASE = "org.nodekit.base"
    BASE_ID = "org.nodekit.base-id"


# --- the launcher's exit codes (nodekit/launcher/__init__.py says when each is used) ---------------------------
EXIT_OK = 0  # the job succeeded on this node (every worker exited 0)
EXIT_BAD_ENV = 2  # bad environment or command: missing variable, script not found, torchrun missing
EXIT_STACK_MISMATCH = 17  # stack or launch mismatch between nodes, or a node rank claimed twice
EXIT_RENDEZVOUS = 18  # a node never arrived, main unreachable or lost, or the preflight port taken
EXIT_PEER_LOST = 19  # another node was lost or failed, and this node stopped its own part of the job
EXIT_LINK = 20  # the link check refused: a pair could not connect, is below min_link_gbit, or (links = refuse) slow
EXIT_GPU = 21  # the GPU health check refused (gpus = "refuse"): a GPU missing, with errors, pending repair, throttled
EXIT_STALLED = 22  # no rank made progress for NODEKIT_STALL_TIMEOUT (stall_action = stop): every node stops
EXIT_TERMINATED = 143  # terminated during preflight, or while waiting for the other nodes after torchrun

# --- ports on main, relative to MASTER_PORT ------------------------------------------------------------------
# torchrun's store listens on MASTER_PORT; nodekit's own preflight store (stack comparison, who arrived, the peer
# watchdog's heartbeats) on the next one by default. A separate port keeps a late torchrun client from ever
# talking to the preflight store.
TORCHRUN_KILL_AFTER_S = 30
"""torchrun's agent, stopped, sends its workers the signal and SIGKILLs those still there this long after
(torch.distributed.elastic's ``PContext.close`` default): a worker in the middle of writing a checkpoint is given it."""
PREFLIGHT_PORT_OFFSET = 1


def preflight_port_for(master_port: int) -> int:
    """The preflight store's port for a job whose rendezvous is on ``master_port``: every side asks here."""
    return master_port + PREFLIGHT_PORT_OFFSET


# --- the link check's transfer per pair and direction ([health] link_seconds, NODEKIT_LINK_SECONDS) -----------
# The settings refuse a value outside these bounds and the launcher reads them again; the schedule's cost estimate
# (linkcheck/rounds.py) uses the default.
LINK_SECONDS_DEFAULT = 0.2
LINK_SECONDS_MIN, LINK_SECONDS_MAX = 0.05, 5.0

# --- the container ---------------------------------------------------------------------------------------------
OUTPUT_DIR = "/outputs"  # where the job writes; the host mounts its output directory here
WORKDIR = "/workspace"  # the project's code in the image, and the launcher's working directory

# --- the host's Docker engine ---------------------------------------------------------------------------------
# Where a Docker daemon's pid may be written (the packaged dockerd's two, and the engine nodekit's test harness
# starts): its /proc/<pid>/limits are the limits containers inherit. Read by the host facts script, here and over
# SSH alike (nodekit.system.host.facts).
DOCKER_PIDFILES = ("/var/run/docker.pid", "/run/docker.pid", "/var/run/nodekit-dockerd.pid")

# --- lines the launcher prints that the head reads as phases (nodekit/runs/ records when each node reached them) ----
PREFLIGHT_OK = "nodekit preflight: ok"  # the start of the report every node prints when preflight passed
RENDEZVOUS_DONE = "nodekit: rendezvous done"  # torchrun's agent finished its rendezvous on this node
OWN_LINES = "nodekit"  # the launcher's own lines start so; the first other line is the job's first output
# ... and its multi-line reports (preflight's table and notes, the data check): a head line starting with one of
# OWN_REPORTS, then lines indented by two spaces, and preflight's timing line "(preflight 1.2 s, ...)".
OWN_REPORTS = ("nodekit preflight:", "nodekit data check:")
OWN_CONTINUED = ("  ", "(preflight ")
# The peer watchdog's line about other nodes, ``nodekit: node 1 (...) failed: <why>; then ...; <what this node does>``
# (failed, lost or stopped from outside): a node that exits 19 was ended by them, and the host's last line quotes the
# first node it names (nodekit/runs/cause.py), whose exception it carries, where that node's output is elsewhere.
PEER_VERDICT = ("nodekit: node ", "nodekit: nodes ")

__all__ = [
    "DEFAULT_LAUNCH_MODE",
    "DOCKER_PIDFILES",
    "EXIT_BAD_ENV",
    "EXIT_GPU",
    "EXIT_LINK",
    "EXIT_OK",
    "EXIT_PEER_LOST",
    "EXIT_RENDEZVOUS",
    "EXIT_STACK_MISMATCH",
    "EXIT_STALLED",
    "EXIT_TERMINATED",
    "LAUNCH_MODES",
    "LINK_SECONDS_DEFAULT",
    "LINK_SECONDS_MAX",
    "LINK_SECONDS_MIN",
    "OUTPUT_DIR",
    "OWN_CONTINUED",
    "OWN_LINES",
    "OWN_REPORTS",
    "PEER_VERDICT",
    "PREFLIGHT_OK",
    "PREFLIGHT_PORT_OFFSET",
    "RENDEZVOUS_DONE",
    "WORKDIR",
    "Env",
    "Label",
    "LaunchMode",
    "preflight_port_for",
]
