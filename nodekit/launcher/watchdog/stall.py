"""The stall watch's decisions, pure: when no rank of the job has made progress for the stall timeout, and the lines
it prints. Readings and times in, decisions out; :mod:`nodekit.launcher.watchdog.stallio` carries them out.

Progress, per rank, is what its process's progress record says (:mod:`nodekit.launcher.stacks.hook`): ``calls``,
the collectives it has issued (every process group's sequence number, gloo's and NCCL's alike), and ``moves``, how
often its main thread was found somewhere else in its Python code than a second before. Why both: a job that trains
issues collectives every step, printed or not, and a rank that works alone (rank 0 evaluating or writing a checkpoint
while the others wait in a barrier, with no collective for minutes) moves in Python. A rank stuck in a collective
that never completes does neither, and neither does a rank stuck in any one call; the job is *stalled* when every
rank of the world has reported and not one number of any rank changed for ``timeout`` seconds. Output is not
progress: a stuck job's other threads may print, and a healthy one may be silent.

What this cannot tell from a stall (and the guide says): every rank spending the whole timeout inside one call that
never returns to Python and issues no collective, e.g. rank 0 in ``subprocess.run`` of a 10-minute tool while the
others wait for it in a barrier. Raise ``stall_timeout`` above such a phase, or set it to 0.

Before there is a world to judge (a rank not yet in a process group, a worker restarting, ranks that have ended)
nothing is stalled: the clock starts again when the world is whole. Every change starts a new *episode*; each is
reported at most once, so ``stall_action = "warn"`` prints one report per stall, not one per second.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from nodekit.launcher.contract import EXIT_STALLED as EXIT_STALLED

# Stacks are asked for this long before the timeout (at most half of it), so that the report is ready when it
# falls due: a dump is a signal and a file read on each node, published on the next heartbeat.
LEAD_S = 3.0
# After the timeout, how long main waits for nodes whose stacks have not arrived before it reports without them.
STACKS_WAIT_S = 5.0

Ranks = Mapping[int, tuple[int, int]]  # rank -> (calls, moves)


@dataclass(frozen=True)
class NodeProgress:
    """One node's ranks as it publishes them: the world they report and each rank's (calls, moves)."""

    world: int | None
    ranks: Ranks

    def to_json(self) -> str:
        return json.dumps({"world": self.world, "ranks": {str(r): list(v) for r, v in sorted(self.ranks.items())}})

    @classmethod
    def from_json(cls, raw: str | bytes) -> NodeProgress:
        data = json.loads(raw)
        world = data.get("world")
        ranks = {int(r): (int(v[0]), int(v[1])) for r, v in dict(data.get("ranks") or {}).items()}
        return cls(int(world) if world is not None else None, ranks)


def merge(nodes: Mapping[int, NodeProgress]) -> NodeProgress:
    """Every node's ranks together; the world is the largest any rank reports."""
    worlds = [n.world for n in nodes.values() if n.world is not None]
    ranks: dict[int, tuple[int, int]] = {}
    for n in nodes.values():
        ranks.update(n.ranks)
    return NodeProgress(max(worlds) if worlds else None, ranks)


class StallWatch:
    """Main's view of the whole job's progress, on main's clock. Pure: times are arguments."""

    def __init__(self, timeout: float, start: float, lead_s: float = LEAD_S) -> None:
        self.timeout = timeout
        self.lead = min(lead_s, timeout / 2)
        self.since = start  # when the current reading first held
        self.signature: tuple[tuple[int, tuple[int, int]], ...] | None = None
        self.episode = 0  # bumped at every change
        self.asked = 0  # the last episode whose stacks were asked for
        self.reported = 0  # the last episode reported

    def see(self, now: float, job: NodeProgress) -> None:
        whole = job.world is not None and job.world > 0 and set(job.ranks) == set(range(job.world))
        signature = tuple(sorted(job.ranks.items())) if whole else None
        if signature is None or signature != self.signature:
            self.signature, self.since = signature, now
            self.episode += 1

    def still(self, now: float) -> float:
        """How long no rank has made progress (0 while the world is not whole)."""
        return 0.0 if self.signature is None else now - self.since

    def ask_due(self, now: float) -> bool:
        """Time to ask every node for its stacks: the timeout is ``lead`` away and this episode was not asked yet."""
        return self.signature is not None and self.asked != self.episode and self.still(now) >= self.timeout - self.lead

    def due(self, now: float) -> bool:
        """The job has stalled and this episode is not reported yet."""
        return self.signature is not None and self.reported != self.episode and self.still(now) >= self.timeout


def stall_line(still_s: float, places: str, then: str) -> str:
    """``nodekit: no rank made progress for 20 s: rank 0 in all_reduce at a.py:5; rank 1 ...; <then>``"""
    return f"nodekit: no rank made progress for {still_s:.0f} s (stall_timeout): {places}; {then}"


def report_head(still_s: float, stop: bool) -> str:
    """The first line of main's report, before the grouped stacks."""
    then = f"stopping every node (exit {EXIT_STALLED})" if stop else 'not stopping it (stall_action = "warn")'
    return (
        f"nodekit: the job stalled: no rank made progress for {still_s:.0f} s (no collective issued, no main thread "
        f"moved); {then}. Where each rank waits:"
    )


@dataclass(frozen=True)
class Notice:
    """What main tells every node about a stall: the one line to print, and whether to stop."""

    episode: int
    line: str
    stop: bool

    def to_json(self) -> str:
        return json.dumps({"episode": self.episode, "line": self.line, "stop": self.stop})

    @classmethod
    def from_json(cls, raw: str | bytes) -> Notice:
        data = json.loads(raw)
        return cls(int(data["episode"]), str(data["line"]), bool(data["stop"]))
