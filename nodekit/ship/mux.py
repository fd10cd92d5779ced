"""One SSH connection per node for a push or a whole ``nodekit run``: OpenSSH connection sharing (ControlMaster)
under the docker CLI.

Over ``ssh://`` every docker call is its own ``ssh`` (the docker CLI runs ``ssh host docker system dial-stdio``),
so a push to a node paid for six key exchanges and logins: four survey questions, the load and the image id check.
On a code change, whose bytes are a few KiB, those handshakes were most of the time. For the length of a push,
:class:`SharedSsh` puts a wrapper named ``ssh`` first on the PATH of every process nodekit starts
(:func:`nodekit.system.proc.extra_env`: the docker CLI finds ``ssh`` there; this process's own environment is not
changed)
that runs the user's own ``ssh`` with ``ControlMaster=auto`` and a ControlPath in a private directory: the first call
to a node opens the connection, the others ride on it. When the push ends, every master it opened is told to exit
(``ssh -O exit``) and the directory is removed. Docker itself recommends connection sharing for
``ssh://`` endpoints; a user whose ~/.ssh/config already does it is not harmed (the options given here win for
these calls only).

The relay tree's sessions (:mod:`nodekit.ship.relay`) ride the same connections: they forward no agent (each
says ``ForwardAgent=no``, which a shared connection honours per session), so nothing ties them to a connection of
their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodekit.errors import DeadlineError
from nodekit.system import proc, ssh

PERSIST_S = 30
"""A master outlives its last call by this much at most (it is told to exit when the push ends anyway)."""

PREFIX = "nkssh."
"""A push's directory is PREFIX + its process's PID + "." + a random part."""

_lock = threading.Lock()
_depth = 0


class SharedSsh:
    """While entered, ``ssh`` run by this process (and the docker CLI it starts) shares one connection per node.
    Nested or concurrent uses share the first one's directory; the outermost exit ends the masters."""

    def __init__(self) -> None:
        self.dir: Path | None = None
        self._real = ""
        self._env = contextlib.ExitStack()

    def __enter__(self) -> SharedSsh:
        global _depth
        with _lock:
            _depth += 1
            if _depth > 1:
                return self
            # The ssh nodekit's children would run: under a fleet command that is the keepalive wrapper
            # (nodekit/backends/fleet/alive.py), so the shared connection keeps alive at the job's interval.
            real = shutil.which("ssh", path=proc.environ().get("PATH"))
            if real is None:
                return self
            # Short: a unix socket path is at most 107 bytes, and %C is 40 of them. The owner's PID in the name lets
            # a later push remove what a killed one (SIGKILL: no __exit__) left: its ssh wrapper and dead sockets.
            parent = Path("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir())
            sweep(parent, real)
            self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}.", dir=parent))
            wrapper = self.dir / "ssh"
            wrapper.write_text(ssh.shared_wrapper(real, str(self.dir), PERSIST_S))
            wrapper.chmod(0o755)
            self._real = real
            path = f"{self.dir}{os.pathsep}{proc.environ().get('PATH', '')}"
            self._env.enter_context(proc.extra_env({"PATH": path}))
        return self

    def __exit__(self, *exc: object) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth > 0 or self.dir is None:
                return
            self._env.close()
            close_masters(self.dir, self._real)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


CLOSING_AT_ONCE = 64
"""Masters told to exit with ``ssh -O exit`` side by side, where one's process is not found (:func:`masters`): each is
a process start, and a run's end has one per host (one after another, 100 s of the head's end at 256 stand-in hosts:
benchmarks/scale_bench.py)."""


def masters(socks: list[Path], proc_root: Path = Path("/proc")) -> dict[Path, int]:
    """The PID of each of ``socks``' masters that runs as this user. OpenSSH titles a master's process
    ``ssh: <ControlPath> [mux]``, so the title names the very socket; read from /proc (Linux), elsewhere none is
    found."""
    wanted = {f"ssh: {s} [mux]".encode(): s for s in socks}
    found: dict[Path, int] = {}
    uid = os.getuid()
    with contextlib.suppress(OSError):
        for e in os.scandir(proc_root):
            if not e.name.isdigit():
                continue
            try:
                if e.stat().st_uid != uid:
                    continue
                title = Path(e.path, "cmdline").read_bytes().split(b"\0", 1)[0].strip()
            except OSError:
                continue
            if (sock := wanted.get(title)) is not None:
                found[sock] = int(e.name)
    return found


def close_masters(d: Path, real_ssh: str) -> int:
    """Tell every master whose control socket is in ``d`` to exit; returns how many were asked. A master whose
    process is found (:func:`masters`) is sent SIGTERM, on which it ends its connection and removes its socket as
    ``ssh -O exit`` has it do, without a process start per host (at 64 stand-in hosts, 64 ``ssh -O exit`` at once
    were the head's memory peak: docs/scale.md); any other is told with ``real_ssh -O exit``, up to
    :data:`CLOSING_AT_ONCE` at once."""
    socks = [p for p in d.iterdir() if p.is_socket()] if d.is_dir() else []
    told = set()
    for sock, pid in masters(socks).items():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            told.add(sock)
    rest = [s for s in socks if s not in told]

    def one(sock: Path) -> None:
        with contextlib.suppress(OSError, DeadlineError):
            proc.run(ssh.exit_master(real_ssh, str(sock)), deadline=10, what="ssh -O exit", fix="", stdin="devnull")

    if rest:
        with ThreadPoolExecutor(max_workers=min(CLOSING_AT_ONCE, len(rest))) as pool:
            list(pool.map(one, rest))
    return len(socks)


def sweep(parent: Path, real_ssh: str) -> list[Path]:
    """Remove the directories under ``parent`` that a push of this user left when its process died without
    cleaning up (the PID in the name is gone): any master still persisting there is told to exit first. Returns
    those removed. A directory of a live process, another user's, or one without a PID in its name is left."""
    removed = []
    uid = os.getuid()
    with contextlib.suppress(OSError):
        for d in parent.glob(f"{PREFIX}*.*"):
            pid = d.name[len(PREFIX) :].split(".", 1)[0]
            with contextlib.suppress(OSError):
                if not pid.isdigit() or int(pid) == os.getpid() or proc.alive(int(pid)):
                    continue
                if not d.is_dir() or d.is_symlink() or d.lstat().st_uid != uid:
                    continue
                close_masters(d, real_ssh)
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed
