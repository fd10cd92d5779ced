"""``nodekit doctor``: the troubleshooting guides' list of multi-node traps, as checks.

Two halves. :func:`rows` is pure: it turns :class:`DoctorFacts` into PASS / WARN / FAIL / SKIP rows, each WARN
and FAIL with the exact command that fixes it; tests feed it facts. :func:`gather` is the only part that runs
commands, opens sockets or talks to Docker, and keeps the whole run under ten seconds by doing the slow parts
(Docker, the TCP probes, the firewall) side by side with bounded waits. :func:`serve` is main's listening half
of the TCP round trip, run only on request (``--listen``).
"""

from __future__ import annotations

import contextlib
import re
import resource
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum

from nodekit.errors import NodekitError, UsageError
from nodekit.host import facts as host_facts
from nodekit.host import net
from nodekit.host.facts import Firewall
from nodekit.host.net import Arrival, Probe, Reach, Route
from nodekit.render.compose import ulimits
from nodekit.settings import Settings
from nodekit.spec import PREFLIGHT_PORT_OFFSET, HostFacts, bridge_addresses, check_main_addr, infiniband_for

MIB = 1024 * 1024
GIB = 1024 * MIB
STACK_WANTED = 64 * MIB
SHM_WANTED = 1 * GIB
# Docker 25+ gives containers a soft limit of 1024 open files: DataLoader workers that share tensors through file
# descriptors run out ("Too many open files").
NOFILE_WANTED = 8192
CLOCK_TOLERANCE_S = 1.0
# A narrowed ephemeral range for NCCL's and gloo's data sockets, so that a firewall can open exactly it.
NCCL_RANGE = (50000, 51000)
CONTAINER_WAIT_S = 7.0

TOOLKIT_FIX = (
    "sudo apt-get install -y nvidia-container-toolkit && sudo nvidia-ctk runtime configure --runtime=docker "
    "&& sudo systemctl restart docker"
)
DAEMON_LIMIT_FIX = (
    "sudo mkdir -p /etc/systemd/system/docker.service.d && printf '[Service]\\nLimit{key}=infinity\\n' | "
    "sudo tee /etc/systemd/system/docker.service.d/nodekit-{name}.conf && sudo systemctl daemon-reload && "
    "sudo systemctl restart docker"
)


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status.value, "detail": self.detail, "fix": self.fix}


def exit_code(rows: Sequence[Row]) -> int:
    return 1 if any(r.status is Status.FAIL for r in rows) else 0


@dataclass(frozen=True)
class EngineCheck:
    """``nodekit.docker.check_engine``'s answer: versions, or the error and which part failed."""

    server: str | None = None
    compose: str | None = None
    buildx: str | None = None
    error: str | None = None
    fix: str | None = None
    failed: str | None = None  # "engine", "compose" or "buildx"


@dataclass(frozen=True)
class ContainerView:
    """Limits, shared memory and GPUs inside a container started as the job's is; sizes in bytes, None = unlimited."""

    image: str
    memlock: int | None = None
    stack: int | None = None
    nofile: int | None = None
    shm: int | None = None
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageCheck:
    ref: str | None = None
    present: bool = False
    fingerprint: str | None = None
    error: str | None = None
    fix: str | None = None


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the checks look at, gathered once; every field is plain data."""

    settings: Settings
    rank: int | None
    main: str | None = None
    main_ip: str | None = None
    main_error: UsageError | None = None
    main_is_here: bool = False
    host: HostFacts = field(default_factory=HostFacts)
    route: Route | None = None
    mtu: int | None = None
    probes: tuple[Probe, ...] = ()
    holders: tuple[tuple[int, str | None], ...] = ()
    """On main: (port, holder) for each rendezvous port already taken; holder None when unknown."""
    port_range: tuple[int, int] | None = None
    reserved: str | None = None
    firewall: Firewall = field(default_factory=Firewall)
    hostname: str = ""
    hostname_addrs: tuple[str, ...] = ()
    engine: EngineCheck = field(default_factory=EngineCheck)
    image: ImageCheck = field(default_factory=ImageCheck)
    container: ContainerView | None = None
    container_error: str | None = None
    """Why the job-like container (limits, no GPUs) did not run; with ``container`` None."""
    container_note: str | None = None
    """Why no container was tried (no engine, no image)."""
    gpu_error: str | None = None
    """Why a container with every GPU did not run, on a node with GPUs."""
    toolkit: bool = False
    host_shm: int | None = None
    host_nofile: int | None = None

    @property
    def ports(self) -> tuple[int, int]:
        return self.settings.master_port, self.settings.master_port + PREFLIGHT_PORT_OFFSET

    @property
    def is_main(self) -> bool:
        return _is_main(self.rank, self.main_is_here)

    @property
    def loopback_main(self) -> bool:
        return self.main_ip is not None and net.is_loopback(self.main_ip)


def _is_main(rank: int | None, main_is_here: bool) -> bool:
    """Main's doctor: rank 0, or no rank given and --main is an address of this machine."""
    return rank == 0 or (rank is None and main_is_here)


