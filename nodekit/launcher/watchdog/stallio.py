"""The stall watch's side of the peer watchdog's store traffic: one :meth:`StallIO.round` per heartbeat, made by the
watchdog's I/O thread (the only thread that touches the store). Decisions are :mod:`stall`'s.

Keys (under ``nodekit/``), beside the watchdog's own::

    progress/<n>       JSON NodeProgress: node n's ranks and their (calls, moves); rewritten when it changes
    stall              JSON {"ask": k, "notice": Notice | null}, written by main only: ``ask`` asks every node
                       for its stacks for episode k; ``notice`` tells every node that the job stalled
    stacks/<k>/<n>     node n's answer to ask k: what ``python -m nodekit.launcher.stacks`` prints

Every node publishes its progress and answers asks (a dump takes a signal and a file read per rank, so it runs in a
thread of its own and is published on the next round). Main also reads every node's progress into its
:class:`~nodekit.launcher.watchdog.stall.StallWatch`, asks for stacks shortly before the timeout, and when it falls
due prints the grouped stacks and writes the notice; each node then prints the notice's line, and with
``stop`` the watchdog stops it as it stops a node for a lost peer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from nodekit.launcher.preflight.exchange import PREFIX, Store
from nodekit.launcher.stacks import collect, places
from nodekit.launcher.watchdog.stall import (
    EXIT_STALLED,
    STACKS_WAIT_S,
    NodeProgress,
    Notice,
    StallWatch,
    merge,
    report_head,
    stall_line,
)

PRUNE_EVERY = 60  # rounds between removals of ended processes' files


def _key(*parts: object) -> str:
    return PREFIX + "/".join(str(p) for p in parts)


def local_progress(directory: str) -> NodeProgress:
    """This node's ranks, from their progress records."""
    found = collect.progress(directory)
    worlds = [p.world for p in found.values()]
    return NodeProgress(max(worlds) if worlds else None, {p.rank: (p.calls, p.moves) for p in found.values()})


def local_stacks(directory: str) -> str:
    """This node's processes' stacks, as ``python -m nodekit.launcher.stacks`` prints them."""
    return collect.to_json(collect.dump_all(directory))


@dataclass(frozen=True)
class StallConfig:
    """``timeout`` seconds without progress; ``stop``: end the job (else only report); ``directory``: the hook's.
    ``progress`` and ``stacks`` read this node's ranks (the seams tests replace)."""

    timeout: float
    stop: bool = True
    directory: str = collect.DEFAULT_DIR
    progress: Callable[[str], NodeProgress] = local_progress
    stacks: Callable[[str], str] = local_stacks


