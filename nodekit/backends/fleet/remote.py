"""Each host's checks and facts, gathered there through the user's own OpenSSH client (``ssh`` on PATH, with the
user's config, keys, agent, ProxyJump and known_hosts) and through the host's Docker engine. Nothing is installed.

:func:`check_all` runs every host at once and raises one :class:`FleetCheckError` naming each failing host with its
fix; nothing has been started anywhere when it does. The parsers are pure.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import DeadlineError, NodekitError
from nodekit.launcher.contract import DOCKER_PIDFILES
from nodekit.system import docker, proc, ssh
from nodekit.system.host.facts import HostFacts

SSH_TIMEOUT_S = 8
MAX_PARALLEL = 64  # sshd's default MaxStartups is 10:30:100 per target; the head's own fan-out is what this bounds

# POSIX sh, run with the user's login: facts as key=value lines. The engine's limits are read from its own
# /proc/<pid>/limits where readable (the pidfiles nodekit.launcher.contract lists), else this login's hard limits.
FACTS_SCRIPT = (
    r"""
echo "gpus=$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l)"
for f in /dev/infiniband/uverbs* /dev/infiniband/rdma_cm /dev/infiniband/umad*; do
  [ -e "$f" ] && echo "ib=$f"
done
for p in """
    + " ".join(DOCKER_PIDFILES)
    + r"""; do
  pid=$(cat "$p" 2>/dev/null) || continue
  grep -E '^Max (locked memory|stack size)' "/proc/$pid/limits" 2>/dev/null | sed 's/^/limit=/' && break
done
echo "memlock_kb=$(ulimit -H -l)"
echo "stack_kb=$(ulimit -H -s)"
echo "host=$(hostname)"
cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {print "listen=" $2}'
"""
)


class FleetCheckError(NodekitError):
    """One or more hosts failed their checks; nothing was started anywhere."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    host: FleetHost
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.host.name}: {self.what}. Fix: {self.fix}"


@dataclass(frozen=True)
class Gathered:
    """What a host reported: its facts, its host name and the TCP ports listening there."""

    facts: HostFacts
    hostname: str = ""
    listening: frozenset[int] = field(default_factory=frozenset)
    absent: frozenset[str] = field(default_factory=frozenset)  # of the paths asked about (the job's mounts)


def ssh_argv(host: FleetHost, command: str) -> list[str]:
    """The ``ssh`` command line for ``command`` on ``host``: batch mode (a missing key fails instead of prompting)."""
    return ssh.command(host.hostname, command, port=host.port, user=host.user, connect_timeout=SSH_TIMEOUT_S)


