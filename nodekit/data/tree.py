"""A dataset through a relay tree: the head sends each content once, whatever the number of hosts that lack it.

The head scans every host and plans each one as for a direct push (:mod:`nodekit.data.plan`). The hosts of one
source that lack contents (over ``ssh://``, one path each) then form one relay tree (:mod:`nodekit.ship.tree`, the
one images take: hop keys that run only the relay step, nothing left on a node; up to :data:`CHAIN_MAX` hosts a
chain, each node feeding one, beyond that each node feeding at most two). The
head sends ONE stream down it: the union of the contents any of them lacks, smallest first, framed as the receiver
reads them (:mod:`nodekit.launcher.datasync.receive`). Each node's relay step tees it on and into that node's own
receiver, whose code and plan the head wrote into the node's relay directory over its own connection at setup
(:class:`~nodekit.ship.access.TreeAccess` ``given``): the stream chooses nothing, and a content a node does not need
is in its plan's ``passing`` and read past. A node that holds a content under another name copies it there, as in a
direct push.

The tree's word is taken for nothing: afterwards the head scans every host of the tree again and plans it again
(what arrived whole is not sent again). The hosts that are not the source's yet (their receiver failed, a node above
them failed, they could not be relayed to), each named in the output with why, are fed again
(:func:`plan_refeed`): two or more through a second tree of their own, so a node that dies high in a big tree costs
the head's link about one more copy, not one per host below it; a single one, or whatever the second tree leaves,
by the direct push (:mod:`nodekit.data.push`). A host that cannot even be scanned again (it died, its link did) is
not tried again: the push fails naming it.

The tree's stall deadline is its sink's (:class:`~nodekit.ship.relay.RelaySink`, as for images); the nodes' work
after the stream's end has a deadline of its own (their final scans).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nodekit.data import transport
from nodekit.data.plan import HostPlan
from nodekit.data.transport import Where
from nodekit.errors import NodekitError
from nodekit.ship.dial import hop_of
from nodekit.ship.hopkeys import Hop
from nodekit.ship.outcome import answered_within
from nodekit.ship.relay import RelayMode, RelaySink, relay_script, why_not_loaded
from nodekit.ship.tree import Tree, plan_tree, shape_lines
from nodekit.system.progress import Reporter

TREE_COST_S = 5.0
"""What a dataset's relay tree costs beyond a stream per host, in seconds: three rounds of short SSH calls to every
host to set it up, a handshake per level, the head's scan of each host afterwards. On the virtual cluster
(docs/guides/data-and-secrets.md) 100 MiB to 4 hosts over 1 Gbit/s links took 9.0 s through the tree and 6.9 s with a
stream each; less the streams themselves on the head's link (about 0.9 s and 3.5 s), 4.7 s."""
HEAD_LINKS = (100e6 / 8, 1e9 / 8)
"""The rates of the head's link (bytes/s) that ``auto`` decides for, since nothing tells it before the stream: a
laptop's or an office's uplink (100 Mbit/s) to a datacenter node's (1 Gbit/s)."""
CHAIN_MAX = 8
"""Up to this many host paths, a dataset's relay tree is a chain: each node feeds one, so its uplink carries one copy
and the stream moves at a node's link. A node that feeds two sends two copies: where the links are the limit, the
stream moves at half a node's link (measured, 500 MiB at 100 Mbit/s on every link: 98.5 s to 8 hosts through a tree
of fan-out two against 45.3 s to one host; docs/benchmarks.md). The chain's cost is its depth, one SSH handshake
per hop before the stream reaches the last node (a few seconds at 8), and a node that fails cuts off every node
below it (fed again through a second tree). Beyond it, the tree of :data:`nodekit.ship.tree.FANOUT`, whose depth
grows as log N."""
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


def tree_pays(hosts: int, stream_bytes: int) -> bool:
    """Pure: whether ``auto`` sends ``stream_bytes`` to ``hosts`` host paths through one tree: the copies it spares the
    head's link, ``(hosts - 1) * stream_bytes``, against its fixed cost (:data:`TREE_COST_S`), choosing what loses
    the least at the worse of :data:`HEAD_LINKS` for it. A needless tree loses its cost less what it spared on the
    fast link; a missing one, what the spared copies take on the slow link less that cost. The two are equal when
    the spared bytes are 2 x cost / (1/slow + 1/fast), about 108 MiB: a tree pays from 108 MiB to 2 hosts, 54 MiB
    to 3, 27 MiB to 5, 14 MiB to 9. Wrong on a fast link it costs seconds; wrong on a slow one, a copy per host."""
    slow, fast = HEAD_LINKS
    return (hosts - 1) * stream_bytes * (1 / slow + 1 / fast) >= 2 * TREE_COST_S


