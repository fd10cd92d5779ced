"""The peer watchdog's decisions, pure: what a node knows of the others (:class:`Watch`, fed with :class:`Reading`
rounds timed on its own clock), whether to stop its job (:func:`alarm`), how it ends once its torchrun returned
(:func:`conclude`), and the lines it prints. Observations and times in, decisions out; :mod:`watchdog` runs them.

A node is *lost* when it has not marked itself done and its counter has not moved for the peer timeout, measured
over successful reads that carried its counter (a worker's reading of a record main did not refresh carries main's
only, :mod:`alive`); a worker that cannot complete a store call for that long has lost main (node 0) itself. A
node whose store connection ended without a done mark is lost sooner: at once when it closed between calls (its
launcher's process is gone: a killed container), and once its counter has also stood still for :data:`CONFIRM_S`
when the end was less clear (a reset, a close mid-frame), since a node beats through that one connection only.
A node that marked itself done with a non-zero code and not ``stopped`` has *failed*, unless a signal from outside
stopped it (``docker stop``, ``docker kill -s HUP|INT|TERM``, an administrator): then it was *stopped by that
signal*, which the others name as such, before any failure its stop caused (theirs included). A node whose torchrun
is restarting workers (max_restarts) is none of these: its launcher, torchrun's agent, keeps beating throughout.
A job that main's stall watch found stalled (:mod:`stall`), or that the link check beside its start refused, stops
every node too (a :class:`Halt`: the line printed then, the code exited with), after lost, stopped and failed nodes:
a lost node explains a stall, not the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodekit.launcher.contract import EXIT_LINK as EXIT_LINK
from nodekit.launcher.contract import EXIT_OK as EXIT_OK
from nodekit.launcher.contract import EXIT_PEER_LOST as EXIT_PEER_LOST
from nodekit.launcher.contract import EXIT_STALLED as EXIT_STALLED
from nodekit.launcher.watchdog.failure import (
    WorkerFailure,
    failed_line,
    first_failed,
    node_failed,
    signal_name,
    who,
)


@dataclass(frozen=True)
class Done:
    """How a node's torchrun ended, as it published it."""

    code: int
    stopped: bool = False
    failure: WorkerFailure | None = None  # the worker torchrun gave up on, when it named one
    signal: int = 0  # the signal from outside that stopped it (its code is then 128 + it); 0: none

    @property
    def failed(self) -> bool:
        """It failed on its own: a non-zero code that neither its watchdog nor a signal from outside caused."""
        return self.code != 0 and not self.stopped and not self.signal

    def to_json(self) -> str:
        data: dict[str, object] = {"code": self.code, "stopped": self.stopped}
        if self.failure is not None:
            data["failure"] = self.failure.to_json_dict()
        if self.signal:
            data["signal"] = self.signal
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Done:
        data = json.loads(raw)
        failure = data.get("failure")
        return cls(
            code=int(data["code"]),
            stopped=bool(data.get("stopped", False)),
            failure=WorkerFailure.from_json_dict(failure) if isinstance(failure, dict) else None,
            signal=int(data.get("signal", 0)),
        )


CONFIRM_S = 3.0
"""A node whose store connection ended unclearly is lost once its counter has stood still this long (three beats)."""
CLOSED, CUT = "closed", "cut"


@dataclass(frozen=True)
class Reading:
    """One round of store reads: each watched node's counter, the done and bye marks found, and how the store
    connection of a node ended when it did (:data:`CLOSED` or :data:`CUT`, main's will for it)."""

    at: float
    counts: Mapping[int, int]
    done: Mapping[int, Done] = field(default_factory=dict)
    bye: frozenset[int] = frozenset()
    gone: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Lost:
    """Node ``rank`` has been silent for ``silent_s``; ``store``: it is main and its store stopped answering;
    ``gone``: how its store connection ended (empty: it did not, as far as is known)."""

    rank: int
    silent_s: float
    store: bool = False
    gone: str = ""


@dataclass(frozen=True)
class Halt:
    """A finding about the whole job that stops it on every node, each finding it alike: the job stalled (main's
    stall watch, exit 22), or the link check beside its start refused it (exit 20). ``line`` is printed when the node
    stops its job; ``code`` is the exit code when the job then fails (0 when it had succeeded anyway)."""

    line: str
    code: int


@dataclass(frozen=True)
class Alarm:
    """Why a node stops its own job: nodes lost, else nodes a signal stopped, else nodes that failed, else a
    :class:`Halt`."""

    lost: tuple[Lost, ...] = ()
    failed: tuple[tuple[int, Done], ...] = ()
    signalled: tuple[tuple[int, Done], ...] = ()
    halt: Halt | None = None

    @property
    def peers(self) -> bool:
        """The alarm is about other nodes (lost, stopped, failed), not only a halt."""
        return bool(self.lost or self.failed or self.signalled)


@dataclass(frozen=True)
class Ending:
    """What the launcher exits with after its torchrun returned, and the line to print (None: nothing to add)."""

    code: int
    line: str | None = None