# --- the pure half: facts -> rows ------------------------------------------------------------------------------


def rows(f: DoctorFacts) -> list[Row]:
    """Every check's row, in the order a user fixes things: engine, GPUs, network, limits, image."""
    out = [*_engine_rows(f.engine), *_gpu_rows(f), *_network_rows(f)]
    out += [_port_range_row(f), _firewall_row(f), _infiniband_row(f), _shm_row(f), _ulimits_row(f), _image_row(f)]
    return out


def _engine_rows(e: EngineCheck) -> list[Row]:
    if e.failed == "engine":
        skip = "not checked: no Docker engine"
        return [
            Row("docker engine", Status.FAIL, e.error or "no engine", e.fix),
            Row("compose v2", Status.SKIP, skip),
            Row("buildx", Status.SKIP, skip),
        ]
    rows_ = [Row("docker engine", Status.PASS, f"Docker {e.server or '?'}")]
    if e.failed == "compose":
        return [*rows_, Row("compose v2", Status.FAIL, e.error or "", e.fix), Row("buildx", Status.SKIP, "not checked")]
    compose = _version(e.compose)
    if compose.split(".")[0].isdigit() and int(compose.split(".")[0]) < 2:
        rows_.append(Row("compose v2", Status.FAIL, f"Compose {compose} is v1", "make engine"))
    else:
        rows_.append(Row("compose v2", Status.PASS, f"Compose {compose}"))
    if e.failed == "buildx":
        return [*rows_, Row("buildx", Status.FAIL, e.error or "", e.fix)]
    return [*rows_, Row("buildx", Status.PASS, f"Buildx {_version(e.buildx)}")]


