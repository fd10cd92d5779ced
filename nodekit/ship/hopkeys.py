"""How a relay node logs in to the next one without the user's keys: a key pair per hop and per push, whose public
half the next node accepts only for that push's relay step.

The head reaches every node of a relay tree (:mod:`nodekit.ship.tree`; a chain is the tree with a fan-out of one)
over its own, already authenticated connection (the user's keys, agent and ``~/.ssh/config``, on the head only),
and there, for each tree (:class:`nodekit.ship.access.TreeAccess`):

1. **setup**, on every node: a private directory (``mktemp -d``, mode 0700) holding the relay script, the node's
   name and, for each node it feeds (the "next node" below; at most ``FANOUT``), a subdirectory with what the head
   says about that node (address, port, the one host key to accept) and a key pair made on this node by
   ``ssh-keygen`` for that one hop (its private half never travels). The node says the addresses it will dial
   each next node from (``ip route get``, and the one the head reached it at).
2. **authorize**, on every node but the root: the key its feeder (the "node before") made for this hop is noted in
   this node's directory, then one line goes into ``~/.ssh/authorized_keys`` for it::

       expiry-time="<its own clock + KEY_LIFETIME_S>",restrict,from="<the node before's addresses>",
       command="<entry_command(this node's directory)>" ssh-ed25519 <the node before's key> nodekit-relay

   ``restrict``: no pty, no agent, port or X11 forwarding, no ``~/.ssh/rc``. ``command=``: whatever the client
   asks for, this node's own relay step runs (SSH_ORIGINAL_COMMAND is never read); what it relays to next is in
   the directory the head wrote. ``from=``: only from the addresses the node before said it dials from (see
   below). ``expiry-time`` (OpenSSH >= 7.7): the hops log in at the tree's start, seconds after this; it only
   bounds a line whose removal never came (the head died).
3. **end**: the relay step itself, as it *starts*, removes its line (the key it noted): a hop key runs one relay
   step (below); as it exits, it removes its directory. And on every node, when the tree ends, the head: after an
   abort, first the process group that *this node's own* relay step recorded in its directory, and only while that
   group still runs that step (never a number another node reported); then the line, found by its key, so that
   concurrent pushes keep theirs (and any nodekit line whose expiry has passed goes too); then the directory.
   authorized_keys is rewritten under ``flock`` into a temporary file that replaces it, so a reader never sees half
   of it and two pushes never lose each other's lines.

**The command path no other user can make or replace.** The directory is made by ``mktemp -d`` (mode 0700, a fresh
name) in the node's /tmp, which any local user can write to. The line's command (:func:`entry_command`) enters the
directory first and runs ``./relay`` only when the directory it entered is a directory owned by the login user with
mode 0700, and not a link (to another push's directory, say): only that user (or root) can then have put or replaced
anything in it, and while it exists nobody else can remove or rename it (/tmp's sticky bit). The script is opened
relative to the directory entered, so a directory removed and made again under the same name by someone else between
the check and the run is never the one read (another user could otherwise make the removed directory again with
their own ``relay``, which a login with the hop key would run as the login user: root). The step itself then works
only inside the directory it entered (``./rc``, ``./out``, never the directory's path): once that directory is
removed nothing can be made in it, so a step that lost a race writes nothing and reads nothing through links another
user planted under the same name.

**A hop key runs one relay step.** The step's first act is ``mkdir ./started`` in the directory it checked: only
one step can succeed, and every other login with the key is refused there (exit 126) before it reads or writes
anything; the winner then removes the key's line, so sshd refuses the key from then on. Two logins with one key at
once (root on the node before holds it) therefore get one relay step, and no second one can outlive the first
one's cleanup. And a line is never left pointing at a directory that is gone: the step removes it first, the head
removes it before the directory; only a relay step SIGKILLed before its start, or a head that died, leaves a line,
which then names a directory that still exists and is still the user's, until the line's expiry or the next push.

**from=** holds what the node before said about itself: the address the head reached it at (SSH_CONNECTION there)
and the source address of its route to this node. The head cannot check the second (a route of the node's own), so
the guarantee is the looser one: a key is accepted only from the addresses its holder named. A node that is not
compromised names its real ones; a compromised node holds the key anyway, and can use it from where it named, to
run this node's relay step and nothing else.

Root on a relay node can therefore use the hop key only to run the relay step on the next node, from addresses it
named, for minutes; no key of the user's reaches any node. Why not the alternatives: ``ssh-add -h`` destination
constraints (OpenSSH >= 8.9 on head and nodes) would still forward a key of the user's, with which root on a node
gets a full login on every constrained host while the push runs; carrying every stream through the head's own
connections (ProxyJump-style) lends nothing but gives up the relay's point, the head sending the image once.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from nodekit.launcher.preflight.network import is_address
from nodekit.system import ssh


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

    @property
    def dest(self) -> str:
        return f"{self.user}@{self.hostname}" if self.user else self.hostname


CONNECT_S = 10
CALL_S = 30
"""Each setup, authorize or end step on a node: a few file operations and one ssh-keygen."""
KEY_LIFETIME_S = 300
"""How long a hop key's line is accepted, from its node's own clock (timezone included): the hops log in when the
tree starts, seconds after the line is written; a line the head could not remove (it died) expires by then."""
COMMENT = "nodekit-relay"

# $1 the node's name (base64), $2 the relay script (base64); then, for each node it feeds (its children in the relay
# tree), six words: that node's name (base64), user@host (base64), port, HostKeyAlias (base64), known_hosts lines
# (base64) and host (base64), kept in the subdirectory c0, c1, ... with a key pair of its own: one key per hop, so
# that a hop key is spent by one relay step even where several of this node's children share one authorized_keys
# (a home directory on NFS). Prints "nodekit-relay-setup DIR", then per child "nodekit-relay-dial J ssh-ed25519
# KEY ADDRESS...".
SETUP_SCRIPT = r"""
umask 077
d=$(mktemp -d "${TMPDIR:-/tmp}/nodekit-relay.XXXXXX") || exit 1
printf %s "$1" > "$d/name"
printf %s "$2" | base64 -d > "$d/relay" || { rm -rf "$d"; exit 1; }
shift 2
via=$(printf '%s\n' "$SSH_CONNECTION" | cut -d ' ' -f 3)
echo "nodekit-relay-setup $d"
j=0
while [ $# -ge 6 ]; do
  c=$d/c$j
  mkdir "$c" && printf %s "$1" > "$c/name" && printf %s "$2" | base64 -d > "$c/dest" && printf %s "$3" > "$c/port" \
    && printf %s "$4" | base64 -d > "$c/alias" && printf %s "$5" | base64 -d > "$c/known_hosts" \
    && ssh-keygen -q -t ed25519 -N '' -C nodekit-relay -f "$c/key" < /dev/null > /dev/null || { rm -rf "$d"; exit 1; }
  host=$(printf %s "$6" | base64 -d)
  addr=$(getent ahosts "$host" 2> /dev/null | awk 'NR == 1 { print $1 }')
  src=$(ip route get "${addr:-$host}" 2> /dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p' | head -n 1)
  echo "nodekit-relay-dial $j $(cut -d ' ' -f 1,2 "$c/key.pub") $src $via"
  j=$((j + 1))
  shift 6
done
"""

# Rewrites ~/.ssh/authorized_keys under a lock: drops nodekit's lines that have expired and the one holding the key
# $drop, appends $line (either may be empty). Never writes a file it could not read whole, nor one made read-only.
_EDIT = r"""
mkdir -p "$HOME/.ssh" || exit 1
f=$HOME/.ssh/authorized_keys
[ -L "$f" ] && f=$(readlink -f "$f")
[ -e "$f" ] || [ -n "$line" ] || exit 0
[ ! -e "$f" ] || { [ -w "$f" ] && [ -n "$(find "$f" -prune -perm -u=w)" ]; } || exit 1
(
  if command -v flock > /dev/null; then flock -w 20 9 || exit 1; fi
  t="$f.nodekit.$$"
  if [ -e "$f" ]; then
    awk -v now="$now" -v drop="$drop" '
      {
        ours = $0 ~ /^expiry-time="[0-9]+",restrict,/ && $NF == "nodekit-relay"
        if (ours && (substr($0, 14, 14) < now || (drop != "" && index($0, " " drop " ")))) next
        print
      }' "$f" > "$t" || { rm -f "$t"; exit 1; }
  else
    : > "$t"
  fi
  if [ -n "$line" ]; then printf '%s\n' "$line" >> "$t" || { rm -f "$t"; exit 1; }; fi
  mv -f "$t" "$f"
) 9>> "$HOME/.ssh/.nodekit-relay.lock"
"""


def own_dir(path: str) -> str:
    """A shell test: the working directory, entered by ``path`` (a shell word), is the login user's own, mode 0700
    (what only that user or root can have filled), and ``path`` is that directory itself, not a link to another."""
    return f"[ x$(stat -c %u.%a.%F.%d.%i .) = x$(id -u).700.directory.$(stat -c %d.%i {path}) ]"


# $1 the line without its expiry (base64), $2 its lifetime in seconds, $3 this node's relay directory, $4 the key
# the line holds: noted in the directory first, so that the relay step removes the line as it starts (its one use).
_AUTHORIZE = r"""
umask 077
unset TZ
case $3 in */nodekit-relay.*) ;; *) exit 2 ;; esac
[ -d "$3" ] && [ -O "$3" ] && [ ! -L "$3" ] && printf %s "$4" > "$3/authorized" || exit 1
exp=$(date -d "+$2 seconds" +%Y%m%d%H%M%S) && now=$(date +%Y%m%d%H%M%S) || exit 1
line="expiry-time=\"$exp\",$(printf %s "$1" | base64 -d)" drop=
"""
AUTHORIZE_SCRIPT = _AUTHORIZE + _EDIT


# $1 the key whose line goes ("-": none), $2 this node's relay directory, $3 1 to end its relay step first. The line
# goes before the directory (the module docstring says why); the directory goes whatever became of the line, and
# only if it is the user's own: it is entered and checked once, and then read and removed from inside (a directory
# another user made under the same name is left alone, and nothing is read through a link of theirs).
_END = r"""
umask 077
unset TZ
drop=$1 d=$2 line=
[ "$drop" = - ] && drop=
now=$(date +%Y%m%d%H%M%S) || exit 1
case $d in */nodekit-relay.*) ;; *) exit 2 ;; esac
cd "$d" 2> /dev/null && @OWN_DIR@ && here=$(stat -c %d.%i .) || { here=; cd /; }
if [ -n "$here" ] && [ "$3" = 1 ] && [ -f ./pgid ]; then
  pg=$(cat ./pgid)
  case $pg in '' | *[!0-9]*) pg=0 ;; esac
  if [ "$pg" -gt 1 ] && [ "$(readlink "/proc/$pg/cwd")" = "$d" ] \
      && tr '\0' ' ' < "/proc/$pg/cmdline" 2> /dev/null | grep -qF "./relay $d"; then
    kill -TERM "-$pg" 2> /dev/null
  fi
