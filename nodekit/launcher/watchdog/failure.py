"""Who failed, said in one line: the worker torchrun gave up on (global rank, local rank, exit code or signal), and
the lines the peer watchdog prints about lost and failed nodes. Pure; no torch (torchrun's ChildFailedError is read
by duck typing, so this module imports without it).

When one worker dies past ``max_restarts``, its peers' collectives fail with it, so several nodes can report a failed
worker within the same second. :func:`first_failed` picks the one to name first. What a peer's death looks like on
the others is exit code 1 (gloo or NCCL raise "Connection closed by peer") or SIGABRT (their destructors call
``std::terminate``); anything else (another signal, another exit code) is more likely the cause. Among the exit 1s,
the exception a worker raised tells them apart (its hook kept it): one of the job's own (``RuntimeError: boom``)
comes before one that names none, and a peer's loss (:data:`CONSEQUENCES`) after both, since torchrun's second is
often the same for the cause and its consequence. So: that order, then the earliest (torchrun's wall-clock
second), then the lowest node rank. Nodes whose torchrun failed without naming a worker (the failing node closed the
rendezvous, a timeout) come after every node that named one.
The line names the others too, so that a wrong guess still shows the whole picture.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodekit.launcher.preflight.stack import StackReport
from nodekit.launcher.stacks.hook import RAISED_MAX


@dataclass(frozen=True)
class WorkerFailure:
    """The first worker that failed on a node whose torchrun gave up (torchrun's ``get_first_failure()``)."""

    rank: int  # the worker's global rank (RANK) in the attempt that failed
    local_rank: int
    exitcode: int  # negative: killed by signal -exitcode, as torchrun reports it
    at: int  # wall-clock seconds when torchrun noticed (ProcessFailure.timestamp)
    max_restarts: int
    """torchrun's; -1 for processes the launcher started itself (``ranks.py``), which nothing restarts."""
    raised: str = ""  # the exception that ended it, as Python printed it last (RuntimeError: boom); "" unknown

    @property
    def signalled(self) -> bool:
        return self.exitcode < 0

    def describe(self) -> str:
        """``worker rank 1 (local rank 0) was killed by SIGKILL; no restarts left (max_restarts = 3)``, or
        ``worker rank 1 (local rank 0) raised RuntimeError: boom (exit code 1); torchrun restarts no worker ...``"""
        code = self.exitcode
        how = f"was killed by {signal_name(-code)}" if self.signalled else f"exited with code {code}"
        if self.raised and not self.signalled:
            how = f"raised {self.raised} (exit code {code})"
        if self.max_restarts < 0:
            left = "nothing restarts it"
        elif self.max_restarts == 0:
            left = "torchrun restarts no worker (max_restarts = 0)"
        else:
            left = f"no restarts left (max_restarts = {self.max_restarts})"
        return f"worker rank {self.rank} (local rank {self.local_rank}) {how}; {left}"

    def to_json_dict(self) -> dict[str, int | str]:
        data: dict[str, int | str] = {
            "rank": self.rank, "local_rank": self.local_rank, "exitcode": self.exitcode, "at": self.at,
            "max_restarts": self.max_restarts,
        }  # fmt: skip
        if self.raised:
            data["raised"] = self.raised
        return data

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> WorkerFailure:
        return cls(
            rank=int(data["rank"]),
            local_rank=int(data["local_rank"]),
            exitcode=int(data["exitcode"]),
            at=int(data.get("at", 0)),
            max_restarts=int(data.get("max_restarts", 0)),
            raised=str(data.get("raised", ""))[:RAISED_MAX],
        )


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def worker_failure(
    error: BaseException, max_restarts: int, raised: Callable[[int], str] = lambda pid: ""
) -> WorkerFailure | None:
    """The first failed worker that torchrun's ChildFailedError carries, or None for any other exception;
    ``raised``: what the exception that ended the process with that pid said (:func:`nodekit.launcher.stacks.collect.
    raised`), "" when unknown."""
    first = getattr(error, "get_first_failure", None)
    if not callable(first):
        return None
    try:
        rank, failure = first()
        return WorkerFailure(
            rank=int(rank),
            local_rank=int(failure.local_rank),
            exitcode=int(failure.exitcode),
            at=int(failure.timestamp),
            max_restarts=max_restarts,
            raised=raised(int(pid)) if (pid := getattr(failure, "pid", None)) and int(failure.exitcode) > 0 else "",
        )
    except Exception:  # a torch whose failure record looks different: the traceback above still says it
        return None


# What a collective raises in the ranks that outlive a peer (gloo, NCCL, the TCPStore): a consequence, not a cause.
CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "DistNetworkError",
                "NCCL communicator was aborted", "remote process exited")  # fmt: skip


def first_failed(failed: Sequence[tuple[int, WorkerFailure | None]]) -> list[tuple[int, WorkerFailure | None]]:
    """``(node rank, its worker failure)`` pairs, the one to name first first (see the module docstring)."""

    def key(item: tuple[int, WorkerFailure | None]) -> tuple[int, int, int, int]:
        rank, f = item
        if f is None:
            return (9, 0, 0, rank)
        if f.exitcode not in (1, -signal.SIGABRT):
            return (0, f.at, 0, rank)
        if not f.raised:
            return (2, f.at, 0, rank)
        return (3 if any(c in f.raised for c in CONSEQUENCES) else 1, f.at, 0, rank)

    return sorted(failed, key=key)


# ---- the lines --------------------------------------------------------------------------------------------------


def who(ranks: Sequence[int], names: Mapping[int, str]) -> str:
    each = [f"{r} ({names.get(r, '?')})" for r in ranks]
    if len(each) == 1:
        return f"node {each[0]}"
    return f"nodes {', '.join(each[:-1])} and {each[-1]}"


def node_names(facts: Iterable[StackReport]) -> dict[int, str]:
    """``{rank: "172.31.250.12, host h2"}`` from the facts every node published in preflight."""
    return {f.rank: f"{f.address or '?'}, host {f.hostname or '?'}" for f in facts}


def node_failed(rank: int, code: int, failure: WorkerFailure | None, names: Mapping[int, str]) -> str:
    """``node 1 (10.0.0.6, host b) failed: worker rank 1 (local rank 0) was killed by SIGKILL; no restarts ...``, or
    ``node 1 (...) failed with exit code 1`` when its torchrun named no worker."""
    if failure is None:
        return f"{who([rank], names)} failed with exit code {code}"
    return f"{who([rank], names)} failed: {failure.describe()}"


def failed_line(failed: Sequence[tuple[int, int, WorkerFailure | None]], names: Mapping[int, str], then: str) -> str:
    """One line for nodes whose torchrun failed, ``(node rank, exit code, worker failure)``, the first named first:
    ``nodekit: node 1 (...) failed with exit code 1: worker rank 1 ...; then node 0 (...) failed ...; <then>``"""
    codes = {rank: code for rank, code, _ in failed}
    order = first_failed([(rank, f) for rank, _, f in failed])
    parts = [node_failed(rank, codes[rank], f, names) for rank, f in order]
    text = parts[0] if len(parts) == 1 else f"{parts[0]}; then {'; '.join(parts[1:])}"
    return f"nodekit: {text}; {then}"