def _version(text: str | None) -> str:
    """The first version number in a tool's version line ("Docker Compose version v2.26.1" -> "2.26.1")."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text or "")
    return m.group(1) if m else (text or "?")


def _gpu_rows(f: DoctorFacts) -> list[Row]:
    n = f.host.gpu_count
    if n == 0:
        return [
            Row(
                "gpus",
                Status.SKIP,
                "no NVIDIA GPU on this node (CPU-only): GPU checks skipped; jobs use gloo, nproc_per_node auto = 1",
            )
        ]
    models = sorted(set(f.host.gpu_models))
    host_row = Row("gpus", Status.PASS, f"{n} x {', '.join(models) or 'NVIDIA GPU'}")
    if f.gpu_error is not None:
        return [host_row, Row("gpus in container", Status.FAIL, f.gpu_error, TOOLKIT_FIX)]
    if f.container is not None:
        seen = len(f.container.gpus)
        if seen == n:
            return [host_row, Row("gpus in container", Status.PASS, f"{seen} visible in {f.container.image}")]
        return [
            host_row,
            Row("gpus in container", Status.FAIL, f"{seen} of {n} GPUs visible inside a container", TOOLKIT_FIX),
        ]
    if not f.toolkit:
        return [
            host_row,
            Row(
                "gpus in container",
                Status.FAIL,
                "NVIDIA container toolkit not installed: no GPU in containers",
                TOOLKIT_FIX,
            ),
        ]
    why = f.container_note or f.container_error or "no container could be started"
    return [host_row, Row("gpus in container", Status.SKIP, f"not checked in a container: {why}")]


def _network_rows(f: DoctorFacts) -> list[Row]:
    s = f.settings
    if f.main is None:
        hint = "nodekit doctor --main ADDR --node-rank R  (ADDR: main's address as the nodes reach it)"
        return [
            _mode_row(f),
            Row("main", Status.SKIP, "no --main given: route, MTU and reachability not checked", hint),
        ]
    if f.main_error is not None or f.main_ip is None:
        message = f.main_error.message if f.main_error else f"cannot resolve {f.main}"
        return [_mode_row(f), Row("main", Status.FAIL, message, f.main_error.fix if f.main_error else None)]
    try:
        check_main_addr(s, f.main_ip)
    except UsageError as e:
        return [_mode_row(f), Row("main", Status.FAIL, e.message, e.fix)]
    role = "main" if f.is_main else "worker"
    where = (
        "loopback: an all-local run, every node must run on this machine"
        if f.loopback_main
        else ("an address of this machine" if f.main_is_here else "another machine")
    )
    out = [_mode_row(f)]
    if f.rank == 0 and not f.main_is_here:
        out.append(
            Row(
                "main",
                Status.WARN,
                f"this is node 0, but {f.main_ip} is not an address of this machine: the job listens here and the "
                "workers connect there (fine only for a NAT or floating address that leads here)",
                "nodekit doctor --main <an address from: ip -br addr> --node-rank 0",
            )
        )
    else:
        out.append(Row("main", Status.PASS, f"{f.main_ip} ({where}); this node is a {role}"))
    out.append(_iface_row(f))
    out.append(_hostname_row(f))
    out += _ports_rows(f) if f.is_main else _reach_rows(f)
    return out


def _mode_row(f: DoctorFacts) -> Row:
    if f.settings.network == "host":
        return Row("network mode", Status.PASS, "host networking: NCCL and gloo reach the other nodes directly")
    if f.main_ip is None:
        return Row(
            "network mode", Status.WARN, "bridge: only for runs with every node on this machine", 'network = "host"'
        )
    try:
        gateway, _, _ = bridge_addresses(f.main_ip, f.host, None)
    except UsageError as e:
        return Row("network mode", Status.FAIL, e.message, e.fix)
    lo, hi = f.ports
    return Row("network mode", Status.PASS, f"bridge (all-local): node 0 publishes {lo}-{hi} on docker0 {gateway}")


def _iface_row(f: DoctorFacts) -> Row:
    assert f.main_ip is not None
    override = f.settings.nodes.get(f.rank) if f.rank is not None else None
    if f.route is None:
        return Row(
            "interface to main",
            Status.FAIL,
            f"no route from this host to {f.main_ip}",
            f"ip route get {f.main_ip}  (then add a route, or pass the address main has on this node's network)",
        )
    chosen = override.iface if override and override.iface else f.route.iface
    note = f" ([nodes.{f.rank}] iface; detected {f.route.iface})" if chosen != f.route.iface else ""
    detail = f"{chosen}{note} from {f.route.src or '?'}, MTU {f.mtu or '?'}"
    peer_mtu = next((p.peer.get("mtu") for p in f.probes if p.peer.get("mtu")), None)
    if peer_mtu and f.mtu and chosen != "lo" and str(f.mtu) != peer_mtu:
        return Row(
            "interface to main",
            Status.WARN,
            f"{detail}, but main's MTU is {peer_mtu}: large NCCL packets fragment or vanish",
            f"sudo ip link set dev {chosen} mtu {peer_mtu}  (or lower main's; every node must agree)",
        )
    return Row("interface to main", Status.PASS, f"{detail}; GLOO/NCCL_SOCKET_IFNAME={chosen}")


def _hostname_row(f: DoctorFacts) -> Row:
    loop = [a for a in f.hostname_addrs if net.is_loopback(a)]
    if not loop or f.loopback_main:
        shown = ", ".join(f.hostname_addrs) or "nothing"
        return Row("host name", Status.PASS, f"{f.hostname} resolves to {shown}")
    addr = f.route.src if f.route and f.route.src else "THIS_NODE_IP"
    return Row(
        "host name",
        Status.WARN,
        f"{f.hostname} resolves to {loop[0]} here: tools that advertise the host name give the others a loopback",
        # The first matching line of /etc/hosts comes first from the resolver; nothing else needs removing.
        f"sudo sed -i '1i {addr} {f.hostname}' /etc/hosts",
    )


def _ports_rows(f: DoctorFacts) -> list[Row]:
    if not f.holders:
        lo, hi = f.ports
        return [Row("ports on main", Status.PASS, f"{lo} (rendezvous) and {hi} (preflight) are free")]
    out = []
    for port, holder in f.holders:
        who = f" by {holder}" if holder else ""
        pid = re.search(r"pid (\d+)", holder or "")
        fix = f"kill {pid.group(1)}" if pid else f"sudo ss -tlnp 'sport = :{port}'"
        fix += f"  (nodekit down --node-rank 0 if it is an earlier run; or --master-port {f.ports[0] + 10})"
        out.append(Row("ports on main", Status.FAIL, f"port {port} is already in use{who}", fix))
    return out


def _reach_rows(f: DoctorFacts) -> list[Row]:
    if not f.probes:
        return [Row("reach main", Status.SKIP, "not probed (no route)")]
    verdicts = [_reach(f, p) for p in f.probes]
    status, why, fix = max(verdicts, key=lambda v: _rank(v[0]))
    ports = "; ".join(
        f"{p.port}: {p.reach.value}" + (f" in {p.rtt_s * 1000:.1f} ms" if p.rtt_s is not None else "") for p in f.probes
    )
    return [Row("reach main", status, f"{ports} ({why})", fix), _clock_row(f)]


def _reach(f: DoctorFacts, p: Probe) -> tuple[Status, str, str | None]:
    """One port's verdict: the TCP round trip, or which way it failed."""
    host = f.main_ip
    listen = f"on main: nodekit doctor --main {host} --node-rank 0 --listen 120, then rerun this"
    if p.reach is Reach.DOCTOR:
        return Status.PASS, f"TCP round trip to main's doctor on {p.peer.get('host', '?')}", None
    if p.reach is Reach.OPEN:
        return Status.WARN, "the port answers, but not as a nodekit doctor: a job already running?", listen
    if p.reach is Reach.REFUSED:
        why = "port closed: main's host answers but nothing listens, or a firewall rejects"
        if f.loopback_main:
            why += f"; main {host} is loopback, so node 0 must run on this same machine"
        return Status.FAIL, why, listen
    if p.reach is Reach.TIMEOUT:
        return Status.FAIL, "timed out: a firewall drops the packets, or main is down", _open_ports_fix(f)
    if p.reach in (Reach.UNREACHABLE, Reach.NO_ROUTE):
        return Status.FAIL, f"{p.reach.value}: {p.detail}", f"ip route get {host}; ping -c 3 {host}"
    return Status.FAIL, p.detail or "connection failed", listen