def shape_of(n: int) -> Tree:
    """Pure: who feeds whom among a dataset tree's ``n`` host paths: a chain up to :data:`CHAIN_MAX`, else the tree
    of :func:`~nodekit.ship.tree.plan_tree`'s fan-out."""
    return plan_tree(n, fanout=1 if n <= CHAIN_MAX else None)


def plan_trees(
    jobs: Sequence[Job], plans: Sequence[HostPlan], mode: RelayMode, among: Collection[int] | None = None
) -> list[TreePlan]:
    """Pure: per source, the jobs that take it through one relay tree: over ``ssh://``, lacking contents, one path
    per host (a second path of a host is pushed directly), at least two; in ``auto`` only where the tree pays for its
    fixed cost (:func:`tree_pays`: the more hosts, the smaller the stream that pays). A file source (``only``)
    goes directly: a tree node's receiver makes a whole directory equal to the plan. ``among``: only these jobs
    (indices) are considered."""
    if mode == "never":
        return []
    by_source: dict[Path, list[int]] = {}
    for i, (j, p) in enumerate(zip(jobs, plans, strict=True)):
        if (among is None or i in among) and j.where.host is not None and p.incoming and j.only is None:
            taken = by_source.setdefault(j.source, [])
            if all(jobs[k].where.name != j.where.name for k in taken):
                taken.append(i)
    out = []
    for source, members in by_source.items():
        stream = union([plans[i] for i in members])
        if len(members) >= 2 and (mode == "always" or tree_pays(len(members), sum(stream.values()))):
            out.append(TreePlan(source, tuple(members), stream))
    return out


@dataclass(frozen=True)
class Refeed:
    """How the head feeds again the jobs a relay tree left unequal: ``trees``, one more tree per source for those
    that still lack contents (two or more of them: the head's link then carries about one more copy, not one per
    host); ``direct``, each its own stream from the head."""

    trees: list[TreePlan]
    direct: tuple[int, ...]


def plan_refeed(jobs: Sequence[Job], plans: Sequence[HostPlan], left: Sequence[int], mode: RelayMode, *,
                again: bool = True, outside: Collection[int] = ()) -> Refeed:  # fmt: skip
    """Pure: ``left``, the jobs a tree did not make equal (``plans`` made again from a scan after it, so what the tree
    delivered whole is not sent twice), through a second tree as :func:`plan_trees` forms one among them; each other
    one, a single host or a stream too small for ``auto``, directly, and so is each in ``outside`` (no node can dial
    it: :attr:`Relayed.outside`). ``again`` False (the second tree failed too): every one directly."""
    trees = plan_trees(jobs, plans, mode, among=set(left) - set(outside)) if again else []
    fed = {i for t in trees for i in t.members}
    return Refeed(trees, tuple(i for i in left if i not in fed))


def refeed_lines(jobs: Sequence[Job], refeed: Refeed, why: Mapping[int, str]) -> list[str]:
    """Pure: the warning for each job a tree left unequal: why (``why``), and how the head feeds it now."""
    out = []
    for t in refeed.trees:
        how = (f"sending it through a second relay tree ({len(t.members)} host paths, {t.send_bytes} bytes once on "
               "the head's link)")  # fmt: skip
        out += [f"{jobs[i].label}: {why[i]}; {how}" for i in t.members]
    return out + [f"{jobs[i].label}: {why[i]}; sending it from the head" for i in refeed.direct]


def node_plan(plan: HostPlan, stream: Mapping[str, int]) -> dict[str, object]:
    """Pure: what one node's receiver is given: its own plan, and the stream's other contents as ``passing``."""
    return {**plan.to_json(), "passing": {h: s for h, s in stream.items() if h not in plan.incoming}}


