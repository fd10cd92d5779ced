"""``nodekit data push`` and the push ``nodekit run`` makes before any container starts: every mount with a
``source``, to every target at once. Nothing is sent anywhere until every host has been scanned and planned: a host
that refuses (files nodekit did not write in the way) or lacks the disk stops the push before its first byte."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from nodekit.config.settings import Settings
from nodekit.data import plan as planning
from nodekit.data import source as sources
from nodekit.data import transport
from nodekit.data import tree as trees
from nodekit.data.transport import MAX_PARALLEL, DataError, Host, RankedHost, Where, at_once, raise_first
from nodekit.errors import NodekitError, UsageError
from nodekit.job.spec import host_path, mount_points
from nodekit.launcher.datasync.scan import Manifest
from nodekit.ship.relay import RelayMode
from nodekit.system.progress import Reporter


@dataclass(frozen=True)
class Job:
    """One mount's source to one host's path: the directory ``root``, or for a file source the file ``only`` in
    ``root``."""

    where: Where
    container: str
    source: Path
    root: str
    only: str | None = None

    @property
    def label(self) -> str:
        return f"{self.where.name}:{os.path.join(self.root, self.only) if self.only else self.root}"

    def want(self, source: Manifest) -> Manifest:
        """What the host path must hold: the source's manifest, or a file source's one entry under the host's name."""
        if self.only is None:
            return source
        (entry,) = source.values()
        return {self.only: entry}


@dataclass(frozen=True)
class Done:
    job: Job
    plan: planning.HostPlan
    sent: int = 0
    how: str = ""
    """How it got its contents when not by its own stream from the head (through a relay tree)."""


def where_of(host: Host) -> Where:
    if host.scheme == "unix":
        return Where(host.name)
    if host.scheme != "ssh":
        raise UsageError(f"{host.name}: a dataset reaches a host over SSH, not {host.scheme}://",
                         fix=f"use ssh://{host.user + '@' if host.user else ''}{host.hostname} for it")  # fmt: skip
    return Where(host.name, host)


def jobs_of(settings: Settings, hosts: Sequence[tuple[Host, int | None]]) -> list[Job]:
    """Every (host, mount with a source) pair; the host path is the host's rank's where it has one."""
    out = []
    for host, rank in hosts:
        where = where_of(host)
        points = {p.container: p.host for p in mount_points(settings, rank)} if rank is not None else {}
        for m in settings.mounts:
            if m.source:
                src = settings.resolve(Path(m.source)).absolute()
                path = points.get(m.container, host_path(settings, m.host))
                if src.is_file():  # the host path is that file: its directory holds it, and others nodekit leaves be
                    root, only = os.path.split(path.rstrip("/"))
                    out.append(Job(where, m.container, src, root or "/", only))
                else:
                    out.append(Job(where, m.container, src, path))
    return out


def plan_all(settings: Settings, jobs: Sequence[Job]) -> tuple[list[planning.HostPlan], dict[Path, sources.Holders]]:
    """Every job's plan, from the sources' manifests and every host's scan; raises before anything is sent."""
    manifests: dict[Path, Manifest] = {}
    holders: dict[Path, sources.Holders] = {}
    for j in jobs:
        if j.source not in manifests:
            manifests[j.source], holders[j.source] = sources.manifest(settings.project_dir, j.source,
                                                                      mount=j.container)  # fmt: skip

    def one(j: Job) -> planning.HostPlan:
        p, view = _scanned(j, j.want(manifests[j.source]))
        if (short := planning.room_problem(p, view.free, where=j.label)) is not None:
            raise short
        return p

    results = at_once(one, jobs)
    raise_first(results, "host path(s)")
    return [r for r in results if isinstance(r, planning.HostPlan)], holders


def dry_run_text(jobs: Sequence[Job], plans: Sequence[planning.HostPlan], relay: RelayMode = "never") -> str:
    """What would travel to each host path, and through which relay tree (``relay`` as for the push)."""
    lines = [f"{j.label} <- {j.source}: {planning.summary(p)}" for j, p in zip(jobs, plans, strict=True)]
    tree_plans = trees.plan_trees(jobs, plans, relay)
    relayed = {i for t in tree_plans for i in t.members}
    total = sum(t.send_bytes for t in tree_plans) + sum(p.send_bytes for i, p in enumerate(plans) if i not in relayed)
    return "\n".join([*lines, *trees.dry_run_lines(jobs, tree_plans), f"would send {total} bytes in all"])


