"""A fake process runner for the command-line unit tier: it stands in for :func:`nodekit.system.proc.spawn._popen` (the
one place nodekit starts a process) and for python-on-whales' own two process starts (``python_on_whales.utils``: its
``subprocess.run`` and its ``Popen``), records every command line with its environment and deadline, and answers with
what a test scripted. Nothing is executed. Used through the ``fake_runner`` fixture (tests/unit/conftest.py)."""

from __future__ import annotations

import io
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FAKE_PID = 4_194_304 + 1000
"""Above Linux's largest possible pid (PID_MAX_LIMIT): a signal to a fake child's process group reaches nobody."""


@dataclass
class Reply:
    """What a faked command answers: its output, its exit code, or that it never ends (``hang``) until killed."""

    stdout: bytes = b""
    stderr: bytes = b""
    returncode: int = 0
    hang: bool = False


@dataclass
class Call:
    """One command line nodekit (``by="nodekit"``) or python-on-whales (``by="python-on-whales"``) started."""

    argv: list[str]
    env: dict[str, str] | None
    deadline: object
    """What nodekit.system.proc was given (seconds, or proc.Unbounded); None for python-on-whales, whose deadline is the
    ``timeout`` prefix of its command line."""
    by: str = "nodekit"
    group: bool = False
    written: bytearray = field(default_factory=bytearray)
    """What was fed to its standard input."""
    signals: list[int] = field(default_factory=list)

    @property
    def cmd(self) -> list[str]:
        """The command line with the program's directory left out (python-on-whales resolves it on PATH)."""
        return [Path(self.argv[0]).name, *self.argv[1:]]


class _Stdin(io.BytesIO):
    def __init__(self, call: Call) -> None:
        super().__init__()
        self._call = call

    def write(self, b: Any) -> int:
        self._call.written += bytes(b)
        return len(b)


class FakePopen:
    """The part of ``subprocess.Popen`` nodekit.system.proc and python-on-whales use, answering from a
    :class:`Reply`."""

    def __init__(self, call: Call, reply: Reply, pid: int, *, stdin: bool, stdout: bool, stderr: bool) -> None:
        self.args, self.pid, self._call, self._reply = call.argv, pid, call, reply
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = _Stdin(call) if stdin else None
        self.stdout: IO[bytes] | None = io.BytesIO(reply.stdout) if stdout else None
        self.stderr: IO[bytes] | None = io.BytesIO(reply.stderr) if stderr else None

    def _running(self) -> bool:
        return self._reply.hang and not self._call.signals

    def poll(self) -> int | None:
        if self._running():
            return None
        if self.returncode is None:
            self.returncode = -self._call.signals[0] if self._call.signals else self._reply.returncode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._running():
            if timeout is None:
                raise AssertionError(f"a wait without a deadline on a process that never ends: {self.args}")
            raise subprocess.TimeoutExpired(self.args, timeout)
        code = self.poll()
        assert code is not None
        return code

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple[bytes, bytes]:
        self.wait(timeout)
        return (self.stdout.read() if self.stdout else b"", self.stderr.read() if self.stderr else b"")

    def send_signal(self, sig: int) -> None:
        self._call.signals.append(sig)

    def kill(self) -> None:
        self.send_signal(9)

    def terminate(self) -> None:
        self.send_signal(15)


class FakeRunner:
    """Records :attr:`calls`; :meth:`on` scripts the answer of commands containing given words."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._rules: list[tuple[tuple[str, ...], Reply]] = []

    def on(self, *words: str, stdout: bytes | str = b"", stderr: bytes | str = b"", returncode: int = 0,
           hang: bool = False) -> None:  # fmt: skip
        """Commands whose line holds ``words`` one after the other answer so (the rule added last wins)."""
        out = stdout.encode() if isinstance(stdout, str) else stdout
        err = stderr.encode() if isinstance(stderr, str) else stderr
        self._rules.append((words, Reply(out, err, returncode, hang)))

    def reply_for(self, cmd: list[str]) -> Reply:
        return next((reply for words, reply in reversed(self._rules) if _holds(cmd, words)), Reply())

    def _start(self, call: Call, *, stdin: bool, stdout: bool, stderr: bool) -> FakePopen:
        self.calls.append(call)
        return FakePopen(call, self.reply_for(call.cmd), FAKE_PID + len(self.calls), stdin=stdin, stdout=stdout,
                         stderr=stderr)  # fmt: skip

    # nodekit.system.proc.spawn._popen's signature
    def popen(self, argv: list[str], *, env: dict[str, str], deadline: object, stdin: str, stdout: str, stderr: str,
              group: bool) -> FakePopen:  # fmt: skip
        call = Call(list(argv), dict(env), deadline, group=group)
        return self._start(call, stdin=stdin == "pipe", stdout=stdout == "pipe", stderr=stderr == "pipe")

    # python_on_whales.utils.Popen (its streamed calls: logs, buildx build)
    def pow_popen(self, args: list[str], stdout: object = None, stderr: object = None,
                  env: dict[str, str] | None = None, **_: object) -> FakePopen:  # fmt: skip
        call = Call([str(a) for a in args], env, None, by="python-on-whales")
        pipe = subprocess.PIPE
        return self._start(call, stdin=False, stdout=stdout == pipe, stderr=stderr == pipe)

    @property
    def pow_subprocess(self) -> Any:
        """Stands in for the ``subprocess`` module inside python_on_whales.utils (its ``run``)."""
        runner = self

        class _Subprocess:
            PIPE = subprocess.PIPE

            @staticmethod
            def run(args: list[str], input: bytes | None = None, stdout: object = None, stderr: object = None,
                    env: dict[str, str] | None = None, **_: object) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
                call = Call([str(a) for a in args], env, None, by="python-on-whales")
                runner.calls.append(call)
                if input:
                    call.written += input
                reply = runner.reply_for(call.cmd)
                return subprocess.CompletedProcess(
                    args,
                    reply.returncode,
                    reply.stdout if stdout == subprocess.PIPE else None,
                    reply.stderr if stderr == subprocess.PIPE else None,
                )

        return _Subprocess

    def only(self, *words: str) -> Call:
        """The one recorded call whose line holds ``words``; AssertionError unless there is exactly one."""
        found = [c for c in self.calls if _holds(c.cmd, words)]
        assert len(found) == 1, f"{len(found)} calls hold {words}: {[c.cmd for c in self.calls]}"
        return found[0]


def _holds(cmd: list[str], words: tuple[str, ...]) -> bool:
    n = len(words)
    return any(tuple(cmd[i : i + n]) == words for i in range(len(cmd) - n + 1))
