"""The job's processes on this node, read from the files :mod:`hook` keeps: their stacks (a signal, then the dump
each wrote) and their progress. Runs inside the container, in the launcher (the stall watch) and as
``python -m nodekit.launcher.stacks`` (``nodekit stacks`` through ``docker exec``). Standard library only.

A process is asked only when it is the one that wrote the files (its start time matches the header: pids are
reused) and its /proc status shows the signal caught: the signal's default action would end any other process.
Two readers at once (``nodekit stacks`` during the stall watch's own dump) take turns on a lock file, so each
reads exactly the dump its signal caused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from nodekit.launcher.stacks.dump import complete
from nodekit.launcher.stacks.hook import DEFAULT_DIR as DEFAULT_DIR
from nodekit.launcher.stacks.hook import RAISED, RAISED_MAX, start_time

FORMAT = 1  # of the JSON `python -m nodekit.launcher.stacks` prints; the host refuses another
COLLECT_S = 3.0  # the whole read: a process that wrote nothing by then is reported without a stack
QUIET_S = 0.3  # a dump that stopped growing this long is taken even when the main thread's stack looks unfinished
POLL_S = 0.01


@dataclass(frozen=True)
class Header:
    pid: int
    start: int
    main: int  # the main thread's id
    signal: int


@dataclass(frozen=True)
class Progress:
    """A rank's progress record (see :mod:`hook`)."""

    rank: int
    world: int
    calls: int
    moves: int


@dataclass(frozen=True)
class Process:
    """One process of the job as read here: its rank once it joined a process group, and its dump."""

    pid: int
    main: int | None = None
    rank: int | None = None
    world: int | None = None
    command: str = ""
    dump: str = ""
    error: str | None = None  # why there is no dump


def _header(path: str) -> Header | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.readline())
        return Header(int(data["pid"]), int(data["start"]), int(data["main"]), int(data["signal"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def hooked(directory: str) -> list[Header]:
    """The live processes that armed the hook in ``directory``, by pid."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        stem, _, ext = name.partition(".")
        if ext != "stack" or not stem.isdigit():
            continue
        head = _header(os.path.join(directory, name))
        if head is not None and head.pid == int(stem) and start_time(head.pid) == head.start:
            found.append(head)
    return sorted(found, key=lambda h: h.pid)


def _progress(directory: str, pid: int) -> Progress | None:
    try:
        with open(os.path.join(directory, f"{pid}.progress")) as f:
            data = json.loads(f.read())
        return Progress(int(data["rank"]), int(data["world"]), int(data["calls"]), int(data["moves"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def progress(directory: str) -> dict[int, Progress]:
    """The progress record of every live hooked process that has one, by pid."""
    return {h.pid: p for h in hooked(directory) if (p := _progress(directory, h.pid)) is not None}


def raised(directory: str, pid: int) -> str:
    """The exception that ended process ``pid`` (its ``<pid>.raised``: ``RuntimeError: boom``), or ""."""
    try:
        with open(os.path.join(directory, f"{pid}{RAISED}"), encoding="utf-8", errors="replace") as f:
            return f.read(RAISED_MAX + 1)[:RAISED_MAX].strip()
    except OSError:
        return ""


def prune(directory: str) -> None:
    """Remove the files of processes that have ended (a long job starts many short ones: compile workers, ...), but
    not what an exception that ended one left (``.raised``: a few hundred bytes, read once torchrun gives up)."""
    alive = {h.pid for h in hooked(directory)}
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            stem = name.partition(".")[0]
            if stem.isdigit() and int(stem) not in alive and not name.endswith(RAISED):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))


def _catches(pid: int, signum: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(ln for ln in f if ln.startswith("SigCgt:")).split()[1]
        return bool(int(caught, 16) >> (signum - 1) & 1)
    except (OSError, StopIteration, ValueError, IndexError):
        return False


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return ""
    return " ".join(argv)[:200]


@contextlib.contextmanager
def _turn(directory: str, deadline: float) -> Iterator[bool]:
    """Hold the directory's lock (whether it was had before ``deadline``)."""
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(POLL_S)
        yield True
    finally:
        os.close(fd)


def dump_all(directory: str, timeout_s: float = COLLECT_S) -> list[Process]:
    """Every live hooked process's stacks now: signal each, then read what each wrote, until each dump holds its
    main thread's whole stack or stopped growing (:data:`QUIET_S`), at most ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    heads = hooked(directory)
    if not heads:
        return []
    with _turn(directory, deadline) as turn:
        if not turn:
            return [Process(h.pid, h.main, error="another reader held the lock") for h in heads]
        return _read(directory, heads, deadline, timeout_s)


def _read(directory: str, heads: list[Header], deadline: float, timeout_s: float) -> list[Process]:
    offsets: dict[int, int] = {}
    errors: dict[int, str] = {}
    for h in heads:
        path = os.path.join(directory, f"{h.pid}.stack")
        if not _catches(h.pid, h.signal):
            errors[h.pid] = "the stack dump is not armed in this process (its handler was replaced)"
            continue
        try:
            offsets[h.pid] = os.path.getsize(path)
            os.kill(h.pid, h.signal)
        except OSError as e:
            offsets.pop(h.pid, None)
            errors[h.pid] = f"cannot signal it: {e.strerror}"
    texts = {pid: "" for pid in offsets}
    grew = {pid: time.monotonic() for pid in offsets}
    pending = set(offsets)
    main = {h.pid: h.main for h in heads}
    while pending and time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = time.monotonic()
        for pid in sorted(pending):
            try:
                with open(os.path.join(directory, f"{pid}.stack"), "rb") as f:
                    f.seek(offsets[pid])
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            if text != texts[pid]:
                texts[pid], grew[pid] = text, now
            if text and (complete(text, main[pid]) or now - grew[pid] >= QUIET_S):
                pending.discard(pid)
    out = []
    for h in heads:
        p = _progress(directory, h.pid)
        text = texts.get(h.pid, "")
        error = errors.get(h.pid) or (None if text else f"no stack within {timeout_s:g} s")
        out.append(Process(h.pid, h.main, p.rank if p else None, p.world if p else None, _command(h.pid), text, error))
    return out


def to_json(processes: list[Process]) -> str:
    return json.dumps({"format": FORMAT, "processes": [asdict(p) for p in processes]})


def from_json(text: str) -> list[Process]:
    """What :func:`to_json` wrote; ValueError for anything else (another format, not JSON)."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not nodekit's stack format {FORMAT}")
    fields = set(Process.__dataclass_fields__)
    return [Process(**{k: v for k, v in p.items() if k in fields}) for p in data["processes"]]
