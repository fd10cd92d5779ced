"""A virtual cluster on one machine: N hosts, each a network namespace with its own address and its own dockerd.

Layout (cluster ``nkt``, 3 hosts)::

    netns nkt-sw      bridge br0, ports h0 h1 h2          (the switch: nothing is added to the root namespace)
    netns nkt-h0      net0 172.31.250.10/24 (veth to h0)   decoy0 10.253.0.2/24 holding the default route
    netns nkt-h1      eth1 172.31.250.11/24                ...   (interface names differ per host, as on real
    netns nkt-h2      ens5 172.31.250.12/24                ...    machines: net0, eth1, ens5, net0, ...)
    dockerd per host  started with `nsenter --net=/var/run/netns/nkt-hI` (not `ip netns exec`, which remounts /sys
                      and breaks the daemon's view of cgroups), socket /run/nodekit-cluster/nkt/hI/docker.sock,
                      data root /var/lib/nodekit-cluster/nkt/hI (kept between runs: images survive), exec root
                      and pidfile under /run/nodekit-cluster/nkt/hI, --bridge=none --iptables=false (containers
                      use host networking, i.e. the host's namespace).

A host's processes are exactly the processes in its network namespace (dockerd, its containerd, the shims, the
containers, and anything run with ``Host.run``), so ``Host.stop`` kills those and nothing else. Everything is
torn down by ``Cluster.down`` (also after a failed test), and a leftover of a killed earlier run of the same
cluster name is cleaned by ``Cluster.up`` before it starts.

Needs root, iproute2, nsenter and a dockerd (PATH, NODEKIT_DOCKERD, or /opt/nodekit-engine from make engine).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
RUN_DIR = Path("/run/nodekit-cluster")
DATA_DIR = Path("/var/lib/nodekit-cluster")
SUBNET = "172.31.250.0/24"
FIRST_HOST = 10
DECOY_ADDR = "10.253.0.2/24"
DECOY_GW = "10.253.0.1"
IFACE = "net0"
# Different per host, so that a fact copied from one machine to another shows up as a failure.
IFACES = ("net0", "eth1", "ens5")
DECOY = "decoy0"
ENGINE_PREFIXES = (Path("/opt/nodekit-engine"),)
LEGACY_TRUST_KEY = Path("/etc/docker/key.json")
SSHD = Path("/usr/sbin/sshd")  # Debian's openssh-server (scripts/sshd.sh installs it)


class HarnessError(RuntimeError):
    """The machine cannot host a virtual cluster (not root, no dockerd, ...), or a host misbehaved."""


def problem() -> str | None:
    """Why a cluster cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and dockerd)"
    for tool in ("ip", "nsenter", "docker"):
        if shutil.which(tool) is None:
            return f"the {tool} command is missing"
    if find_dockerd() is None:
        return "no dockerd found (PATH, NODEKIT_DOCKERD, or make engine)"
    if LEGACY_TRUST_KEY.exists():
        # Docker >= 23 takes a new data root's engine ID from this file: every virtual host would get one ID.
        return f"{LEGACY_TRUST_KEY} exists (left by an old dockerd), so every new engine would share one ID; remove it"
    return None


def find_dockerd() -> Path | None:
    given = os.environ.get("NODEKIT_DOCKERD")
    if given:
        return Path(given) if Path(given).is_file() else None
    # The engine `make engine` provisioned comes first: another dockerd on PATH (e.g. bookworm's docker.io 20.10,
    # which charliecloud-builders drags in) would give every virtual host an engine this project never tested.
    for prefix in ENGINE_PREFIXES:
        for sub in ("usr/sbin", "usr/bin", "sbin", "bin"):
            if (prefix / sub / "dockerd").is_file():
                return prefix / sub / "dockerd"
    found = shutil.which("dockerd")
    return Path(found) if found else None


def _daemon_path(dockerd: Path) -> str:
    """PATH for dockerd: it finds containerd, the shims, runc and docker-init through it."""
    prefix = dockerd.parent.parent
    dirs = [dockerd.parent, prefix / "bin", prefix / "sbin"]
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return ":".join([*dict.fromkeys(str(d) for d in dirs if d.is_dir()), system])


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise HarnessError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


# --- processes by network namespace ----------------------------------------------------------------------------


def netns_inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def pids_in_netns(inode: int) -> list[int]:
    """Live (not zombie) processes whose network namespace is ``inode``."""
    want = f"net:[{inode}]"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "net") != want:
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(entry.name))
    return found


def kill_netns(inode: int, *, timeout: float = 15) -> int:
    """SIGKILL every process in the namespace until none is left (new ones may appear while we kill). Every one is
    stopped first (SIGSTOP), so that none sees another die and acts on it: killed one by one, a docker CLI whose
    daemon had just died reported the container's loss (exit 125) through Slurm before it was killed itself, which a
    host that dies at once never does."""
    for pid in [p for p in pids_in_netns(inode) if p != os.getpid()]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while pids := [p for p in pids_in_netns(inode) if p != os.getpid()]:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        if time.monotonic() > deadline:
            raise HarnessError(f"processes {pids} survive SIGKILL in netns {inode}")
        time.sleep(0.05)
    return len(killed)


def unmount_under(*roots: Path) -> int:
    """Unmount (lazily, deepest first) everything mounted under ``roots``: overlay and shm mounts that a killed
    daemon leaves behind in the shared mount namespace."""
    prefixes = [str(r.resolve()).rstrip("/") + "/" for r in roots]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point.startswith(p) or point + "/" == p for p in prefixes):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    return len(points)


def remove_cgroups(parent: str) -> None:
    """Remove the (empty, once the processes are dead) cgroups dockerd made under ``--cgroup-parent``."""
    base = Path("/sys/fs/cgroup")
    roots = [base / parent.strip("/")]
    if base.is_dir():
        roots += [d / parent.strip("/") for d in base.iterdir() if d.is_dir()]
    for root in roots:
        if root.is_dir():
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
        with contextlib.suppress(OSError):
            root.parent.rmdir()  # /nodekit-cluster itself, unless another cluster still uses it


def ping_socket(sock: Path, timeout: float = 1.0) -> bool:
    """True when an engine answers GET /_ping on the unix socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return False
    return head.startswith(b"HTTP/1.") and b" 200 " in head


# --- hosts -----------------------------------------------------------------------------------------------------


def cluster_tmp(name: str) -> Path:
    """The TMPDIR of cluster ``name``'s SSH sessions (:attr:`Host.tmp`)."""
    return Path("/tmp") / f"nkc-tmp.{name}"


