"""The one shape every backend's plan has, in the spirit of torchx's scheduler (``submit_dryrun`` returns the
request that ``schedule`` then carries out).

Each backend's ``plan(...)`` returns a :class:`BackendPlan`: the files applying it writes, what applying does besides
(``steps``), the notes and warnings the user should read, and ``detail``, the backend's own typed decision that its
``apply`` carries out. ``--dry-run`` prints :meth:`BackendPlan.shown` (through ``nodekit.cli.ui.show_plan``, the one
print path) and changes nothing; without it the same object goes to the backend's ``apply``, so what was printed is
what is done. Pure: nothing here reads or writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from nodekit.job.secret import masked

D = TypeVar("D")


@dataclass(frozen=True)
class PlannedFile:
    """A file applying the plan writes: its path, its whole text and the secret inside it (masked whenever the file
    is shown), and ``about``, what the heading says of it beside the path (compose: its project)."""

    path: Path
    text: str
    secret: str = ""
    about: str = ""

    @property
    def shown(self) -> str:
        """The text as it may be printed: the secret masked."""
        return masked(self.text, self.secret)

    @property
    def heading(self) -> str:
        return f"# would write {self.path}{f' ({self.about})' if self.about else ''}:"


@dataclass(frozen=True)
class BackendPlan(Generic[D]):
    """What applying does, as text and as data. ``backend`` is the registered name (``nodekit.config.backends``);
    ``detail`` is what the backend's ``apply`` carries out."""

    backend: str
    detail: D
    files: tuple[PlannedFile, ...] = ()
    steps: str = ""
    """What applying does besides writing ``files``, as the dry run prints it (the fleet's hosts, ship and relays)."""
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    def shown(self) -> str:
        """Exactly what ``--dry-run`` prints: the steps, each file under its heading (secrets masked), then the notes
        and the warnings; every line ends with a newline."""
        parts = [self.steps + "\n"] if self.steps else []
        for f in self.files:
            text = f.shown
            parts += [f.heading + "\n", text if not text or text.endswith("\n") else text + "\n"]
        parts += [f"# note: {note}\n" for note in self.notes]
        parts += [f"# warning: {warning}\n" for warning in self.warnings]
        return "".join(parts)
