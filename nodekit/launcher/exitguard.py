"""Exit codes that tell the truth: a process that finished its work exits 0 even when torch's teardown would abort.

Loaded into every Python process of the job by ``nodekit-exitguard.pth`` in the image's environment, only when
``NODEKIT_EXIT_GUARD=1`` (the launcher sets it for the job's processes unless the user set it; ``0`` switches it
off). Standard library only; importing it has no effect beyond installing three hooks, and, where the launcher
also set NODEKIT_WORKER_DIR, arming the stack dump and progress record of :mod:`nodekit.launcher.stacks.hook` (this
module is the image's one entry into every process of the job; NODEKIT_EXIT_GUARD=0 switches both off).

The problem: with torch 2.x, gloo's (and NCCL's) process-group destructors, run during the interpreter's
finalisation while the peers are closing their sockets, now and then call ``std::terminate`` ("terminate called
without an active exception"): SIGABRT, exit 134, on a rank whose script had returned normally. Lightning's
``Trainer`` and scripts that never call ``destroy_process_group`` hit it; users cannot work around it.

How a finished process is told from a failed one (the rule docs/concepts/failures.md documents):

* *finished*: the ``__main__`` module ran to its end, or a ``sys.exit()`` with 0 or None ended it (its SystemExit
  went up through ``__main__``'s frame), and no uncaught exception reached ``sys.excepthook``;
  (On Python 3.11, which keeps no record of the frames an uncaught SystemExit left, "went up through" is judged
  by where ``__main__``'s frame stopped: at the call that was running when ``sys.exit(0)`` was made. One ending is
  then misread: inside that same top-level call, a library's ``sys.exit(0)`` caught and then a bare
  ``raise SystemExit(n)``: it counts as finished.)
* anything else is *not known to be finished*: an uncaught exception, ``sys.exit(n)`` with n != 0, a
  ``raise SystemExit(n)`` (the ``__main__`` module then did not run to its end), ``os._exit(n)`` and signals (no
  Python code runs at all then).

Only a finished process is changed: the guard's ``atexit`` handler, registered when the interpreter starts and so
run last (``atexit`` is last-in, first-out: after the script's and the frameworks' own handlers, and after the
non-daemon threads were joined), flushes the standard streams and every open buffered file, then ends the process
with ``os._exit(0)``, skipping the finalisation in which the teardown aborts. Every other process exits exactly
as it would without the guard.

Whether ``__main__`` ran to its end: the first import made while ``__main__``'s module code runs lets a
``sys.meta_path`` hook (which never finds anything itself) keep a reference to that frame; at exit the frame's last
instruction is a return when the module completed, and the instruction that raised when it did not.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Any, NoReturn

from nodekit.launcher.contract import Env

ENV = Env.EXIT_GUARD
_RETURNS = frozenset({"RETURN_VALUE", "RETURN_CONST"})
_WRITERS = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


class _State:
    exit_exc: SystemExit | None = None  # what the last sys.exit() raised
    exit_lasti: int | None = None  # where __main__'s frame was then (None: it was not among the callers)
    uncaught: bool = False  # an exception reached sys.excepthook
    main_frame: FrameType | None = None
    installed: bool = False


_state = _State()


def _main_module_frame(frame: FrameType | None) -> FrameType | None:
    """The outermost frame running ``__main__``'s module code (a script, ``-m module`` or ``-c``), if any."""
    found = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            found = frame
        frame = frame.f_back
    return found


class _MainFrameFinder:
    """A meta-path finder that finds nothing: it only notes ``__main__``'s frame at the first import it makes."""

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: object = None) -> None:
        if _state.main_frame is None:
            _state.main_frame = _main_module_frame(sys._getframe(1))
        return None


def completed(frame: FrameType) -> bool:
    """Whether ``frame`` (one that has stopped running) ended with a return rather than an exception."""
    import dis

    code = frame.f_code.co_code
    lasti = frame.f_lasti
    if not 0 <= lasti < len(code):
        return False
    return dis.opname[code[lasti]] in _RETURNS


def finished() -> bool:
    """Whether this process is known to have finished its work (see the module docstring)."""
    frame = _state.main_frame
    if _state.uncaught or frame is None:
        return False
    if completed(frame):
        return True
    e = _state.exit_exc
    if e is None or not (e.code is None or e.code == 0):
        return False
    # sys.exit(0) counts only if its SystemExit went up through __main__'s frame: one caught below it (a library
    # or torchrun calling sys.exit internally) says nothing about how the process ends. From Python 3.12 the
    # exception's traceback shows the frames it went through. Python 3.11 stops updating ``__traceback__`` at the
    # last frame that caught it (the exit() wrapper below), so there the test is where __main__'s frame stopped:
    # at the very instruction that was running when sys.exit(0) was called (a caught exit followed by a
    # ``raise SystemExit(n)`` elsewhere in the module stops it at another one).
    return _passed_through(e, frame) or (_state.exit_lasti is not None and _state.exit_lasti == frame.f_lasti)


def _lasti_of_main(caller: FrameType | None) -> int | None:
    """The instruction __main__'s module frame is at, if it is ``caller`` or one of its callers."""
    main = _state.main_frame
    while caller is not None:
        if caller is main:
            return caller.f_lasti
        caller = caller.f_back
    return None


def _passed_through(e: BaseException, frame: FrameType) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame is frame:
            return True
        tb = tb.tb_next
    return False


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    # Files the script left open still hold buffered data that finalisation would have written.
    for obj in gc.get_objects():
        try:
            # type(), not isinstance(): the latter asks lazy proxies for __class__, which can warn or import.
            if issubclass(type(obj), _WRITERS) and not obj.closed:
                obj.flush()
        except Exception:
            pass


def _at_exit(exit_now: Callable[[int], Any] = os._exit) -> None:
    if not finished():
        return
    _flush_all()
    exit_now(0)


def install() -> None:
    """Install the hooks once: sys.exit and sys.excepthook recorders, the meta-path finder, the atexit handler."""
    if _state.installed:
        return
    _state.installed = True
    real_exit = sys.exit
    real_hook = sys.excepthook

    def exit(status: str | int | None = None) -> NoReturn:
        try:
            real_exit(status)
        except SystemExit as e:
            _state.exit_exc = e
            _state.exit_lasti = _lasti_of_main(sys._getframe(1))
            raise

    def excepthook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _state.uncaught = True
        real_hook(tp, value, tb)

    sys.exit = exit
    sys.excepthook = excepthook
    sys.meta_path.insert(0, _MainFrameFinder())
    atexit.register(_at_exit)


if os.environ.get(ENV, "").strip() == "1":
    install()
    if os.environ.get(Env.WORKER_DIR, "").strip():
        from nodekit.launcher.stacks import hook

        hook.arm_from_env()
