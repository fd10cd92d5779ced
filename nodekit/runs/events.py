"""The calls a backend makes while a run goes on, so that the run's record (nodekit/runs/recorder.py) knows when
each node reached each phase and how the run ended. Backends call these at a few named points; what is recorded,
written or sent is the recorder's business. Lines of output are not here: the command tees them to the recorder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

Phase = Literal["image", "started", "preflight", "rendezvous", "output", "end"]
PHASES: tuple[Phase, ...] = ("image", "started", "preflight", "rendezvous", "output", "end")
"""In the order a node goes through them: its image is there, its container started, the launcher's preflight
passed, torchrun's rendezvous is done, the job printed its first line, the node ended."""


class RunEvents(Protocol):
    def image(self, ref: str, image_id: str, labels: Mapping[str, str]) -> None:
        """The image every node runs (its labels carry the fingerprint and the lock's digest)."""

    def phase(self, rank: int, phase: Phase) -> None:
        """Node ``rank`` reached ``phase`` now (the first time in this attempt counts)."""

    def exited(self, rank: int, code: int | None) -> None:
        """Node ``rank`` ended with ``code``; None: its host was lost."""

    def attempt(self, number: int, hosts: Sequence[tuple[int, str]]) -> None:
        """The whole job starts again (``number`` 1 is the first restart) on ``hosts`` ((rank, where); fewer when
        lost hosts were left out, ranked again)."""

    def failed(self, rank: int, code: int, reason: str) -> None:
        """The backend's verdict: node ``rank`` is to blame, with ``code`` (-1: lost) and the reason in words."""

    def placed(self, job_id: str, hosts: Sequence[tuple[int, str]]) -> None:
        """A scheduler took the job (Slurm's job id) and put its ranks on ``hosts`` ((rank, host); may be empty
        while it waits)."""


class NoEvents:
    """What a backend is given when nothing records the run."""

    def image(self, ref: str, image_id: str, labels: Mapping[str, str]) -> None:
        pass

    def phase(self, rank: int, phase: Phase) -> None:
        pass

    def exited(self, rank: int, code: int | None) -> None:
        pass

    def attempt(self, number: int, hosts: Sequence[tuple[int, str]]) -> None:
        pass

    def failed(self, rank: int, code: int, reason: str) -> None:
        pass

    def placed(self, job_id: str, hosts: Sequence[tuple[int, str]]) -> None:
        pass


NO_EVENTS = NoEvents()
