"""The link check's listener and transfers in a process of their own, which the launcher's thread drives.

The launcher runs the check in a thread beside the job's start, while its main thread imports and starts torchrun
(a second or more of Python holding the interpreter's lock). A thread of the same process then waits up to the
lock's switch interval (5 ms) each time it wants the lock back: every ping's answer and every read of the bulk
stream. The check then measures the launcher, not the link: on 8 nodes of one 2-core machine, every other node's
process busy that way, the check named 12 pairs of links that were all alike, the pairs' median round trip
0.7 to 2.5 ms; with the listener and transfers in processes of their own, none, and 0.06 to 0.07 ms
(benchmarks/link_bench.py, part 3).

So :class:`Apart` starts ``python -m nodekit.launcher.linkcheck.apart``: it listens (``listener.py``) and measures
the pairs it is asked to (``probe.measure``); the rounds, the store and the verdict stay in the launcher
(``run.py``). The protocol is one JSON object per line: the first line on the child's standard input carries the
job secret (never an argument or an environment variable), the store's run id and the address to listen on; the
child answers ``{"port": P}`` or ``{"error": "..."}``; then each request (a pair to measure) gets one answer (the
pair). The child ends when its standard input closes, which the kernel does when the launcher ends however it
ends, so it outlives neither the check nor the launcher.

:class:`Here` is the same interface in this process (the listener in a thread, as before): for simulations that run
hundreds of nodes in a few processes (benchmarks/link_scale.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from nodekit.launcher.linkcheck.listener import LinkServer
from nodekit.launcher.linkcheck.probe import CONNECT_S, DRAIN_S, TRIES, measure
from nodekit.launcher.linkcheck.verdict import Pair, Transfer

START_S = 30.0  # the child's start and its listener's bind: a Python start, seconds on a crowded machine at most
# A pair takes its connections (TRIES x CONNECT_S each way), the pings, two transfers and their drains; the answer is
# awaited a little longer than that, then the child is taken for stuck.
PAIR_SLACK_S = 10.0


class ListenError(Exception):
    """The listener could not be opened (the address is not this machine's, ...): its reason, one line."""


class Meter(Protocol):
    """Where one node listens during the check, and how it measures a pair with a partner's listener."""

    port: int

    def measure(self, a: int, b: int, addr: str, port: int, seconds: float, source: str | None) -> Pair: ...

    def close(self) -> None: ...


Meters = Callable[[str, bytes, str], Meter]
"""Opens a :class:`Meter`: (job secret, run id, the address to listen on)."""


class Here:
    """The listener in a thread of this process, and the transfers on the calling thread."""

    def __init__(self, secret: str, run_id: bytes, local: str) -> None:
        self.secret, self.run_id = secret, run_id
        try:
            self._server = LinkServer(secret, run_id, local).start()
        except OSError as e:
            raise ListenError(str(e.strerror or e)) from e
        self.port = self._server.port

    def measure(self, a: int, b: int, addr: str, port: int, seconds: float, source: str | None) -> Pair:
        return measure(a, b, addr, port, self.secret, self.run_id, seconds, source=source)

    def close(self) -> None:
        self._server.close()


class Apart:
    """The listener and the transfers in a child process (see the module docstring)."""

    def __init__(self, secret: str, run_id: bytes, local: str) -> None:
        root = str(Path(__file__).resolve().parents[3])  # the directory holding the nodekit package
        # Only nodekit's directory on the path, first: the child needs nothing else (the standard library), and the
        # job's directory (the working directory, which `-m` would put first, or a PYTHONPATH the image sets) could
        # hold files named like the standard library's modules.
        env = {**os.environ, "PYTHONPATH": root}
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "nodekit.launcher.linkcheck.apart"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True, cwd=root,
            )  # fmt: skip
        except OSError as e:
            raise ListenError(f"cannot start its process ({e.strerror or e})") from e
        self.pid = self._child.pid
        assert self._child.stdin is not None and self._child.stdout is not None
        self._in: IO[bytes] = self._child.stdin
        self._out: IO[bytes] = self._child.stdout
        self._buf = bytearray()
        try:
            first = self._ask({"secret": secret, "run_id": run_id.hex(), "local": local}, START_S)
        except ListenError:
            self.close()
            raise
        if "error" in first:
            self.close()
            raise ListenError(str(first["error"]))
        self.port = int(str(first["port"]))

    def _ask(self, request: dict[str, object], within_s: float) -> dict[str, object]:
        try:
            self._in.write(json.dumps(request).encode() + b"\n")
            self._in.flush()
        except OSError as e:
            raise ListenError(self._ended() or f"its process is gone ({e.strerror or e})") from e
        line = self._line(time.monotonic() + within_s)
        if line is None:
            ended = self._ended()
            if not ended:  # stuck: ended, so that a late answer is never read as the next request's
                self._child.kill()
            raise ListenError(ended or f"its process did not answer within {within_s:g} s")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ListenError("its process answered something else")
        return answer

    def _ended(self) -> str:
        """Why the child cannot answer when it has ended ("" while it runs)."""
        try:
            code = self._child.wait(0.5)
        except subprocess.TimeoutExpired:
            return ""
        return f"its process ended (exit code {code}) without an answer"

    def _line(self, deadline: float) -> bytes | None:
        """The child's next line by ``deadline`` (None: none came, or the child ended). Read from its descriptor
        through this object's own buffer, which ``select`` is never asked about."""
        fd = self._out.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line

    def measure(self, a: int, b: int, addr: str, port: int, seconds: float, source: str | None) -> Pair:
        bound = 2 * (TRIES * CONNECT_S + seconds + 2 * DRAIN_S) + PAIR_SLACK_S
        request = {"a": a, "b": b, "addr": addr, "port": port, "seconds": seconds, "source": source}
        try:
            return Pair.from_json_dict(self._ask(request, bound))
        except (ListenError, ValueError, KeyError, TypeError) as e:
            why = f"this node's link check process: {e}" if isinstance(e, ListenError) else f"a garbled answer ({e})"
            return Pair(a, b, Transfer(), Transfer(), error=why)

    def close(self) -> None:
        """Ends the child: its input closed (it closes its listener and exits), then killed if it has not."""
        for f in (self._in, self._out):
            with contextlib.suppress(OSError):
                f.close()
        try:
            self._child.wait(CONNECT_S)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()


def serve(into: IO[bytes], out: IO[bytes]) -> int:
    """The child's side: listen, then measure each requested pair, until ``into`` closes."""

    def say(obj: dict[str, object]) -> None:
        out.write(json.dumps(obj).encode() + b"\n")
        out.flush()

    first = into.readline()
    if not first:
        return 0
    hello = json.loads(first)
    secret, run_id = str(hello["secret"]), bytes.fromhex(str(hello["run_id"]))
    try:
        here = Here(secret, run_id, str(hello["local"]))
    except ListenError as e:
        say({"error": str(e)})
        return 0
    try:
        say({"port": here.port})
        for line in into:
            r = json.loads(line)
            pair = here.measure(int(r["a"]), int(r["b"]), str(r["addr"]), int(r["port"]), float(r["seconds"]),
                                r.get("source"))  # fmt: skip
            say(pair.to_json_dict())
    finally:
        here.close()
    return 0


def main() -> int:
    # The launcher stops it by closing its input; a signal meant for the launcher's group ends it quietly.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    try:
        return serve(sys.stdin.buffer, sys.stdout.buffer)
    except Exception as e:  # the launcher went away mid-answer, a garbled request: one line in the job's log
        print(f"nodekit link check: its process stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
