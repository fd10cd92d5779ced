"""Each host's checks and facts, gathered there through the user's own OpenSSH client (``ssh`` on PATH, with the
user's config, keys, agent, ProxyJump and known_hosts) and through the host's Docker engine. Nothing is installed.
The facts are the ones ``nodekit up`` reads on its own host, by the same script (nodekit/system/host/facts.py).

:func:`check_all` runs every host at once and raises one :class:`FleetCheckError` naming each failing host with its
fix; nothing has been started anywhere when it does. The parsers are pure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import DeadlineError, NodekitError
from nodekit.system import docker, proc, ssh
from nodekit.system.host import facts as host_facts
from nodekit.system.host.facts import Gathered, HostFacts, facts_script, parse_facts

SSH_TIMEOUT_S = 8
# The connection, then the facts script there (nvidia-smi within its own deadline, a few file reads).
SSH_DEADLINE_S = SSH_TIMEOUT_S + host_facts.NVIDIA_SMI_S + host_facts.SCRIPT_S
MAX_PARALLEL = 64  # sshd's default MaxStartups is 10:30:100 per target; the head's own fan-out is what this bounds


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


def gather(host: FleetHost, gpus: int | None = None, paths: Sequence[str] = ()) -> Gathered | Problem:
    """Facts of ``host``: over SSH for ``ssh://``, here for ``unix://``, from the config alone for ``tcp://``."""
    if host.scheme == "unix":
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
        done = proc.run(ssh_argv(host, facts_script(paths)), deadline=SSH_DEADLINE_S, what="SSH", fix=fix)
    except DeadlineError:
        return Problem(host, f"SSH did not answer within {SSH_DEADLINE_S:g} s", fix)
    if done.returncode == 255:
        return ssh_problem(host, done.stderr)
    if done.returncode != 0:
        return Problem(host, f"the facts script failed there ({done.stderr.strip()[-200:]})", "check its login shell")
    got = parse_facts(done.stdout, gpus)
    if got.nvidia_smi_hung:
        return Problem(host, f"nvidia-smi did not answer within {host_facts.NVIDIA_SMI_S:g} s", host_facts.NVIDIA_FIX)
    return got


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
    then: Callable[[FleetHost], object] | None = None,
) -> list[Gathered]:
    """:func:`check_host` on every host in parallel; their facts in rank order, or FleetCheckError naming every
    failing host with its fix. ``then`` runs in a host's own thread as soon as that host passed (the next question
    for it, over the connection its check opened, without waiting for the slowest host); it must not raise."""

    def one(h: FleetHost) -> Gathered | list[Problem]:
        result = check_host(h, expect(h), gpus(h))
        if on_done is not None:
            on_done(h, None if isinstance(result, Gathered) else "; ".join(p.what for p in result))
        if then is not None and isinstance(result, Gathered):
            then(h)
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