@dataclass
class Host:
    """One machine of the cluster: a network namespace with one address toward the others and its own engine."""

    cluster: str
    index: int
    addr: str
    prefixlen: int
    decoy: bool
    data_root: Path
    run_dir: Path
    pid: int | None = None
    containerd_store: bool = False
    """Start the engine with Docker's containerd image store (the `containerd-snapshotter` feature) instead of the
    classic layer store: the default of new Docker installs from 29 on."""
    switch: str = ""
    sshd_pid: int | None = None

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def netns(self) -> str:
        return f"{self.cluster}-h{self.index}"

    @property
    def tmp(self) -> Path:
        """The TMPDIR of this host's SSH sessions, one per cluster (mode 1777, as /tmp): what a relay step makes
        there is this cluster's, never another test group's that runs at the same time on this machine's /tmp."""
        return cluster_tmp(self.cluster)

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def sock(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.sock}"

    @property
    def exec_root(self) -> Path:
        return self.run_dir / "exec"

    @property
    def log(self) -> Path:
        return self.data_root.parent / f"{self.name}-dockerd.log"

    @property
    def iface(self) -> str:
        """The interface that reaches the other hosts (the decoy holds the default route); named per host."""
        return IFACES[self.index % len(IFACES)]

    @property
    def cgroup_parent(self) -> str:
        return f"/nodekit-cluster/{self.cluster}/{self.name}"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for commands on this host: ours, with DOCKER_HOST pointing at this host's engine."""
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.docker_host
        env.pop("DOCKER_CONTEXT", None)
        env.update(extra or {})
        return env

    def argv(self, *cmd: str) -> list[str]:
        return ["nsenter", f"--net={self.netns_path}", "--", *cmd]

    def run(
        self,
        *cmd: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
        cwd: Path | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on this host (in its namespace, DOCKER_HOST set) and capture its output."""
        proc = subprocess.run(
            self.argv(*cmd), env=self.env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
        if check and proc.returncode != 0:
            raise HarnessError(f"[{self.name}] {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def popen(
        self, *cmd: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, log: Path | None = None
    ) -> subprocess.Popen[str]:
        """Start ``cmd`` on this host; stdout and stderr go together to ``log`` (or a pipe)."""
        out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 - handed to the child, closed below
        try:
            return subprocess.Popen(
                self.argv(*cmd), env=self.env(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True
            )
        finally:
            if log:
                out.close()  # type: ignore[union-attr]

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["docker", "-H", self.docker_host, *args], capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise HarnessError(f"[{self.name}] docker {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def image_id(self, ref: str) -> str | None:
        proc = self.docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def running_containers(self) -> list[str]:
        return self.docker("ps", "-q").stdout.split()

    # -- lifecycle --

    def create_network(self) -> None:
        ns = self.netns
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        iface = self.iface
        sh("ip", "-n", self.switch, "link", "add", self.name, "type", "veth", "peer", "name", iface, "netns", ns)
        sh("ip", "-n", self.switch, "link", "set", self.name, "master", "br0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{self.addr}/{self.prefixlen}", "dev", iface)
        sh("ip", "-n", ns, "link", "set", iface, "up")
        if self.decoy:
            # A veth pair with both ends here (not every kernel has the dummy driver): an interface with an
            # address and a carrier, leading nowhere.
            sh("ip", "-n", ns, "link", "add", DECOY, "type", "veth", "peer", "name", f"{DECOY}p")
            sh("ip", "-n", ns, "addr", "add", DECOY_ADDR, "dev", DECOY)
            sh("ip", "-n", ns, "link", "set", f"{DECOY}p", "up")
            sh("ip", "-n", ns, "link", "set", DECOY, "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", DECOY_GW, "dev", DECOY)

    def start(self, dockerd: Path) -> None:
        """Start this host's dockerd (returns at once; ``wait_ready`` waits for it)."""
        if self.pid is not None and _alive(self.pid):
            return
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.sock.unlink()
        env = {"PATH": _daemon_path(dockerd), "HOME": "/root"}
        argv = self.argv(
            str(dockerd),
            f"--host={self.docker_host}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.run_dir / 'docker.pid'}",
            # cgroupfs everywhere: on cgroup v2 dockerd would default to systemd, which wants "x.slice" parents.
            "--exec-opt=native.cgroupdriver=cgroupfs",
            f"--cgroup-parent={self.cgroup_parent}",
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            "--log-level=warn",
            *self._store_flags(),
        )
        with open(self.log, "a") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = proc.pid  # nsenter execs dockerd: the same process

    def _store_flags(self) -> list[str]:
        if not self.containerd_store:
            return ["--storage-driver=overlay2"]
        config = self.run_dir / "daemon.json"
        config.write_text(json.dumps({"features": {"containerd-snapshotter": True}}) + "\n")
        return [f"--config-file={config}"]

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ping_socket(self.sock):
                return
            if self.pid is not None and not _alive(self.pid):
                raise HarnessError(f"dockerd of {self.name} exited at start; see {self.log}:\n{_tail(self.log)}")
            time.sleep(0.1)
        raise HarnessError(f"dockerd of {self.name} did not answer in {timeout:.0f}s; see {self.log}")

    def stop(self) -> int:
        """The host dies: kill its daemon, its containerd and shims, its containers' processes and anything else
        running in its namespace. Returns how many processes were killed. Its network stays (cut() cuts it)."""
        inode = netns_inode(self.netns_path)
        n = kill_netns(inode) if inode is not None else 0
        self.pid = None
        unmount_under(self.exec_root, self.data_root)
        return n

    def restart(self, dockerd: Path) -> None:
        self.stop()
        shutil.rmtree(self.exec_root, ignore_errors=True)
        self.start(dockerd)
        self.wait_ready()

    def cut(self) -> None:
        """Pull the cable: the host's port on the switch goes down (the host still sees its own address)."""
        sh("ip", "-n", self.switch, "link", "set", self.name, "down")

    def reconnect(self) -> None:
        sh("ip", "-n", self.switch, "link", "set", self.name, "up")

    def block(self, dest: str, ports: Sequence[int]) -> None:
        """Silently drop this host's TCP packets to ``dest`` on ``ports`` (a firewall in the way): connections
        time out, and the route to ``dest`` is unchanged, so ``ip route get`` answers as before. The rules live in
        the host's namespace and vanish with it. (A blackhole route would fail connect() at once with EINVAL.)"""
        if shutil.which("iptables") is None:
            raise HarnessError("Host.block needs iptables")
        for port in ports:
            self.run("iptables", "-w", "-A", "OUTPUT", "-p", "tcp", "-d", dest, "--dport", str(port), "-j", "DROP",
                     check=True)  # fmt: skip

    def unblock(self) -> None:
        self.run("iptables", "-w", "-F", "OUTPUT", check=True)

    def isolate(self) -> None:
        """The host vanishes from the network without a word (a frozen machine, a dead switch port behind a
        router): every packet in or out of its interface toward the others is dropped in its namespace, so TCP
        connections to it hang instead of being reset. Its processes go on running. ``rejoin`` undoes it."""
        if shutil.which("iptables") is None:
            raise HarnessError("Host.isolate needs iptables")
        for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self.run("iptables", "-w", "-I", chain, flag, self.iface, "-j", "DROP", check=True)

    def rejoin(self) -> None:
        for chain in ("INPUT", "OUTPUT"):
            self.run("iptables", "-w", "-F", chain, check=True)

    # -- an OpenSSH server, so that a head node reaches this host the way it reaches a real one --

    @property
    def sshd_dir(self) -> Path:
        return self.run_dir / "sshd"

    @property
    def home(self) -> Path:
        """The login user's home directory as this host's sshd sessions see it (bound over /root for them only)."""
        return self.sshd_dir / "home"

    def start_sshd(
        self, authorized_keys: str, host_key: Path, *, sshd: Path = SSHD, path_first: Path | None = None
    ) -> int:
        """Start Debian's sshd in this host's namespace on port 22 of its address: only key logins (those in
        ``authorized_keys``, and the user's own ``~/.ssh/authorized_keys``, sshd's default), host key ``host_key``,
        and ``DOCKER_HOST`` set for every session so that a remote ``docker`` (the docker CLI's ``ssh://`` transport
        runs ``docker system dial-stdio`` there) reaches this host's engine. Its sessions run in a mount namespace of
        their own in which :attr:`home` is /root: each host has its own home, as separate machines do, and nothing
        written to ~/.ssh there reaches this machine's /root. ``path_first``: a directory put first on the sessions'
        PATH (this host's own ``docker``, say; the hosts share one file system). Returns sshd's PID (``stop_sshd``
        ends it; the host's ``stop`` kills it with everything else)."""
        d = self.sshd_dir
        d.mkdir(parents=True, exist_ok=True)
        (self.home / ".ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        (d / "authorized_keys").write_text(authorized_keys)
        self.tmp.mkdir(exist_ok=True)
        self.tmp.chmod(0o1777)
        config = d / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    "Port 22",
                    f"ListenAddress {self.addr}",
                    f"HostKey {host_key}",
                    f"PidFile {d / 'sshd.pid'}",
                    f"AuthorizedKeysFile {d / 'authorized_keys'} .ssh/authorized_keys",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    f"SetEnv DOCKER_HOST={self.docker_host} TMPDIR={self.tmp}"
                    + (f" PATH={path_first}:/usr/local/bin:/usr/bin:/bin" if path_first else ""),
                    "",
                ]
            )
        )
        log = d / "sshd.log"
        # unshare and sh exec: the PID is sshd's. Private propagation: the bind stays in sshd's namespace.
        bind = ["sh", "-c", 'mount --bind "$0" /root && exec "$@"', str(self.home)]
        own_home = ["unshare", "--mount", "--propagation", "private", "--", *bind]
        proc = subprocess.Popen(
            self.argv(*own_home, str(sshd), "-D", "-f", str(config), "-E", str(log)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.sshd_pid = proc.pid  # nsenter execs sshd: the same process
        deadline = time.monotonic() + 10
        while not self._port_open(22):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(f"sshd of {self.name} did not start; see {log}:\n{_tail(log)}")
            time.sleep(0.05)
        return proc.pid

    def _port_open(self, port: int) -> bool:
        probe = f"import socket; socket.create_connection(({self.addr!r}, {port}), timeout=1).close()"
        return self.run("python3", "-c", probe, timeout=10).returncode == 0

    def stop_sshd(self, *, wait: float = 0) -> None:
        """SIGTERM to sshd; with ``wait``, up to that many seconds for it to be gone (its port free again)."""
        pid, self.sshd_pid = self.sshd_pid, None
        if pid is not None and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + wait
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "netns": self.netns,
            "addr": self.addr,
            "iface": self.iface,
            "DOCKER_HOST": self.docker_host,
            "dockerd_pid": self.pid,
            "data_root": str(self.data_root),
            "log": str(self.log),
        }


def ssh_client(d: Path, hosts: Sequence[Host], client_key: Path, host_key_pub: str) -> Path:
    """An OpenSSH client set up for ``hosts`` as a user's own ~/.ssh/config would be (IdentityFile,
    UserKnownHostsFile with their host key, StrictHostKeyChecking): the directory of an ``ssh`` that runs the system's
    ssh with ``-F`` that config. Put it first on PATH; nodekit and the docker CLI's ssh:// transport both use it."""
    d.mkdir(parents=True, exist_ok=True)
    kind, key = host_key_pub.split()[:2]
    (d / "known_hosts").write_text("".join(f"{h.addr} {kind} {key}\n" for h in hosts))
    config = d / "ssh_config"
    config.write_text(
        f"Host {' '.join(h.addr for h in hosts)}\n"
        f"  IdentityFile {client_key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {d / 'known_hosts'}\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 5\n"
        "  LogLevel ERROR\n"
    )
    bin_dir = d / "bin"
    bin_dir.mkdir(exist_ok=True)
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {shutil.which("ssh") or "/usr/bin/ssh"} -F {config} "$@"\n')
    ssh.chmod(0o755)
    return bin_dir


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# --- the cluster -----------------------------------------------------------------------------------------------


@dataclass
class Cluster:
    """N hosts on a private bridge. ``up`` makes them (cleaning a stale leftover first), ``down`` removes them."""

    n: int
    name: str = "nkc"
    subnet: str = SUBNET
    decoy: bool = True
    data_dir: Path = DATA_DIR
    run_dir: Path = RUN_DIR
    owner: int | None = None
    """pid of the process that owns the cluster (a test run); None: made by hand, lives until ``down``."""
    hosts: list[Host] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 50:
            raise HarnessError("a cluster has 1 to 50 hosts")
        if len(self.name) > 8 or not self.name.replace("-", "").isalnum():
            raise HarnessError("a cluster name is up to 8 letters, digits or dashes")
        net = ipaddress.ip_network(self.subnet)
        addrs = list(net.hosts())
        self.hosts = [
            Host(
                cluster=self.name,
                index=i,
                addr=str(addrs[FIRST_HOST - 1 + i]),
                prefixlen=net.prefixlen,
                decoy=self.decoy,
                data_root=self.data_dir / self.name / f"h{i}",
                run_dir=self.run_dir / self.name / f"h{i}",
                switch=self.switch,
            )
            for i in range(self.n)
        ]

    @property
    def switch(self) -> str:
        return f"{self.name}-sw"

    @property
    def main(self) -> Host:
        return self.hosts[0]

    @property
    def state_file(self) -> Path:
        return self.run_dir / self.name / "state.json"

    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self, *, timeout: float = 90) -> Cluster:
        why = problem()
        if why:
            raise HarnessError(why)
        dockerd = find_dockerd()
        assert dockerd is not None
        t0 = time.monotonic()
        self._claim()
        try:
            sh("ip", "netns", "add", self.switch)
            sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for h in self.hosts:
                h.create_network()
            self.timings["network_s"] = time.monotonic() - t0
            for h in self.hosts:
                h.start(dockerd)
            self._save()
            with ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
                list(pool.map(lambda h: h.wait_ready(timeout), self.hosts))
            self._save()
        except BaseException:
            self.down()
            raise
        self.timings["up_s"] = time.monotonic() - t0
        return self

    def down(self, *, purge: bool = False) -> None:
        """Kill every host's processes, remove namespaces, mounts and run files. ``purge`` also deletes the data
        roots (the hosts' images)."""
        t0 = time.monotonic()
        clean(self.name, run_dir=self.run_dir, data_dir=self.data_dir, purge=purge)
        for h in self.hosts:
            h.pid = None
        self.timings["down_s"] = time.monotonic() - t0

    def restart(self, host: Host) -> None:
        dockerd = find_dockerd()
        assert dockerd is not None
        host.restart(dockerd)
        self._save()

    def _claim(self) -> None:
        state = read_state(self.state_file)
        if state is not None:
            owner = state.get("owner")
            if isinstance(owner, int) and owner != os.getpid() and _alive(owner):
                raise HarnessError(f"cluster {self.name} is in use by pid {owner}; pick another name")
            if owner is None and any(_alive(int(h["dockerd_pid"])) for h in state["hosts"] if h.get("dockerd_pid")):
                raise HarnessError(f"cluster {self.name} is up; python -m tests.cluster down --name {self.name} first")
        clean(self.name, run_dir=self.run_dir, data_dir=self.data_dir)
        (self.run_dir / self.name).mkdir(parents=True, exist_ok=True)
        self._save()

    def _save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2))
        tmp.replace(self.state_file)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "owner": self.owner,
            "subnet": self.subnet,
            "switch": self.switch,
            "hosts": [h.describe() for h in self.hosts],
        }


def read_state(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def leftovers(name: str) -> list[str]:
    """Network namespaces of cluster ``name`` that exist now."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{name}-"))


def clean(name: str, *, run_dir: Path = RUN_DIR, data_dir: Path = DATA_DIR, purge: bool = False) -> None:
    """Remove everything of cluster ``name``: processes in its namespaces (only those), the namespaces, mounts
    under its directories, its cgroups and run files. Safe to call when nothing is there."""
    for ns in leftovers(name):
        inode = netns_inode(NETNS_DIR / ns)
        if inode is not None:
            kill_netns(inode)
    unmount_under(run_dir / name, data_dir / name)
    for ns in leftovers(name):
        sh("ip", "netns", "del", ns, check=False)
    remove_cgroups(f"/nodekit-cluster/{name}")
    shutil.rmtree(run_dir / name, ignore_errors=True)
    if purge:
        shutil.rmtree(data_dir / name, ignore_errors=True)


@contextlib.contextmanager
def cluster(n: int, name: str = "nkc", **kw: object) -> Iterator[Cluster]:
    c = Cluster(n, name=name, owner=os.getpid(), **kw)  # type: ignore[arg-type]
    c.up()
    try:
        yield c
    finally:
        c.down()