fi
trap '[ -n "$here" ] && rm -rf ./* && cd / && [ "$(stat -c %d.%i "$d" 2> /dev/null)" = "$here" ] && rmdir "$d"' EXIT
[ -n "$drop" ] || exit 0
""".replace("@OWN_DIR@", own_dir('"$d"'))
END_SCRIPT = _END + _EDIT

# $1 this node's relay directory, $2 a word for its relay step (base64); standard input: a file for it. What the
# head fixes for one node of a tree (a dataset's receiver and that node's own plan), written over the head's own
# connection into the directory only the login user can fill, never taken from the stream its feeder sends.
_PUT = r"""
umask 077
set -C
case $1 in */nodekit-relay.*) ;; *) exit 2 ;; esac
cd "$1" && @OWN_DIR@ || exit 1
printf %s "$2" | base64 -d > ./arg && cat > ./given
""".replace("@OWN_DIR@", own_dir('"$1"'))


UNAUTHORIZE = r"""
unauthorize() {
  [ -f ./authorized ] || return 0
  drop=$(cat ./authorized) line= now=$(date +%Y%m%d%H%M%S) || return 0
  ( umask 077; unset TZ; @EDIT@ ) && rm -f ./authorized
}
""".replace("@EDIT@", _EDIT)
"""The shell function the relay step calls as it starts (and again as it exits, if that failed): removes the line
the authorize step noted the key of, reading the key from the directory the step runs in (never by its path)."""

_DIR = re.compile(r"/[A-Za-z0-9._/-]*/nodekit-relay\.[A-Za-z0-9]+")
_ED25519 = re.compile(r"AAAAC3NzaC1lZDI1NTE5AAAAI[A-Za-z0-9+/]{43}")
"""The base64 of an ed25519 public key blob: its type name, then 32 bytes; nothing else can pass as one."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _sh(script: str, name: str, *args: str) -> str:
    """``script`` as one remote command line for the user's login shell: sent in base64, its arguments base64,
    digits or validated paths, so nothing needs quoting."""
    return f'sh -c "$(printf %s {_b64(script)} | base64 -d)" {name} ' + " ".join(args)