def _clock_row(f: DoctorFacts) -> Row:
    if f.main_is_here:
        return Row("clock", Status.PASS, "main is this machine: same clock")
    got = [p for p in f.probes if p.clock_offset_s is not None]
    if not got:
        return Row("clock", Status.SKIP, "offset to main needs main's doctor listening (--listen)")
    best = min(got, key=lambda p: p.offset_error_s or 0.0)
    off, err = best.clock_offset_s or 0.0, best.offset_error_s or 0.0
    detail = f"main is {off:+.3f} s from this node (+- {err:.3f} s)"
    if abs(off) - err > CLOCK_TOLERANCE_S:
        return Row("clock", Status.WARN, f"{detail}: logs and timeouts disagree", "sudo timedatectl set-ntp true")
    return Row("clock", Status.PASS, detail)


def _port_range_row(f: DoctorFacts) -> Row:
    if f.port_range is None:
        return Row("port range", Status.SKIP, "cannot read /proc/sys/net/ipv4/ip_local_port_range")
    lo, hi = f.port_range
    reserved = net.ports_in_spec(f.reserved or "")
    clash = [p for p in f.ports if lo <= p <= hi and p not in reserved]
    base = f"ephemeral ports {lo}-{hi} (NCCL's and gloo's data sockets)"
    if clash:
        a, b = f.ports
        return Row(
            "port range",
            Status.WARN,
            f"{base} include {', '.join(map(str, clash))}: an outgoing connection can take it before the rendezvous",
            f"sudo sysctl -w net.ipv4.ip_local_reserved_ports={a}-{b}",
        )
    return Row("port range", Status.PASS, f"{base}; {f.ports[0]}-{f.ports[1]} outside")


