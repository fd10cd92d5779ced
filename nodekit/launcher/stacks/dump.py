"""What Python's faulthandler writes, read back: the threads of one dump and their frames. Pure; standard library.

faulthandler (``faulthandler.register(sig, file, all_threads=True)``, armed by :mod:`hook`) writes from inside the
signal handler, in C, without the GIL: it works while the main thread is blocked in a collective, where no Python
code of the process can run. Its format (CPython 3.9 to 3.14)::

    Thread 0x00007f8ec4bcf6c0 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 975 in run
      ...

    Current thread 0x00007f8ec4e952c0 [MainThread] (most recent call first):
      File "/workspace/train.py", line 61 in main
      File "/workspace/train.py", line 90 in <module>

The ``[name]`` appears from 3.14; ``Stack (most recent call first):`` heads a dump of one thread; a thread deeper
than faulthandler's limit (100 frames) ends with ``  ...``; ``  <no Python frame>`` is a thread in C only. Anything
else (a torn line) is skipped. The thread id is the thread's ``threading.get_ident()``, so the hook's record of the
main thread's id names the main thread here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])?"
    r" \(most recent call first\):$"
)
_STACK = "Stack (most recent call first):"
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.*)$')
_CUT = "  ..."


@dataclass(frozen=True)
class Frame:
    """One frame as faulthandler prints it: file as the code object names it, line (None: unknown), function."""

    file: str
    line: int | None
    func: str

    def where(self) -> str:
        return f"{self.file}:{self.line if self.line is not None else '?'}"


@dataclass(frozen=True)
class Thread:
    """One thread of a dump; ``frames`` innermost first, as faulthandler prints them."""

    ident: int
    current: bool = False  # the thread that ran the signal handler
    name: str | None = None  # from Python 3.14
    frames: tuple[Frame, ...] = ()
    cut: bool = False  # deeper than faulthandler's limit: the outermost frames are missing

    def outermost_first(self) -> tuple[Frame, ...]:
        return tuple(reversed(self.frames))


def parse(text: str) -> list[Thread]:
    """The threads of one dump, in the order faulthandler wrote them (newest thread first, the main thread
    usually last)."""
    threads: list[Thread] = []
    ident: int | None = None
    current, name, cut = False, None, False
    frames: list[Frame] = []

    def close() -> None:
        if ident is not None:
            threads.append(Thread(ident, current, name, tuple(frames), cut))

    for line in text.splitlines():
        head = _HEADER.match(line)
        if head is not None or line == _STACK:
            close()
            frames, cut = [], False
            if head is None:
                ident, current, name = 0, True, None
            else:
                ident, current, name = int(head["ident"], 16), head["current"] == "Current thread", head["name"]
            continue
        if ident is None:
            continue
        frame = _FRAME.match(line)
        if frame is not None:
            number = frame["line"]
            frames.append(Frame(frame["file"], int(number) if number.isdigit() else None, frame["func"]))
        elif line == _CUT:
            cut = True
    close()
    return threads


def main_thread(threads: list[Thread], ident: int | None) -> Thread | None:
    """The process's main thread: the one with the id the hook recorded; without it (or not found), the one whose
    outermost frame is module code, never one started by ``threading``."""
    if ident is not None:
        found = next((t for t in threads if t.ident == ident), None)
        if found is not None:
            return found
    for t in reversed(threads):
        if t.frames and t.frames[-1].func in ("<module>", "_run_module_as_main"):
            return t
    return None


_BOTTOM = ("<module>", "_run_module_as_main")


def complete(text: str, ident: int | None) -> bool:
    """Whether a dump that is still being read already holds the main thread's whole stack: followed by another
    thread, cut at faulthandler's limit, or reaching module code. (faulthandler writes no end marker, and writes
    line by line from the signal handler; the reader polls.)"""
    threads = parse(text)
    main = main_thread(threads, ident)
    if main is None:
        return False
    if threads[-1] is not main or main.cut:
        return True
    return bool(main.frames) and main.frames[-1].func in _BOTTOM and text.endswith("\n")
