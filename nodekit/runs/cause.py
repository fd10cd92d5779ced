"""The exception a failed node's job raised, read from its output: what the run's closing line quotes.

A rank that raises prints its traceback, and within a second every other rank prints one of its own (gloo's
"Connection closed by peer", NCCL's watchdog): the cause is 40 lines up by the time the run ends. The head reads
every node's lines anyway; :class:`Causes` keeps, per node, the first traceback's exception line (type and
message), so that the last line can say ``node 1 failed with exit code 1: rank 1 raised RuntimeError: boom``.

A traceback is Python's own shape: ``Traceback (most recent call last):``, indented frames, then the first line
that is not indented (``RuntimeError: boom``). torch prefixes each line of a rank's uncaught exception with
``[rankN]:``, which names the rank. A chained exception (``During handling of the above exception`` / ``The above
exception was the direct cause``) is followed to its last link, the one Python prints last.

A node that exited 19 (:data:`~nodekit.launcher.contract.EXIT_PEER_LOST`) was ended by another node, and its own
traceback is the consequence (gloo's "Connection closed by peer"). Its peer watchdog printed a line naming the node
that failed first, with the exception that node's done mark carried (:data:`~nodekit.launcher.contract.PEER_VERDICT`):
that is its quote, the only place the cause is when the failing node's output is on another machine (``nodekit up``).
Pure: lines in, a quote out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodekit.launcher.contract import EXIT_PEER_LOST, PEER_VERDICT
from nodekit.system.terminal import ESCAPES

_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\b")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
TRACEBACK = "Traceback (most recent call last):"
MAX_QUOTE = 240


@dataclass(frozen=True)
class Raised:
    """One exception line: ``RuntimeError: boom``, and the rank whose ``[rankN]:`` prefix it carried (or None)."""

    text: str
    rank: int | None

    def quote(self) -> str:
        """``rank 1 raised RuntimeError: boom``, at most :data:`MAX_QUOTE` characters of the exception."""
        text = self.text if len(self.text) <= MAX_QUOTE else self.text[: MAX_QUOTE - 3] + "..."
        return f"rank {self.rank} raised {text}" if self.rank is not None else f"raised {text}"


@dataclass
class _Reading:
    state: str = "idle"  # idle, frames (inside a traceback), after (an exception line seen), chained
    candidate: Raised | None = None


@dataclass
class Causes:
    """Every node's output fed line by line; :meth:`first` is a node's first complete traceback's exception."""

    _reading: dict[tuple[int, int | None], _Reading] = field(default_factory=dict)
    _first: dict[int, Raised] = field(default_factory=dict)
    _verdict: dict[int, str] = field(default_factory=dict)

    def feed(self, node: int, line: str) -> None:
        text = ESCAPES.sub("", line).rstrip("\r\n")
        if node not in self._verdict and text.startswith(PEER_VERDICT):
            self._verdict[node] = _first_named(text)
        if node in self._first:
            return
        m = _PREFIX.match(text)
        rank = int(m.group(1)) if m else None
        body = text[m.end() :] if m else text
        key = (node, rank)
        r = self._reading.setdefault(key, _Reading())
        if body.startswith(TRACEBACK):
            if r.state == "after":  # a new traceback, not a chained one: the last one is complete
                self._settle(node, key)
                if node in self._first:
                    return
                r = self._reading.setdefault(key, _Reading())
            r.state = "frames"
            return
        if r.state == "idle" or not body.strip():
            return
        if r.state == "after":
            if body.startswith(_CHAINED):
                r.state = "chained"
                return
            self._settle(node, key)
            return
        if r.state == "frames" and not body[0].isspace() and _EXCEPTION.match(body):
            r.candidate, r.state = Raised(body.strip(), rank), "after"

    def _settle(self, node: int, key: tuple[int, int | None]) -> None:
        r = self._reading.pop(key)
        if r.candidate is not None:
            self._first.setdefault(node, r.candidate)

    def first(self, node: int) -> Raised | None:
        """The node's first exception: a settled one, else one whose traceback was the output's last."""
        for key in [k for k in self._reading if k[0] == node and self._reading[k].candidate is not None]:
            self._settle(node, key)
        return self._first.get(node)

    def quote(self, node: int, code: int) -> str | None:
        """What a closing line quotes for ``node``, which exited with ``code``: on 19 its watchdog's verdict (the node
        that failed first, its exception included), else its own first exception; None when there is none."""
        if code == EXIT_PEER_LOST:
            return self._verdict.get(node)
        raised = self.first(node)
        return raised.quote() if raised is not None else None


def _first_named(line: str) -> str:
    """``node 1 (...) failed: worker rank 1 ... raised RuntimeError: boom (exit code 1); ...`` from a verdict line: the
    first node it names, without the nodes that followed (``; then``) or what this node did (the last clause)."""
    text = line.removeprefix("nodekit: ").partition("; then ")[0]
    text = text if "; then " in line else text.rpartition("; ")[0] or text
    return text if len(text) <= 2 * MAX_QUOTE else text[: 2 * MAX_QUOTE - 3] + "..."