def _scanned(j: Job, want: Manifest) -> tuple[planning.HostPlan, planning.NodeView]:
    """The host path's plan toward ``want`` from a scan of it now, and what the scan saw."""
    view = planning.NodeView.of(transport.scan(j.where, j.root, want, j.only))
    return planning.plan_host(want, view, where=j.label), view


T = TypeVar("T")

LATE_GRACE_S = 10.0
"""After a relay tree, how long the head waits for the scans still out once the first has answered (or twice the
first's time, when longer). A scan after a tree reads metadata only (each node hashed what it wrote), so a healthy
host answers within seconds; one that stays silent (its link gone, SSH waiting out its keepalive, about 45 s) no
longer holds the second tree back from the hosts it cut off: it is named, left out of that tree, and its answer
is awaited when its own push comes."""


def answered_soon(
    pool: ThreadPoolExecutor, fn: Callable[[int], T], items: Sequence[int], grace_s: float = LATE_GRACE_S
) -> tuple[dict[int, T | NodekitError], dict[int, Future[T]]]:
    """``fn`` on every item at once, on ``pool``: the answers (a NodekitError in a result's place) of those that came
    within ``grace_s`` of the first answer (or twice its time), and the futures of those still out then. With no
    answer at all, every one is waited for: nothing could go on without them."""
    start = time.monotonic()
    futures: dict[Future[T], int] = {pool.submit(fn, i): i for i in items}
    pending = set(futures)
    deadline: float | None = None
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        if not done:
            break  # the deadline passed with these still out
        if deadline is None:
            first = time.monotonic() - start
            deadline = start + first + max(grace_s, 2 * first)
    answers: dict[int, T | NodekitError] = {}
    for f, i in futures.items():
        if f not in pending:
            answer: T | NodekitError = _outcome(f)
            answers[i] = answer
    return answers, {futures[f]: f for f in pending}


def _outcome(f: Future[T]) -> T | NodekitError:
    """A finished future's result, or the NodekitError it raised (as :func:`~nodekit.data.transport.at_once`)."""
    e = f.exception()
    if isinstance(e, NodekitError):
        return e
    if e is not None:
        raise e
    return f.result()


@dataclass
class _Trees:
    """What the relay trees left for the direct push: the jobs they made equal (``out``), the jobs whose scan after a
    tree failed (``lost``: the host is gone, or its link; not tried again), the scans still out when the next tree
    went (``late``), and the bytes sent into trees that made no job equal (``unclaimed``)."""

    out: dict[int, Done]
    lost: dict[int, NodekitError]
    late: dict[int, Callable[[], Done | NodekitError | planning.HostPlan]]
    unclaimed: int = 0
    settle: list[Callable[[], None]] = field(default_factory=list)
    """The cleanups broken trees left running on their nodes, waited for before the push ends."""