@dataclass(frozen=True)
class Dial:
    """How a node dials one of the nodes it feeds: the public half of the key it made for that hop, and the
    addresses it dials from."""

    key: str
    """The ed25519 public key blob (base64)."""
    addrs: tuple[str, ...]


@dataclass(frozen=True)
class Prepared:
    """What setup made on one node: its relay directory and, per node it feeds (in order), a :class:`Dial`."""

    dir: str
    dials: tuple[Dial, ...] = ()


def setup_command(hop: Hop, feeds: Sequence[Hop], relay_script: str) -> str:
    args = [_b64(hop.name), _b64(relay_script)]
    for after in feeds:
        args += [_b64(after.name), _b64(after.dest), str(after.port), _b64(after.alias), _b64(after.known_hosts),
                 _b64(after.hostname)]  # fmt: skip
    return _sh(SETUP_SCRIPT, "nodekit-relay-setup", *args)


def parse_setup(stdout: str, *, feeds: int) -> Prepared | str:
    """Pure: setup's answer for a node that feeds ``feeds`` others, checked as the untrusted text it is (a node may
    say anything): a directory of the shape mktemp makes, then per node it feeds an ed25519 key and IP addresses;
    or why not."""
    found: str | None = None
    dials: dict[int, Dial] = {}
    for line in stdout.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "nodekit-relay-setup" and found is None:
            if len(words) < 2 or not _DIR.fullmatch(words[1]):
                return "its relay directory is not one mktemp makes"
            found = words[1]
        elif words[0] == "nodekit-relay-dial" and found is not None and len(words) >= 2 and words[1].isdigit():
            j = int(words[1])
            if j >= feeds or j in dials:
                return "it made a hop key nobody asked for"
            if len(words) < 4 or words[2] != "ssh-ed25519" or not _ED25519.fullmatch(words[3]):
                return "it made no ed25519 key (is ssh-keygen installed there?)"
            addrs = tuple(dict.fromkeys(a for a in words[4:] if is_address(a)))
            if not addrs:
                return "it could not say which address it dials the next node from"
            dials[j] = Dial(key=words[3], addrs=addrs)
    if found is None:
        return "it printed no setup line"
    if len(dials) < feeds:
        return "it made no ed25519 key (is ssh-keygen installed there?)"
    return Prepared(dir=found, dials=tuple(dials[j] for j in range(feeds)))


