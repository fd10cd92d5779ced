"""The peer watchdog: while torchrun runs, every node shows that it is alive and watches the others, so that a node
that dies or vanishes mid-training ends the job on every other node within NODEKIT_PEER_TIMEOUT, with one line naming
it, instead of a gloo/NCCL error naming at best an address (or, when a host vanished without closing its
connections, nothing at all until the collective timeout, 10 to 30 minutes by default).

The channel is preflight's TCPStore, which node 0 keeps hosting for the whole job. Keys (under ``nodekit/``)::

    hb/<r>     counter that node r bumps every BEAT_S. Counters, not timestamps: a watcher notes on its own clock
               when it first saw each value, so no clock is compared between nodes
    done/<r>   JSON {"code": N, "stopped": bool, "failure": {...}}: node r's torchrun returned with N; ``stopped``:
               its own watchdog stopped it (another node was lost or failed), so it is not the cause; ``failure``:
               the worker its torchrun gave up on (rank, exit code or signal), when it named one
    bye/<r>    node r no longer needs the store; node 0 hosts it until every node said bye or went silent
    gone/<r>   set by main's store when node r's connection ends (its will: ``closed`` or ``cut``); read before
               the done marks, so a node that ended normally (done, then its connection closed) is never taken
               for lost
    alive      main's aggregate of all of the above, one JSON record (:mod:`nodekit.launcher.watchdog.alive`):
               main reads every node's keys in its own process (it hosts the store) and publishes this once per
               beat; a worker writes its own keys and reads only this record, so a beat costs main O(N)
               operations and a node O(1) round trips, not N x (N - 1) and N - 1

and, with the stall watch on, those of :mod:`nodekit.launcher.watchdog.stallio` (every node's progress, main's asks
for stacks and its notice that the job stalled).

The decisions are pure (:mod:`nodekit.launcher.watchdog.decide`: who is lost or failed, when to stop, how to end, the
lines). :class:`Watchdog` runs them in two daemon threads: one does the store calls, one judges.
They are separate because a call to a main that vanished without a FIN can block for many minutes (TCPStore bounds
none of them), and a blocked call must itself count as silence.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping

from nodekit.launcher.preflight.exchange import PREFIX, Clock, Store
from nodekit.launcher.watchdog import alive
from nodekit.launcher.watchdog.alive import ALIVE_KEY, Alive
from nodekit.launcher.watchdog.decide import (
    EXIT_LINK,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_STALLED,
    Alarm,
    Done,
    Ending,
    Halt,
    Lost,
    Reading,
    Watch,
    alarm,
    alarm_line,
    conclude,
    lost_line,
)
from nodekit.launcher.watchdog.failure import WorkerFailure, node_names
from nodekit.launcher.watchdog.stallio import StallConfig, StallIO

__all__ = [
    "EXIT_OK", "EXIT_PEER_LOST", "Alarm", "Done", "Ending", "Lost", "Reading", "StallConfig", "Watch", "Watchdog",
    "alarm", "alarm_line", "conclude", "lost_line", "node_names",
]  # fmt: skip
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


# ---- the threads ------------------------------------------------------------------------------------------------


def _stderr(line: str) -> None:
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


class Watchdog:
    """Beat, watch and judge in two daemon threads from :meth:`start` until :meth:`finish` returns.

    ``stop`` is called once, from the judging thread, when another node is lost or failed (main passes "SIGTERM to
    this process", which torchrun turns into stopping its workers); if :meth:`finish` has not been called
    ``stop_grace_s`` later, ``hard_exit(19)`` ends the process. Only the I/O thread touches the store. With
    ``stall``, the I/O thread also runs the stall watch's round (:class:`StallIO`) while torchrun runs; a notice
    that stops the job raises the alarm like a lost node does, one that only warns is printed.
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
        stall: StallConfig | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self._settle = settle  # work beside the job on this store that must end before this node is done
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
        self._halt: Halt | None = None  # the job stalled, or the link check beside its start refused it
        self._alarm_at = 0.0
        self._own: Done | None = None
        self._outside = 0  # a signal from outside that is stopping this node (set from a signal handler)
        self._leaving = False
        self.broken: str | None = None  # the store error that ended the I/O thread
        self._stall = (
            StallIO(stall, rank, nnodes, self.clock.now(), err=err, wake=self._wake.set) if stall is not None else None
        )
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

    def refuse(self, line: str) -> None:
        """The link check beside the job refused it (a pair that cannot connect): stop this node's job as a stall
        does, printing ``line``; the node then exits 20 (every node gets the same verdict and does the same)."""
        self._halt_with(Halt(line, EXIT_LINK))

    def _halt_with(self, halt: Halt) -> None:
        """Stop this node's job on ``halt`` (the first one found stands: a stall after a refusal is its effect). Held
        here, not in the :class:`Watch` that :meth:`start` renews, so a halt found before the start stands."""
        with self._lock:
            if self._halt is None:
                self._halt = halt
        self._wake.set()

    def stopping(self, signum: int) -> None:
        """A signal from outside is stopping this node (torchrun is ending its workers): publish its done mark now,
        as it will be (128 + the signal), so that the others name this stop before they take the failures it
        causes in their own workers for a crash. Safe in a signal handler: it sets a number and wakes the I/O
        thread."""
        if not self._outside and self._alarm is None:
            self._outside = signum
            self._wake.set()

    def finish(self, code: int, failure: WorkerFailure | None = None, *, signal: int = 0) -> Ending:
        """This node's torchrun returned ``code`` (``failure``: the worker it gave up on; ``signal``: the signal from
        outside that stopped it): publish it, wait until the other nodes are settled (not at all for a worker that
        succeeded), say bye, print the ending's line if any and return the ending. Work beside the job on the same
        store (the link check: ``settle``) ends first, within its own bound."""
        if self._settle is not None:
            self._settle()
        since = self.clock.now()
        with self._lock:
            raised = self._alarm
            signal = signal if raised is None else 0
            stopped = raised is not None
            own = Done(code, stopped=stopped, failure=failure if raised is None else None, signal=signal)
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
            ending = conclude(self.watch, now, own, raised, self.names, self._halt)
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
        sent: Done | None = None
        alive_key, last_seq = _key(ALIVE_KEY), None
        # A worker's faster reads once its job returned cost main one round trip each: at most ~320/s in all.
        settle_s = min(self.beat_s, SETTLE_POLL_S * (1 if me == 0 else max(1.0, self.nnodes / 16)))
        try:
            leave_will = getattr(store, "will", None)  # a worker's connection to main (main's store is local)
            if leave_will is not None:
                leave_will(_key("gone", me))
            while not self._quit.is_set():
                self._wake.clear()  # before reading the flags: a wake-up set after this is not lost
                with self._lock:
                    own, leaving = self._own, self._leaving
                    if own is None and self._outside:
                        own = Done(128 + self._outside, signal=self._outside)
                    unread = [r for r in others if self.watch.peers[r].done is None]
                    byes = [r for r in others if self.watch.peers[r].done is not None and not self.watch.peers[r].bye]
                if own is not None and own != sent:
                    store.set(_key("done", me), own.to_json())
                    sent = own
                beats = int(store.add(_key("hb", me), 1))
                if leaving:
                    store.set(_key("bye", me), "1")
                    break
                if me == 0:
                    reading = self._read_all(store, others, unread, byes)
                else:
                    raw = store.get(alive_key) if last_seq is not None or store.check([alive_key]) else None
                    record = Alive.from_json(raw) if raw is not None else None
                    reading = alive.reading(record, last_seq, self.clock.now(), me)
                    last_seq = record.seq if record is not None else None
                if self._stall is not None:  # before the reading is seen: finish() then knows a stall its peers knew
                    self._stall_round(store, ended=own is not None)
                with self._lock:
                    self.watch.see(reading)
                    published = alive.aggregate(beats, self.watch, beats, own) if me == 0 else None
                if published is not None:  # outside the lock: the judge never waits on a store call
                    store.set(alive_key, published.to_json())
                self._wake.wait(self.beat_s if own is None else settle_s)
        except Exception as e:  # torch's DistNetworkError; the client never reconnects, so this is final
            text = str(e).strip()
            self.broken = text.splitlines()[0] if text else type(e).__name__
            with self._lock:
                self.watch.store_gone = True
        finally:
            self._published.set()

    def _read_all(self, store: Store, others: list[int], unread: list[int], byes: list[int]) -> Reading:
        """Main's round: every node's counter, the wills and done marks of those not done yet, and the byes of
        those done, all from the table in this process (main hosts the store): O(N) calls, no network."""
        counts = {r: int(store.add(_key("hb", r), 0)) for r in others}
        gone = {r: store.get(_key("gone", r)).decode() for r in unread if store.check([_key("gone", r)])}
        done = {r: Done.from_json(store.get(_key("done", r))) for r in unread if store.check([_key("done", r)])}
        bye = frozenset(r for r in byes if store.check([_key("bye", r)]))
        return Reading(at=self.clock.now(), counts=counts, done=done, bye=bye, gone=gone)

    def _stall_round(self, store: Store, *, ended: bool = False) -> None:
        """The stall watch's round (once this node's job has ``ended``, only the notice is read); a fault of its own
        (not the store's) switches it off, never the peer watchdog."""
        assert self._stall is not None
        try:
            notice = self._stall.notice(store) if ended else self._stall.round(store, self.clock.now())
        except (ValueError, KeyError, TypeError, OSError) as e:
            self._stall = None
            self._err(f"nodekit: warning: the stall watch stopped ({type(e).__name__}: {e}); the peer watchdog goes on")
            return
        if notice is None:
            return
        if notice.stop:
            self._halt_with(Halt(notice.line, EXIT_STALLED))
        elif self.rank != 0:  # main printed the whole report
            self._err(notice.line)

    def _judge(self) -> None:
        while not self._quit.wait(self.judge_s):
            line = None
            hard = False
            with self._lock:
                if self._own is not None:
                    return
                now = self.clock.now()
                if self._alarm is None:
                    found = alarm(self.watch, now, self._halt)
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
