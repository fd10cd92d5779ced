"""The supervisor's decision table, pure: given what each node reported and the time, what the head does next.

Nodes report an exit (code, when) or a loss (the head lost its engine: SSH down, host dead). The first node that
failed is the culprit, with one subtlety: the peer watchdog makes every *other* node exit 19 ("node k failed"), so a
19 is a consequence; when only 19s have arrived the table waits up to ``settle_s`` for the cause to report before it
blames the earliest 19. Nodes the head stopped itself are never blamed. A failure is also held for ``settle_s``
before anyone is stopped, so that peers failing with it at the same moment (their collectives break when one rank
dies) are reported as failing on their own and named with it (``also``), not as stopped by the head.
Then: stop whoever still runs; once nobody runs, restart the whole job while restarts are left (without lost hosts
when ``min_nodes`` allows), else fail with the culprit's code. A refusal the same job would meet again (:data:`FINAL`:
bad input, a stack mismatch, the link or GPU health check) fails at once, whatever restarts are left. Tested on a
fake clock (``now`` is an argument).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from nodekit.launcher.contract import EXIT_BAD_ENV, EXIT_GPU, EXIT_LINK, EXIT_PEER_LOST, EXIT_STACK_MISMATCH
from nodekit.launcher.stops import STOPPED_BY

SETTLE_S = 3.0
LOST = -1  # exit code reported for a node whose host was lost
# The launcher's refusals that the same job on the same hosts would meet again: bad input (2), a stack mismatch (17),
# a link check (20) or GPU health check (21) that refused. Restarting would spend the budget on the same refusal.
FINAL = {EXIT_BAD_ENV: "bad input", EXIT_STACK_MISMATCH: "a stack mismatch", EXIT_LINK: "the link check",
         EXIT_GPU: "the GPU health check"}  # fmt: skip


def ended_how(code: int) -> str:
    """``failed with exit code 1``, or ``was stopped by SIGHUP (exit 129)`` for a stop from outside."""
    name = STOPPED_BY.get(code)
    return f"was stopped by {name} (exit {code})" if name else f"failed with exit code {code}"


Action = Literal["wait", "stop", "done", "restart", "fail"]


@dataclass(frozen=True)
class Report:
    """What one node said. ``code`` None: still running. ``stopped``: the head stopped it (never the culprit)."""

    rank: int
    code: int | None = None
    at: float | None = None
    lost: bool = False
    stopped: bool = False

    @property
    def ended(self) -> bool:
        return self.code is not None or self.lost

    @property
    def failed(self) -> bool:
        return not self.stopped and (self.lost or (self.code is not None and self.code != 0))


@dataclass(frozen=True)
class Decision:
    action: Action
    culprit: int | None = None
    code: int = 0
    stop: tuple[int, ...] = ()
    drop: tuple[int, ...] = ()
    """Ranks whose hosts are left out of the restart (lost, allowed by min_nodes)."""
    reason: str = ""
    also: tuple[int, ...] = ()
    """Other nodes that failed on their own within ``settle_s`` of the culprit: when one rank dies, its peers' gloo or
    NCCL calls fail within milliseconds with the same code, and which report reaches the head first is chance."""


@dataclass(frozen=True)
class Budget:
    restarts: int = 0
    used: int = 0
    min_nodes: int | None = None
    failures: Mapping[int, int] = field(default_factory=dict)
    """Failures per rank in earlier attempts, to name a host that keeps failing."""


def culprit(reports: Sequence[Report], now: float, settle_s: float = SETTLE_S, cause_s: float = 0.0) -> Report | None:
    """The node to blame, or None when none failed yet (or only watchdog 19s, younger than ``settle_s`` or, while
    a node still runs, than ``cause_s``: the 19s say some node was lost, and a host that vanished is reported lost
    by the head only once its connection's keepalive gives up; blaming a 19 before then names the wrong node)."""
    failed = sorted((r for r in reports if r.failed), key=lambda r: (r.at if r.at is not None else now, r.rank))
    if not failed:
        return None
    causes = [r for r in failed if r.lost or r.code != EXIT_PEER_LOST]
    if causes:
        return causes[0]
    first = failed[0]
    running = any(not r.ended for r in reports)
    if running and first.at is not None and now - first.at < max(settle_s, cause_s):
        return None
    return first


def decide(
    reports: Sequence[Report], now: float, budget: Budget, settle_s: float = SETTLE_S, cause_s: float = 0.0
) -> Decision:
    """What to do now; see the module docstring (``cause_s``: :func:`culprit`)."""
    blamed = culprit(reports, now, settle_s, cause_s)
    running = tuple(r.rank for r in reports if not r.ended and not r.stopped)
    if blamed is None:
        if any(r.failed for r in reports):
            return Decision("wait", reason="a node stopped because of another; waiting for the cause to report")
        if not running and all(r.code == 0 for r in reports):
            return Decision("done", reason="every node finished")
        return Decision("wait")
    code = LOST if blamed.lost else int(blamed.code or 0)
    what = "was lost" if blamed.lost else ended_how(code)
    at = blamed.at if blamed.at is not None else now
    also = tuple(
        r.rank
        for r in reports
        if r.failed and r.rank != blamed.rank and r.code != EXIT_PEER_LOST and (r.at or now) - at <= settle_s
    )
    if running:
        if now - at < settle_s and not blamed.lost:
            # Let the peers' near-simultaneous failures arrive before stopping anyone: they are candidates too.
            return Decision("wait", culprit=blamed.rank, code=code, reason="collecting simultaneous failures")
        return Decision(
            "stop", culprit=blamed.rank, code=code, stop=running, reason=f"node {blamed.rank} {what}", also=also
        )
    if any(not r.ended and r.stopped for r in reports):
        return Decision("wait", culprit=blamed.rank, code=code, reason="stopping")
    lost = tuple(r.rank for r in reports if r.lost)
    keep = len(reports) - len(lost)
    final = FINAL.get(code) if not blamed.lost else None
    if budget.used < budget.restarts and final is None:
        if not lost:
            return Decision("restart", culprit=blamed.rank, code=code, reason=f"node {blamed.rank} {what}", also=also)
        if budget.min_nodes is not None and keep >= budget.min_nodes:
            return Decision("restart", culprit=blamed.rank, code=code, drop=lost, reason=f"node {blamed.rank} {what}")
    times = budget.failures.get(blamed.rank, 0) + 1
    again = f" (in {times} of {budget.used + 1} attempts)" if times > 1 else ""
    if final is not None and budget.used < budget.restarts:
        again += f"; not restarted: {final} refused, and would refuse the same job again"
    return Decision(
        "fail",
        culprit=blamed.rank,
        code=code if code != LOST else 1,
        reason=f"node {blamed.rank} {what}{again}",
        also=also,
    )
