"""``nodekit run``: the plan per rank, carried out on every host (``status``/``logs``/``down``: fleet/manage.py).

Order, each phase in parallel over hosts: the training command checked here -> check every host (and gather facts;
each host is asked for the image as soon as its own check passed: fleet/image.py) -> the attempt's plan (fleet/plan.py:
what ``--dry-run`` prints; a refusal costs no transfer) -> ship the image where missing -> write
``compose/node-R.yaml`` -> start every node -> one merged log while the supervisor's decision table (fleet/supervise.py)
watches the exits -> gang stop, restart or finish. Whatever happens (failure, Ctrl-C, SIGTERM or SIGHUP through
nodekit.system.proc.stopping, an error of ours), every node's container is removed before this returns; a host that
cannot be reached for that is named. Every connection to a node keeps alive (fleet/alive.py): a host that vanishes is
reported lost about ``peer_timeout`` after it stopped answering, and the supervisor waits that long for it before
blaming a survivor. Every ssh of the run to one host (the check's, the docker CLI's for the image, the start: the
host's own ``docker run``, fleet/start.py; the node's follower: its log and exit code in one SSH command,
fleet/follow.py; ``down``) rides one shared connection (:class:`nodekit.ship.SharedSsh`, opened while this machine
picks the image, fleet/remote.py's ``opening``, and keeping alive as above): one key exchange and login per host per
run, not one per call.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from nodekit.backends.compose.node import NodePlan, write_compose
from nodekit.backends.compose.render import SERVICE
from nodekit.backends.fleet import follow, handoff, remote, start, stop
from nodekit.backends.fleet.alive import alive_interval, kept_alive, loss_window
from nodekit.backends.fleet.hosts import FleetHost, check_items
from nodekit.backends.fleet.image import is_this_image, ship_image
from nodekit.backends.fleet.manage import parallel as _parallel
from nodekit.backends.fleet.nodes import gathered, job_settings
from nodekit.backends.fleet.plan import plan
from nodekit.backends.fleet.supervise import LOST, SETTLE_S, Budget, Decision, Report, decide
from nodekit.config.settings import Settings
from nodekit.errors import JobFailed, NodekitError
from nodekit.image.blobs import BLOBS
from nodekit.job.gather import check_command
from nodekit.job.secret import new_secret
from nodekit.job.spec import mount_points
from nodekit.launcher.contract import preflight_port_for
from nodekit.runs.cause import Causes
from nodekit.runs.events import NO_EVENTS, RunEvents
from nodekit.system import docker, fdlimit, proc
from nodekit.system.host.facts import Gathered
from nodekit.system.progress import Reporter

STOP_TIMEOUT_S = 10  # SIGTERM, then Docker's SIGKILL: "every other node stopped within seconds"

LineFn = Callable[[int, str], None]


@dataclass
class _Live:  # one node as planned; ``args``: its docker run's (empty: compose up starts it)
    plan: NodePlan
    host: FleetHost
    args: tuple[str, ...] = ()


def _down(live: Sequence[_Live], timeout: int = STOP_TIMEOUT_S, *, keep: bool = False) -> list[FleetHost]:
    """Every node's container stopped and removed, in parallel (with ``keep``, for ``keep_containers``: stopped and
    kept, so that nodekit exec and logs still reach it; nodekit down removes it); the hosts where that failed (a lost
    host: its container may still run there, unreachable from here)."""

    def one(n: _Live) -> FleetHost | None:
        try:
            stop.end(n.host, n.plan, timeout=timeout, keep=keep)
        except NodekitError:
            return n.host
        return None

    return [h for h in _parallel(one, live) if h is not None]


def left_running(hosts: Sequence[FleetHost]) -> str:
    """What to tell the user about hosts whose ``down`` failed ("" when there are none)."""
    if not hosts:
        return ""
    names = ", ".join(h.name for h in hosts)
    cmds = "; ".join(f"nodekit down --node {h.rank}" for h in hosts)
    return f"; could not reach {names} to remove its container (it may still run there): {cmds} once it answers"


def _start(live: Sequence[_Live], reporter: Reporter, events: RunEvents = NO_EVENTS) -> None:
    """Every node's container started, in parallel: by the host's own ``docker run`` in one SSH command on an
    ``ssh://`` host (:mod:`nodekit.backends.fleet.start`), by ``compose up`` elsewhere; the first error (every node
    then removed). However this ends (a signal included), every start has ended before it returns, so no ``down``
    can run before an ``up``: an ``ssh://`` start cut off by a stop signal is settled on its host first
    (:func:`nodekit.backends.fleet.start.start`), and a host where that failed is named."""

    def one(n: _Live) -> NodekitError | None:
        if proc.interrupted():  # a signal arrived: start nothing more
            return None
        try:
            if n.args:
                start.start(n.host, n.plan, note=reporter.detail, args=n.args)
            else:
                docker.compose_up(n.plan.compose_path, n.plan.project, host=n.host.url)
        except NodekitError as e:
            e.node = n.host.name
            return e
        events.phase(n.host.rank, "started")
        return None

    pool = ThreadPoolExecutor(max_workers=min(remote.MAX_PARALLEL, max(1, len(live))))
    futures = [pool.submit(one, n) for n in live]
    try:
        errors = [e for f in futures if (e := f.result()) is not None]
    except KeyboardInterrupt:
        wait(futures)
        unsettled = [e for f in futures if isinstance(e := f.result(), start.Unsettled)]
        for e in unsettled:
            reporter.warn(e.one_line())
            proc.left_behind(f"node {e.host.rank}'s container on {e.host.where} (then: {e.fix})")
        raise
    finally:
        wait(futures)  # after a signal too: its handler ended their processes, and a second one does not raise
        pool.shutdown(wait=False)
    if errors:
        _down(live)
        raise errors[0]


def _watch(live: Sequence[_Live], events: queue.Queue[tuple[str, int, Any]]) -> list[threading.Thread]:
    """A follower per node (:func:`nodekit.backends.fleet.follow.follow`: one SSH command per ``ssh://`` host),
    feeding ``events``: ("line", rank, text) for each line, then ("eof", rank, None) and ("exit", rank, code), or
    ("lost", rank, message)."""
    threads = []
    for n in live:
        rank = n.plan.node.rank

        def one(n: _Live = n, rank: int = rank) -> None:
            try:
                code = follow.follow(n.host, n.plan.compose_path, n.plan.project, SERVICE,
                                     lambda line: events.put(("line", rank, line)))  # fmt: skip
                ended: tuple[str, int, Any] = ("exit", rank, code)
            except NodekitError as e:
                ended = ("lost", rank, e.message)
            events.put(("eof", rank, None))
            events.put(ended)

        t = threading.Thread(target=one, daemon=True)
        t.start()
        threads.append(t)
    return threads


def _attempt(
    live: Sequence[_Live],
    budget: Budget,
    reporter: Reporter,
    on_line: LineFn,
    clock: Callable[[], float],
    cause_s: float = 0.0,
    events: RunEvents = NO_EVENTS,
    keep: bool = False,
) -> Decision:
    """Run one attempt to its end: the decision that ended it (done, restart or fail). ``cause_s``: how long the
    supervisor waits for a node the others report lost (:func:`nodekit.backends.fleet.supervise.culprit`);
    ``keep``: the nodes it stops keep their containers (``keep_containers``)."""
    inbox: queue.Queue[tuple[str, int, Any]] = queue.Queue()
    _watch(live, inbox)
    causes = Causes()  # each node's first traceback, for the closing line
    reports = {n.plan.node.rank: Report(n.plan.node.rank) for n in live}
    eofs: set[int] = set()
    stopping: list[threading.Thread] = []
    while True:
        try:
            kind, rank, value = inbox.get(timeout=0.25)
        except queue.Empty:
            kind, rank, value = "tick", -1, None
        if kind == "line":
            on_line(rank, value)
            causes.feed(rank, value)
            continue
        if kind == "eof":
            eofs.add(rank)
        elif kind == "exit":
            reports[rank] = replace(reports[rank], code=int(value), at=clock())
            events.exited(rank, int(value))
        elif kind == "lost":
            reports[rank] = replace(reports[rank], lost=True, at=clock())
            events.exited(rank, None)
            if not reports[rank].stopped:
                reporter.warn(f"lost {live[rank].host.name}: {value}")
        decision = decide(list(reports.values()), clock(), budget, cause_s=cause_s)
        if decision.action == "stop":
            who = live[decision.culprit or 0].host.name
            code = "lost" if decision.code == LOST else f"exit code {decision.code}"
            reporter.warn(f"{who} failed ({code}): stopping node(s) {', '.join(map(str, decision.stop))}")
            for r in decision.stop:
                reports[r] = replace(reports[r], stopped=True)
            t = threading.Thread(target=_down, args=([live[r] for r in decision.stop],), kwargs={"keep": keep},
                                 daemon=True)  # fmt: skip
            t.start()
            stopping.append(t)
        elif decision.action in ("done", "restart", "fail"):
            # The rest of every node's log, before the verdict (the followers end with their containers).
            deadline = clock() + 5
            while len(eofs) < len(live) and clock() < deadline:
                try:
                    kind, rank, value = inbox.get(timeout=0.25)
                except queue.Empty:
                    continue
                if kind == "line":
                    on_line(rank, value)
                    causes.feed(rank, value)
                elif kind == "eof":
                    eofs.add(rank)
            for t in stopping:
                t.join(STOP_TIMEOUT_S + 20)
            said = causes.quote(decision.culprit, decision.code) if decision.culprit is not None else None
            if decision.action != "done" and said is not None:
                return replace(decision, reason=f"{decision.reason}: {said}")
            return decision


def run(
    settings: Settings,
    hosts: Sequence[FleetHost],
    reporter: Reporter,
    on_line: LineFn,
    *,
    image: str | None = None,
    debug: bool = False,
    clock: Callable[[], float] = time.monotonic,
    events: RunEvents = NO_EVENTS,
    started: float | None = None,
) -> int:
    """Check, ship, write, start, supervise; restart up to ``settings.restarts`` times. Returns 0, or raises
    JobFailed with the failing node's exit code. Ctrl-C (or nodekit.system.proc.Interrupted: SIGTERM, SIGHUP) stops
    every node, then goes on (the CLI exits 128 + the signal). ``events`` hears the image, when each node reached
    each phase the head sees (image there, container started, ended) and the verdict (nodekit/runs/). ``started``:
    the command's start on ``clock`` (:func:`~nodekit.system.progress.command_started`), from which the progress
    lines count; by default the call's."""
    started = clock() if started is None else started
    from nodekit.image.builder import current_image

    check_command(settings)  # a missing script is refused before any host is checked or shipped to
    fdlimit.ensure_open_files(stop.open_files(len(hosts)), what=f"nodekit run on {len(hosts)} hosts")
    interval = alive_interval(settings.peer_timeout)
    from nodekit import ship

    # One SSH connection per host for the whole run, keeping alive at the job's interval: opened while this machine
    # picks the image, then the check (the image's question included), the start, each node's follower and down
    # ride on it without handshakes.
    with (
        kept_alive(interval),
        ship.SharedSsh(),
        remote.opening(hosts) as opened,
        ThreadPoolExecutor(max_workers=1) as beside,
        handoff.Keeper(settings, hosts, reporter) as keeper,  # the outputs' mirror, for a restart without a host
    ):
        # The connections open while this machine picks the image (0.2 s of engine calls); its own image is read
        # while the hosts are checked, which need only its reference and ride the open connections.
        ref = image or current_image(settings)
        local = beside.submit(docker.require_image, ref)
        return _attempts(settings, list(hosts), reporter, on_line, ref, local, debug, clock, loss_window(interval),
                         events, opened, keeper, started=started)  # fmt: skip


def _attempts(
    settings: Settings,
    hosts: list[FleetHost],
    reporter: Reporter,
    on_line: LineFn,
    ref: str,
    local: Future[docker.ImageInfo],
    debug: bool,
    clock: Callable[[], float],
    cause_s: float,
    events: RunEvents = NO_EVENTS,
    opened: Mapping[int, remote.Opening] | None = None,
    keeper: handoff.Keeper | None = None,
    *,
    started: float,
) -> int:
    t0 = started  # the command's start (run's ``started``): every progress line counts from it
    secret = new_secret()  # one per run, the same on every node (nodekit/job/secret.py)
    failures: dict[int, int] = {}
    used = 0
    while True:
        n = len(hosts)
        first = used == 0
        facts, there, info = _check(settings, hosts, reporter, ref, local, events if first else NO_EVENTS,
                                    opened if first else None)  # fmt: skip
        reporter.done(f"{n} host(s) ready ({clock() - t0:.1f} s)")
        # Planned before any byte moves: a refused plan (a wrong main) costs the checks, not a push to every host.
        planned = plan(gathered(job_settings(settings, hosts, restart=used), hosts, facts, ref, image_id=info.identity,
                                secret=secret, debug=debug)).detail  # fmt: skip
        if missing := [h for h in hosts if h.rank not in there]:
            ship_image(ref, missing, reporter, store=settings.project_dir / BLOBS, relay=settings.relay)
        else:
            reporter.done(f"{ref} is already on every host")
        for h in hosts:
            events.phase(h.rank, "image")
        if first and any(m.source for m in settings.mounts):  # before any container starts, on every host at once
            from nodekit.data.push import for_run

            for_run(settings, hosts, reporter)
        for p in planned.nodes:
            write_compose(p)
        live = [_Live(plan=p, host=r.host, args=r.start) for p, r in zip(planned.nodes, planned.ranks, strict=True)]
        attempt = f" (restart {used} of {settings.restarts})" if used else ""
        reporter.step(f"starting {n} node(s){attempt}: {', '.join(str(p.compose_path) for p in planned.nodes[:4])}")
        try:
            _start(live, reporter, events)
            reporter.done(f"{n} node(s) started ({clock() - t0:.1f} s since the command)")
            budget = Budget(restarts=settings.restarts, used=used, min_nodes=settings.min_nodes, failures=failures)
            decision = _attempt(live, budget, reporter, on_line, clock, cause_s, events, settings.keep_containers)
        except KeyboardInterrupt as e:
            why = f"; {e.name} received" if isinstance(e, proc.Interrupted) else ""
            reporter.warn(f"interrupted: stopping every node ({n}){why}")
            if unreached := _down(live):
                reporter.warn(left_running(unreached).removeprefix("; "))
            raise
        except BaseException:
            _down(live)
            raise
        final = decision.action != "restart"
        unreached = _down(live, keep=final and settings.keep_containers)
        if decision.action == "done":
            reporter.done(f"the job finished on {n} node(s) in {clock() - t0:.1f} s")
            return 0
        culprit = hosts[decision.culprit or 0]
        failures[culprit.rank] = failures.get(culprit.rank, 0) + 1
        if decision.action == "restart":
            used += 1
            if decision.drop:  # each host keeps its [nodes.R]; the newest outputs reach every host left
                settings, hosts = handoff.restart_without(settings, hosts, decision.drop, reporter, keeper)
            reporter.warn(f"{decision.reason}: restarting the whole job ({used} of {settings.restarts})")
            events.attempt(used, [(h.rank, h.where) for h in hosts])
            continue
        events.failed(culprit.rank, decision.code, decision.reason)
        raise _verdict(hosts, decision, culprit, unreached)


def _check(
    settings: Settings,
    hosts: Sequence[FleetHost],
    reporter: Reporter,
    ref: str,
    local: Future[docker.ImageInfo],
    events: RunEvents,
    opened: Mapping[int, remote.Opening] | None = None,
) -> tuple[list[Gathered], set[int], docker.ImageInfo]:
    """Every host checked (facts, or FleetCheckError: nothing started), the ranks whose host has the image (asked in
    each host's check, one SSH command per host: remote.check_script), and this machine's image, read beside them
    (``local``): its failure is the one raised, before any host's, as it was when it was read first. ``events``
    hears the image once it is known, a host's failure or not."""
    reporter.step(f"checking {len(hosts)} host(s): {check_items(hosts)}")
    try:
        reports = _reports(settings, hosts, reporter, ref, opened)
    except NodekitError:
        _image_known(ref, local, events)
        raise
    info = _image_known(ref, local, events)
    there = {h.rank for h, r in zip(hosts, reports, strict=True) if is_this_image(info, r.image)}
    return [r.gathered for r in reports], there, info


def _image_known(ref: str, local: Future[docker.ImageInfo], events: RunEvents) -> docker.ImageInfo:
    info = local.result()  # ImageError (not here) is raised before anything else
    events.image(ref, info.identity, info.labels)
    return info


def _reports(
    settings: Settings,
    hosts: Sequence[FleetHost],
    reporter: Reporter,
    ref: str,
    opened: Mapping[int, remote.Opening] | None = None,
) -> list[remote.HostReport]:
    return remote.check_all(
        hosts,
        expect=lambda h: remote.Expect(
            ports=(settings.master_port, preflight_port_for(settings.master_port)) if h.rank == 0 else (),
            # A mount with a source is made by the dataset push that follows the check.
            paths=tuple(
                p.host for p, m in zip(mount_points(settings, h.rank), settings.mounts, strict=True) if not m.source
            ),
            image=ref,
        ),
        gpus=lambda h: settings.nodes[h.rank].gpus if h.rank in settings.nodes else None,
        on_done=lambda h, why: reporter.detail(f"{h.name}: {'ok' if why is None else 'failed (said below)'}"),
        opened=opened,
    )


def _verdict(
    hosts: Sequence[FleetHost], decision: Decision, culprit: FleetHost, unreached: Sequence[FleetHost]
) -> JobFailed:
    also = ""
    if decision.also:
        others = ", ".join(hosts[r].name for r in decision.also)
        also = f" (and within {SETTLE_S:g} s, on their own: {others}; the first to report is not always the cause)"
    return JobFailed(
        f"{culprit.name} {decision.reason.split(' ', 2)[2]}{also}; every node was stopped{left_running(unreached)}",
        exit_code=decision.code,
        node=None,
        fix=f"the merged log above has node {culprit.rank}'s output (nodekit run --node {culprit.rank}: only it)",
    )
