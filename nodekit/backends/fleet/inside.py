"""``nodekit exec``: a command in one node's job container, or in every node's with each line prefixed by its node.

A running container gets ``docker exec``; an ended one that was kept (``nodekit up`` keeps it, ``nodekit run``
with ``keep_containers``) gets a throw-away copy of itself (nodekit.system.docker.inside), so a shell after a
failure finds what the job left. Remote hosts are reached through their engine endpoint, as ``nodekit run`` does
(the user's own ssh and its configuration for ``ssh://``), kept alive like a run's connections.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from nodekit.backends.fleet.manage import parallel
from nodekit.backends.fleet.targets import Target
from nodekit.errors import NodekitError
from nodekit.system import proc
from nodekit.system.docker import inside

USER_COMMAND = proc.Unbounded("the user's command lasts as long as it does (Ctrl-C or its end stops it)")
LineFn = Callable[[int, str], None]


class NoContainer(NodekitError):
    exit_code = 1


@dataclass(frozen=True)
class Ended:
    """One node's end: its command's exit code, or why it could not run there."""

    target: Target
    code: int
    problem: str = ""


@contextlib.contextmanager
def _argv(t: Target, command: Sequence[str], *, stdin: bool, tty: bool) -> Iterator[list[str]]:
    """The command line for ``command`` in node ``t``'s container; a snapshot it needed is removed afterwards."""
    c = inside.job_container(t.project, t.url)
    if c is None:
        raise NoContainer(
            f"{t.name} has no container of {t.project} (no job was started there, or it was removed)",
            fix="nodekit status shows each node; keep_containers = true keeps them after a run",
        )
    if c.running:
        yield inside.exec_argv(t.url, c.id, command, stdin=stdin, tty=tty)
        return
    image = inside.snapshot(c, t.url)
    try:
        yield inside.snapshot_argv(t.url, c, image, command, stdin=stdin, tty=tty)
    finally:
        inside.drop_snapshot(image, t.url)


def run_one(t: Target, command: Sequence[str], *, stdin: bool, tty: bool) -> int:
    """``command`` in node ``t``'s container with this terminal (a TTY when ``tty``): its exit code. In this
    process group, so that the terminal's keys reach it; Ctrl-C outside a TTY and SIGTERM/SIGHUP end it."""
    with _argv(t, command, stdin=stdin, tty=tty) as argv:
        child = proc.start(argv, deadline=USER_COMMAND, what=f"{command[0]} on {t.name}",
                           stdin="inherit" if stdin else "devnull")  # fmt: skip
        code = child.wait()
    return 1 if code is None else code


def run_all(targets: Sequence[Target], command: Sequence[str], on_line: LineFn) -> list[Ended]:
    """``command`` in every node's container at once, no stdin; every output line to ``on_line(rank, line)``
    as it comes. Each node's end, in rank order (a node that could not run it: code 1 and the problem)."""
    lock = threading.Lock()

    def one(t: Target) -> Ended:
        try:
            with _argv(t, command, stdin=False, tty=False) as argv:
                child = proc.start(argv, deadline=USER_COMMAND, what=f"{command[0]} on {t.name}", stdin="devnull",
                                   stdout="pipe", stderr="stdout", group=True)  # fmt: skip
                for line in child.lines():
                    with lock:
                        on_line(t.rank, line.rstrip("\n"))
                code = child.wait()
        except NodekitError as e:
            return Ended(t, e.exit_code or 1, e.one_line())
        return Ended(t, 1 if code is None else code)

    return sorted(parallel(one, targets), key=lambda e: e.target.rank)


def first_failure(ended: Sequence[Ended]) -> Ended | None:
    """The lowest-ranked node whose command failed (or could not run), if any."""
    return next((e for e in ended if e.code != 0), None)