@dataclass
class _Peer:
    count: int | None
    changed: float  # when the current count was first read (watch start before any read)
    seen: float  # when a reading last carried its count (watch start before any read)
    moves: tuple[float, ...] = ()  # read times of the last two changes
    done: Done | None = None
    bye: bool = False
    gone: str = ""


class Watch:
    """What node ``rank`` knows of the others, from readings timed on its own clock. Pure: times are arguments."""

    def __init__(self, rank: int, nnodes: int, timeout: float, start: float, confirm_s: float = CONFIRM_S) -> None:
        self.rank = rank
        self.timeout = timeout
        self.confirm_s = min(confirm_s, timeout)
        self.last_ok = start  # when a round of store calls last completed
        self.store_gone = False  # a store call failed: the connection is closed for good (TCPStore never reconnects)
        self.peers = {r: _Peer(count=None, changed=start, seen=start) for r in range(nnodes) if r != rank}

    def see(self, reading: Reading) -> None:
        self.last_ok = max(self.last_ok, reading.at)
        for rank, count in reading.counts.items():
            peer = self.peers.get(rank)
            if peer is None:
                continue
            peer.seen = max(peer.seen, reading.at)
            if count != peer.count:
                first = peer.count is None
                peer.count, peer.changed = count, reading.at
                if not first:
                    peer.moves = (*peer.moves, reading.at)[-2:]
        for rank, done in reading.done.items():
            if rank in self.peers:
                self.peers[rank].done = done
        for rank in reading.bye:
            if rank in self.peers:
                self.peers[rank].bye = True
        for rank, how in reading.gone.items():
            if rank in self.peers:
                self.peers[rank].gone = how

    def store_silence(self, now: float) -> float:
        return now - self.last_ok

    def silence(self, rank: int) -> float:
        """How long ``rank``'s counter has stood still, over reads that succeeded and carried it."""
        peer = self.peers[rank]
        return peer.seen - peer.changed

    def lost(self, now: float) -> tuple[Lost, ...]:
        """Nodes not done whose counter stood still for the timeout; for a worker, main when the store stopped
        answering for the timeout (then the others cannot be judged: only what was already known is added)."""
        out = []
        for rank, peer in sorted(self.peers.items()):
            if peer.done is not None:
                continue
            if rank == 0 and self.store_silence(now) >= self.timeout:
                out.append(Lost(0, self.store_silence(now), store=True))
            elif self._lost(rank, peer):
                out.append(Lost(rank, self.silence(rank), gone=peer.gone))
        return tuple(out)

    def _lost(self, rank: int, peer: _Peer) -> bool:
        """Silent for the timeout; or its connection closed (it ended); or cut, and silent for ``confirm_s``."""
        silent = self.silence(rank)
        return silent >= self.timeout or peer.gone == CLOSED or (bool(peer.gone) and silent >= self.confirm_s)

    def failed(self) -> tuple[tuple[int, Done], ...]:
        return tuple((r, p.done) for r, p in sorted(self.peers.items()) if p.done is not None and p.done.failed)

    def signalled(self) -> tuple[tuple[int, Done], ...]:
        """The nodes a signal from outside stopped."""
        return tuple((r, p.done) for r, p in sorted(self.peers.items()) if p.done is not None and p.done.signal)

    def alive_since(self, rank: int, since: float) -> bool:
        """``rank`` beat after ``since``: two changes read after it (the first can be a beat sent before)."""
        moves = self.peers[rank].moves
        return len(moves) == 2 and moves[0] > since

    def settled(self, now: float, since: float) -> bool:
        """For a node whose torchrun returned at ``since``: whether it knows how every other node stands, i.e.
        each is done, lost, or has beaten since (alive: it will see this node's done mark and act on it).

        Node 0 also hosts the store: it is settled when every other node said bye, was lost, went silent, or ended
        (its done mark, then its connection closed)."""
        lost = {x.rank for x in self.lost(now)}
        if self.rank == 0:
            if self.store_gone:
                return True  # its own store failing (never seen): nobody can read or write anything anyway
            # A node whose connection ended cannot say bye any more; one that had not marked itself done is waited
            # for until it is lost (a cut connection needs the heartbeat to agree): else the ending names no one.
            return all(
                peer.bye
                or rank in lost
                or self.silence(rank) >= self.timeout
                or (bool(peer.gone) and peer.done is not None)
                for rank, peer in self.peers.items()
            )
        if 0 in lost or (self.store_gone and self.peers[0].done is not None):
            return True  # nothing more can be learned without the store
        return all(
            peer.done is not None or rank in lost or self.alive_since(rank, since) for rank, peer in self.peers.items()
        )


def alarm(watch: Watch, now: float, halt: Halt | None = None) -> Alarm | None:
    """While this node's torchrun runs: stop it when another node is lost, was stopped or has failed, or on
    ``halt`` (the job stalled, or the link check refused it); else None."""
    lost, failed, signalled = watch.lost(now), watch.failed(), watch.signalled()
    if lost or failed or signalled:
        return Alarm(lost=lost, failed=failed, signalled=signalled)
    return Alarm(halt=halt) if halt is not None else None