def ssh_problem(host: FleetHost, stderr: str) -> Problem:
    """What an ssh failure means, and its fix, from OpenSSH's own last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else "ssh failed"
    low = stderr.lower()
    target = f"{host.user + '@' if host.user else ''}{host.hostname}"
    if "host key verification failed" in low or "remote host identification has changed" in low:
        fix = f"ssh {target} once by hand to check and accept its host key (known_hosts)"
    elif "permission denied" in low:
        fix = f"ssh-copy-id {target} (or add your key to its authorized_keys / your ssh-agent)"
    elif "could not resolve" in low:
        fix = "check the host name in hosts (or add it to ~/.ssh/config)"
    else:
        fix = f"check that {host.hostname} is up and runs sshd (ssh {target} true)"
    return Problem(host, f"SSH to {target} failed: {last}", fix)


def facts_script(paths: Sequence[str] = ()) -> str:
    """:data:`FACTS_SCRIPT`, plus a line for each of ``paths`` (the node's mount sources) missing on the host."""
    tests = "".join(f'[ -e {shlex.quote(p)} ] || echo "absent="{shlex.quote(p)}\n' for p in paths)
    return FACTS_SCRIPT + tests


def parse_facts(text: str, gpus: int | None = None) -> Gathered:
    """The facts script's output as data; ``gpus`` (the config's ``[nodes.R] gpus``) wins over the count found."""
    count = 0
    ib: list[str] = []
    memlock: int | bool | None = False
    stack: int | bool | None = False
    kb: dict[str, int | None] = {}
    hostname = ""
    listening: set[int] = set()
    absent: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition("=")
        value = value.strip()
        if key == "gpus" and value.isdigit():
            count = int(value)
        elif key == "ib":
            ib.append(value)
        elif key == "limit":
            parts = value.split()
            hard = parts[4]  # "Max locked memory SOFT HARD bytes", "Max stack size SOFT HARD bytes"
            parsed = None if hard == "unlimited" else int(hard)
            if value.startswith("Max locked memory"):
                memlock = parsed
            else:
                stack = parsed
        elif key in ("memlock_kb", "stack_kb"):
            kb[key] = None if value == "unlimited" or not value.isdigit() else int(value) * 1024
        elif key == "host":
            hostname = value
        elif key == "absent":
            absent.add(line.partition("=")[2])
        elif key == "listen":
            port = value.rsplit(":", 1)[-1]
            if port:
                listening.add(int(port, 16))
    facts = HostFacts(
        gpu_count=count if gpus is None else gpus,
        memlock_hard=kb.get("memlock_kb") if memlock is False else memlock,
        stack_hard=kb.get("stack_kb") if stack is False else stack,
        infiniband=tuple(sorted(ib)),
    )
    return Gathered(facts=facts, hostname=hostname, listening=frozenset(listening), absent=frozenset(absent))


def gather(host: FleetHost, gpus: int | None = None, paths: Sequence[str] = ()) -> Gathered | Problem:
    """Facts of ``host``: over SSH for ``ssh://``, here for ``unix://``, from the config alone for ``tcp://``."""
    if host.scheme == "unix":
        from nodekit.system.host import facts as host_facts

        here = host_facts.gather()
        return Gathered(
            facts=here if gpus is None else here.model_copy(update={"gpu_count": gpus}),
            absent=frozenset(p for p in paths if not os.path.exists(p)),
        )
    if host.scheme == "tcp":
        return Gathered(facts=HostFacts(gpu_count=gpus or 0))
    if shutil.which("ssh") is None:
        return Problem(
            host, "no ssh client on this machine", "install OpenSSH's client (apt-get install openssh-client)"
        )
    fix = f"check that {host.hostname} is up (ssh {host.hostname})"
    try:
        done = proc.run(ssh_argv(host, facts_script(paths)), deadline=SSH_TIMEOUT_S + 20, what="SSH", fix=fix)
    except DeadlineError:
        return Problem(host, "SSH did not answer within 30 s", fix)
    if done.returncode == 255:
        return ssh_problem(host, done.stderr)
    if done.returncode != 0:
        return Problem(host, f"the facts script failed there ({done.stderr.strip()[-200:]})", "check its login shell")
    return parse_facts(done.stdout, gpus)


@dataclass(frozen=True)
class Expect:
    """What the job needs of one host."""

    gpus: bool = False
    ports: tuple[int, ...] = ()
    paths: tuple[str, ...] = ()  # host paths the node's mounts need


def check_host(host: FleetHost, expect: Expect, gpus: int | None) -> Gathered | list[Problem]:
    """Reachable, engine with Compose, GPUs and NVIDIA runtime where expected, free ports (main): facts, or why not."""
    got = gather(host, gpus, expect.paths)
    if isinstance(got, Problem):
        return [got]
    problems = [
        Problem(host, f"mount source {p} does not exist there", f"create it there, or set [nodes.{host.rank}] mounts")
        for p in sorted(got.absent)
    ]
    try:
        docker.check_engine(host.url, buildx=False)  # nodes run images, they build none
    except NodekitError as e:
        problems.append(Problem(host, e.message, e.fix or docker.ENGINE_FIX))
        return problems
    if expect.gpus or got.facts.gpu_count > 0:
        if got.facts.gpu_count == 0:
            problems.append(Problem(host, "no NVIDIA GPU found", "check nvidia-smi there, or set [nodes.R] gpus = 0"))
        elif "nvidia" not in docker.runtimes(host.url):
            problems.append(
                Problem(host, "the engine has no NVIDIA runtime", "install nvidia-container-toolkit and restart docker")
            )
    if host.scheme == "unix":
        from nodekit.system.host import net

        busy = [p for p in expect.ports if net.port_in_use(p)]
    else:
        busy = sorted(set(expect.ports) & got.listening)
    if busy:
        problems.append(
            Problem(
                host,
                f"port(s) {', '.join(map(str, busy))} on main are already in use",
                "nodekit down (an earlier run), or set another master_port",
            )
        )
    return problems or got


def check_all(
    hosts: Sequence[FleetHost],
    expect: Callable[[FleetHost], Expect],
    gpus: Callable[[FleetHost], int | None],
    on_done: Callable[[FleetHost, str | None], None] | None = None,
) -> list[Gathered]:
    """:func:`check_host` on every host in parallel; their facts in rank order, or FleetCheckError naming every
    failing host with its fix."""

    def one(h: FleetHost) -> Gathered | list[Problem]:
        result = check_host(h, expect(h), gpus(h))
        if on_done is not None:
            on_done(h, None if isinstance(result, Gathered) else "; ".join(p.what for p in result))
        return result

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, max(1, len(hosts)))) as pool:
        results = list(pool.map(one, hosts))
    problems = [p for r in results if not isinstance(r, Gathered) for p in r]
    if problems:
        names = ", ".join(dict.fromkeys(p.host.name for p in problems))
        raise FleetCheckError(
            f"{len(dict.fromkeys(p.host.rank for p in problems))} of {len(hosts)} host(s) failed the checks, nothing "
            f"was started: " + " | ".join(p.line() for p in problems),
            fix=f"fix {names} and run again",
        )
    return [r for r in results if isinstance(r, Gathered)]
