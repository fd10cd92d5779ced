"""Every ssh command line nodekit runs, built in one place: the fleet's checks (nodekit.backends.fleet.remote), the
relay's head session and each hop's own ssh inside the relay script (nodekit.ship.relay), the shared connections of a
push (nodekit.ship.mux), and the questions put to the head's own OpenSSH (``ssh -G``, ``ssh-keygen -F``). An option
every connection should carry is added here, once. Pure: the commands run through nodekit.system.proc.

Always batch mode: a missing key fails instead of prompting (nodekit runs unattended, many hosts at once). The
user's own ``~/.ssh/config``, keys, agent and known_hosts apply on the head, except where a hop pins the host key it
accepts. Nothing nodekit runs forwards the user's agent: a relay's sessions say ``ForwardAgent=no`` even where the
user's config says yes, and a relay node logs in to the next one with a key made for that push
(:mod:`nodekit.ship.hopkeys`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

BATCH = ("-o", "BatchMode=yes")
ALIVE_INTERVAL_S = 10
ALIVE_COUNT = 3


def keepalive(interval: int = ALIVE_INTERVAL_S, count: int = ALIVE_COUNT) -> tuple[str, ...]:
    """OpenSSH's own liveness check: a connection whose peer has not answered ``count`` probes sent ``interval``
    seconds apart ends (exit 255, "Timeout, server ... not responding") instead of hanging until TCP gives up,
    which is hours for a host that vanished without a reset (a cut cable, a dropped route, a frozen machine)."""
    return ("-o", f"ServerAliveInterval={interval}", "-o", f"ServerAliveCountMax={count}")


KEEPALIVE = keepalive()
"""Every ssh nodekit starts carries it: a connection whose peer stops answering ends after about 30 to 40 s."""
LEND_NOTHING = ("-o", "ForwardAgent=no", "-o", "ClearAllForwardings=yes")
"""No agent and no port forwarded, whatever the user's ~/.ssh/config says for that host (the command line wins)."""


@dataclass(frozen=True)
class Pinned:
    """Accept only the host keys in the file ``known_hosts``, looked up under ``alias`` (known_hosts handling for
    a host the head vouches for: the relay's hops). Values may be shell words (the relay script's variables)."""

    known_hosts: str
    alias: str


def options(
    *, connect_timeout: int, lend_nothing: bool = False, keepalive: bool = True, pinned: Pinned | None = None
) -> list[str]:
    """The options of an ssh command line, in the order nodekit has always written them."""
    argv = [*BATCH, *(LEND_NOTHING if lend_nothing else ())]
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
    lend_nothing: bool = False,
    keepalive: bool = True,
) -> list[str]:
    """``ssh [options] [-p port] [-l user] -- host remote``: ``remote`` run there by the user's login shell.
    ``lend_nothing``: no agent or port forwarding even where the user's config asks for it."""
    argv = ["ssh", *options(connect_timeout=connect_timeout, lend_nothing=lend_nothing, keepalive=keepalive)]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    return [*argv, "--", host, remote]


HOP_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)
"""OpenSSH's default ciphers, AES-GCM first. A relay node encrypts every byte of a stream once more per node it
feeds and decrypts it once, so the cipher's cost per byte is the tree's: with AES instructions (x86 servers of the
last decade, ARMv8's crypto extensions) AES-GCM costs about 60 % of chacha20-poly1305 (OpenSSH's first choice) on
both ends (here: 1.4 against 2.4 CPU-seconds for 500 MB, ssh and sshd together). The whole default set stays
offered, so a node whose sshd allows only some of it still connects."""


def hop_words(*, connect_timeout: int, pinned: Pinned, identity: str) -> str:
    """The relay script's own ``ssh`` to the next node (its options as shell words; ``pinned``'s values and
    ``identity`` are the script's variables, so they are not quoted here): none of the node's own ssh configuration
    (``-F /dev/null``: the head decided where and how), only the key file ``identity`` (no agent, not the node's
    own keys), nothing forwarded, only the head's host key line accepted, the cheapest cipher first
    (:data:`HOP_CIPHERS`)."""
    own = ["-F", "/dev/null", "-i", identity, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
           "-o", f"Ciphers={','.join(HOP_CIPHERS)}"]  # fmt: skip
    return " ".join(["ssh", *own, *options(connect_timeout=connect_timeout, lend_nothing=True, keepalive=True,
                                           pinned=pinned)])  # fmt: skip


def shared(control_dir: str, persist_s: int) -> list[str]:
    """Options that share one connection per host (OpenSSH's ControlMaster): the first call opens it, the others
    ride on it, and it outlives its last call by ``persist_s`` seconds at most. The shared connection keeps alive
    (:data:`KEEPALIVE`): a node that vanishes ends every call riding on it."""
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C", "-o", f"ControlPersist={persist_s}",
            *KEEPALIVE]  # fmt: skip


def alive_wrapper(real_ssh: str, *, interval: int, count: int, connect_timeout: int) -> str:
    """A POSIX sh script standing in for ``ssh`` under the docker CLI (its ``ssh://`` transport runs ``ssh``
    from PATH): the real one with :func:`keepalive` and a connect timeout. Options given first win in OpenSSH, so
    these hold over the docker CLI's own ``ConnectTimeout=30`` and over the user's config for these calls only."""
    opts = [*keepalive(interval, count), "-o", f"ConnectTimeout={connect_timeout}"]
    return f'#!/bin/sh\nexec {shlex.join([real_ssh, *opts])} "$@"\n'


def shared_wrapper(real_ssh: str, control_dir: str, persist_s: int) -> str:
    """A POSIX sh script standing in for ``ssh``: the real one with :func:`shared`'s options."""
    return f'#!/bin/sh\nexec {shlex.join([real_ssh, *shared(control_dir, persist_s)])} "$@"\n'


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
