"""A dataset through a relay tree: the head sends each content once, whatever the number of hosts that lack it.

The head scans every host and plans each one as for a direct push (:mod:`nodekit.data.plan`). The hosts of one
source that lack contents (over ``ssh://``, one path each) then form one relay tree (:mod:`nodekit.ship.tree`, the
one images take: each node feeds at most two, hop keys that run only the relay step, nothing left on a node). The
head sends ONE stream down it: the union of the contents any of them lacks, smallest first, framed as the receiver
reads them (:mod:`nodekit.launcher.datasync.receive`). Each node's relay step tees it on and into that node's own
receiver, whose code and plan the head wrote into the node's relay directory over its own connection at setup
(:class:`~nodekit.ship.access.TreeAccess` ``given``): the stream chooses nothing, and a content a node does not need
is in its plan's ``passing`` and read past. A node that holds a content under another name copies it there, as in a
direct push.

The tree's word is taken for nothing: afterwards the head scans every host of the tree again and plans it again; a
host that is not the source's yet (its receiver failed, a node above it failed, it could not be relayed to) gets
the direct push, named in the output (:mod:`nodekit.data.push`).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nodekit.data import transport
from nodekit.data.plan import HostPlan
from nodekit.data.transport import Where
from nodekit.errors import NodekitError
from nodekit.launcher.datacheck.filehash import CHUNK
from nodekit.ship.dial import hop_of
from nodekit.ship.hopkeys import Hop
from nodekit.ship.relay import RELAY_MIN_BYTES, RelayMode, RelaySink, relay_script, why_not_loaded
from nodekit.ship.tree import plan_tree, shape_lines
from nodekit.system.progress import Reporter

STALL_S = 60.0
"""The tree's stream taking nothing for this long (a node, or a link, hangs): the head cuts the tree, and every
host it did not make equal gets the direct push."""
RECEIVER_STALL_S = 60
"""A node's receiver taking nothing for this long is cut off there, so the nodes that node feeds go on: longer
than the image's load (a receiver may first hash files of the user's it adopts)."""

CONSUMER = (
    f'exec python3 -c "$(printf %s {base64.b64encode(transport.BOOT.encode()).decode()} | base64 -d)" relayed '
    '"$(cat ./arg)" < ./given 3< ./load'
)
"""What takes the stream on each node: the receiver, its code and plan from the node's own input (``./given``), the
stream straight from the relay step's fifo on fd 3, applied to the node's own path (``./arg``). ``exec``: no shell
stays behind holding the fifo open (a receiver that stopped would otherwise leave the step's tee blocked on a reader
that never reads, not broken off, and the nodes this one feeds would wait)."""


class Job(Protocol):
    """One source to one host's path (:class:`nodekit.data.push.Job`)."""

    @property
    def where(self) -> Where: ...
    @property
    def source(self) -> Path: ...
    @property
    def root(self) -> str: ...
    @property
    def only(self) -> str | None: ...
    @property
    def label(self) -> str: ...


@dataclass(frozen=True)
class TreePlan:
    """One relay tree: the jobs it serves (indices into the push's jobs, in the tree's order: the first is fed by
    the head) and the stream it carries (content hash to size, in the order sent)."""

    source: Path
    members: tuple[int, ...]
    stream: Mapping[str, int]

    @property
    def send_bytes(self) -> int:
        return sum(self.stream.values())


def union(plans: Sequence[HostPlan]) -> dict[str, int]:
    """Pure: every content any of ``plans`` lacks, once, smallest first (a stream cut short has finished the most
    files)."""
    sizes = {h: s for p in plans for h, s in p.incoming.items()}
    return {h: sizes[h] for h in sorted(sizes, key=lambda h: (sizes[h], h))}


def plan_trees(jobs: Sequence[Job], plans: Sequence[HostPlan], mode: RelayMode) -> list[TreePlan]:
    """Pure: per source, the jobs that take it through one relay tree: over ``ssh://``, lacking contents, one path
    per host (a second path of a host is pushed directly), at least two; in ``auto`` only when the stream is at least
    ``RELAY_MIN_BYTES`` (each hop's SSH handshake costs more than a small stream wins). A file source (``only``)
    goes directly: a tree node's receiver makes a whole directory equal to the plan."""
    if mode == "never":
        return []
    by_source: dict[Path, list[int]] = {}
    for i, (j, p) in enumerate(zip(jobs, plans, strict=True)):
        if j.where.host is not None and p.incoming and j.only is None:
            taken = by_source.setdefault(j.source, [])
            if all(jobs[k].where.name != j.where.name for k in taken):
                taken.append(i)
    out = []
    for source, members in by_source.items():
        stream = union([plans[i] for i in members])
        if len(members) >= 2 and (mode == "always" or sum(stream.values()) >= RELAY_MIN_BYTES):
            out.append(TreePlan(source, tuple(members), stream))
    return out


def node_plan(plan: HostPlan, stream: Mapping[str, int]) -> dict[str, object]:
    """Pure: what one node's receiver is given: its own plan, and the stream's other contents as ``passing``."""
    return {**plan.to_json(), "passing": {h: s for h, s in stream.items() if h not in plan.incoming}}