def dry_run_lines(jobs: Sequence[Job], trees: Sequence[TreePlan]) -> list[str]:
    """What ``data push --dry-run`` says of each tree: who feeds whom, and the one copy on the head's link."""
    out = []
    for t in trees:
        out.append(f"relayed: {len(t.members)} host paths of {t.source} in one tree, {t.send_bytes} bytes once on "
                   "the head's link; a host whose host key the head lacks is sent its own stream; the hosts a node "
                   "that fails cuts off are fed again through a second tree (one alone: its own stream)")  # fmt: skip
        out += shape_lines([jobs[i].where.name for i in t.members], shape_of(len(t.members)))
    return out


def endpoint(where: Where) -> str:
    h = where.host
    assert h is not None
    return f"ssh://{h.user + '@' if h.user else ''}{h.hostname}{f':{h.port}' if h.port else ''}"


@dataclass(frozen=True)
class Relayed:
    """What one tree did: the bytes the head sent into it, who fed each job it reached (None: the head), and why
    each job it did not reach was not (for the output; the head scans every host again whatever is said here)."""

    sent: int
    fed_by: Mapping[int, str | None]
    missed: Mapping[int, str]
    outside: frozenset[int] = frozenset()
    """The jobs no node can dial (the head has no host key for it, a proxy in the way): never in a tree."""
    settle: Callable[[], None] | None = None
    """Waits for the cleanup a broken tree left running on its nodes (:meth:`RelaySink.settle`); the push calls it
    before it ends."""


def relay(t: TreePlan, jobs: Sequence[Job], plans: Sequence[HostPlan], files: Mapping[str, Path],
          reporter: Reporter, *, stall_s: float | None = None, what: str = "a relay tree") -> Relayed:  # fmt: skip
    """Carry out the tree ``t``: the head's one stream down it (``what``, in the output). Never raises for a host's
    failure: a job it did not reach is in ``missed``, to be fed again (:func:`plan_refeed`)."""
    with ThreadPoolExecutor(max_workers=min(32, len(t.members))) as pool:
        found = list(pool.map(lambda i: hop_of(jobs[i].where.name, endpoint(jobs[i].where)), t.members))
    members = [(i, h) for i, h in zip(t.members, found, strict=True) if isinstance(h, Hop)]
    missed = {i: f"not in the relay tree ({h})" for i, h in zip(t.members, found, strict=True) if isinstance(h, str)}
    outside = frozenset(missed)
    if len(members) < 2:
        return Relayed(0, {}, {**missed, **{i: "no relay tree to join" for i, _ in members}}, outside)
    stream = union([plans[i] for i, _ in members])
    hops = [h for _, h in members]
    given = [(jobs[i].root, transport.bundle() + transport.block(json.dumps(node_plan(plans[i], stream)).encode()))
             for i, _ in members]  # fmt: skip
    tree = shape_of(len(members))
    script = relay_script("none", load_stall_s=RECEIVER_STALL_S, consumer=CONSUMER)
    reporter.step(f"dataset: {sum(stream.values())} bytes of {t.source} through {what} to "
                  + "; ".join(f"{hops[k].name} -> {', '.join(hops[c].name for c in kids)}"
                              for k in range(len(hops)) if (kids := tree.children(k))))  # fmt: skip
    try:
        sink = RelaySink(hops, tree=tree, script=script, given=given, stall_s=stall_s)
    except NodekitError as e:
        broke = f"the relay tree could not be set up: {e.message}"
        return Relayed(0, {}, {**missed, **{i: broke for i, _ in members}}, outside)
    sent = 0
    settle: Callable[[], None] | None = None
    try:
        for chunk, payload in transport.frames(stream, files):
            sink.write(chunk)  # the sink's stall deadline cuts the tree when this blocks for stall_s
            sent += payload
        # The nodes work on after the stream's end (local copies, renames, their final scan).
        most = max(sum(s for s, _ in plans[i].want.values()) for i, _ in members)
        answer_s = transport.SCAN_BASE_S + most / transport.HASH_RATE
        with answered_within(sink, answer_s) as late:
            report = sink.finish()
        if late.is_set():
            reporter.warn(f"dataset: {what} did not finish within {answer_s:.0f} s of the stream's end: cut off")
    except NodekitError as e:
        # The cleanup on the tree's nodes goes on while the head scans them and feeds the rest again: a node that
        # hangs (the likeliest cause here) would hold its end step, and so the hosts it cut off, up to its deadline.
        sink.abort(wait=False)
        settle = sink.settle
        report = sink.report()
        reporter.warn(f"dataset: {what} broke ({e.message})")
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
    return Relayed(sent, fed, missed, outside, settle)
