"""A node whose store connection ends is named lost at once (issue 28): pure decisions on a fake clock, then main's
watchdog against a real store whose worker process is SIGKILLed, as `docker kill` ends a node's container."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from nodekit.launcher.preflight.exchange import Clock
from nodekit.launcher.store.server import host
from nodekit.launcher.watchdog.decide import (
    CLOSED,
    CUT,
    EXIT_PEER_LOST,
    Done,
    Lost,
    Reading,
    Watch,
    alarm,
    conclude,
    lost_line,
)
from nodekit.launcher.watchdog.run import Watchdog

T = 30.0
NAMES = {0: "10.0.0.5, host a", 1: "10.0.0.6, host b", 2: "10.0.0.7, host c"}


def beats(w: Watch, until: int, gone: dict[int, str] | None = None, done: dict[int, Done] | None = None) -> None:
    """A reading a second up to ``until``; nodes in ``gone`` stop beating from their first reading on."""
    for t in range(until + 1):
        w.see(Reading(at=float(t), counts={1: t, 2: t}))
    w.see(Reading(at=until + 0.5, counts={1: until, 2: until}, gone=gone or {}, done=done or {}))


def test_a_node_whose_connection_closed_is_lost_at_once() -> None:
    w = Watch(0, 3, T, start=0.0)
    beats(w, 10, gone={2: CLOSED})
    assert w.lost(10.5) == (Lost(2, 0.5, gone=CLOSED),)
    line = lost_line(w.lost(10.5), NAMES, "stopping this node")
    assert "node 2 (10.0.0.7, host c) lost: store connection closed without a done mark" in line


def test_a_connection_cut_unclearly_is_lost_once_the_heartbeat_agrees() -> None:
    w = Watch(0, 3, T, start=0.0, confirm_s=3.0)
    beats(w, 10, gone={1: CUT})
    assert w.lost(10.5) == ()
    for t in (11, 12, 13):
        w.see(Reading(at=float(t), counts={1: 10, 2: t}))
    assert w.lost(13.0) == (Lost(1, 3.0, gone=CUT),)
    assert "store connection broke and the heartbeat stopped" in lost_line(w.lost(13.0), NAMES, "x")


def test_main_whose_job_failed_as_a_connection_was_cut_waits_for_the_heartbeat_and_names_the_node() -> None:
    """A host killed mid-job: its kernel resets both the job's gloo connection and its store connection (unread data
    makes a reset, read as a cut). Main's workers fail first ("Connection reset by peer"); main then waits for the
    heartbeat to agree before it ends, and names the lost node (19), not its own worker's failure (1). Before, main
    took the cut for settled at once and exited 1 naming no one (CI, a host stopped under Slurm)."""
    w = Watch(0, 3, T, start=0.0, confirm_s=3.0)
    beats(w, 10, gone={1: CUT})
    since = 10.5
    assert not w.settled(10.5, since)
    settled = []
    for t in (11, 12, 13):
        w.see(Reading(at=float(t), counts={1: 10, 2: t}, bye=frozenset({2})))
        settled.append(w.settled(float(t), since))
    assert settled == [False, False, True]
    ending = conclude(w, 13.0, Done(1), None, NAMES)
    assert ending.code == EXIT_PEER_LOST, ending
    assert ending.line is not None and "node 1 (10.0.0.6, host b) lost: store connection broke" in ending.line


def test_a_node_that_ended_normally_is_not_lost_when_its_connection_closes() -> None:
    w = Watch(0, 3, T, start=0.0)
    beats(w, 10, gone={1: CLOSED}, done={1: Done(0)})
    assert w.lost(10.5) == () and alarm(w, 10.5) is None


WORKER = """
import sys, threading
from nodekit.launcher.store.client import Client
from nodekit.launcher.watchdog.run import Watchdog
store = Client.connect("127.0.0.1", int(sys.argv[1]), sys.argv[2], timeout_s=30, connect_s=5)
dog = Watchdog(store, 1, 2, 30.0, {}, stop=lambda: None, beat_s=0.05, judge_s=0.02)
dog.start()
print("beating", flush=True)
threading.Event().wait()
"""


def test_main_names_a_killed_node_at_once_not_a_peer_timeout_later() -> None:
    """Before: main waited the whole peer timeout for a node whose connection the kernel had closed when its
    container was killed (16.4 s with peer_timeout 15). Now its will says so, and main stops within a beat."""
    secret = "d" * 32
    hosted = host(secret, 0, timeout_s=30, host="127.0.0.1")
    lines: list[str] = []
    stopped = threading.Event()
    dog = Watchdog(hosted, 0, 2, T, NAMES, stop=stopped.set, clock=Clock(log=lines.append), err=lines.append,
                   hard_exit=lambda code: None, beat_s=0.05, judge_s=0.02)  # fmt: skip
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(hosted.port), secret], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "beating\n"
        dog.start()
        time.sleep(0.5)
        assert not stopped.is_set(), lines
        killed = time.monotonic()
        os.kill(worker.pid, signal.SIGKILL)
        assert stopped.wait(T), "main waited for the peer timeout"
        took = time.monotonic() - killed
    finally:
        worker.kill()
        worker.wait()
        dog.finish(19)
        hosted.close()
    assert took < 2.0, took
    assert any("node 1 (10.0.0.6, host b) lost: store connection closed" in ln for ln in lines), lines
