"""Armed in every Python process of the job: a stack dump on a signal, and a progress record once torch.distributed
runs. Standard library only at import; torch is only looked up in ``sys.modules``, never imported.

Loaded by :mod:`nodekit.launcher.exitguard`, which the image's ``nodekit-exitguard.pth`` imports into every Python
process of the job (torchrun's workers, Lightning's own, the env-mode process) when the launcher set
NODEKIT_EXIT_GUARD=1; this module acts only where the launcher also set :data:`ENV` (the directory below). Nothing
is installed on the node and the user's script is not changed. Any failure here leaves the process as it would be
without nodekit: nothing is raised.

In ``<dir>`` (mode 0700), per process:

``<pid>.stack``
    a header line ``{"pid": P, "start": S, "main": M, "signal": N}`` (S: the process's start time in clock ticks,
    /proc/<pid>/stat field 22, so a reused pid is never mistaken for it; M: the main thread's id, which
    faulthandler prints as ``Thread 0x...``), then every dump: ``faulthandler.register(N, all_threads=True)``
    writes the stack of every thread there when the process receives signal N (SIGRTMIN + 7: unused by torch,
    Lightning and Slurm, which use SIGUSR1/SIGUSR2/SIGTERM; its default action would end a process, so the reader
    signals only processes whose /proc/<pid>/status shows it caught).
``<pid>.raised``
    written when an uncaught exception ends the process: the exception's line as Python prints it last
    (``RuntimeError: boom``), at most :data:`RAISED_MAX` characters. The launcher reads the one of the worker
    torchrun gave up on (by its pid) and publishes it with its done mark, so that every node's last line quotes
    the cause: main's too, when the failing rank is on another machine and its traceback only in that machine's
    output.
``<pid>.progress``
    once this process has joined a process group, one JSON line rewritten (atomically) when it changes, checked
    every :data:`PROGRESS_S`: ``{"rank", "world", "calls", "moves"}``. ``calls``: the collectives this process
    has issued, summed over its process groups (the groups' sequence numbers, which gloo and NCCL both keep);
    ``moves``: how many checks found the main thread running Python code, or somewhere else in it (code and
    instruction of every frame) than at the check before. A rank stuck in a collective, or in any one call, moves
    neither; a rank that trains, computes in Python, or saves a checkpoint moves one or both. The launcher's stall
    watch reads these.

*Running* is read from the instruction the main thread's innermost frame is at, because of where the interpreter
hands the GIL to another thread: only at a function's start (RESUME) and at a loop's backward jump, so a thread
found there was executing bytecode; one blocked in a call (a collective's wait, ``time.sleep``) is always found at
the calling instruction. Without it, a pure-Python loop would be found at the same backward jump at every check.

Why faulthandler and not py-spy: it is in every CPython, needs no package in the image and no ptrace capability in
the container, and dumps from a C signal handler, so it answers while the main thread is blocked in C (a gloo or
NCCL wait), which a Python-level handler would not. It shows Python frames only; that is where a rank's place in
the script is.
"""

from __future__ import annotations

import _thread
import contextlib
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType, ModuleType, TracebackType

from nodekit.launcher.contract import Env

ENV = Env.WORKER_DIR
DEFAULT_DIR = "/tmp/nodekit-workers"  # what the launcher sets ENV to, unless its own environment names another
SIGNAL = signal.SIGRTMIN + 7
PROGRESS_S = 1.0
RAISED = ".raised"
RAISED_MAX = 1000  # a message can be megabytes (a tensor's repr): the quote is one line


def start_time(pid: int | str) -> int | None:
    """Process ``pid``'s start time (clock ticks since boot, /proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _frames(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def position(frame: FrameType | None) -> tuple[tuple[int, int], ...]:
    """Where a thread is: its frames' code objects and instruction offsets, innermost first."""
    return tuple((id(f.f_code), f.f_lasti) for f in _frames(frame))


_RUNNING = frozenset({"RESUME", "JUMP_BACKWARD", "JUMP_ABSOLUTE"})  # JUMP_ABSOLUTE: Python 3.10's backward jump


def running(frame: FrameType | None) -> bool:
    """Whether a thread whose innermost frame is ``frame`` was caught executing bytecode (see the module docstring)."""
    if frame is None:
        return False
    import dis

    code, at = frame.f_code.co_code, frame.f_lasti
    if not 0 <= at < len(code):
        return False
    name = dis.opname[code[at]]
    return name in _RUNNING or name.startswith("POP_JUMP_BACKWARD")


def calls(c10d: ModuleType | None) -> int:
    """Collectives issued so far over every process group of this process (their sequence numbers)."""
    groups = getattr(getattr(c10d, "_world", None), "pg_map", None) or {}
    total = 0
    for group in list(groups):
        # A backend without sequence numbers, or a group being destroyed: not counted.
        with contextlib.suppress(Exception):
            total += int(group._get_sequence_number_for_group())
    return total


def _report(path: str, main: int) -> None:
    """The progress thread's loop (see the module docstring); never raises."""
    moves, last, written = 0, None, ""
    while True:
        time.sleep(PROGRESS_S)
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                continue
            frame = sys._current_frames().get(main)
            here = position(frame)
            moves += (last is not None and here != last) or running(frame)
            last, frame = here, None  # no frame kept: it would keep its locals (tensors) alive
            c10d = sys.modules.get("torch.distributed.distributed_c10d")
            line = (
                f'{{"rank": {int(dist.get_rank())}, "world": {int(dist.get_world_size())}, '
                f'"calls": {calls(c10d)}, "moves": {moves}}}\n'
            )
            if line != written:
                with open(path + ".tmp", "w") as f:
                    f.write(line)
                os.replace(path + ".tmp", path)
                written = line
        except Exception:  # the group was destroyed under us, the directory vanished: try again next time
            continue


def raised_line(value: BaseException) -> str:
    """The exception's last line as Python prints it (``RuntimeError: boom``; a message's first line only)."""
    import traceback  # only in a process that is ending with an exception

    lines = "".join(traceback.format_exception_only(type(value), value)).strip().splitlines()
    text = next((line for line in lines if line.strip()), type(value).__name__)
    return text if len(text) <= RAISED_MAX else text[: RAISED_MAX - 3] + "..."


def keep_raised(base: str) -> None:
    """Chain a ``sys.excepthook`` that writes ``<base>.raised`` (see the module docstring) before the hook it
    replaces prints the traceback; a write that fails is skipped."""
    previous = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            with open(base + RAISED + ".tmp", "w", encoding="utf-8") as f:
                f.write(raised_line(value))
            os.replace(base + RAISED + ".tmp", base + RAISED)
        previous(tp, value, tb)

    sys.excepthook = excepthook


def arm(directory: str) -> bool:
    """Arm this process (see the module docstring); whether it worked."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        pid = os.getpid()
        base = os.path.join(directory, str(pid))
        fd = os.open(base + ".stack", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        main = _thread.get_ident()
        header = f'{{"pid": {pid}, "start": {start_time(pid) or 0}, "main": {main}, "signal": {int(SIGNAL)}}}\n'
        os.write(fd, header.encode())
        faulthandler.register(SIGNAL, file=fd, all_threads=True)  # keeps fd: it stays open for the process's life
        _thread.start_new_thread(_report, (base + ".progress", main))
        keep_raised(base)
        return True
    except Exception:
        return False


def arm_from_env() -> bool:
    directory = os.environ.get(ENV, "").strip()
    return arm(directory) if directory else False
