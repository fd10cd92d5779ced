"""Where each rank waits, and the ranks that wait in the same place as one entry. Pure; standard library.

A rank's *place* is read from its main thread's stack: the innermost frame of the user's own code (not the
standard library, not site-packages, not nodekit) gives ``file:line``, and the call it makes there gives the
operation: the torch.distributed function it called (``all_reduce``, ``all_gather_object``, ``barrier``: the
outermost one in ``distributed_c10d.py``, so ``all_gather_object`` rather than the ``all_gather`` inside it), else
the torch function it called (``backward``: DDP's gradient all-reduce runs in C++ under it and shows no Python
frame of its own), else none. So::

    ranks 0,2,3 in all_gather at train.py:88; rank 1 in all_reduce at train.py:61

The report prints that summary, then one stack per place (its lowest rank's, outermost call first, as a Python
traceback reads), or with ``every`` every rank's main thread and other threads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nodekit.launcher.contract import WORKDIR  # the user's files are shown relative to it
from nodekit.launcher.stacks.collect import Process
from nodekit.launcher.stacks.dump import Frame, Thread, main_thread, parse

_STDLIB = re.compile(r"/lib/python3\.\d+/")
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/nodekit/launcher/")
_WRAPPERS = frozenset(
    {"wrapper", "inner", "wrapped", "_fn", "decorate_context", "__call__", "_call_impl", "_wrapped_call_impl"}
)
_C10D = "torch/distributed/distributed_c10d.py"
_HOOK = "nodekit/launcher/stacks/hook.py"  # nodekit's own progress thread, in every process: never shown


def library(file: str) -> bool:
    """Whether a frame's file is not the user's: the standard library, an installed package, nodekit, frozen."""
    if file.startswith("<"):
        return file not in ("<string>", "<stdin>")
    return any(m in file for m in _LIBRARY_MARKS) or _STDLIB.search(file) is not None


def shown(file: str, workdir: str = WORKDIR) -> str:
    """A file as the report names it: relative to the working directory, or from its package on."""
    if file.startswith(workdir.rstrip("/") + "/"):
        return file[len(workdir.rstrip("/")) + 1 :]
    for mark in ("/site-packages/", "/dist-packages/"):
        if mark in file:
            return file.split(mark, 1)[1]
    return file


@dataclass(frozen=True)
class Place:
    """Where a rank waits; ``problem``: why it has no stack."""

    op: str | None = None
    file: str | None = None
    line: int | None = None
    func: str | None = None
    problem: str | None = None

    @property
    def key(self) -> tuple[str | None, str | None, int | None, str | None]:
        return (self.op, self.file, self.line, self.problem)

    def text(self) -> str:
        if self.problem is not None:
            return f"without a stack ({self.problem})"
        if self.file is None:
            return "with no Python frame"
        at = f"{self.file}:{self.line if self.line is not None else '?'}"
        return f"in {self.op} at {at}" if self.op else f"at {at} in {self.func}"


@dataclass(frozen=True)
class RankStack:
    """One process of the job with its parsed dump: ``rank`` None for a process that joined no process group
    (a data loader's worker, a compile worker); ``node`` as the reader knows it."""

    pid: int
    rank: int | None
    node: int | None
    main: Thread | None
    threads: tuple[Thread, ...] = ()
    world: int | None = None
    command: str = ""
    error: str | None = None

    @classmethod
    def of(cls, process: Process, node: int | None) -> RankStack:
        threads = tuple(parse(process.dump))
        main = main_thread(list(threads), process.main)
        error = process.error if process.error or main is not None else "no main thread in its dump"
        return cls(process.pid, process.rank, node, main, threads, process.world, process.command, error)

    @property
    def others(self) -> tuple[Thread, ...]:
        """Its threads but the main one and nodekit's own."""
        return tuple(t for t in self.threads if t is not self.main and not any(_HOOK in f.file for f in t.frames))


def _op(chain: Sequence[Frame]) -> str | None:
    """The operation a user frame's call is, from the library frames it called, outermost first."""
    c10d = [f.func for f in chain if f.file.endswith(_C10D) and f.func not in _WRAPPERS]
    if c10d:
        return c10d[0]
    first = next((f for f in chain if f.func not in _WRAPPERS), None)
    if first is not None and "/torch/" in first.file:
        return first.func
    return None


def place(stack: RankStack, workdir: str = WORKDIR) -> Place:
    if stack.main is None:
        return Place(problem=stack.error or "no main thread")
    frames = stack.main.frames  # innermost first
    if not frames:
        return Place()
    at = next((i for i, f in enumerate(frames) if not library(f.file)), 0)
    chain = tuple(reversed(frames[:at]))
    mine = frames[at]
    return Place(_op(chain), shown(mine.file, workdir), mine.line, mine.func)


@dataclass(frozen=True)
class Group:
    """Ranks waiting in one place, lowest rank first."""

    place: Place
    stacks: tuple[RankStack, ...] = field(default_factory=tuple)

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.stacks if s.rank is not None]

    def text(self) -> str:
        ranks = self.ranks
        return f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {ranks_text(ranks)} {self.place.text()}"