def conclude(
    watch: Watch, now: float, own: Done, raised: Alarm | None, names: Mapping[int, str], halt: Halt | None = None
) -> Ending:
    """After this node's torchrun returned with ``own.code`` (and its lingering, if any): the exit code and the line.

    A lost node is the cause worth naming: exit 19 whenever one is found after this node's own job failed (gloo
    usually ends the others first, "Connection closed by peer", before the heartbeat says who). A node that
    succeeded still exits 0: every node had passed torchrun's exit barrier. A job that failed with no node lost
    names every node whose torchrun failed, the first failure first (:func:`failure.first_failed`); this node exits
    19 when that first failure was another node's, else with its own code. A node stopped on a :class:`Halt` exits
    with its code, 22 for a stall and 20 for a refused link check (its line was printed when it stopped). A node
    whose job failed before it acted on a ``halt`` it then learned of (main stopped its own job on a stall, and this
    node's workers failed in their collective first) exits as that halt says, with its line, unless a node was lost.
    """
    lost = tuple(x for x in watch.lost(now) if raised is None or x.rank not in {y.rank for y in raised.lost})
    if own.signal:  # this node was stopped from outside: its own line was printed when the signal came
        return Ending(own.code)
    if raised is None and halt is not None and own.code != 0 and not lost:
        return Ending(halt.code, halt.line)
    if raised is not None and raised.halt is not None and not raised.peers:
        return Ending(EXIT_OK if own.code == 0 else raised.halt.code)
    if raised is not None:
        code = EXIT_OK if own.code == 0 else EXIT_PEER_LOST
        return Ending(code, lost_line(lost, names, f"this node had stopped (exit {code})") if lost else None)
    stopped = watch.signalled()
    if not lost and stopped and own.code != 0:
        return Ending(EXIT_PEER_LOST, stopped_line(stopped, names, f"this node exits {EXIT_PEER_LOST}"))
    if not lost:
        peers = watch.failed()
        if own.code == 0 or (own.failure is None and not peers):
            return Ending(own.code)
        failed = [(watch.rank, own.code, own.failure), *((r, d.code, d.failure) for r, d in peers)]
        first = first_failed([(r, f) for r, _, f in failed])[0][0]
        code = own.code if first == watch.rank else EXIT_PEER_LOST
        return Ending(code, failed_line(failed, names, f"the job failed (this node exits {code})"))
    if own.code == 0:
        return Ending(EXIT_OK, lost_line(lost, names, "after this node's job had succeeded"))
    return Ending(EXIT_PEER_LOST, lost_line(lost, names, f"this node's job had ended with exit code {own.code}"))


def lost_line(lost: tuple[Lost, ...], names: Mapping[int, str], then: str) -> str:
    """``nodekit: node 2 (172.31.250.12, host h2) lost: no heartbeat for 15 s; <then>``"""
    main = [x for x in lost if x.store]
    closed = [x for x in lost if not x.store and x.gone]
    silent = [x for x in lost if not x.store and not x.gone]
    parts = []
    if main:
        parts.append(f"{who([0], names)} lost: main's store unreachable for {main[0].silent_s:.0f} s")
    if closed:
        how = (
            "store connection closed without a done mark (the launcher ended: its container killed or stopped)"
            if all(x.gone == CLOSED for x in closed)
            else "store connection broke and the heartbeat stopped"
        )
        parts.append(f"{who([x.rank for x in closed], names)} lost: {how}")
    if silent:
        parts.append(
            f"{who([x.rank for x in silent], names)} lost: no heartbeat for {min(x.silent_s for x in silent):.0f} s"
        )
    return f"nodekit: {'; '.join(parts)}; {then}"


SIGNAL_FROM = "a signal to its container: nodekit down, docker stop, docker kill or an administrator"


def stopped_line(stopped: tuple[tuple[int, Done], ...], names: Mapping[int, str], then: str) -> str:
    """``nodekit: node 1 (10.0.0.6, host b) was stopped by SIGHUP (a signal to its container: ...); <then>``"""
    parts = [f"{who([r], names)} was stopped by {signal_name(d.signal)}" for r, d in stopped]
    return f"nodekit: {'; '.join(parts)} ({SIGNAL_FROM}); {then}"


def alarm_line(found: Alarm, names: Mapping[int, str]) -> str:
    """The one line a node prints when its watchdog stops it."""
    if found.halt is not None and not found.peers:
        return found.halt.line
    if found.lost:
        return lost_line(found.lost, names, "stopping this node")
    if found.signalled:
        return stopped_line(found.signalled, names, "stopping this node")
    if len(found.failed) == 1:
        rank, done = found.failed[0]
        return f"nodekit: {node_failed(rank, done.code, done.failure, names)}; stopping this node"
    return failed_line([(r, d.code, d.failure) for r, d in found.failed], names, "stopping this node")