class StallIO:
    """One node's part; main (rank 0) also judges. Not thread-safe: only the I/O thread calls :meth:`round`."""

    def __init__(
        self,
        config: StallConfig,
        rank: int,
        nnodes: int,
        start: float,
        *,
        err: Callable[[str], None],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.config, self.rank, self.nnodes = config, rank, nnodes
        self._err, self._wake = err, wake
        self.watch = StallWatch(config.timeout, start) if rank == 0 else None
        self._published = ""
        self._answered = 0
        self._dumping: int | None = None  # the ask being answered
        self._dumped: tuple[int, str] | None = None
        self._seen = 0  # the last notice's episode
        self._stacks: dict[int, str] = {}  # main: the answers to its last ask
        self._rounds = 0

    # -- every node --

    def round(self, store: Store, now: float) -> Notice | None:
        """Publish, answer, and on main judge; a notice that arrived in this round, if any."""
        self._rounds += 1
        if self._rounds % PRUNE_EVERY == 0:
            collect.prune(self.config.directory)
        mine = self.config.progress(self.config.directory)
        raw = mine.to_json()
        if raw != self._published:
            store.set(_key("progress", self.rank), raw)
            self._published = raw
        state = json.loads(store.get(_key("stall"))) if store.check([_key("stall")]) else {}
        self._answer(store, int(state.get("ask") or 0))
        if self.watch is not None:
            self._judge(store, now, mine, state)
        return self._new_notice(state)

    def notice(self, store: Store) -> Notice | None:
        """Only a notice that arrived since the last round: what a node whose job has ended still reads, so that a
        failure the stall's stop caused is named as the stall (its own job can end before it reads the notice)."""
        return self._new_notice(json.loads(store.get(_key("stall"))) if store.check([_key("stall")]) else {})

    def _new_notice(self, state: dict[str, object]) -> Notice | None:
        notice = Notice.from_json(json.dumps(state["notice"])) if state.get("notice") else None
        if notice is None or notice.episode <= self._seen:
            return None
        self._seen = notice.episode
        return notice

    def _answer(self, store: Store, ask: int) -> None:
        done = self._dumped
        if done is not None:
            self._dumped = None
            store.set(_key("stacks", done[0], self.rank), done[1])
            self._answered = max(self._answered, done[0])
        if ask > self._answered and self._dumping is None and self._dumped is None:
            self._dumping = ask
            threading.Thread(target=self._dump_for, args=(ask,), name="nodekit-stacks", daemon=True).start()

    def _dump_for(self, ask: int) -> None:
        try:
            text = self.config.stacks(self.config.directory)
        except Exception as e:  # an unreadable directory: the answer says so, main reports the node without stacks
            text = json.dumps({"format": collect.FORMAT, "processes": [], "error": str(e)})
        self._dumped, self._dumping = (ask, text), None
        self._wake()

    # -- main --

    def _judge(self, store: Store, now: float, mine: NodeProgress, state: dict[str, object]) -> None:
        watch = self.watch
        assert watch is not None
        nodes = {0: mine}
        for r in range(1, self.nnodes):
            if store.check([_key("progress", r)]):
                nodes[r] = NodeProgress.from_json(store.get(_key("progress", r)))
        watch.see(now, merge(nodes))
        if watch.ask_due(now):
            watch.asked = watch.episode
            self._stacks = {}
            self._set(store, state, ask=watch.episode)
        if not watch.due(now):
            return
        ask = watch.asked if watch.asked == watch.episode else None
        if ask is not None:
            for r in range(self.nnodes):
                if r not in self._stacks and store.check([_key("stacks", ask, r)]):
                    self._stacks[r] = store.get(_key("stacks", ask, r)).decode(errors="replace")
        if ask is not None and len(self._stacks) < self.nnodes and now < watch.since + watch.timeout + STACKS_WAIT_S:
            return
        watch.reported = watch.episode
        still = watch.still(now)
        stacks, silent = self._rank_stacks()
        summary = "; ".join([places.summary(stacks), *silent])
        self._err(report_head(still, self.config.stop) + "\n" + places.report(stacks))
        then = f"stopping this node (exit {EXIT_STALLED})" if self.config.stop else 'not stopped (stall_action "warn")'
        notice = Notice(watch.episode, stall_line(still, summary, then), self.config.stop)
        self._set(store, state, notice=json.loads(notice.to_json()))

    def _rank_stacks(self) -> tuple[list[places.RankStack], list[str]]:
        """Every node's answer read into stacks, and a phrase for each node that sent none (or a reader's error)."""
        stacks: list[places.RankStack] = []
        silent = [r for r in range(self.nnodes) if r not in self._stacks]
        problems = [f"node(s) {', '.join(map(str, silent))} sent no stacks"] if silent else []
        for node, raw in sorted(self._stacks.items()):
            try:
                error = json.loads(raw).get("error")
                processes = collect.from_json(raw)
            except (ValueError, TypeError, KeyError, AttributeError):
                error, processes = "an answer in another format", []
            if error:
                problems.append(f"node {node} could not read its stacks ({error})")
            stacks += [places.RankStack.of(p, node) for p in processes]
        return stacks, problems

    def _set(self, store: Store, state: dict[str, object], **changes: object) -> None:
        state.update(changes)
        store.set(_key("stall"), json.dumps(state))
