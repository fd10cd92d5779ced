"""``nodekit data push`` and the push ``nodekit run`` makes before any container starts: every mount with a
``source``, to every target at once. Nothing is sent anywhere until every host has been scanned and planned: a host
that refuses (files nodekit did not write in the way) or lacks the disk stops the push before its first byte."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nodekit.config.settings import Settings
from nodekit.data import plan as planning
from nodekit.data import source as sources
from nodekit.data import transport
from nodekit.data import tree as trees
from nodekit.data.transport import DataError, Host, RankedHost, Where, at_once, raise_first
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


def _relayed(jobs: Sequence[Job], plans: list[planning.HostPlan], holders: Mapping[Path, Mapping[str, Path]],
             reporter: Reporter, relay: RelayMode) -> tuple[dict[int, Done], dict[int, NodekitError], int]:  # fmt: skip
    """The jobs the relay trees made equal to their source, each proven so by a scan of the head's own. Every other
    job of a tree has its plan made again in ``plans`` from a scan of now (what the tree left staged there is not
    sent again), its reason named; those of one source that still lack contents take a second tree of their own
    when two or more do (:func:`~nodekit.data.tree.plan_refeed`), and what that one leaves, like a single host,
    gets the direct push. Also returned: the jobs whose scan after a tree failed (the host is gone, or its link),
    with that error, which are not tried again; and the bytes sent into trees that made no job equal."""
    out: dict[int, Done] = {}
    lost: dict[int, NodekitError] = {}
    unclaimed = 0
    outside: set[int] = set()

    def rescan(i: int) -> planning.HostPlan:
        return _scanned(jobs[i], plans[i].want)[0]

    todo = trees.plan_trees(jobs, plans, relay)
    for again, what in ((True, "a relay tree"), (False, "a second relay tree")):
        left: list[int] = []
        why: dict[int, str] = {}
        for t in todo:
            did = trees.relay(t, jobs, plans, holders[t.source], reporter, what=what)
            outside |= did.outside
            sent = did.sent
            for i, p in zip(t.members, at_once(rescan, list(t.members)), strict=True):
                said = did.missed.get(i) or f"after {what}"
                if isinstance(p, NodekitError):
                    reporter.warn(f"{jobs[i].label}: {said}; it cannot be scanned again ({p.message})")
                    p.message = f"{jobs[i].label}: {said}; then {p.message}"
                    lost[i] = p
                elif i in did.fed_by and not p.changes:
                    feeder = did.fed_by[i]
                    out[i] = Done(jobs[i], plans[i], sent, f"relayed by {feeder}" if feeder else "fed by the head")
                    sent = 0
                else:
                    why[i] = did.missed.get(i) or f"not the source's after {what} ({planning.summary(p)})"
                    plans[i] = p
                    left.append(i)
            unclaimed += sent
        refeed = trees.plan_refeed(jobs, plans, left, relay, again=again, outside=outside)
        for line in trees.refeed_lines(jobs, refeed, why):
            reporter.warn(line)
        todo = refeed.trees
        if not todo:
            break
    return out, lost, unclaimed


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
    relayed, lost, unclaimed = _relayed(jobs, plans, holders, reporter, relay)

    def one(i: int) -> Done:
        j, p = jobs[i], plans[i]
        if i in relayed:
            return relayed[i]
        if i in lost:
            raise lost[i]
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
    if unclaimed and done:  # a tree that made no path equal still cost the head's link its bytes
        done[0] = Done(done[0].job, done[0].plan, done[0].sent + unclaimed, done[0].how)
    for d in done:
        how = f", {d.how}" if d.how else ""
        reporter.detail(f"{d.job.label}: {planning.summary(d.plan)}; sent {d.sent} bytes{how}")
    if verify:
        verify_all(done, reporter)
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