def dry_run_lines(jobs: Sequence[Job], trees: Sequence[TreePlan]) -> list[str]:
    """What ``data push --dry-run`` says of each tree: who feeds whom, and the one copy on the head's link."""
    out = []
    for t in trees:
        out.append(f"relayed: {len(t.members)} host paths of {t.source} in one tree, {t.send_bytes} bytes once on "
                   "the head's link; a host whose host key the head lacks is sent its own stream")  # fmt: skip
        out += shape_lines([jobs[i].where.name for i in t.members], plan_tree(len(t.members)))
    return out


def endpoint(where: Where) -> str:
    h = where.host
    assert h is not None
    return f"ssh://{h.user + '@' if h.user else ''}{h.hostname}{f':{h.port}' if h.port else ''}"


def _frames(stream: Mapping[str, int], files: Mapping[str, Path]) -> Iterator[tuple[bytes, int]]:
    """The stream as the receiver reads it, each piece with the payload bytes in it; a content is read once and
    not hashed here (each node hashes what it receives)."""
    for h, size in stream.items():
        yield f"{h} {size}\n".encode(), 0
        left = size
        with open(files[h], "rb") as f:
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise transport.DataError(f"{files[h]} shrank while it was sent", fix="push again once written")
                left -= len(chunk)
                yield chunk, len(chunk)
    yield b"END\n", 0


class _Watch:
    """Cuts the tree (``sink.abort``) when it has taken nothing for ``limit`` seconds."""

    def __init__(self, sink: RelaySink, limit: float) -> None:
        self.sink, self.limit, self.last, self.cut = sink, limit, time.monotonic(), False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def moved(self, limit: float | None = None) -> None:
        self.last = time.monotonic()
        self.limit = self.limit if limit is None else limit

    def _run(self) -> None:
        while not self._done.wait(0.5):
            if time.monotonic() - self.last > self.limit:
                self.cut = True
                self.sink.abort()
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


@dataclass(frozen=True)
class Relayed:
    """What one tree did: the bytes the head sent into it, who fed each job it reached (None: the head), and why
    each job it did not reach was not (for the output; the head scans every host again whatever is said here)."""

    sent: int
    fed_by: Mapping[int, str | None]
    missed: Mapping[int, str]


def relay(t: TreePlan, jobs: Sequence[Job], plans: Sequence[HostPlan], files: Mapping[str, Path],
          reporter: Reporter, *, stall_s: float = STALL_S) -> Relayed:  # fmt: skip
    """Carry out the tree ``t``: the head's one stream down it. Never raises for a host's failure: a job it did not
    reach is in ``missed``, for the direct push."""
    with ThreadPoolExecutor(max_workers=min(32, len(t.members))) as pool:
        found = list(pool.map(lambda i: hop_of(jobs[i].where.name, endpoint(jobs[i].where)), t.members))
    members = [(i, h) for i, h in zip(t.members, found, strict=True) if isinstance(h, Hop)]
    missed = {i: f"not in the relay tree ({h})" for i, h in zip(t.members, found, strict=True) if isinstance(h, str)}
    if len(members) < 2:
        return Relayed(0, {}, {**missed, **{i: "no relay tree to join" for i, _ in members}})
    stream = union([plans[i] for i, _ in members])
    hops = [h for _, h in members]
    given = [(jobs[i].root, transport.bundle() + transport.block(json.dumps(node_plan(plans[i], stream)).encode()))
             for i, _ in members]  # fmt: skip
    tree = plan_tree(len(members))
    script = relay_script("none", load_stall_s=RECEIVER_STALL_S, consumer=CONSUMER)
    reporter.step(f"dataset: {sum(stream.values())} bytes of {t.source} through a relay tree to "
                  + "; ".join(f"{hops[k].name} -> {', '.join(hops[c].name for c in kids)}"
                              for k in range(len(hops)) if (kids := tree.children(k))))  # fmt: skip
    try:
        sink = RelaySink(hops, tree=tree, script=script, given=given)
    except NodekitError as e:
        return Relayed(0, {}, {**missed, **{i: f"the relay tree could not be set up: {e.message}" for i, _ in members}})
    watch = _Watch(sink, stall_s)
    sent = 0
    try:
        for chunk, payload in _frames(stream, files):
            sink.write(chunk)
            sent += payload
            watch.moved()
        # The nodes work on after the stream's end (local copies, renames, their final scan).
        most = max(sum(s for s, _ in plans[i].want.values()) for i, _ in members)
        watch.moved(transport.SCAN_BASE_S + most / transport.HASH_RATE)
        report = sink.finish()
    except NodekitError as e:
        sink.abort()
        report = sink.report()
        reporter.warn(f"dataset: the relay tree broke ({e.message})")
    finally:
        watch.stop()
    if watch.cut:
        reporter.warn(f"dataset: the relay tree took nothing for {watch.limit:.0f} s: cut off")
    why = why_not_loaded(hops, report, sink.rc, tree)
    for i, h in members:
        rc, last = report.loads.get(h.name, (None, ""))
        if rc not in (None, 0):
            why[h.name] = f"its receiver failed (exit {rc}): {last or 'no output'}"
        if h.name in why:
            missed[i] = why[h.name]
    fed: dict[int, str | None] = {}
    for k, (i, _) in enumerate(members):
        if i not in missed:
            p = tree.parent[k]
            fed[i] = None if p is None else hops[p].name
    return Relayed(sent, fed, missed)
