"""Relays: a node that receives the image stream passes it on to others, so the head's link carries it once.

A push to N nodes over ``ssh://`` would otherwise send N copies out of the head. With a relay tree
(:mod:`nodekit.ship.tree`: each node feeds at most two others, so the last is about log2(N) hops away) the head
opens one SSH session, to the tree's root, and runs :data:`RELAY_SCRIPT` there (POSIX sh; nothing is installed on
any node). The script tees its stdin into ``docker load`` on that node and into one ``ssh`` per node it feeds,
each of which runs the same script, and so on: the stream flows down the tree while every node loads it, so N nodes
take about the time of one. Each node reports its load's exit code and last lines on stderr, which flows back up
the tree to the head; the head then checks the image id on every node itself, over its own connection to each, as
for a direct push, so a node that lies about another's load changes only a message. A node the tree did not
deliver to (a node above it failed) is sent the image directly from the head.

What a hop needs, and where it comes from:

- The next node's (each node it feeds) address, user and port: from the head's own ``ssh -G`` for that node's
  endpoint (its ``~/.ssh/config`` applies). A node reached through ProxyJump or ProxyCommand is not relayed to.
- The next node's host key: pinned by the head. The hop's ``ssh`` trusts only the lines the head's known_hosts
  files hold for that node (``ssh-keygen -F``, under ``HostKeyAlias``), with ``StrictHostKeyChecking=yes``; a node
  the head has no host key line for is not relayed to.
- A key to log in with: never the user's. Each node dials the next with a key pair made on it for this push, which
  the next node accepts only from it, only to run its own relay step, only for minutes, and only until the push
  ends (:mod:`nodekit.ship.hopkeys`, which the head sets up over its own connection to each node; no agent is
  forwarded anywhere).
- Ending a tree early: the head ends, on each node, only the process group that node's own relay step recorded in
  its directory there; nothing a node says on stderr is ever taken as a process to kill.
- On every node: sh, base64, mktemp, mkfifo, GNU tee (``-p``: a hop that dies does not stop the node before it),
  GNU date (``-d``), ssh and ssh-keygen, and sshd reading ``~/.ssh/authorized_keys`` (its default). A node where
  setting up fails, or whose hop is refused, gets the image directly.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from nodekit.errors import ShipError
from nodekit.ship import hopkeys
from nodekit.ship.access import TreeAccess
from nodekit.ship.hopkeys import Hop, node_argv
from nodekit.ship.tree import Tree, plan_tree
from nodekit.system import proc, ssh
from nodekit.system.docker.streams import Tail

RelayMode = Literal["auto", "always", "never"]
RELAY_MODES: tuple[RelayMode, ...] = ("auto", "always", "never")

RELAY_MIN_BYTES = 64 << 20
"""``auto`` relays only when at least this much travels: each hop adds an SSH handshake from the node before it
(a few tenths of a second), which a small transfer (a code change) does not win back; 64 MiB is about half a
second of a 1 Gbit/s link per extra copy."""

CONNECT_S = 10
STALL_S = 60.0
"""The tree's stream taking nothing for this long (the root stopped reading: a node or a link hangs somewhere and
every tee above it blocks): :class:`RelaySink` cuts the whole tree, on every node, and its caller feeds whom it
did not reach again. Longer than a node's own :data:`LOAD_STALL_S` and a hop's SSH keepalive (about 30 s), so a
failure deeper in the tree is cut there first and only its subtree is lost."""
_TAG = "nodekit-relay"

# Run as `sh ./relay DIR` in DIR (the node's own directory, made and filled by hopkeys' setup over the head's own
# connection; hopkeys.entry_command, the authorized_keys line's command, checks it is the user's own first):
# everything it needs is in DIR, nothing is read from SSH_ORIGINAL_COMMAND. It runs as the login user (root, often)
# and trusts nothing it checked a moment ago:
# - Only the directory it was started in, never the path DIR again: every file is ./name, not "$d/name". The
#   directory entered stays the one checked even if it is removed and another user makes DIR again with links in it
#   (a second login with the same key, started before the first one's cleanup, would otherwise write its exit code
#   through such a link and send the last lines of whatever another one points at, as root, back to the key's
#   holder). In a removed directory no file can be made; set -C makes no file through a link to one that exists.
# - A hop key runs one relay step: `mkdir ./started` succeeds for the first step only (the lock is in the directory
#   checked), which then removes its authorized_keys line before anything else, so sshd refuses the key from then
#   on and a login that got in before that runs nothing. Ending, it removes the line (if that failed at the start)
#   and then empties and removes its directory, and only the one it was started in.
# - Each node it feeds (c0, c1, ...: its children in the relay tree) takes the stream through a fifo of its own and
#   an ssh of its own; tee -p goes on past an output whose reader is gone (that node died, refused the hop, or
#   stopped answering ssh's keepalives), so one failed node cuts only its own subtree, never its siblings or the
#   nodes above it. Its own load is one more output (./load), watched: tee blocked writing to it (its stdout, fd 1,
#   in /proc/PID/syscall) with nothing written for LOAD_STALL_S seconds means this node's engine hangs, and that
#   load is ended so that the nodes it feeds go on. Where /proc/PID/syscall cannot be read (Yama ptrace_scope 2 and
#   not root) nothing is ended, and the head's stall deadline applies.
_SCRIPT = r"""
set -C
d=$1
me=$(cat ./name)
@UNAUTHORIZE@
trap 'exit 143' TERM HUP INT
if ! mkdir ./started 2> /dev/null; then
  echo "nodekit-relay: this relay step has run already (its hop key was used already): refused" >&2
  exit 126
