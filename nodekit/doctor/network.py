"""The network checks, pure: :class:`DoctorFacts` in, rows out for the path from this node to main.

Network mode, main's address and role, the interface and MTU toward main, the host name, main's ports (on main) or
the TCP round trip to main's doctor and the clock offset (on a worker), the ephemeral port range and the firewall;
and :func:`arrivals_row`, main's verdict after listening. Every WARN and FAIL carries the command that fixes it.
Nothing here runs a command or opens a socket: the probes were made by :mod:`nodekit.doctor.gathering` and
:mod:`nodekit.doctor.listen`, and arrive here as data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nodekit.doctor.handshake import Arrival, Probe, Reach
from nodekit.doctor.model import CheckRow, DoctorFacts, Status
from nodekit.errors import UsageError
from nodekit.job.spec import bridge_addresses, check_main_addr
from nodekit.system.host import net

CLOCK_TOLERANCE_S = 1.0
# A narrowed ephemeral range for NCCL's and gloo's data sockets, so that a firewall can open exactly it.
NCCL_RANGE = (50000, 51000)


def network_rows(f: DoctorFacts) -> list[CheckRow]:
    """The network mode and main's address; once main resolves, the interface toward it, the host name, and
    main's free ports (on main) or the TCP round trip and clock offset (on a worker)."""
    s = f.settings
    if f.main is None:
        hint = "nodekit doctor --main ADDR --node-rank R  (ADDR: main's address as the nodes reach it)"
        return [
            _mode_row(f),
            CheckRow("main", Status.SKIP, "no --main given: route, MTU and reachability not checked", hint),
        ]
    if f.main_error is not None or f.main_ip is None:
        message = f.main_error.message if f.main_error else f"cannot resolve {f.main}"
        return [_mode_row(f), CheckRow("main", Status.FAIL, message, f.main_error.fix if f.main_error else None)]
    try:
        check_main_addr(s, f.main_ip)
    except UsageError as e:
        return [_mode_row(f), CheckRow("main", Status.FAIL, e.message, e.fix)]
    role = "main" if f.is_main else "worker"
    where = (
        "loopback: an all-local run, every node must run on this machine"
        if f.loopback_main
        else ("an address of this machine" if f.main_is_here else "another machine")
    )
    out = [_mode_row(f)]
    if f.rank == 0 and not f.main_is_here:
        out.append(
            CheckRow(
                "main",
                Status.WARN,
                f"this is node 0, but {f.main_ip} is not an address of this machine: the job listens here and the "
                "workers connect there (fine only for a NAT or floating address that leads here)",
                "nodekit doctor --main <an address from: ip -br addr> --node-rank 0",
            )
        )
    else:
        out.append(CheckRow("main", Status.PASS, f"{f.main_ip} ({where}); this node is a {role}"))
    out.append(_iface_row(f))
    out.append(_hostname_row(f))
    out += _ports_rows(f) if f.is_main else _reach_rows(f)
    return out


def _mode_row(f: DoctorFacts) -> CheckRow:
    if f.settings.network == "host":
        return CheckRow("network mode", Status.PASS, "host networking: NCCL and gloo reach the other nodes directly")
    if f.main_ip is None:
        return CheckRow(
            "network mode", Status.WARN, "bridge: only for runs with every node on this machine", 'network = "host"'
        )
    try:
        gateway, _, _ = bridge_addresses(f.main_ip, f.host, None)
    except UsageError as e:
        return CheckRow("network mode", Status.FAIL, e.message, e.fix)
    lo, hi = f.ports
    return CheckRow("network mode", Status.PASS, f"bridge (all-local): node 0 publishes {lo}-{hi} on docker0 {gateway}")


def _iface_row(f: DoctorFacts) -> CheckRow:
    assert f.main_ip is not None
    override = f.settings.nodes.get(f.rank) if f.rank is not None else None
    if f.route is None:
        return CheckRow(
            "interface to main",
            Status.FAIL,
            f"no route from this host to {f.main_ip}",
            f"ip route get {f.main_ip}  (then add a route, or pass the address main has on this node's network)",
        )
    chosen = override.iface if override and override.iface else f.route.iface
    note = f" ([nodes.{f.rank}] iface; detected {f.route.iface})" if chosen != f.route.iface else ""
    detail = f"{chosen}{note} from {f.route.src or '?'}, MTU {f.mtu or '?'}"
    peer_mtu = next((p.peer.get("mtu") for p in f.probes if p.peer.get("mtu")), None)
    warning = None
    if peer_mtu and f.mtu and chosen != "lo" and str(f.mtu) != peer_mtu:
        warning = (
            f"{detail}, but main's MTU is {peer_mtu}: large NCCL packets fragment or vanish",
            f"sudo ip link set dev {chosen} mtu {peer_mtu}  (or lower main's; every node must agree)",
        )
    return _warn_or_pass("interface to main", warning, f"{detail}; GLOO/NCCL_SOCKET_IFNAME={chosen}")


def _warn_or_pass(check: str, warning: tuple[str, str] | None, passed: str) -> CheckRow:
    """``check``'s WARN row (detail, fix) when there is a warning, else its PASS row saying ``passed``."""
    if warning is None:
        return CheckRow(check, Status.PASS, passed)
    return CheckRow(check, Status.WARN, *warning)


