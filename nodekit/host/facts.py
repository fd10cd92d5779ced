"""Gather HostFacts: GPUs, ulimits the Docker daemon can grant, InfiniBand devices, the route to main."""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path

from nodekit.host.net import route_to
from nodekit.spec import HostFacts

DOCKER_PIDFILES = (Path("/var/run/docker.pid"), Path("/run/docker.pid"), Path("/var/run/nodekit-dockerd.pid"))


def gather(main_ip: str | None = None, *, root: Path = Path("/")) -> HostFacts:
    """Everything render needs to know about this host. ``main_ip`` adds the route toward main."""
    gpus = gpu_models(root)
    memlock = daemon_hard_limit("Max locked memory", resource.RLIMIT_MEMLOCK, root)
    stack = daemon_hard_limit("Max stack size", resource.RLIMIT_STACK, root)
    ib_dir = root / "dev" / "infiniband"
    infiniband = tuple(sorted(f"/dev/infiniband/{p.name}" for p in ib_dir.iterdir())) if ib_dir.is_dir() else ()
    iface = local_addr = None
    if main_ip is not None:
        route = route_to(main_ip)
        if route is not None:
            iface, local_addr = route.iface, route.src or None
    return HostFacts(
        gpu_count=len(gpus),
        gpu_models=tuple(gpus),
        memlock_hard=memlock,
        stack_hard=stack,
        infiniband=infiniband,
        iface=iface,
        local_addr=local_addr,
    )


def gpu_models(root: Path = Path("/")) -> list[str]:
    """NVIDIA GPUs as the driver lists them (no CUDA, no torch needed); empty on a CPU-only node."""
    proc_dir = root / "proc" / "driver" / "nvidia" / "gpus"
    if proc_dir.is_dir():
        models = []
        for info in sorted(proc_dir.glob("*/information")):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
        if models:
            return models
    if root == Path("/") and shutil.which("nvidia-smi"):
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        if proc.returncode == 0:
            return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    return []


def daemon_hard_limit(label: str, which: int, root: Path = Path("/")) -> int | None:
    """The hard limit the Docker daemon runs with (containers cannot exceed it); None = unlimited.

    Read from the daemon's /proc/<pid>/limits when its pidfile is readable, else this process's own limit,
    which a daemon started from the same session inherits.
    """
    for pidfile in DOCKER_PIDFILES:
        path = root / str(pidfile).lstrip("/")
        try:
            pid = path.read_text().strip()
            limits = (root / "proc" / pid / "limits").read_text()
        except OSError:
            continue
        parsed = parse_proc_limit(limits, label)
        if parsed is not False:
            return parsed
    hard = resource.getrlimit(which)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def parse_proc_limit(text: str, label: str) -> int | None | bool:
    """The hard limit for ``label`` in /proc/PID/limits text: bytes, None (unlimited) or False (absent)."""
    for line in text.splitlines():
        if line.startswith(label):
            hard = line[len(label):].split()[1]
            return None if hard == "unlimited" else int(hard)
    return False
