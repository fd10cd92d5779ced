"""Gather HostFacts: GPUs, ulimits the Docker daemon can grant, InfiniBand devices, the route to main.

Also the smaller facts only ``nodekit doctor`` looks at (shared memory, host name, firewall); each returns data.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import resource
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from nodekit.errors import DeadlineError, HostToolHung
from nodekit.launcher import contract
from nodekit.system import proc
from nodekit.system.frozen import FROZEN
from nodekit.system.host import net

NVIDIA_SMI_S = 20.0
"""nvidia-smi answers in well under a second; a driver that does not in this long has hung."""
TOOL_S = 3.0
"""ufw and iptables: each call is bounded to this."""


class HostFacts(BaseModel):
    """What this machine offers: gathered here (:func:`gather`) on the node itself, handed to the planners as data."""

    model_config = FROZEN

    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()
    # Hard limits in bytes as the Docker daemon will see them; None means unlimited.
    memlock_hard: int | None = None
    stack_hard: int | None = None
    infiniband: tuple[str, ...] = ()
    iface: str | None = Field(None, description="interface that routes toward main")
    local_addr: str | None = Field(None, description="this node's source address toward main")
    bridge_gateway: str | None = Field(None, description="address of Docker's default bridge (docker0) here")


def gather(main_ip: str | None = None, *, root: Path = Path("/")) -> HostFacts:
    """Everything render needs to know about this host. ``main_ip`` adds the route toward main."""
    gpus = gpu_models(root)
    memlock = daemon_hard_limit("Max locked memory", resource.RLIMIT_MEMLOCK, root)
    stack = daemon_hard_limit("Max stack size", resource.RLIMIT_STACK, root)
    links = net.links_here() if root == Path("/") else []
    iface = local_addr = None
    if main_ip is not None:
        route = net.route_to(main_ip, links)
        if route is not None:
            iface, local_addr = route.iface, route.src or None
    return HostFacts(
        gpu_count=len(gpus),
        gpu_models=tuple(gpus),
        memlock_hard=memlock,
        stack_hard=stack,
        infiniband=infiniband_devices(root),
        iface=iface,
        local_addr=local_addr,
        bridge_gateway=bridge_gateway(links),
    )


def infiniband_devices(root: Path = Path("/")) -> tuple[str, ...]:
    """The RDMA device nodes a container needs (uverbs, rdma_cm, umad), sorted; empty without InfiniBand."""
    ib_dir = root / "dev" / "infiniband"
    return tuple(sorted(f"/dev/infiniband/{p.name}" for p in ib_dir.iterdir())) if ib_dir.is_dir() else ()


def bridge_gateway(links: list[net.Link], name: str = "docker0") -> str | None:
    """The IPv4 address of Docker's default bridge on this host (the gateway its containers see)."""
    link = net.link_named(name, links)
    for addr in link.addrs if link else ():
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(addr).version == 4:
                return addr
    return None


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
        return nvidia_smi_models()
    return []


def nvidia_smi_models() -> list[str]:
    """The GPUs ``nvidia-smi`` lists (none when it fails); HostToolHung (one line, exit 2) when it hangs."""
    done = proc.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        deadline=NVIDIA_SMI_S,
        what="nvidia-smi",
        fix="check the NVIDIA driver: nvidia-smi must answer at once (a hung one needs the driver reloaded or the "
        "host rebooted)",
        error=HostToolHung,
    )
    if done.returncode == 0:
        return [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]
    return []


def daemon_hard_limit(label: str, which: int, root: Path = Path("/")) -> int | None:
    """The hard limit the Docker daemon runs with (containers cannot exceed it); None = unlimited.

    Read from the daemon's /proc/<pid>/limits when its pidfile is readable, else this process's own limit,
    which a daemon started from the same session inherits.
    """
    for pidfile in contract.DOCKER_PIDFILES:
        path = root / pidfile.lstrip("/")
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


def parse_proc_limit(text: str, label: str) -> int | bool | None:
    """The hard limit for ``label`` in /proc/PID/limits text: bytes, None (unlimited) or False (absent)."""
    for line in text.splitlines():
        if line.startswith(label):
            hard = line[len(label) :].split()[1]
            return None if hard == "unlimited" else int(hard)
    return False


def shm_bytes(root: Path = Path("/")) -> int | None:
    """Size of /dev/shm; with ``ipc: host`` the job's containers share this very mount."""
    try:
        st = os.statvfs(root / "dev" / "shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def hostname_addrs() -> tuple[str, tuple[str, ...]]:
    """This host's name and the addresses it resolves to here (/etc/hosts first, as libc does)."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return name, ()
    return name, tuple(dict.fromkeys(str(i[4][0]) for i in infos))


@dataclass(frozen=True)
class Firewall:
    """What this host's packet filter does to incoming TCP, as far as this user can read it."""

    ufw: str | None = None
    """"active", "inactive", or None when ufw is not installed or not readable."""
    iptables_policy: str | None = None
    """The INPUT chain's policy (ACCEPT, DROP), None when iptables is absent or not readable."""
    iptables_blocks: bool = False
    """An INPUT rule drops or rejects some traffic."""
    readable: bool = True
    """False when a firewall tool exists but this user cannot read its rules (not root)."""


def parse_iptables_input(text: str) -> tuple[str | None, bool]:
    """The INPUT policy and whether a rule drops/rejects, from ``iptables -S INPUT``."""
    policy = None
    blocks = False
    for line in text.splitlines():
        parts = line.split()
        if parts[:2] == ["-P", "INPUT"] and len(parts) > 2:
            policy = parts[2]
        elif parts[:2] == ["-A", "INPUT"] and ("-j DROP" in line or "-j REJECT" in line):
            blocks = True
    return policy, blocks


def firewall() -> Firewall:
    """Read ufw's status and iptables' INPUT chain (both need root; each call is bounded to 3 s)."""
    ufw = policy = None
    blocks = False
    readable = True
    if shutil.which("ufw"):
        out = _run(["ufw", "status"])
        if out is None:
            readable = False
        else:
            ufw = "active" if "status: active" in out.lower() else "inactive"
    if shutil.which("iptables"):
        out = _run(["iptables", "-S", "INPUT"])
        if out is None:
            readable = False
        else:
            policy, blocks = parse_iptables_input(out)
    return Firewall(ufw=ufw, iptables_policy=policy, iptables_blocks=blocks, readable=readable)


def nvidia_container_toolkit() -> bool:
    """Whether the NVIDIA container toolkit (what gives containers GPUs) is installed on this host."""
    return any(shutil.which(t) for t in ("nvidia-container-cli", "nvidia-container-runtime-hook", "nvidia-ctk"))


def _run(argv: list[str]) -> str | None:
    try:
        done = proc.run(argv, deadline=TOOL_S, what=argv[0], fix="")
    except (OSError, DeadlineError):
        return None
    return done.stdout if done.returncode == 0 else None