def _hostname_row(f: DoctorFacts) -> CheckRow:
    loop = [a for a in f.hostname_addrs if net.is_loopback(a)]
    if not loop or f.loopback_main:
        shown = ", ".join(f.hostname_addrs) or "nothing"
        return CheckRow("host name", Status.PASS, f"{f.hostname} resolves to {shown}")
    addr = f.route.src if f.route and f.route.src else "THIS_NODE_IP"
    return CheckRow(
        "host name",
        Status.WARN,
        f"{f.hostname} resolves to {loop[0]} here: tools that advertise the host name give the others a loopback",
        # The first matching line of /etc/hosts comes first from the resolver; nothing else needs removing.
        f"sudo sed -i '1i {addr} {f.hostname}' /etc/hosts",
    )


def _ports_rows(f: DoctorFacts) -> list[CheckRow]:
    if not f.holders:
        lo, hi = f.ports
        return [CheckRow("ports on main", Status.PASS, f"{lo} (rendezvous) and {hi} (preflight) are free")]
    out = []
    for port, holder in f.holders:
        who = f" by {holder}" if holder else ""
        pid = re.search(r"pid (\d+)", holder or "")
        fix = f"kill {pid.group(1)}" if pid else f"sudo ss -tlnp 'sport = :{port}'"
        fix += f"  (nodekit down --node-rank 0 if it is an earlier run; or --master-port {f.ports[0] + 10})"
        out.append(CheckRow("ports on main", Status.FAIL, f"port {port} is already in use{who}", fix))
    return out


def _reach_rows(f: DoctorFacts) -> list[CheckRow]:
    if not f.probes:
        return [CheckRow("reach main", Status.SKIP, "not probed (no route)")]
    verdicts = [_reach(f, p) for p in f.probes]
    status, why, fix = max(verdicts, key=lambda v: _rank(v[0]))
    ports = "; ".join(
        f"{p.port}: {p.reach.value}" + (f" in {p.rtt_s * 1000:.1f} ms" if p.rtt_s is not None else "") for p in f.probes
    )
    return [CheckRow("reach main", status, f"{ports} ({why})", fix), _clock_row(f)]


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


def _clock_row(f: DoctorFacts) -> CheckRow:
    if f.main_is_here:
        return CheckRow("clock", Status.PASS, "main is this machine: same clock")
    got = [p for p in f.probes if p.clock_offset_s is not None]
    if not got:
        return CheckRow("clock", Status.SKIP, "offset to main needs main's doctor listening (--listen)")
    best = min(got, key=lambda p: p.offset_error_s or 0.0)
    off, err = best.clock_offset_s or 0.0, best.offset_error_s or 0.0
    detail = f"main is {off:+.3f} s from this node (+- {err:.3f} s)"
    skewed = abs(off) - err > CLOCK_TOLERANCE_S
    warning = (f"{detail}: logs and timeouts disagree", "sudo timedatectl set-ntp true") if skewed else None
    return _warn_or_pass("clock", warning, detail)


def port_range_row(f: DoctorFacts) -> CheckRow:
    """Whether the ephemeral port range can hand the rendezvous ports to an outgoing connection."""
    if f.port_range is None:
        return CheckRow("port range", Status.SKIP, "cannot read /proc/sys/net/ipv4/ip_local_port_range")
    lo, hi = f.port_range
    reserved = net.ports_in_spec(f.reserved or "")
    clash = [p for p in f.ports if lo <= p <= hi and p not in reserved]
    base = f"ephemeral ports {lo}-{hi} (NCCL's and gloo's data sockets)"
    a, b = f.ports
    warning = None
    if clash:
        warning = (
            f"{base} include {', '.join(map(str, clash))}: an outgoing connection can take it before the rendezvous",
            f"sudo sysctl -w net.ipv4.ip_local_reserved_ports={a}-{b}",
        )
    return _warn_or_pass("port range", warning, f"{base}; {a}-{b} outside")


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


def firewall_row(f: DoctorFacts) -> CheckRow:
    """Whether ufw or iptables may drop incoming TCP: the rendezvous ports, NCCL's and gloo's data sockets."""
    fw = f.firewall
    blocking = fw.ufw == "active" or fw.iptables_policy in ("DROP", "REJECT") or fw.iptables_blocks
    if blocking:
        what = (
            "ufw is active" if fw.ufw == "active" else f"iptables INPUT {fw.iptables_policy or 'has DROP/REJECT rules'}"
        )
        return CheckRow(
            "firewall",
            Status.WARN,
            f"{what}: open the rendezvous ports and a narrowed ephemeral range for NCCL/gloo",
            _open_ports_fix(f),
        )
    if not fw.readable:
        return CheckRow(
            "firewall",
            Status.SKIP,
            "cannot read the firewall rules (run doctor as root to check)",
            _open_ports_fix(f) + "  (if a firewall is on)",
        )
    if fw.ufw is None and fw.iptables_policy is None:
        return CheckRow("firewall", Status.PASS, "no ufw or iptables on this host")
    return CheckRow("firewall", Status.PASS, "no rule drops incoming TCP (ufw inactive or absent, INPUT accepts)")


def arrivals_row(
    arrivals: Sequence[Arrival], *, nnodes: int, ports: Sequence[int], seconds: float, main_ip: str | None = None
) -> CheckRow:
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
        return CheckRow("workers", Status.FAIL, f"{detail}; {', '.join(problems)}", fix)
    if not got:
        return CheckRow(
            "workers", Status.WARN, detail if unnamed else f"no worker's doctor connected in {seconds:.1f} s", fix
        )
    return CheckRow("workers", Status.PASS, detail)


def _rank(s: Status) -> int:
    return {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3}[s]