def _open_ports_fix(f: DoctorFacts) -> str:
    a, b = f.ports
    lo, hi = NCCL_RANGE
    narrow = f'sudo sysctl -w net.ipv4.ip_local_port_range="{lo} {hi}"'
    if f.firewall.ufw == "active":
        return f"{narrow} && sudo ufw allow {a}:{b}/tcp && sudo ufw allow {lo}:{hi}/tcp  (on every node)"
    return (
        f"{narrow} && sudo iptables -I INPUT -p tcp --dport {a}:{b} -j ACCEPT && "
        f"sudo iptables -I INPUT -p tcp --dport {lo}:{hi} -j ACCEPT  (on every node)"
    )


def _firewall_row(f: DoctorFacts) -> Row:
    fw = f.firewall
    blocking = fw.ufw == "active" or fw.iptables_policy in ("DROP", "REJECT") or fw.iptables_blocks
    if blocking:
        what = (
            "ufw is active" if fw.ufw == "active" else f"iptables INPUT {fw.iptables_policy or 'has DROP/REJECT rules'}"
        )
        return Row(
            "firewall",
            Status.WARN,
            f"{what}: open the rendezvous ports and a narrowed ephemeral range for NCCL/gloo",
            _open_ports_fix(f),
        )
    if not fw.readable:
        return Row(
            "firewall",
            Status.SKIP,
            "cannot read the firewall rules (run doctor as root to check)",
            _open_ports_fix(f) + "  (if a firewall is on)",
        )
    if fw.ufw is None and fw.iptables_policy is None:
        return Row("firewall", Status.PASS, "no ufw or iptables on this host")
    return Row("firewall", Status.PASS, "no rule drops incoming TCP (ufw inactive or absent, INPUT accepts)")


def _infiniband_row(f: DoctorFacts) -> Row:
    devices = f.host.infiniband
    mode = f.settings.ib
    if mode == "on" and not devices:
        try:
            infiniband_for(f.settings, f.host, f.rank or 0)
        except UsageError as e:
            return Row("infiniband", Status.FAIL, e.message, e.fix)
    if not devices:
        return Row("infiniband", Status.PASS, "no /dev/infiniband: NCCL_IB_DISABLE=1, NCCL uses TCP sockets")
    if mode == "off":
        return Row(
            "infiniband", Status.WARN, f'{len(devices)} RDMA devices, but ib = "off": NCCL uses TCP', 'ib = "auto"'
        )
    if f.host.memlock_hard is not None:
        return Row(
            "infiniband",
            Status.FAIL,
            f"{len(devices)} RDMA devices, but memlock is capped at {f.host.memlock_hard // 1024} KiB: RDMA "
            "registration fails",
            DAEMON_LIMIT_FIX.format(key="MEMLOCK", name="memlock"),
        )
    return Row("infiniband", Status.PASS, f"{len(devices)} RDMA devices passed with IPC_LOCK, memlock unlimited")


def _shm_row(f: DoctorFacts) -> Row:
    shm = f.container.shm if f.container and f.container.shm else f.host_shm
    if shm is None:
        return Row("shared memory", Status.SKIP, "cannot read /dev/shm")
    where = "in the container (ipc: host)" if f.container and f.container.shm else "on the host (ipc: host shares it)"
    if shm < SHM_WANTED:
        return Row(
            "shared memory",
            Status.WARN,
            f"/dev/shm is {_size(shm)} {where}: DataLoader workers and NCCL need more",
            "sudo mount -o remount,size=16G /dev/shm",
        )
    return Row("shared memory", Status.PASS, f"/dev/shm {_size(shm)} {where}")


