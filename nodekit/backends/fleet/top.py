"""``nodekit top``: one sampler session per node (nodekit.backends.fleet.sampler's script), read as it goes.

An ``ssh://`` host runs the script in one long-lived SSH session of the user's own ``ssh`` (its configuration,
keys and known_hosts, as ``nodekit run``; kept alive, so a vanished host ends it within about 30 s); a host on this
machine (``unix://``, or no hosts at all) runs it in a local ``sh``; a ``tcp://`` engine gives its state and last
line only, since its counters are on a machine nodekit cannot read. Each session is a process group of its own:
Ctrl-C (nodekit.system.proc) ends them all, and a session's end (its host lost) shows in its row.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nodekit.backends.fleet import remote, sampler
from nodekit.backends.fleet.targets import Target
from nodekit.system import proc, ssh
from nodekit.system.docker.streams import Drain

UNTIL_STOPPED = proc.Unbounded("nodekit top samples until Ctrl-C, or until its node's session ends")
LOGS_EVERY_S = 5.0
"""How often a node's last line is read (``tail -n 1`` of its log file: with ``sleep``, the only processes a tick
starts; see nodekit.backends.fleet.sampler)."""


def session_argv(t: Target, every: float, logs_every_s: float = LOGS_EVERY_S) -> tuple[list[str], dict[str, str]]:
    """The command line of node ``t``'s sampler and the environment it adds (``DOCKER_HOST`` for a local session
    of a configured engine). Pure."""
    scheme = t.host.scheme if t.host else "unix"
    args = sampler.samplers_args(t.project, every, logs_every_s, counters=scheme != "tcp")
    if t.host is not None and scheme == "ssh":
        remote_cmd = shlex.join(["sh", "-c", sampler.SCRIPT, "nodekit-top", *args])
        h = t.host
        return ssh.command(h.hostname, remote_cmd, port=h.port, user=h.user, connect_timeout=remote.SSH_TIMEOUT_S), {}
    env = {"DOCKER_HOST": t.host.url} if t.host is not None else {}
    return ["sh", "-c", sampler.SCRIPT, "nodekit-top", *args], env


class Session:
    """One node's sampler process and the thread that reads it into its :class:`~sampler.NodeView`."""

    def __init__(self, t: Target, every: float, on_tick: Callable[[], None]) -> None:
        self.target = t
        self.view = sampler.NodeView(rank=t.rank, where=t.where)
        self.lock = threading.Lock()
        self.ticks = 0
        argv, env = session_argv(t, every)
        self.child = proc.start(argv, deadline=UNTIL_STOPPED, what=f"nodekit top's sampler on {t.name}",
                                env=proc.environ(env), stdin="devnull", stdout="pipe", stderr="pipe",
                                group=True)  # fmt: skip
        assert self.child.stderr is not None
        self._stderr = Drain(self.child.stderr)
        self._on_tick = on_tick
        self.thread = threading.Thread(target=self._read, daemon=True, name=f"top-{t.rank}")
        self.thread.start()

    def _read(self) -> None:
        for line in self.child.lines():
            with self.lock:
                ticked = self.view.feed(line)
                if ticked:
                    self.ticks += 1
            if ticked:
                self._on_tick()
        code = self.child.wait()
        with self.lock:
            said = self._stderr.text().strip().splitlines()
            why = said[-1] if said else f"its session ended (exit {code})"
            self.view.problem = why
            self.view.state = "unreachable" if self.ticks == 0 else "lost"
        self._on_tick()

    def row(self) -> sampler.Row:
        with self.lock:
            return sampler.row(self.view)

    def close(self) -> None:
        if self.child.poll() is None:
            self.child.end(2.0)
        self.thread.join(2.0)


class Top:
    """Every node's session; :meth:`rows` is the table as it stands."""

    def __init__(self, targets: Sequence[Target], every: float) -> None:
        self.changed = threading.Event()
        self.sessions = [Session(t, every, self.changed.set) for t in targets]

    def rows(self) -> list[sampler.Row]:
        return sampler.mark_quiet([s.row() for s in self.sessions])

    def wait(self, ticks: int, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Until every node's session has made ``ticks`` ticks or ended, or ``deadline_s`` has passed."""
        end = clock() + deadline_s
        while clock() < end:
            if all(s.ticks >= ticks or s.child.poll() is not None for s in self.sessions):
                return
            self.changed.wait(min(0.5, max(0.0, end - clock())))
            self.changed.clear()

    def close(self) -> None:
        for s in self.sessions:
            s.close()


class Recording:
    """Adds each row's new tick to a live run's record (samples.jsonl), once per tick."""

    def __init__(self, record_dir: Path | None) -> None:
        self.dir = record_dir
        self._seen: dict[int, float] = {}

    def add(self, top: Top, now: float) -> None:
        if self.dir is None:
            return
        from nodekit.runs import store

        fresh: list[dict[str, Any]] = []
        rows = {r.rank: r for r in top.rows()}
        for s in top.sessions:
            with s.lock:
                tick = s.view.ticks[-1].uptime if s.view.ticks else None
            if tick is None or self._seen.get(s.target.rank) == tick or s.target.rank not in rows:
                continue
            self._seen[s.target.rank] = tick
            fresh.append(sampler.sample_of(rows[s.target.rank], now))
        try:
            store.append_samples(self.dir, fresh)
        except OSError:
            self.dir = None  # the record went away (pruned, or the disk): sampling goes on unrecorded
