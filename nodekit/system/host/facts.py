"""Gather HostFacts: GPUs, ulimits the Docker daemon can grant, InfiniBand devices, the route to main.

One gatherer for a host's facts, wherever nodekit runs it: :data:`FACTS_SCRIPT` (POSIX sh) prints them as
``key=value`` lines and :func:`parse_facts` reads them. ``nodekit up`` runs it here (:func:`gather`, through
``sh``), ``nodekit run`` on each host over SSH (nodekit/backends/fleet/remote.py), so both see a host's GPUs,
devices and limits the same way. What only this machine's network stack says (the route toward main, Docker's
bridge) is added here, in Python; the launcher finds the rest on the node at container start.

Also the smaller facts only ``nodekit doctor`` looks at (shared memory, host name, firewall); each returns data.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from nodekit.errors import DeadlineError, HostToolHung
from nodekit.launcher import contract
from nodekit.system import proc
from nodekit.system.frozen import FROZEN
from nodekit.system.host import net

NVIDIA_SMI_S = 20.0
"""nvidia-smi answers in well under a second; a driver that does not in this long has hung."""
SCRIPT_S = 10.0
"""The facts script but nvidia-smi: a few file reads."""
TOOL_S = 3.0
"""ufw and iptables: each call is bounded to this."""
NVIDIA_FIX = (
    "check the NVIDIA driver: nvidia-smi must answer at once (a hung one needs the driver reloaded or the host "
    "rebooted)"
)


class HostFacts(BaseModel):
    """What this machine offers: gathered on the node itself (:func:`gather`, or over SSH), handed to the planners as
    data."""

    model_config = FROZEN

    gpu_count: int = 0
    gpu_models: tuple[str, ...] = ()
    # Hard limits in bytes as the Docker daemon will see them; None means unlimited.
    memlock_hard: int | None = None
    stack_hard: int | None = None
    nofile_hard: int | None = Field(None, description="open files the daemon's containers may have; None: unlimited")
    infiniband: tuple[str, ...] = ()
    iface: str | None = Field(None, description="interface that routes toward main")
    local_addr: str | None = Field(None, description="this node's source address toward main")
    bridge_gateway: str | None = Field(None, description="address of Docker's default bridge (docker0) here")


# POSIX sh, run with the user's login here or over SSH: facts as key=value lines. $R is the root the paths are read
# under ("" on a real host; a directory laid out like one in tests). The engine's limits are read from its own
# /proc/<pid>/limits where readable (the pidfiles nodekit.launcher.contract lists), else this login's hard limits.
# GPUs are the driver's list (/proc/driver/nvidia), else what nvidia-smi says within NVIDIA_SMI_S.
FACTS_SCRIPT = r"""
gpus=$(for f in "$R"/proc/driver/nvidia/gpus/*/information; do
  [ -r "$f" ] && sed -n 's/^Model:[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$/gpu=\1/p' "$f"
done)
if [ -n "$gpus" ]; then
  printf '%s\n' "$gpus"
elif [ -z "$R" ] && command -v nvidia-smi >/dev/null 2>&1; then
  t=""; command -v timeout >/dev/null 2>&1 && t="timeout -s KILL $NK_SMI_S"
  out=$($t nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null); rc=$?
  case $rc in
    0) printf '%s\n' "$out" | sed -n 's/^[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$/gpu=\1/p' ;;
    124|137) echo "nvidia_smi=hung" ;;
  esac
fi
# The RDMA device nodes a container needs for InfiniBand: verbs, the connection manager, management datagrams.
for f in "$R"/dev/infiniband/uverbs* "$R"/dev/infiniband/rdma_cm "$R"/dev/infiniband/umad*; do
  [ -e "$f" ] && echo "ib=${f#"$R"}"
done
for p in $PIDFILES; do
  pid=$(cat "$R$p" 2>/dev/null) || continue
  grep -E '^Max (locked memory|stack size|open files)' "$R/proc/$pid/limits" 2>/dev/null | sed 's/^/limit=/' && break
done
echo "memlock_kb=$(ulimit -H -l)"
echo "stack_kb=$(ulimit -H -s)"
echo "nofile=$(ulimit -H -n)"
echo "host=$(hostname)"
cat "$R"/proc/net/tcp "$R"/proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {print "listen=" $2}'
awk '/\|--/ {ip = $2} /\/32 host LOCAL/ {print "addr=" ip}' "$R"/proc/net/fib_trie 2>/dev/null | sort -u
awk '{print "addr6=" $1}' "$R"/proc/net/if_inet6 2>/dev/null
"""


def facts_script(paths: Sequence[str] = (), *, root: str = "", nvidia_smi_s: float | None = None) -> str:
    """:data:`FACTS_SCRIPT` for a host whose files are under ``root`` ("" for a real one), plus a line for each of
    ``paths`` (the node's mount sources) missing there."""
    smi = NVIDIA_SMI_S if nvidia_smi_s is None else nvidia_smi_s
    head = (
        f"R={shlex.quote(root.rstrip('/'))}\nNK_SMI_S={smi:g}\n"
        f"PIDFILES={shlex.quote(' '.join(contract.DOCKER_PIDFILES))}\n"
    )
    tests = "".join(f'[ -e "$R"{shlex.quote(p)} ] || echo "absent="{shlex.quote(p)}\n' for p in paths)
    return head + FACTS_SCRIPT + tests


@dataclass(frozen=True)
class Gathered:
    """What a host reported: its facts, its host name and the TCP ports listening there."""

    facts: HostFacts
    hostname: str = ""
    listening: frozenset[int] = field(default_factory=frozenset)
    absent: frozenset[str] = field(default_factory=frozenset)  # of the paths asked about (the job's mounts)
    nvidia_smi_hung: bool = False
    addresses: frozenset[str] = field(default_factory=frozenset)  # the host's own IP addresses; empty: not known


def parse_facts(text: str, gpus: int | None = None) -> Gathered:
    """The facts script's output as data; ``gpus`` (the config's ``[nodes.R] gpus``) wins over the count found."""
    models: list[str] = []
    ib: list[str] = []
    daemon: dict[str, int | None] = {}
    login: dict[str, int | None] = {}
    hostname = ""
    listening: set[int] = set()
    absent: set[str] = set()
    addresses: set[str] = set()
    hung = False
    for line in text.splitlines():
        key, _, value = line.partition("=")
        value = value.strip()
        if key == "gpu" and value:
            models.append(value)
        elif key == "nvidia_smi":
            hung = value == "hung"
        elif key == "ib":
            ib.append(value)
        elif key == "limit":
            label = next(
                (k for k in ("Max locked memory", "Max stack size", "Max open files") if value.startswith(k)), ""
            )
            if label:
                hard = value[len(label) :].split()[1]  # "Max locked memory SOFT HARD bytes"
                daemon[label] = None if hard == "unlimited" else int(hard)
        elif key in ("memlock_kb", "stack_kb"):
            login[key] = None if value == "unlimited" or not value.isdigit() else int(value) * 1024
        elif key == "nofile":
            login[key] = None if value == "unlimited" or not value.isdigit() else int(value)
        elif key == "host":
            hostname = value
        elif key == "absent":
            absent.add(line.partition("=")[2])
        elif key == "listen":
            port = value.rsplit(":", 1)[-1]
            if port:
                listening.add(int(port, 16))
        elif key == "addr":
            with contextlib.suppress(ValueError):
                addresses.add(str(ipaddress.IPv4Address(value)))
        elif key == "addr6":  # /proc/net/if_inet6: 32 hex digits
            with contextlib.suppress(ValueError):
                addresses.add(str(ipaddress.IPv6Address(int(value, 16))))

    def limit(label: str, fallback: str) -> int | None:
        return daemon[label] if label in daemon else login.get(fallback)

    facts = HostFacts(
        gpu_count=len(models) if gpus is None else gpus,
        gpu_models=tuple(models) if gpus is None or gpus == len(models) else (),
        memlock_hard=limit("Max locked memory", "memlock_kb"),
        stack_hard=limit("Max stack size", "stack_kb"),
        nofile_hard=limit("Max open files", "nofile"),
        infiniband=tuple(sorted(ib)),
    )
    return Gathered(
        facts=facts, hostname=hostname, listening=frozenset(listening), absent=frozenset(absent), nvidia_smi_hung=hung,
        addresses=frozenset(addresses),
    )  # fmt: skip


def run_script(root: Path = Path("/")) -> Gathered:
    """:data:`FACTS_SCRIPT` run here, under ``root``; HostToolHung (one line, exit 2) when nvidia-smi hangs."""
    local = "" if root == Path("/") else str(root)
    done = proc.run(
        ["sh", "-c", facts_script(root=local)],
        deadline=NVIDIA_SMI_S + SCRIPT_S,
        what="the host facts script (sh)",
        fix=NVIDIA_FIX,
        error=HostToolHung,
    )
    got = parse_facts(done.stdout)
    if got.nvidia_smi_hung:
        raise proc.hung("nvidia-smi", NVIDIA_SMI_S, NVIDIA_FIX, error=HostToolHung)
    return got


def gather(main_ip: str | None = None, *, root: Path = Path("/")) -> HostFacts:
    """Everything planning needs to know about this host: :data:`FACTS_SCRIPT`'s facts, and here the route toward
    main (with ``main_ip``) and Docker's bridge."""
    facts = run_script(root).facts
    links = net.links_here() if root == Path("/") else []
    iface = local_addr = None
    if main_ip is not None:
        route = net.route_to(main_ip, links)
        if route is not None:
            iface, local_addr = route.iface, route.src or None
    return facts.model_copy(update={"iface": iface, "local_addr": local_addr, "bridge_gateway": bridge_gateway(links)})


def addresses_here() -> frozenset[str]:
    """This host's own IP addresses (its interfaces'), as :attr:`Gathered.addresses` holds a host's."""
    return frozenset(a.split("%", 1)[0] for link in net.links_here() for a in link.addrs)


def bridge_gateway(links: list[net.Link], name: str = "docker0") -> str | None:
    """The IPv4 address of Docker's default bridge on this host (the gateway its containers see)."""
    link = net.link_named(name, links)
    for addr in link.addrs if link else ():
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(addr).version == 4:
                return addr
    return None


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