def _ulimits_row(f: DoctorFacts) -> Row:
    c = f.container
    if c is None and f.container_error is not None:
        # runc names the limit it could not set by number: RLIMIT_STACK 3, RLIMIT_NOFILE 7, RLIMIT_MEMLOCK 8.
        which = re.search(r"rlimit type (\d+)", f.container_error)
        key = {"3": "STACK", "7": "NOFILE", "8": "MEMLOCK"}.get(which.group(1)) if which else None
        fix = DAEMON_LIMIT_FIX.format(key=key, name=key.lower()) if key else None
        return Row("ulimits", Status.FAIL, f"the job's container cannot start: {f.container_error}", fix)
    if c is not None:
        memlock, stack, nofile, src = c.memlock, c.stack, c.nofile, f"in a container of {c.image}"
    else:
        asked = ulimits(f.host)
        memlock = None if "memlock" in asked else f.host.memlock_hard
        stack = int(asked["stack"]["soft"])
        nofile = f.host_nofile
        src = f"predicted from the host ({f.container_note or 'no container run'})"
    detail = f"memlock {_limit(memlock)}, stack {_limit(stack)}, nofile {nofile if nofile else 'unlimited'} {src}"
    if stack is not None and stack < STACK_WANTED:
        return Row(
            "ulimits", Status.WARN, f"{detail}: stack below 64 MiB", DAEMON_LIMIT_FIX.format(key="STACK", name="stack")
        )
    if nofile is not None and nofile < NOFILE_WANTED:
        return Row(
            "ulimits",
            Status.WARN,
            f"{detail}: nofile below {NOFILE_WANTED} (DataLoader workers run out of descriptors)",
            DAEMON_LIMIT_FIX.format(key="NOFILE", name="nofile"),
        )
    return Row("ulimits", Status.PASS, detail)


def _image_row(f: DoctorFacts) -> Row:
    img = f.image
    if img.error is not None:
        return Row("image", Status.WARN, img.error, img.fix or "nodekit build")
    if not img.present or img.ref is None:
        return Row("image", Status.WARN, f"{img.ref or 'the image'} is not on this engine", "nodekit build")
    tag = img.ref.rsplit(":", 1)[-1]
    if img.fingerprint is None:
        return Row("image", Status.WARN, f"{img.ref} has no nodekit fingerprint label", "nodekit build")
    if not img.fingerprint.startswith(tag):
        return Row("image", Status.WARN, f"{img.ref} carries fingerprint {img.fingerprint[:12]}", "nodekit build")
    return Row(
        "image", Status.PASS, f"{img.ref}, fingerprint {img.fingerprint[:12]} (nodekit build is a no-op if current)"
    )


def arrivals_row(
    arrivals: Sequence[Arrival], *, nnodes: int, ports: Sequence[int], seconds: float, main_ip: str | None = None
) -> Row:
    """Main's verdict after listening: which workers' doctors completed the round trip on every port."""
    got: dict[int, set[int]] = {}
    for a in arrivals:
        if a.rank is not None:
            got.setdefault(a.rank, set()).add(a.port)
    expected = set(range(1, nnodes))
    complete = sorted(r for r, ps in got.items() if set(ports) <= ps)
    partial = {r: sorted(set(ports) - ps) for r, ps in got.items() if not set(ports) <= ps}
    detail = f"round trips from node(s) {', '.join(map(str, complete)) or 'none'} in {seconds:.1f} s"
    unnamed = {a.peer for a in arrivals if a.rank is None}
    if unnamed:
        detail += f", and from {', '.join(sorted(unnamed))} without --node-rank"
    missing = sorted(expected - set(got))
    problems = [f"node {r} missing" for r in missing] + [
        f"node {r} not on port {', '.join(map(str, ps))}" for r, ps in sorted(partial.items())
    ]
    fix = f"on each worker: nodekit doctor --main {main_ip or 'MAIN_ADDR'} --node-rank R (its FAIL row says why)"
    if problems:
        return Row("workers", Status.FAIL, f"{detail}; {', '.join(problems)}", fix)
    if not got:
        return Row(
            "workers", Status.WARN, detail if unnamed else f"no worker's doctor connected in {seconds:.1f} s", fix
        )
    return Row("workers", Status.PASS, detail)


def _rank(s: Status) -> int:
    return {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3}[s]


def _limit(n: int | None) -> str:
    return "unlimited" if n is None else _size(n)


