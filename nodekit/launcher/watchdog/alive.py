"""Main's aggregate of the heartbeats, pure: the one record (``nodekit/alive``) that every worker reads per beat
instead of every other node's counter, so that the watchdog costs main O(N) store operations per beat and each node
O(1) round trips, where reading every peer cost N x (N - 1) and N - 1 sequential round trips per node.

Main (node 0) hosts the store in its own process, so it reads every node's counter, done mark and will there (no
network), feeds its own :class:`Watch` with them, and publishes what it read as one :class:`Alive` record: its
``seq`` (bumped on every publish, so it is main's heartbeat as the workers see it), each node's counter, and the done
marks and wills found. A worker turns the record it read into the same :class:`Reading` that N - 1 reads of the store
would give (:func:`reading`), timed on its own clock, so every decision, line and exit code is the one
:mod:`decide` makes from reading each node itself.

Failure modes, and what each worker concludes:

- **main lost** (its host gone, its launcher killed): the worker's connection breaks or its calls hang, and after
  ``peer_timeout`` without a completed call it names main lost ("main's store unreachable"), as before;
- **main's I/O thread stalled** (it beats, aggregates and publishes, so all stop together): the store still
  answers but ``seq`` stands still; a record whose ``seq`` did not move is *stale*: it counts as a beat read for
  main only, so main is named lost ("no heartbeat") after ``peer_timeout`` and no other node's silence grows on a
  record main did not refresh;
- **a worker's own connection stalling**: its calls hang; its heartbeat stops in main's table, main and every
  worker name it lost after ``peer_timeout``; it names main lost itself (the store is silent for it);
- **a node done, not lost**: its done mark is in the record (read after its will, as before), and a node with a
  done mark is never lost;
- **a restart**: torchrun's agent keeps beating while it restarts workers; a new ``nodekit run`` attempt is a new
  store (a fresh run id), so no record outlives its attempt.

A lost node is named ``peer_timeout`` after the worker first read its last counter: the aggregate adds up to one
beat (main's publish) to the one beat (the worker's read) there was before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodekit.launcher.watchdog.decide import Done, Reading, Watch

ALIVE_KEY = "alive"  # under the watchdog's prefix: nodekit/alive


@dataclass(frozen=True)
class Alive:
    """Main's record: its publish counter, each node's heartbeat counter (None: not read yet), and the done marks
    and wills (``closed`` or ``cut``) it found."""

    seq: int
    counts: tuple[int | None, ...]
    done: Mapping[int, Done] = field(default_factory=dict)
    gone: Mapping[int, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "seq": self.seq,
                "hb": list(self.counts),
                "done": {str(r): json.loads(d.to_json()) for r, d in sorted(self.done.items())},
                "gone": {str(r): how for r, how in sorted(self.gone.items())},
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> Alive:
        data = json.loads(raw)
        return cls(
            seq=int(data["seq"]),
            counts=tuple(None if c is None else int(c) for c in data["hb"]),
            done={int(r): Done.from_json(json.dumps(d)) for r, d in data.get("done", {}).items()},
            gone={int(r): str(how) for r, how in data.get("gone", {}).items()},
        )


def aggregate(seq: int, watch: Watch, own_count: int, own_done: Done | None) -> Alive:
    """Main's record from its own :class:`Watch` (fed from the table) after round ``seq``: every node's counter as
    main last read it, every done mark and will it knows, its own included."""
    counts: list[int | None] = [None] * (len(watch.peers) + 1)
    counts[watch.rank] = own_count
    done = {r: p.done for r, p in watch.peers.items() if p.done is not None}
    if own_done is not None:
        done[watch.rank] = own_done
    for r, peer in watch.peers.items():
        counts[r] = peer.count
    gone = {r: p.gone for r, p in watch.peers.items() if p.gone}
    return Alive(seq=seq, counts=tuple(counts), done=done, gone=gone)


def reading(record: Alive | None, last_seq: int | None, at: float, rank: int) -> Reading:
    """What worker ``rank`` learns at ``at`` (its own clock) from the record it read (None: main has published none
    yet). Main's counter is ``seq``; the others' counters, done marks and wills count only when ``seq`` moved since
    the record read before (``last_seq``): a stale record says nothing about them (see the module docstring)."""
    if record is None:
        return Reading(at=at, counts={0: 0})
    if record.seq == last_seq:
        return Reading(at=at, counts={0: record.seq})
    counts = {r: c for r, c in enumerate(record.counts) if c is not None and r not in (0, rank)}
    return Reading(
        at=at,
        counts={0: record.seq, **counts},
        done={r: d for r, d in record.done.items() if r != rank},
        gone={r: how for r, how in record.gone.items() if r != rank},
    )