fi
here=$(stat -c %d.%i .)
trap 'unauthorize; rm -rf ./*; cd / && [ "$(stat -c %d.%i "$d" 2> /dev/null)" = "$here" ] && rmdir "$d"' EXIT
unauthorize
trap '' PIPE
unset SSH_AUTH_SOCK
{ cut -d' ' -f5 /proc/$$/stat 2> /dev/null || echo $$; } > ./pgid
kids= outs= j=0
while [ -f ./c$j/dest ]; do
  port=$(cat ./c$j/port) dest=$(cat ./c$j/dest) alias=$(cat ./c$j/alias)
  mkfifo ./c$j/fifo
  @SSH@ -p "$port" -- "$dest" nodekit-relay < ./c$j/fifo &
  kids="$kids $j:$!" outs="$outs ./c$j/fifo" j=$((j + 1))
done
exec 3<&0
mkfifo ./load
docker load -q < ./load > ./out 2>&1 &
lp=$!
tee -p $outs <&3 > ./load &
tp=$!
exec 3<&-
same=0 last=
while kill -0 "$tp" 2> /dev/null; do
  sleep 1
  now=$(cut -d' ' -f1,2 "/proc/$tp/syscall" 2> /dev/null)$(grep '^wchar' "/proc/$tp/io" 2> /dev/null)
  case $now in
    *' 0x1wchar'*) if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi ;;
    *) same=0 ;;
  esac
  last=$now
  if [ "$same" -ge @LOAD_STALL@ ]; then
    echo "nodekit-relay: docker load here took nothing for @LOAD_STALL@ s: cut off; the nodes it feeds go on" >> ./out
    kill "$lp" 2> /dev/null
    same=-999999
  fi
done
wait "$tp"
wait "$lp"
echo $? > ./rc
rc=$(cat ./rc 2> /dev/null || echo 125)
echo "nodekit-relay load $me $rc $(tail -n 3 ./out | base64 | tr -d '\n')" >&2
for k in $kids; do
  wait "${k#*:}"
  r=$?
  echo "nodekit-relay hop $(cat "./c${k%%:*}/name") $r" >&2
done
exit 0
"""
LOAD_STALL_S = 20
"""A node whose own ``docker load`` takes nothing for this long (its engine hangs) cuts that load off, and the
stream goes on to the nodes it feeds: it would otherwise hold up every node above it, and the head's stall deadline
(:data:`STALL_S`) would cut the whole tree. Shorter than a hop's SSH keepalive (about 30 s,
which ends the hop to a node that stopped answering), so the nearest failure is the one that is cut."""

_RELAY = _SCRIPT.replace("@UNAUTHORIZE@", hopkeys.UNAUTHORIZE.strip()).replace(
    "@SSH@",
    ssh.hop_words(connect_timeout=CONNECT_S, pinned=ssh.Pinned("./c$j/known_hosts", '"$alias"'), identity="./c$j/key"),
)


RELAY_SCRIPT = _RELAY.replace("@LOAD_STALL@", str(LOAD_STALL_S))
"""The relay step for a gzip (or uncompressed) stream."""


def relay_script(codec: str, *, load_stall_s: int = LOAD_STALL_S, consumer: str | None = None) -> str:
    """The relay step for a stream compressed with ``codec``: a zstd stream is passed on as it came and
    decompressed on each node by its zstd command before its ``docker load`` (never by the engine). Its own load
    is cut off after ``load_stall_s`` seconds of taking nothing (:data:`LOAD_STALL_S`). ``consumer``: a shell
    command that takes the stream on each node in place of ``docker load`` (it reads ``./load``; what the head
    wrote into the node's directory, ``./arg`` and ``./given``, is its input of the node's own)."""
    script = _RELAY.replace("@LOAD_STALL@", str(int(load_stall_s)))
    if consumer is not None:
        return script.replace("docker load -q < ./load", consumer)
    if codec != "zstd":
        return script
    return script.replace("docker load -q < ./load", "zstd -dcq < ./load | docker load -q")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode(errors="replace")
    except ValueError:
        return text


@dataclass
class Report:
    """What the tree's nodes said on stderr, by node name."""

    loads: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Each node's ``docker load`` exit code and last lines."""
    hops: dict[str, int] = field(default_factory=dict)
    """For each node but the root: the exit code of the ``ssh`` that reached it (255: could not connect, or it
    stopped answering)."""
    other: list[str] = field(default_factory=list)
    """Every other line (ssh's own complaints: a refused host key, a refused login)."""


