"""Every ssh command line nodekit runs, built in one place: the fleet's checks (nodekit.fleet.remote), the relay's
head session and each hop's own ssh inside the relay script (nodekit.ship.relay), the shared connections of a push
(nodekit.ship.mux), and the questions put to the head's own OpenSSH (``ssh -G``, ``ssh-keygen -F``). An option
every connection should carry is added here, once. Pure: the commands run through nodekit.proc.

Always batch mode: a missing key fails instead of prompting (nodekit runs unattended, many hosts at once). The
user's own ``~/.ssh/config``, keys, agent and known_hosts apply, except where a hop pins the host key it accepts.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

BATCH = ("-o", "BatchMode=yes")
KEEPALIVE = ("-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3")
"""A connection whose peer stops answering ends after about 30 s instead of hanging."""


@dataclass(frozen=True)
class Pinned:
    """Accept only the host keys in the file ``known_hosts``, looked up under ``alias`` (known_hosts handling for
    a host the head vouches for: the relay's hops). Values may be shell words (the relay script's variables)."""

    known_hosts: str
    alias: str


def options(
    *, connect_timeout: int, forward_agent: bool = False, keepalive: bool = False, pinned: Pinned | None = None
) -> list[str]:
    """The options of an ssh command line, in the order nodekit has always written them."""
    argv = ["-A"] if forward_agent else []
    argv += BATCH
    if pinned is not None:
        argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={pinned.known_hosts}",
                 "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"HostKeyAlias={pinned.alias}",
                 "-o", "CheckHostIP=no"]  # fmt: skip
    argv += ["-o", f"ConnectTimeout={connect_timeout}"]
    if keepalive:
        argv += KEEPALIVE
    return argv


def command(
    host: str,
    remote: str,
    *,
    connect_timeout: int,
    port: int | None = None,
    user: str | None = None,
    forward_agent: bool = False,
    keepalive: bool = False,
) -> list[str]:
    """``ssh [options] [-p port] [-l user] -- host remote``: ``remote`` run there by the user's login shell."""
    argv = ["ssh", *options(connect_timeout=connect_timeout, forward_agent=forward_agent, keepalive=keepalive)]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    return [*argv, "--", host, remote]


def hop_words(*, connect_timeout: int, pinned: Pinned) -> str:
    """The relay script's own ``ssh`` to the next node (its options as shell words; ``pinned``'s values are the
    script's variables, so they are not quoted here): agent forwarded, only the head's host key line accepted."""
    return " ".join(["ssh", *options(connect_timeout=connect_timeout, forward_agent=True, keepalive=True,
                                     pinned=pinned)])  # fmt: skip


def shared(control_dir: str, persist_s: int) -> list[str]:
    """Options that share one connection per host (OpenSSH's ControlMaster): the first call opens it, the others
    ride on it, and it outlives its last call by ``persist_s`` seconds at most."""
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C", "-o", f"ControlPersist={persist_s}"]


def shared_wrapper(real_ssh: str, control_dir: str, persist_s: int, *, opt_out: str) -> str:
    """A POSIX sh script standing in for ``ssh``: the real one with :func:`shared`'s options, unless the variable
    ``opt_out`` is set (a session that forwards an agent must not share)."""
    return (
        "#!/bin/sh\n"
        f'[ -n "${opt_out}" ] && exec {shlex.quote(real_ssh)} "$@"\n'
        f'exec {shlex.join([real_ssh, *shared(control_dir, persist_s)])} "$@"\n'
    )


def exit_master(real_ssh: str, control_socket: str) -> list[str]:
    """Tell the master listening on ``control_socket`` to exit (the host argument is ignored with a ControlPath)."""
    return [real_ssh, "-o", f"ControlPath={control_socket}", "-O", "exit", "nodekit-mux"]


def config_of(real_ssh: str, host: str, *, user: str | None = None, port: int | None = None) -> list[str]:
    """``ssh -G``: the configuration the head's OpenSSH would use for ``host`` (its ~/.ssh/config applied)."""
    argv = [real_ssh, "-G"]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    return [*argv, "--", host]


def known_hosts_lookup(keygen: str, name: str, known_hosts_file: str) -> list[str]:
    """``ssh-keygen -F``: the lines of ``known_hosts_file`` for ``name`` (hashed entries included)."""
    return [keygen, "-F", name, "-f", known_hosts_file]