def _size(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n // 1024} KiB"


# --- the container probe: script and parser --------------------------------------------------------------------

CONTAINER_SCRIPT = (
    'echo "memlock $(ulimit -S -l)"; echo "stack $(ulimit -S -s)"; echo "nofile $(ulimit -S -n)"; '
    'echo "shm $(df -kP /dev/shm | tail -n 1)"'
)


def parse_container_probe(image: str, text: str) -> ContainerView:
    """CONTAINER_SCRIPT's output: ulimit values in KiB (memlock, stack) or counts (nofile), df -kP, nvidia-smi -L."""
    values: dict[str, int | None] = {}
    gpus = []
    shm = None
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("memlock", "stack", "nofile"):
            rest = rest.strip()
            scale = 1 if key == "nofile" else 1024
            with contextlib.suppress(ValueError):
                values[key] = None if rest == "unlimited" else int(rest) * scale
        elif key == "shm":
            cols = rest.split()
            with contextlib.suppress(IndexError, ValueError):
                shm = int(cols[1]) * 1024
        elif line.startswith("GPU "):
            gpus.append(line)
    return ContainerView(
        image=image,
        memlock=values.get("memlock"),
        stack=values.get("stack"),
        nofile=values.get("nofile"),
        shm=shm,
        gpus=tuple(gpus),
    )


# --- the gathering half ------------------------------------------------------------------------------------------


def gather(settings: Settings, *, main: str | None, rank: int | None, probe_timeout: float = 3.0) -> DoctorFacts:
    """Collect every fact the checks need, in parallel, in well under ten seconds."""
    main_ip: str | None = None
    main_error = None
    if main is not None:
        try:
            main_ip = net.resolve(main)
        except UsageError as e:
            main_error = e
    ports = (settings.master_port, settings.master_port + PREFLIGHT_PORT_OFFSET)
    with ThreadPoolExecutor(max_workers=6) as pool:
        engine_f = pool.submit(_engine)
        firewall_f = pool.submit(host_facts.firewall)
        name_f = pool.submit(host_facts.hostname_addrs)
        route_f = pool.submit(net.route_to, main_ip) if main_ip is not None else None
        # The route toward main is asked once, here; the host facts need not repeat it.
        host = host_facts.gather(None)
        route = route_f.result() if route_f is not None else None
        here = main_ip is not None and (net.is_loopback(main_ip) or (route is not None and route.local))
        mtu = net.mtu(route.iface) if route else None
        probes: tuple[Probe, ...] = ()
        holders: tuple[tuple[int, str | None], ...] = ()
        if _is_main(rank, here):
            holders = tuple((p, net.port_holder(p)) for p in ports if net.port_in_use(p))
        elif main_ip is not None and route is not None:
            about = {"rank": str(rank), "host": name_f.result()[0], "iface": route.iface, "mtu": str(mtu or "")}
            hello = net.hello_line(about)
            futures = [pool.submit(net.probe, main_ip, p, hello=hello, connect_timeout=probe_timeout) for p in ports]
            probes = tuple(fut.result() for fut in futures)
        engine = engine_f.result()
        image, containers = _image_and_container(settings, engine, host)
        hostname, addrs = name_f.result()
        firewall = firewall_f.result()
    return DoctorFacts(
        settings=settings,
        rank=rank,
        main=main,
        main_ip=main_ip,
        main_error=main_error,
        main_is_here=here,
        host=host,
        route=route,
        mtu=mtu,
        probes=probes,
        holders=holders,
        port_range=net.local_port_range(),
        reserved=net.reserved_ports(),
        firewall=firewall,
        hostname=hostname,
        hostname_addrs=addrs,
        engine=engine,
        image=image,
        container=containers.view,
        container_error=containers.error,
        container_note=containers.note,
        gpu_error=containers.gpu_error,
        toolkit=host_facts.nvidia_container_toolkit(),
        host_shm=host_facts.shm_bytes(),
        host_nofile=host_facts.daemon_hard_limit("Max open files", resource.RLIMIT_NOFILE),
    )


def _engine() -> EngineCheck:
    from nodekit import docker

    try:
        info = docker.check_engine()
    except NodekitError as e:
        failed = "compose" if "Compose" in e.message else "buildx" if "Buildx" in e.message else "engine"
        return EngineCheck(error=e.message, fix=e.fix, failed=failed)
    return EngineCheck(server=info.server_version, compose=info.compose_version, buildx=info.buildx_version)


@dataclass(frozen=True)
class _Containers:
    view: ContainerView | None = None
    error: str | None = None
    gpu_error: str | None = None
    note: str | None = None


def _image_and_container(settings: Settings, engine: EngineCheck, host: HostFacts) -> tuple[ImageCheck, _Containers]:
    if engine.failed is not None:
        return ImageCheck(error="not checked: no usable Docker engine", fix=engine.fix), _Containers(note="no engine")
    image = _image(settings)
    if not image.present or image.ref is None:
        return image, _Containers(note="no image built")
    return image, _run_containers(image.ref, host)


def _image(settings: Settings) -> ImageCheck:
    from nodekit import docker

    try:
        from nodekit.build import current_image
        from nodekit.render.image import LABEL_FINGERPRINT
    except ImportError:
        return ImageCheck(error="this nodekit has no build module to find the image", fix="nodekit build")
    try:
        ref = current_image(settings)
        info = docker.image_info(ref)
    except NodekitError as e:
        return ImageCheck(error=e.message, fix=e.fix)
    if info is None:
        return ImageCheck(ref=ref, present=False)
    return ImageCheck(ref=ref, present=True, fingerprint=info.labels.get(LABEL_FINGERPRINT))


def _run_containers(ref: str, host: HostFacts) -> _Containers:
    """Start ``ref`` as the job's container starts (limits, IPC), and on a GPU node also with every GPU.

    Two containers side by side rather than one: a missing NVIDIA runtime must not hide the limits.
    """
    from nodekit import docker

    limits = [f"{k}={v['soft']}:{v['hard']}" for k, v in ulimits(host).items()]

    def run(script: str, gpus: bool) -> tuple[str | None, str | None]:
        try:
            return docker.run_as_job(ref, script, ulimits=limits, gpus=gpus, timeout=CONTAINER_WAIT_S), None
        except NodekitError as e:
            return None, e.message

    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = pool.submit(run, CONTAINER_SCRIPT, False)
        with_gpus = pool.submit(run, "nvidia-smi -L", True) if host.gpu_count > 0 else None
        out, error = plain.result()
        gpu_out, gpu_error = with_gpus.result() if with_gpus is not None else (None, None)
    view = parse_container_probe(ref, (out or "") + (gpu_out or "")) if out is not None else None
    if view is None and gpu_out is not None:
        view = parse_container_probe(ref, gpu_out)
    return _Containers(view=view, error=error if view is None else None, gpu_error=gpu_error)


def serve(
    settings: Settings,
    *,
    main_ip: str | None,
    seconds: float,
    host: str = "0.0.0.0",
    on_ready: Callable[[], None] | None = None,
    on_arrival: Callable[[Arrival], None] | None = None,
) -> Row:
    """Main's half of the round trip: listen on both rendezvous ports until every worker came or time is up."""
    ports = [settings.master_port, settings.master_port + PREFLIGHT_PORT_OFFSET]
    route = net.route_to(main_ip) if main_ip else None
    mtu = net.mtu(route.iface) if route else None
    expected = range(1, settings.nnodes)

    def everyone(arrivals: list[Arrival]) -> bool:
        return bool(expected) and all(_came(arrivals, r, p) for r in expected for p in ports)

    started = time.monotonic()
    try:
        arrivals = net.listen(
            ports,
            seconds=seconds,
            host=host,
            about={"mtu": str(mtu)} if mtu else {},
            until=everyone,
            on_ready=on_ready,
            on_arrival=on_arrival,
        )
    except OSError as e:
        return Row("workers", Status.FAIL, f"cannot listen on {ports}: {e.strerror}", "see the ports on main row")
    return arrivals_row(
        arrivals, nnodes=settings.nnodes, ports=ports, seconds=time.monotonic() - started, main_ip=main_ip
    )


def _came(arrivals: Sequence[Arrival], rank: int, port: int) -> bool:
    return any(a.rank == rank and a.port == port for a in arrivals)


def as_json(rows_: Sequence[Row]) -> list[dict[str, str | None]]:
    return [r.as_dict() for r in rows_]


__all__ = ["ContainerView", "DoctorFacts", "Row", "Status", "arrivals_row", "gather", "rows", "serve"]