def parse_report(stderr: str) -> Report:
    """What the tree said, for messages only: the head judges every node by the image id it finds there itself,
    and takes nothing here as an instruction (no process to end, no node to trust)."""
    r = Report()
    for line in stderr.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] == _TAG and words[1] in ("load", "hop") and words[3].isdigit():
            who, n = _unb64(words[2]), int(words[3])
            if words[1] == "load":
                r.loads[who] = (n, _unb64(words[4]).strip() if len(words) > 4 else "")
            else:
                r.hops[who] = n
        elif line.strip():
            r.other.append(line.strip())
    return r


def why_not_loaded(
    hops: Sequence[Hop], report: Report, head_rc: int | None, tree: Tree | None = None
) -> dict[str, str]:
    """For each node of the tree (default: :func:`~nodekit.ship.tree.plan_tree` over ``hops``) that reported no
    successful load: why, in words."""
    tree = plan_tree(len(hops)) if tree is None else tree
    out: dict[str, str] = {}
    said = "; ".join(report.other[-3:])
    for i, h in enumerate(hops):
        if h.name in report.loads:
            rc, last = report.loads[h.name]
            if rc != 0:
                out[h.name] = f"docker load there failed (exit {rc}): {last or 'no output'}"
            continue
        p = tree.parent[i]
        if p is None:
            out[h.name] = f"its SSH session ended (exit {head_rc})" + (f": {said}" if said else "")
            continue
        before = hops[p].name
        rc_hop = report.hops.get(h.name)
        if rc_hop == 255:
            out[h.name] = f"{before} could not ssh to it" + (f": {said}" if said else "")
        else:
            out[h.name] = f"the stream from {before} stopped before it reached it"
    return out


REPORT_LINES_PER_NODE = 4
"""The head keeps at most this many report lines per node of a tree (each says two: its load, and a hop for each
node it feeds, which is one per node but the root)."""
LINE_MAX = 8 << 10
"""A report line is shorter than this: a name, an exit code and three lines of ``docker load``'s output in base64."""
_TAG_LINE = _TAG.encode() + b" "


class Said:
    """What a tree says on its stderr, as it arrives, in bounded memory however much comes (the root node, and
    root there, can write without end): its last :data:`REPORT_LINES_PER_NODE` report lines per node (each cut
    at :data:`LINE_MAX`), and the last 64 KiB of it all for everything else (ssh's own complaints). Each chunk
    costs its own length."""

    def __init__(self, nodes: int = 8) -> None:
        self._reports: deque[bytes] = deque(maxlen=REPORT_LINES_PER_NODE * max(nodes, 1))
        self._tail = Tail()
        self._partial = b""
        self._lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._tail.add(chunk)
            data = self._partial + chunk
            end = data.rfind(b"\n") + 1
            if data.find(_TAG_LINE, 0, end) >= 0:
                self._reports.extend(ln[:LINE_MAX] for ln in data[:end].splitlines() if ln.startswith(_TAG_LINE))
            self._partial = data[end : end + LINE_MAX]  # a longer line is no report line: its start is enough

    def end(self) -> None:
        """The stream ended: its last line counts without its line end."""
        self.add(b"\n")

    def text(self) -> str:
        """The report lines after what else is kept: :func:`parse_report` reads this."""
        with self._lock:
            other = [ln for ln in self._tail.text().splitlines() if not ln.startswith(_TAG + " ")]
            return "\n".join([*other, *(r.decode(errors="replace") for r in self._reports)])