def _relayed(jobs: Sequence[Job], plans: list[planning.HostPlan], holders: Mapping[Path, Mapping[str, Path]],
             reporter: Reporter, relay: RelayMode, pool: ThreadPoolExecutor, trees_done: _Trees) -> None:  # fmt: skip
    """The jobs the relay trees made equal to their source, each proven so by a scan of the head's own. Every other
    job of a tree has its plan made again in ``plans`` from a scan of now (what the tree left staged there is not
    sent again), its reason named; those of one source that still lack contents take a second tree of their own
    when two or more do (:func:`~nodekit.data.tree.plan_refeed`), and what that one leaves, like a single host,
    gets the direct push. A host whose scan after a tree is still out :data:`LATE_GRACE_S` after the others
    answered goes to the direct push with its scan (``late``), so a stalled host does not hold its subtree back.
    What the trees did goes into ``trees_done`` as it happens (its cleanups too, should this raise)."""
    outside: set[int] = set()

    def rescan(i: int) -> planning.HostPlan:
        return _scanned(jobs[i], plans[i].want)[0]

    todo = trees.plan_trees(jobs, plans, relay)
    for again, what in ((True, "a relay tree"), (False, "a second relay tree")):
        left: list[int] = []
        why: dict[int, str] = {}
        for t in todo:
            did = trees.relay(t, jobs, plans, holders[t.source], reporter, what=what)
            if did.settle is not None:
                trees_done.settle.append(did.settle)
            outside |= did.outside
            sent = did.sent

            def sort(i: int, p: planning.HostPlan | NodekitError, what: str = what, did: trees.Relayed = did,
                     sent: int = 0) -> Done | NodekitError | planning.HostPlan:  # fmt: skip
                """One rescan's answer: the job the tree made equal (Done), lost (the error, named), or its new plan."""
                said = did.missed.get(i) or f"after {what}"
                if isinstance(p, NodekitError):
                    reporter.warn(f"{jobs[i].label}: {said}; it cannot be scanned again ({p.message})")
                    p.message = f"{jobs[i].label}: {said}; then {p.message}"
                    return p
                if i in did.fed_by and not p.changes:
                    feeder = did.fed_by[i]
                    return Done(jobs[i], plans[i], sent, f"relayed by {feeder}" if feeder else "fed by the head")
                return p

            answers, late = answered_soon(pool, rescan, list(t.members))
            for i in t.members:
                if i in late:
                    said = did.missed.get(i) or f"after {what}"
                    reporter.warn(f"{jobs[i].label}: {said}; its scan has not answered within {LATE_GRACE_S:.0f} s "
                                  "of the others', which go on without it")  # fmt: skip
                    trees_done.late[i] = partial(_sorted_late, sort, i, late[i])
                    continue
                r = sort(i, answers[i], sent=sent)
                if isinstance(r, NodekitError):
                    trees_done.lost[i] = r
                elif isinstance(r, Done):
                    trees_done.out[i] = r
                    sent = 0  # the tree's bytes counted once, on the first path it made equal
                else:
                    why[i] = did.missed.get(i) or f"not the source's after {what} ({planning.summary(r)})"
                    plans[i] = r
                    left.append(i)
            trees_done.unclaimed += sent
        refeed = trees.plan_refeed(jobs, plans, left, relay, again=again, outside=outside)
        for line in trees.refeed_lines(jobs, refeed, why):
            reporter.warn(line)
        todo = refeed.trees
        if not todo:
            break


def _sorted_late(
    sort: Callable[[int, planning.HostPlan | NodekitError], Done | NodekitError | planning.HostPlan],
    i: int,
    f: Future[planning.HostPlan],
) -> Done | NodekitError | planning.HostPlan:
    """A late scan's answer, waited for (its own SSH deadlines bound it), sorted as the others were."""
    wait([f])
    answer: planning.HostPlan | NodekitError = _outcome(f)
    return sort(i, answer)


def push(
    settings: Settings,
    jobs: Sequence[Job],
    reporter: Reporter,
    *,
    dry_run: bool = False,
    verify: bool = False,
    relay: RelayMode = "never",
) -> list[Done]:
    """Make every job's host path equal its source. DataError naming the host and the first differing files when a
    host's result differs; nothing is sent when any host refuses or lacks room. ``relay``: hosts of one source that
    lack contents take them through one relay tree (:mod:`nodekit.data.tree`) when ``always``, or in ``auto`` when
    enough travels; any host it did not make equal gets its own stream from the head, named. ``verify``: then every
    host reads every file of its copy again from disk (:func:`verify_all`)."""
    if not jobs:
        return []
    reporter.step(f"dataset: scanning {len({j.source for j in jobs})} source(s) and {len(jobs)} host path(s)")
    plans, holders = plan_all(settings, jobs)
    if dry_run:
        return [Done(j, p) for j, p in zip(jobs, plans, strict=True)]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
        done = _pushed(jobs, plans, holders, reporter, relay, pool)
    for d in done:
        how = f", {d.how}" if d.how else ""
        reporter.detail(f"{d.job.label}: {planning.summary(d.plan)}; sent {d.sent} bytes{how}")
    if verify:
        verify_all(done, reporter)
    return done