def authorized_line(before: Dial, here: Prepared) -> str:
    """The authorized_keys line (without its expiry, which the node adds by its own clock) that lets the node
    feeding ``here``, dialling as ``before``, run the relay step in ``here``'s directory, and nothing else. Its parts
    were checked by :func:`parse_setup`; checked again here, as a line with a quote or a newline in it would be a
    different line."""
    if not (_ED25519.fullmatch(before.key) and _DIR.fullmatch(here.dir) and before.addrs):
        raise ValueError("not a checked setup")
    if not all(is_address(a) for a in before.addrs):
        raise ValueError("not an address")
    return (f'restrict,from="{",".join(before.addrs)}",command="{entry_command(here.dir)}" '
            f"ssh-ed25519 {before.key} {COMMENT}")  # fmt: skip


def entry_command(relay_dir: str) -> str:
    """What runs a node's relay step: the script setup wrote into its directory, once the directory entered is the
    login user's own, mode 0700, and not a link (see the module docstring). One line for any login shell (sh, bash,
    csh, fish): no double quotes, so it sits in ``command="..."`` as it is. The directory follows ``./relay`` as its
    argument, which the step reads as its own directory and the head's end matches its process by."""
    if not _DIR.fullmatch(relay_dir):
        raise ValueError("not a checked setup")
    check = own_dir(relay_dir)
    refuse = f"echo nodekit-relay: {relay_dir} is not a mode 0700 directory of this user, or is a link >&2; exit 126"
    return f"exec sh -c 'cd {relay_dir} && {check} && exec sh ./relay {relay_dir}; {refuse}'"


def authorize_command(line: str, lifetime_s: int, relay_dir: str, key: str) -> str:
    if not _DIR.fullmatch(relay_dir) or not _ED25519.fullmatch(key):
        raise ValueError("not a checked setup")
    return _sh(AUTHORIZE_SCRIPT, "nodekit-relay-authorize", _b64(line), str(int(lifetime_s)), relay_dir, key)


def put_command(relay_dir: str, arg: str) -> str:
    """Writes ``arg`` and the command's standard input into ``relay_dir`` as ``./arg`` and ``./given``."""
    if not _DIR.fullmatch(relay_dir):
        raise ValueError("not a checked setup")
    return _sh(_PUT, "nodekit-relay-put", relay_dir, _b64(arg) or "''")


def end_command(relay_dir: str, key: str, *, kill: bool) -> str:
    if not _DIR.fullmatch(relay_dir) or (key and not _ED25519.fullmatch(key)):
        raise ValueError("not a checked setup")
    return _sh(END_SCRIPT, "nodekit-relay-end", key or "-", relay_dir, "1" if kill else "0")


def node_argv(hop: Hop, command: str, *, keepalive: bool = False) -> list[str]:
    """The head's own ssh to ``hop`` (as its endpoint names it: the head's ~/.ssh/config applies), lending it
    nothing: no agent, no forwarding."""
    parts = urlsplit(hop.endpoint)
    return ssh.command(parts.hostname or hop.hostname, command, port=parts.port, user=parts.username,
                       connect_timeout=CONNECT_S, lend_nothing=True, keepalive=keepalive)  # fmt: skip
