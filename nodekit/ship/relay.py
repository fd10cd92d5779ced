"""Relays: a node that receives the image stream passes it on to the next, so the head's link carries it once.

A push to N nodes over ``ssh://`` would otherwise send N copies out of the head. With a relay chain the head opens
one SSH session, to the chain's first node, and runs :data:`RELAY_SCRIPT` there (POSIX sh, sent on the command
line in base64; nothing is installed on any node). The script tees its stdin into ``docker load`` on that node and
into ``ssh`` to the next node, which runs the same script, and so on: the stream flows through the chain while
every node loads it, so N nodes take about the time of one. Each node reports on stderr, which flows back along
the chain to the head: its process group (so an aborted push can end what it started), and its load's exit code
and last lines. The head then checks the image id on every node itself, over its own connection to each, as for
a direct push; a node the chain did not deliver to is sent the image directly from the head.

What a hop needs, and where it comes from:

- The next node's address, user and port: from the head's own ``ssh -G`` for that node's endpoint (its
  ``~/.ssh/config`` applies). A node reached through ProxyJump or ProxyCommand is not relayed to.
- The next node's host key: pinned by the head. The hop's ``ssh`` trusts only the lines the head's known_hosts
  files hold for that node (``ssh-keygen -F``, under ``HostKeyAlias``), with ``StrictHostKeyChecking=yes``; a node
  the head has no host key line for is not relayed to.
- A key to log in with: the head's, by agent forwarding (``ssh -A``) along the chain. The user's ssh-agent when it
  holds keys; otherwise a private ssh-agent that nodekit starts for the push (:class:`Agent`) with the key files
  ``ssh -G`` names, each held for at most 15 minutes, stopped by PID when the push ends.
- On every node: sh, base64, mktemp, mkfifo, GNU tee (``-p``: a hop that dies does not stop the node before it)
  and ssh. A node without them fails its load, and gets the image directly.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from nodekit import proc, ssh
from nodekit.errors import DeadlineError, ShipError
from nodekit.ship.mux import NO_MUX

RelayMode = Literal["auto", "always", "never"]
RELAY_MODES: tuple[RelayMode, ...] = ("auto", "always", "never")

RELAY_MIN_BYTES = 64 << 20
"""``auto`` relays only when at least this much travels: each hop adds an SSH handshake from the node before it
(a few tenths of a second), which a small transfer (a code change) does not win back; 64 MiB is about half a
second of a 1 Gbit/s link per extra copy."""

CHAIN_MAX = 8
"""At most this many nodes in one chain: the head sends one stream per chain. A chain goes as fast as its slowest
hop, and a node that dies cuts every node after it (they are then fed from the head), so many nodes make several
shorter chains, not one long one."""


def split_chains(n: int, most: int | None = None) -> list[range]:
    """Pure: ``n`` nodes (in order) cut into the fewest chains of at most ``most`` (default :data:`CHAIN_MAX`), as
    even as can be; a lone node is no chain (it is fed directly)."""
    if n < 2:
        return []
    count = -(-n // max(CHAIN_MAX if most is None else most, 2))
    size, extra = divmod(n, count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        out.append(range(start, end))
        start = end
    return out


CONNECT_S = 10
KEY_LIFETIME_S = 900
_TAG = "nodekit-relay"

# $1: this script in base64; $2: this node's name (base64); then per node after this one: name (base64),
# user@host (base64), port, HostKeyAlias (base64), known_hosts lines (base64). Every argument is base64 or digits,
# so the next hop's command line needs no quoting, and its length grows linearly with the chain.
_SCRIPT = r"""
s=$1 me=$2
shift 2
d=$(mktemp -d "${TMPDIR:-/tmp}/nodekit-relay.XXXXXX") || { echo "nodekit-relay load $me 125" >&2; exit 0; }
trap 'rm -rf "$d"' EXIT
trap 'exit 143' TERM HUP INT
trap '' PIPE
echo "nodekit-relay pgid $me $(cut -d' ' -f5 /proc/$$/stat 2>/dev/null || echo $$)" >&2
next=
if [ $# -ge 5 ]; then
  nm=$1 port=$3
  dest=$(printf %s "$2" | base64 -d)
  alias=$(printf %s "$4" | base64 -d)
  printf %s "$5" | base64 -d > "$d/known_hosts"
  shift 5
  mkfifo "$d/next"
  @SSH@ -p "$port" -- "$dest" \
    "sh -c \"\$(printf %s $s | base64 -d)\" nodekit-relay $s $nm $*" < "$d/next" &
  next=$!
  tee -p "$d/next" | { docker load -q > "$d/out" 2>&1; echo $? > "$d/rc"; }
else
  docker load -q > "$d/out" 2>&1; echo $? > "$d/rc"
fi
rc=$(cat "$d/rc" 2>/dev/null || echo 125)
echo "nodekit-relay load $me $rc $(tail -n 3 "$d/out" | base64 | tr -d '\n')" >&2
if [ -n "$next" ]; then
  wait "$next"
  echo "nodekit-relay hop $nm $?" >&2
fi
exit 0
"""
RELAY_SCRIPT = _SCRIPT.replace(
    "@SSH@", ssh.hop_words(connect_timeout=CONNECT_S, pinned=ssh.Pinned('"$d/known_hosts"', '"$alias"'))
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode(errors="replace")
    except ValueError:
        return text


@dataclass(frozen=True)
class Hop:
    """One node of a relay chain, as the node before it dials it."""

    name: str
    endpoint: str
    user: str
    hostname: str
    port: int
    alias: str
    """The name the head's known_hosts knows the node by (``HostKeyAlias`` on the hop before it)."""
    known_hosts: str
    """The head's known_hosts lines for the node: the only host keys the hop before it accepts."""
    identities: tuple[str, ...] = ()
    """The key files the head's ssh offers the node (added to a private agent when the user runs none)."""

    @property
    def dest(self) -> str:
        return f"{self.user}@{self.hostname}" if self.user else self.hostname


def parse_ssh_config(text: str) -> dict[str, list[str]]:
    """``ssh -G`` output: lower-case keyword to its values (identityfile and a few others repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


def host_key_name(hostname: str, port: int, alias: str | None) -> str:
    """The name ssh looks a host up by in known_hosts: the HostKeyAlias as is, else ``host`` on port 22 and
    ``[host]:port`` on any other (OpenSSH's put_host_port)."""
    if alias:
        return alias
    return hostname if port == 22 else f"[{hostname}]:{port}"


def known_lines(found: str) -> str:
    """The key lines of ``ssh-keygen -F`` output (its ``# Host ... found`` comments dropped)."""
    return "".join(ln + "\n" for ln in found.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


def _expand(path: str, home: str) -> str:
    return home + path[1:] if path.startswith("~") else path


def hop_of(name: str, endpoint: str, env: Mapping[str, str] | None = None) -> Hop | str:
    """The hop for the target ``endpoint`` as the head's own OpenSSH sees it, or why it cannot be relayed to."""
    parts = urlsplit(endpoint)
    if parts.scheme != "ssh" or not parts.hostname:
        return "not an ssh:// endpoint"
    real, keygen = shutil.which("ssh", path=(env or proc.environ()).get("PATH")), shutil.which("ssh-keygen")
    if real is None or keygen is None:
        return "no ssh or ssh-keygen on this machine"
    argv = ssh.config_of(real, parts.hostname, user=parts.username, port=parts.port)
    try:
        got = proc.run(argv, deadline=10, what="ssh -G", fix="", env=env)
    except (OSError, DeadlineError) as e:
        return f"ssh -G failed: {e}"
    if got.returncode != 0:
        return f"ssh -G failed: {got.stderr.strip()[-200:]}"
    cfg = parse_ssh_config(got.stdout)

    def one(key: str, default: str = "") -> str:
        return (cfg.get(key) or [default])[0]

    for key in ("proxyjump", "proxycommand"):
        if one(key, "none") != "none":
            return f"reached through {key} (its node may not reach it directly)"
    hostname, port = one("hostname", parts.hostname), int(one("port", "22"))
    alias = one("hostkeyalias", "none")
    lookup = host_key_name(hostname, port, None if alias == "none" else alias)
    home = str(Path.home())
    files = [_expand(f, home) for key in ("userknownhostsfile", "globalknownhostsfile")
             for v in cfg.get(key, []) for f in v.split()]  # fmt: skip
    lines = ""
    for f in files:
        if Path(f).is_file():
            found = proc.run(ssh.known_hosts_lookup(keygen, lookup, f), deadline=10, what="ssh-keygen -F",
                             fix="check that file (ssh-keygen -F HOST -f FILE)")  # fmt: skip
            lines += known_lines(found.stdout)
    if not lines:
        return f"the head has no host key for {lookup} in {' '.join(files) or 'its known_hosts'}"
    identities = tuple(p for p in (_expand(f, home) for f in cfg.get("identityfile", [])) if Path(p).is_file())
    return Hop(name=name, endpoint=endpoint, user=one("user"), hostname=hostname, port=port, alias=lookup,
               known_hosts=lines, identities=identities)  # fmt: skip


def chain_command(hops: Sequence[Hop]) -> str:
    """The command the head runs on the chain's first node: :data:`RELAY_SCRIPT`, with every node after the first
    as arguments (how to dial it, the host key to accept)."""
    script = _b64(RELAY_SCRIPT)
    args = [script, _b64(hops[0].name)]
    for h in hops[1:]:
        args += [_b64(h.name), _b64(h.dest), str(h.port), _b64(h.alias), _b64(h.known_hosts)]
    return f'sh -c "$(printf %s {script} | base64 -d)" {_TAG} ' + " ".join(args)


@dataclass
class Report:
    """What the chain's nodes said on stderr, by node name."""

    loads: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Each node's ``docker load`` exit code and last lines."""
    hops: dict[str, int] = field(default_factory=dict)
    """For each node after the first: the exit code of the ``ssh`` that reached it (255: could not connect)."""
    pgids: dict[str, int] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    """Every other line (ssh's own complaints: a refused host key, a refused login)."""


def parse_report(stderr: str) -> Report:
    r = Report()
    for line in stderr.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] == _TAG and words[1] in ("load", "hop", "pgid") and words[3].isdigit():
            who, n = _unb64(words[2]), int(words[3])
            if words[1] == "load":
                r.loads[who] = (n, _unb64(words[4]).strip() if len(words) > 4 else "")
            elif words[1] == "hop":
                r.hops[who] = n
            else:
                r.pgids[who] = n
        elif line.strip():
            r.other.append(line.strip())
    return r


def why_not_loaded(hops: Sequence[Hop], report: Report, head_rc: int | None) -> dict[str, str]:
    """For each node of the chain that reported no successful load: why, in words."""
    out: dict[str, str] = {}
    said = "; ".join(report.other[-3:])
    for i, h in enumerate(hops):
        if h.name in report.loads:
            rc, last = report.loads[h.name]
            if rc != 0:
                out[h.name] = f"docker load there failed (exit {rc}): {last or 'no output'}"
            continue
        if i == 0:
            out[h.name] = f"its SSH session ended (exit {head_rc})" + (f": {said}" if said else "")
            continue
        before = hops[i - 1].name
        rc_hop = report.hops.get(h.name)
        if rc_hop == 255:
            out[h.name] = f"{before} could not ssh to it" + (f": {said}" if said else "")
        else:
            out[h.name] = f"the stream from {before} stopped before it reached it"
    return out


class Agent:
    """The ssh-agent the chain's hops log in through (agent forwarding): the user's own (``existing``, its
    socket), else a private one started here holding ``identities``. ``socket`` is None when no key could be added
    (one that needs a passphrase, with no agent to hold it unlocked). ``close`` stops a private agent by PID."""

    def __init__(self, identities: Sequence[str], *, existing: str | None = None) -> None:
        self.socket: str | None = existing
        self.added = 0
        self._proc: proc.Child | None = None
        self._dir = ""
        agent, add = shutil.which("ssh-agent"), shutil.which("ssh-add")
        if existing is not None or agent is None or add is None or not identities:
            return
        self._dir = tempfile.mkdtemp(prefix="nodekit-agent.")
        sock = os.path.join(self._dir, "agent.sock")
        self._proc = proc.start([agent, "-D", "-a", sock], deadline=proc.Unbounded("lives for the push: close()"),
                                what="ssh-agent", stdin="devnull", stdout="devnull", stderr="devnull")  # fmt: skip
        deadline = time.monotonic() + 2
        while not os.path.exists(sock):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.02)
        env = {k: v for k, v in proc.environ().items() if k not in ("DISPLAY", "SSH_ASKPASS")}
        env |= {"SSH_AUTH_SOCK": sock, "SSH_ASKPASS_REQUIRE": "never"}
        for key in dict.fromkeys(identities):
            with contextlib.suppress(OSError, DeadlineError):
                done = proc.run([add, "-q", "-t", str(KEY_LIFETIME_S), key], deadline=10, what="ssh-add", fix="",
                                env=env, stdin="devnull")  # fmt: skip
                self.added += done.returncode == 0
        if self.added:
            self.socket = sock

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.end(grace=5)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def user_agent_has_keys(env: Mapping[str, str]) -> bool:
    """Whether the user's own ssh-agent (SSH_AUTH_SOCK) answers and holds at least one key."""
    sock, add = env.get("SSH_AUTH_SOCK"), shutil.which("ssh-add")
    if not sock or add is None or not os.path.exists(sock):
        return False
    with contextlib.suppress(OSError, DeadlineError):
        return proc.run([add, "-l"], deadline=5, what="ssh-add -l", fix="", env=env).returncode == 0
    return False


def head_argv(hop: Hop, command: str) -> list[str]:
    """The head's ``ssh -A`` to ``hop`` (as its endpoint names it: the head's ~/.ssh/config applies)."""
    parts = urlsplit(hop.endpoint)
    return ssh.command(parts.hostname or hop.hostname, command, port=parts.port, user=parts.username,
                       connect_timeout=CONNECT_S, forward_agent=True, keepalive=True)  # fmt: skip


class RelaySink:
    """Feeds the chain ``hops``: the head's ``ssh -A`` to the first node runs :data:`RELAY_SCRIPT` there. Has
    the shape of :class:`nodekit.docker.LoadSink` (write, finish, abort); ``finish`` returns the chain's
    :class:`Report` and never raises for a node's failure (the head verifies every node itself)."""

    def __init__(self, hops: Sequence[Hop], agent_socket: str | None) -> None:
        self.hops = list(hops)
        # Its own connection (NO_MUX): a shared one would forward the agent of whichever call opened it.
        env = proc.environ({NO_MUX: "1", **({"SSH_AUTH_SOCK": agent_socket} if agent_socket is not None else {})})
        self._env = env
        self._stderr = b""
        self._proc = proc.start(head_argv(self.hops[0], chain_command(self.hops)), env=env, stdin="pipe",
                                stdout="devnull", stderr="pipe", what=f"the relay chain from {self.hops[0].name}",
                                deadline=proc.Unbounded("the stream: finish() or abort() ends it"))  # fmt: skip
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        self.rc: int | None = None

    def _read(self) -> None:
        assert self._proc.stderr is not None
        self._stderr = self._proc.stderr.read()

    def report(self) -> Report:
        self._drain.join(timeout=10)
        return parse_report(self._stderr.decode(errors="replace"))

    def write(self, chunk: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(chunk)
        except (BrokenPipeError, ValueError):
            self._proc.wait()
            first = self.hops[0]
            why = why_not_loaded(self.hops[:1], self.report(), self._proc.returncode).get(first.name, "")
            raise ShipError(f"the relay stream to {first.name} broke: {why}", node=first.name) from None

    def finish(self) -> Report:
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()
        self.rc = self._proc.wait()
        return self.report()

    def abort(self) -> None:
        """Cut the chain: end the head's session and, on every node that said where its relay runs, that relay's
        process group (a hop blocked on a hung node would otherwise linger)."""
        self._proc.cut_off()
        self.rc = self._proc.returncode
        pgids = self.report().pgids
        by_name = {h.name: h for h in self.hops}
        kills = [
            proc.start(head_argv(by_name[n], f"kill -TERM -- -{pg} 2>/dev/null; true"), env=self._env, deadline=15,
                       what=f"ending the relay on {n}", stdin="devnull", stdout="devnull", stderr="devnull")
            for n, pg in pgids.items() if n in by_name and pg > 1
        ]  # fmt: skip
        for k in kills:
            k.wait()