def ranks_text(ranks: Iterable[int]) -> str:
    """``0,2,3``; runs of three or more as ``4-63``."""
    out: list[str] = []
    run: list[int] = []
    for r in [*sorted(set(ranks)), None]:
        if r is not None and run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)))
        run = [r] if r is not None else []
    return ",".join(out)


def ranked(stacks: Iterable[RankStack]) -> list[RankStack]:
    """The processes that are ranks, lowest rank first (a rank found twice: the lowest pid first)."""
    return sorted((s for s in stacks if s.rank is not None), key=lambda s: (s.rank or 0, s.pid))


def groups(stacks: Iterable[RankStack], workdir: str = WORKDIR) -> list[Group]:
    """Ranks by place, the group of the lowest rank first."""
    by: dict[tuple[object, ...], list[RankStack]] = {}
    places: dict[tuple[object, ...], Place] = {}
    for s in ranked(stacks):
        p = place(s, workdir)
        by.setdefault(p.key, []).append(s)
        places[p.key] = p
    return [Group(places[k], tuple(v)) for k, v in by.items()]


def missing(stacks: Sequence[RankStack]) -> list[int]:
    """Ranks of the world (as the ranks report it) that no process was found for."""
    worlds = {s.world for s in stacks if s.world is not None}
    if not worlds:
        return []
    found = {s.rank for s in stacks if s.rank is not None}
    return [r for r in range(max(worlds)) if r not in found]


def summary(stacks: Sequence[RankStack], workdir: str = WORKDIR) -> str:
    """One line: every place with its ranks, and the ranks found nowhere."""
    parts = [g.text() for g in groups(stacks, workdir)]
    gone = missing(stacks)
    if gone:
        parts.append(f"{'rank' if len(gone) == 1 else 'ranks'} {ranks_text(gone)} not found on any node")
    return "; ".join(parts) if parts else "no rank found"


def _traceback(thread: Thread, workdir: str) -> list[str]:
    lines = ["  ... (deeper than faulthandler's 100 frames)"] if thread.cut else []
    lines += [f'  File "{shown(f.file, workdir)}", line {f.line if f.line is not None else "?"}, in {f.func}'
              for f in thread.outermost_first()]  # fmt: skip
    return lines or ["  (no Python frame)"]


def _who(s: RankStack) -> str:
    node = f"node {s.node}, " if s.node is not None else ""
    return f"{node}pid {s.pid}"


def report(stacks: Sequence[RankStack], *, every: bool = False, workdir: str = WORKDIR) -> str:
    """The summary (one line per place), then each place's stack, most recent call last; ``every``: every rank's
    main thread and other threads, and the job's processes that are not ranks."""
    found = groups(stacks, workdir)
    nodes = {s.node for s in ranked(stacks)}
    head = (
        f"{len(ranked(stacks))} rank(s) on {len(nodes)} node(s), {len(found)} place(s)"
        + (f"; {'rank' if len(missing(stacks)) == 1 else 'ranks'} {ranks_text(missing(stacks))} not found"
           if missing(stacks) else "")
    )  # fmt: skip
    lines = [head + ":", *(f"  {g.text()}" for g in found)]
    for g in found:
        shown_stacks = g.stacks if every else g.stacks[:1]
        for s in shown_stacks:
            same = "" if every or len(set(g.ranks)) == 1 else f" (the stack of rank {s.rank}; {g.text()})"
            lines += ["", f"rank {s.rank} ({_who(s)}) {g.place.text()}{same}, most recent call last:"]
            if s.main is not None:
                lines += _traceback(s.main, workdir)
            if every:
                for t in s.others:
                    lines += [f"  -- thread 0x{t.ident:x}{f' [{t.name}]' if t.name else ''}:"]
                    lines += ["  " + ln for ln in _traceback(t, workdir)]
    others = [s for s in stacks if s.rank is None]
    if others and every:
        for s in others:
            lines += ["", f"pid {s.pid} (not a rank: {s.command[:80] or '?'}), {_who(s)}:"]
            lines += _traceback(s.main, workdir) if s.main is not None else [f"  ({s.error})"]
    elif others:
        lines += ["", f"({len(others)} other Python process(es) of the job, not ranks, not shown)"]
    return "\n".join(lines)