def _pushed(jobs: Sequence[Job], plans: list[planning.HostPlan], holders: Mapping[Path, sources.Holders],
            reporter: Reporter, relay: RelayMode, pool: ThreadPoolExecutor) -> list[Done]:  # fmt: skip
    """The relay trees (:func:`_relayed`), then every job they left, each its own stream from the head at once;
    then the cleanup a broken tree left running on its nodes, waited for."""
    relayed = _Trees({}, {}, {})
    try:
        _relayed(jobs, plans, holders, reporter, relay, pool, relayed)
        return _direct(jobs, plans, holders, reporter, relayed)
    finally:
        for settle in relayed.settle:
            settle()


def _direct(jobs: Sequence[Job], plans: list[planning.HostPlan], holders: Mapping[Path, sources.Holders],
            reporter: Reporter, relayed: _Trees) -> list[Done]:  # fmt: skip
    """Every job the trees left, each its own stream from the head, at once."""

    def one(i: int) -> Done:
        if i in relayed.late:  # its scan after a tree, awaited now; then as any other
            r = relayed.late[i]()
            if isinstance(r, NodekitError):
                raise r
            if isinstance(r, Done):
                return r
            if r.changes:
                reporter.warn(f"{jobs[i].label}: answered late, not the source's ({planning.summary(r)}); "
                              "sending it from the head")  # fmt: skip
            plans[i] = r
        j, p = jobs[i], plans[i]
        if i in relayed.out:
            return relayed.out[i]
        if i in relayed.lost:
            raise relayed.lost[i]
        if not p.changes:
            return Done(j, p)
        result, sent = transport.apply(j.where, j.root, p.to_json(), holders[j.source], only=j.only)
        if not result.get("ok"):
            diffs = "; ".join(str(d) for d in result.get("diffs", []))
            raise DataError(f"{j.label} differs from {j.source} after the push: {diffs}",
                            fix="run `nodekit data push` again: it repairs what differs")  # fmt: skip
        return Done(j, p, sent)

    results = at_once(one, list(range(len(jobs))))
    done = [r for r in results if isinstance(r, Done)]
    failed = [r for r in results if isinstance(r, NodekitError)]
    if failed and done:  # what the user need not push again
        failed[0].message += f"; the {len(done)} other host path(s) are the source's"
    raise_first(results, "host path(s)")
    if relayed.unclaimed and done:  # a tree that made no path equal still cost the head's link its bytes
        done[0] = Done(done[0].job, done[0].plan, done[0].sent + relayed.unclaimed, done[0].how)
    return done


def verify_all(done: Sequence[Done], reporter: Reporter) -> None:
    """Every host path read back from its disk, on every host at once, no hash cache trusted, and compared with the
    source's manifest: DataError (exit 1) naming the host, the path and the first differing files. The hosts' caches
    learn what was read, so the next push repairs what differs."""
    reporter.step(f"dataset: reading {len(done)} host path(s) back from disk")

    def one(d: Done) -> int:
        result = transport.verify(d.job.where, d.job.root, d.plan.want, d.job.only)
        if not result.get("ok"):
            diffs = "; ".join(str(x) for x in result.get("diffs", []))
            raise DataError(f"{d.job.label} differs from {d.job.source} when read back from its disk: {diffs}",
                            fix="run `nodekit data push` again: it repairs what differs")  # fmt: skip
        return int(result.get("bytes", 0))

    results = at_once(one, list(done))
    raise_first(results, "host path(s)")
    read = sum(r for r in results if isinstance(r, int))
    reporter.detail(f"verified {len(done)} host path(s) against the source: {read} bytes read back")


def report_line(done: Sequence[Done], *, verified: bool = False) -> str:
    hosts = len({d.job.where.name for d in done})
    sent = sum(d.sent for d in done)
    relayed = sum(d.how.startswith("relayed") for d in done)
    paths = f"{len(done)} path(s)" + (f", {relayed} relayed by other hosts" if relayed else "")
    how = ", verified: every file read back from disk" if verified else ""
    return f"dataset identical to the source on {hosts} host(s) ({paths}{how}); sent {sent} bytes"


def for_run(settings: Settings, hosts: Sequence[RankedHost], reporter: Reporter) -> None:
    """The push ``nodekit run`` makes after its hosts' checks, before any container starts (relayed as
    nodekit.toml's ``relay`` says)."""
    done = push(settings, jobs_of(settings, [(h, h.rank) for h in hosts]), reporter, relay=settings.relay)
    reporter.done(report_line(done))
