"""The peer watchdog: while torchrun runs, every node shows that it is alive and watches the others, so that a node
that dies or vanishes mid-training ends the job on every other node within NODEKIT_PEER_TIMEOUT, with one line naming
it, instead of a gloo/NCCL error naming at best an address (or, when a host vanished without closing its
connections, nothing at all until the collective timeout, 10 to 30 minutes by default).

The channel is preflight's TCPStore, which node 0 keeps hosting for the whole job. Keys (under ``nodekit/``)::

    hb/<r>     counter that node r bumps every BEAT_S. Counters, not timestamps: a watcher notes on its own clock
               when it first saw each value, so no clock is compared between nodes
    done/<r>   JSON {"code": N, "stopped": bool}: node r's torchrun returned with N; ``stopped``: its own watchdog
               stopped it (another node was lost or failed), so it is not the cause
    bye/<r>    node r no longer needs the store; node 0 hosts it until every node said bye or went silent

A node is *lost* when it has not marked itself done and its counter has not moved for the peer timeout, measured
over successful reads; a worker that cannot complete a store call for that long has lost main (node 0) itself.
A node that marked itself done with a non-zero code and not ``stopped`` has *failed*.

The decisions are pure (:class:`Watch`, :func:`alarm`, :func:`conclude` and the line renderers: observations and
times in, decisions out). :class:`Watchdog` runs them in two daemon threads: one does the store calls, one judges.
They are separate because a call to a main that vanished without a FIN can block for many minutes (TCPStore bounds
none of them), and a blocked call must itself count as silence.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nodekit.launcher.facts import NodeFacts
from nodekit.launcher.preflight import PREFIX, Clock, Store

EXIT_OK = 0
EXIT_PEER_LOST = 19
BEAT_S = 1.0
JUDGE_S = 0.25
# Once this node's torchrun returned, its I/O thread reads the others this often instead of every BEAT_S: main
# lingers until every node said bye, and a bye read one beat late was most of the job's teardown (0.5 s median).
SETTLE_POLL_S = 0.05
# torchrun gives its workers 30 s (its shutdown timeout) between SIGTERM and SIGKILL; a torchrun still not back
# well after that is stuck where a signal cannot reach it (a C++ rendezvous wait), and the watchdog ends the process.
STOP_GRACE_S = 60.0
# How long node 0 keeps the store up, past the peer timeout, for nodes that are still stopping their own workers
# (torchrun's 30 s) before they can say bye.
HOST_MARGIN_S = 45.0
# Past the peer timeout, a worker's wait for the others to settle: every case resolves within the timeout plus a
# beat or two; this only bounds the unforeseen.
WORKER_MARGIN_S = 10.0
# How long the main thread waits for the I/O thread to publish this node's last keys.
PUBLISH_WAIT_S = 5.0


def _key(*parts: object) -> str:
    return PREFIX + "/".join(str(p) for p in parts)


# ---- observations and decisions (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """How a node's torchrun ended, as it published it."""

    code: int
    stopped: bool = False

    @property
    def failed(self) -> bool:
        """It failed on its own: a non-zero code that its watchdog did not cause."""
        return self.code != 0 and not self.stopped

    def to_json(self) -> str:
        return json.dumps({"code": self.code, "stopped": self.stopped}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Done:
        data = json.loads(raw)
        return cls(code=int(data["code"]), stopped=bool(data.get("stopped", False)))


@dataclass(frozen=True)
class Reading:
    """One round of store reads: each watched node's counter, and the done and bye marks found."""

    at: float
    counts: Mapping[int, int]
    done: Mapping[int, Done] = field(default_factory=dict)
    bye: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Lost:
    """Node ``rank`` has been silent for ``silent_s``; ``store``: it is main and its store stopped answering."""

    rank: int
    silent_s: float
    store: bool = False


@dataclass(frozen=True)
class Alarm:
    """Why a node stops its own job: nodes lost, else nodes that failed."""

    lost: tuple[Lost, ...] = ()
    failed: tuple[tuple[int, Done], ...] = ()


@dataclass(frozen=True)
class Ending:
    """What the launcher exits with after its torchrun returned, and the line to print (None: nothing to add)."""

    code: int
    line: str | None = None


@dataclass
class _Peer:
    count: int | None
    changed: float  # when the current count was first read (watch start before any read)
    moves: tuple[float, ...] = ()  # read times of the last two changes
    done: Done | None = None
    bye: bool = False


class Watch:
    """What node ``rank`` knows of the others, from readings timed on its own clock. Pure: times are arguments."""

    def __init__(self, rank: int, nnodes: int, timeout: float, start: float) -> None:
        self.rank = rank
        self.timeout = timeout
        self.last_ok = start  # when a round of store calls last completed
        self.store_gone = False  # a store call failed: the connection is closed for good (TCPStore never reconnects)
        self.peers = {r: _Peer(count=None, changed=start) for r in range(nnodes) if r != rank}

    def see(self, reading: Reading) -> None:
        self.last_ok = max(self.last_ok, reading.at)
        for rank, count in reading.counts.items():
            peer = self.peers.get(rank)
            if peer is not None and count != peer.count:
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

    def store_silence(self, now: float) -> float:
        return now - self.last_ok

    def silence(self, rank: int) -> float:
        """How long ``rank``'s counter has stood still, over reads that succeeded."""
        return self.last_ok - self.peers[rank].changed

    def lost(self, now: float) -> tuple[Lost, ...]:
        """Nodes not done whose counter stood still for the timeout; for a worker, main when the store stopped
        answering for the timeout (then the others cannot be judged: only what was already known is added)."""
        out = []
        for rank, peer in sorted(self.peers.items()):
            if peer.done is not None:
                continue
            if rank == 0 and self.store_silence(now) >= self.timeout:
                out.append(Lost(0, self.store_silence(now), store=True))
            elif self.silence(rank) >= self.timeout:
                out.append(Lost(rank, self.silence(rank)))
        return tuple(out)

    def failed(self) -> tuple[tuple[int, Done], ...]:
        return tuple((r, p.done) for r, p in sorted(self.peers.items()) if p.done is not None and p.done.failed)

    def alive_since(self, rank: int, since: float) -> bool:
        """``rank`` beat after ``since``: two changes read after it (the first can be a beat sent before)."""
        moves = self.peers[rank].moves
        return len(moves) == 2 and moves[0] > since

    def settled(self, now: float, since: float) -> bool:
        """For a node whose torchrun returned at ``since``: whether it knows how every other node stands, i.e.
        each is done, lost, or has beaten since (alive: it will see this node's done mark and act on it).

        Node 0 also hosts the store: it is settled when every other node said bye or went silent."""
        lost = {x.rank for x in self.lost(now)}
        if self.rank == 0:
            if self.store_gone:
                return True  # its own store failing (never seen): nobody can read or write anything anyway
            return all(peer.bye or self.silence(rank) >= self.timeout for rank, peer in self.peers.items())
        if 0 in lost or (self.store_gone and self.peers[0].done is not None):
            return True  # nothing more can be learned without the store
        return all(
            peer.done is not None or rank in lost or self.alive_since(rank, since) for rank, peer in self.peers.items()
        )


def alarm(watch: Watch, now: float) -> Alarm | None:
    """While this node's torchrun runs: stop it when another node is lost or has failed, else None."""
    lost, failed = watch.lost(now), watch.failed()
    return Alarm(lost=lost, failed=failed) if lost or failed else None


def conclude(watch: Watch, now: float, own: Done, raised: Alarm | None, names: Mapping[int, str]) -> Ending:
    """After this node's torchrun returned with ``own.code`` (and its lingering, if any): the exit code and the line.

    A lost node is the cause worth naming: exit 19 whenever one is found after this node's own job failed (gloo
    usually ends the others first, "Connection closed by peer", before the heartbeat says who). A node that
    succeeded still exits 0: every node had passed torchrun's exit barrier.
    """
    lost = tuple(x for x in watch.lost(now) if raised is None or x.rank not in {y.rank for y in raised.lost})
    if raised is not None:
        code = EXIT_OK if own.code == 0 else EXIT_PEER_LOST
        return Ending(code, lost_line(lost, names, f"this node had stopped (exit {code})") if lost else None)
    if not lost:
        return Ending(own.code)
    if own.code == 0:
        return Ending(EXIT_OK, lost_line(lost, names, "after this node's job had succeeded"))
    return Ending(EXIT_PEER_LOST, lost_line(lost, names, f"this node's job had ended with exit code {own.code}"))


def node_names(facts: tuple[NodeFacts, ...]) -> dict[int, str]:
    """``{rank: "172.31.250.12, host h2"}`` from the facts every node published in preflight."""
    return {f.rank: f"{f.address or '?'}, host {f.hostname or '?'}" for f in facts}


def _who(ranks: list[int], names: Mapping[int, str]) -> str:
    each = [f"{r} ({names.get(r, '?')})" for r in ranks]
    if len(each) == 1:
        return f"node {each[0]}"
    return f"nodes {', '.join(each[:-1])} and {each[-1]}"


def lost_line(lost: tuple[Lost, ...], names: Mapping[int, str], then: str) -> str:
    """``nodekit: node 2 (172.31.250.12, host h2) lost: no heartbeat for 15 s; <then>``"""
    main = [x for x in lost if x.store]
    silent = [x for x in lost if not x.store]
    parts = []
    if main:
        parts.append(f"{_who([0], names)} lost: main's store unreachable for {main[0].silent_s:.0f} s")
    if silent:
        parts.append(
            f"{_who([x.rank for x in silent], names)} lost: no heartbeat for {min(x.silent_s for x in silent):.0f} s"
        )
    return f"nodekit: {'; '.join(parts)}; {then}"


def alarm_line(found: Alarm, names: Mapping[int, str]) -> str:
    """The one line a node prints when its watchdog stops it."""
    if found.lost:
        return lost_line(found.lost, names, "stopping this node")
    ranks = [r for r, _ in found.failed]
    codes = ", ".join(str(d.code) for _, d in found.failed)
    exit_code = f"exit code {codes}" if len(ranks) == 1 else f"exit codes {codes}"
    return f"nodekit: {_who(ranks, names)} failed with {exit_code}; stopping this node"


# ---- the threads ------------------------------------------------------------------------------------------------


def _stderr(line: str) -> None:
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


class Watchdog:
    """Beat, watch and judge in two daemon threads from :meth:`start` until :meth:`finish` returns.

    ``stop`` is called once, from the judging thread, when another node is lost or failed (main passes "SIGTERM to
    this process", which torchrun turns into stopping its workers); if :meth:`finish` has not been called
    ``stop_grace_s`` later, ``hard_exit(19)`` ends the process. Only the I/O thread touches the store.
    """

    def __init__(
        self,
        store: Store,
        rank: int,
        nnodes: int,
        timeout: float,
        names: Mapping[int, str],
        *,
        stop: Callable[[], None],
        clock: Clock | None = None,
        err: Callable[[str], None] = _stderr,
        hard_exit: Callable[[int], None] = os._exit,
        beat_s: float = BEAT_S,
        judge_s: float = JUDGE_S,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.store = store
        self.rank, self.nnodes, self.timeout = rank, nnodes, timeout
        self.names = dict(names)
        self.clock = clock or Clock()
        self._stop, self._err, self._hard_exit = stop, err, hard_exit
        self.beat_s, self.judge_s, self.stop_grace_s = beat_s, judge_s, stop_grace_s
        self.watch = Watch(rank, nnodes, timeout, self.clock.now())
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._quit = threading.Event()
        self._published = threading.Event()  # this node's last keys are written (or cannot be)
        self._alarm: Alarm | None = None
        self._alarm_at = 0.0
        self._own: Done | None = None
        self._leaving = False
        self.broken: str | None = None  # the store error that ended the I/O thread
        self._threads = [
            threading.Thread(target=self._io, name="nodekit-heartbeat", daemon=True),
            threading.Thread(target=self._judge, name="nodekit-watchdog", daemon=True),
        ]

    @property
    def alarm(self) -> Alarm | None:
        with self._lock:
            return self._alarm

    def start(self) -> None:
        with self._lock:
            self.watch = Watch(self.rank, self.nnodes, self.timeout, self.clock.now())
        for t in self._threads:
            t.start()

    def finish(self, code: int) -> Ending:
        """This node's torchrun returned ``code``: publish it, wait until the other nodes are settled (not at all
        for a worker that succeeded), say bye, print the ending's line if any and return the ending."""
        since = self.clock.now()
        with self._lock:
            raised = self._alarm
            own = Done(code, stopped=raised is not None)
            self._own = own
        self._wake.set()
        margin = HOST_MARGIN_S if self.rank == 0 else WORKER_MARGIN_S
        deadline = since + self.timeout + margin
        linger = self.rank == 0 or code != 0 or raised is not None
        while linger:
            now = self.clock.now()
            with self._lock:
                if self.watch.settled(now, since) or now >= deadline:
                    break
            self.clock.sleep(min(0.1, self.judge_s))
        with self._lock:
            now = self.clock.now()
            ending = conclude(self.watch, now, own, raised, self.names)
            unreachable = self.rank != 0 and self.watch.store_silence(now) >= self.timeout
            self._leaving = True
        self._wake.set()
        self._published.wait(0 if unreachable else PUBLISH_WAIT_S)  # a call to a vanished main may never return
        self._quit.set()
        self._wake.set()
        if ending.line:
            self._err(ending.line)
        return ending

    # -- threads --

    def _io(self) -> None:
        store, me = self.store, self.rank
        others = sorted(r for r in range(self.nnodes) if r != me)
        done_sent = False
        try:
            while not self._quit.is_set():
                self._wake.clear()  # before reading the flags: a wake-up set after this is not lost
                with self._lock:
                    own, leaving = self._own, self._leaving
                    unread = [r for r in others if self.watch.peers[r].done is None]
                    byes = [r for r in others if self.watch.peers[r].done is not None and not self.watch.peers[r].bye]
                if own is not None and not done_sent:
                    store.set(_key("done", me), own.to_json())
                    done_sent = True
                store.add(_key("hb", me), 1)
                if leaving:
                    store.set(_key("bye", me), "1")
                    break
                counts = {r: int(store.add(_key("hb", r), 0)) for r in others}
                done = {r: Done.from_json(store.get(_key("done", r))) for r in unread if store.check([_key("done", r)])}
                bye = frozenset(r for r in byes if me == 0 and store.check([_key("bye", r)]))
                reading = Reading(at=self.clock.now(), counts=counts, done=done, bye=bye)
                with self._lock:
                    self.watch.see(reading)
                self._wake.wait(self.beat_s if own is None else min(self.beat_s, SETTLE_POLL_S))
        except Exception as e:  # torch's DistNetworkError; the client never reconnects, so this is final
            text = str(e).strip()
            self.broken = text.splitlines()[0] if text else type(e).__name__
            with self._lock:
                self.watch.store_gone = True
        finally:
            self._published.set()

    def _judge(self) -> None:
        while not self._quit.wait(self.judge_s):
            line = None
            hard = False
            with self._lock:
                if self._own is not None:
                    return
                now = self.clock.now()
                if self._alarm is None:
                    found = alarm(self.watch, now)
                    if found is not None:
                        self._alarm, self._alarm_at = found, now
                        line = alarm_line(found, self.names)
                elif now - self._alarm_at >= self.stop_grace_s:
                    hard = True
            if line is not None:
                self._err(line)
                self._stop()
            if hard:
                self._err(
                    f"nodekit: torchrun did not stop within {self.stop_grace_s:g} s of the watchdog's SIGTERM; "
                    f"exiting (exit {EXIT_PEER_LOST})"
                )
                self._hard_exit(EXIT_PEER_LOST)
                return