class RelaySink:
    """Feeds the tree ``tree`` over ``hops`` (default: :func:`~nodekit.ship.tree.plan_tree`; its root is
    ``hops[0]``): sets up every node's access for this push (:class:`~nodekit.ship.hopkeys.TreeAccess`; ShipError
    when a node cannot be), then the head's ssh to the root runs its relay step. Has the shape of
    :class:`nodekit.system.docker.LoadSink` (write, finish, abort); ``finish`` returns the tree's :class:`Report`
    and never raises for a node's failure (the head verifies every node itself). ``script`` replaces the image's
    relay step (:func:`relay_script` with a consumer of its own) and ``given`` is each node's input for it
    (:class:`~nodekit.ship.access.TreeAccess`).

    The tree's one stall deadline is here, where it is fed, for images and datasets alike: a :meth:`write` that
    blocks for ``stall_s`` seconds (:data:`STALL_S`) cuts the tree (:meth:`abort`) and raises ShipError saying
    so. ``finish`` waits for the nodes' work after the stream's end: its caller bounds that
    (:func:`nodekit.ship.outcome.answered_within`)."""

    def __init__(
        self,
        hops: Sequence[Hop],
        *,
        tree: Tree | None = None,
        codec: str = "gzip",
        script: str | None = None,
        given: Sequence[tuple[str, bytes]] | None = None,
        stall_s: float | None = None,
    ) -> None:
        self.hops = list(hops)
        self.tree = plan_tree(len(self.hops)) if tree is None else tree
        script = relay_script(codec) if script is None else script
        self.access = TreeAccess(self.hops, script, tree=self.tree, given=given)
        entry = self.access.open()
        self._said = Said(len(self.hops))
        try:
            self._proc = proc.start(node_argv(self.hops[0], entry, keepalive=True), stdin="pipe", stdout="devnull",
                                    stderr="pipe", what=f"the relay tree from {self.hops[0].name}",
                                    deadline=proc.Stall(STALL_S if stall_s is None else stall_s))  # fmt: skip
        except BaseException:
            self.access.close()
            raise
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        self.rc: int | None = None
        self._aborted = False
        self._closing: threading.Thread | None = None
        self._close_lock = threading.Lock()

    def _read(self) -> None:
        """Keeps what the tree said as it arrives: a node's line counts even when the session never ends cleanly
        (cut off at the answer deadline, or a process on the way still holding the pipe open)."""
        stream = self._proc.stderr
        assert stream is not None
        read = getattr(stream, "read1", stream.read)  # read1: what has arrived, without waiting for a full block
        for chunk in iter(lambda: read(65536), b""):
            self._said.add(chunk)
        self._said.end()

    def report(self) -> Report:
        self._drain.join(timeout=10)
        return parse_report(self._said.text())

    def write(self, chunk: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            with self._proc.waiting():
                self._proc.stdin.write(chunk)
        except (BrokenPipeError, ValueError):
            self._proc.wait()
            first = self.hops[0]
            if self._proc.timed_out:
                # The head's session is gone: the relay steps on the nodes too, and their keys, on a thread of its own
                # (a node that hangs holds its end step up to its deadline); the caller's abort waits for it.
                self.abort(wait=False)
                assert isinstance(self._proc.deadline, proc.Stall)
                raise ShipError(f"the relay tree from {first.name} took nothing for {self._proc.deadline.seconds:g} s "
                                "(a node or a link in it hangs): cut off on every node",
                                fix="check the tree's nodes and links, then push again (--relay never sends each "
                                "node its own stream)", node=first.name) from None  # fmt: skip
            why = why_not_loaded(self.hops[:1], self.report(), self._proc.returncode).get(first.name, "")
            raise ShipError(f"the relay stream to {first.name} broke: {why}", node=first.name) from None

    def finish(self) -> Report:
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError), self._proc.waiting():  # its last buffered bytes go out here
            self._proc.stdin.close()
        self.rc = self._proc.wait()
        # An abort (the answer deadline's timer thread) or the stall deadline ends the head's session, which is what
        # lets this wait return: this close must then kill the nodes' relay steps too, whichever close comes first.
        self._close(kill=self._aborted or self._proc.timed_out, wait=True)
        return self.report()

    def abort(self, *, wait: bool = True) -> None:
        """Cut the tree: end the head's session and, on every node, the relay step that node itself recorded
        there (a hop blocked on a hung node would otherwise linger); then remove the push's keys and directories.
        ``wait`` False: that cleanup goes on on a thread of its own (each node's step bounded by its deadline, a
        node that hangs up to :data:`~nodekit.ship.hopkeys.CALL_S`) while the caller goes on; :meth:`settle` waits
        for it, as a later abort or finish does."""
        self._aborted = True
        self._proc.cut_off()
        self.rc = self._proc.returncode
        self._close(kill=True, wait=wait)

    def settle(self) -> None:
        """Wait for a cleanup that an abort left running (nothing when none did)."""
        if self._closing is not None:
            self._closing.join()

    def _close(self, *, kill: bool, wait: bool) -> None:
        """The tree's access closed on every node, once, whoever asks first (idempotent)."""
        with self._close_lock:
            if self._closing is None:
                self._closing = threading.Thread(target=self.access.close, kwargs={"kill": kill},
                                                 name="relay-cleanup")  # fmt: skip
                self._closing.start()
        if wait:
            self.settle()
