"""One node of a job: plan its compose file (pure decisions on a gathered world), write it, run it.

:func:`nodekit.job.gather.gather_node` validates everything the user gave, gathers what the plan needs from this
machine and decides the node into a :class:`~nodekit.job.gather.NodeWorld`; :func:`plan` makes the compose file from it
alone (pure);
nothing is written until ``write_compose`` and nothing runs until ``up``. A plan that fails leaves no file behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nodekit.backends.compose.render import SERVICE, compose_filename, project_name, render_compose, to_yaml
from nodekit.backends.shape import BackendPlan, PlannedFile
from nodekit.config.settings import Settings
from nodekit.errors import JobFailed, NetworkError, UsageError
from nodekit.job.container import ContainerSpec
from nodekit.job.gather import NodeWorld
from nodekit.job.plan import plan_container, unset_pass_env
from nodekit.job.spec import NodeSpec, output_dir_of
from nodekit.launcher.contract import Env
from nodekit.launcher.stops import STOPPED_BY
from nodekit.launcher.watchdog.decide import SIGNAL_FROM
from nodekit.runs.cause import Causes
from nodekit.runs.events import NO_EVENTS, RunEvents
from nodekit.system import docker, hostlock, proc
from nodekit.system.files import write_atomic
from nodekit.system.host import net
from nodekit.system.host.facts import HostFacts
from nodekit.system.progress import Reporter


@dataclass(frozen=True)
class NodePlan:
    """Everything ``nodekit up`` will do on this node, printable by ``--dry-run``: its container (``container``) and
    the compose file that renders it (``text``)."""

    node: NodeSpec
    image: str
    facts: HostFacts
    container: ContainerSpec
    compose_path: Path
    project_dir: Path  # below it, no directory on the way to compose_path may be a link (write_atomic)
    project: str
    text: str
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    job_secret: str = ""
    image_id: str = ""  # the image's identity on this host when planning looked it up ("" for compose and dry runs)
    main_note: str = ""  # which address node 0 took for main when none was given

    @property
    def shown(self) -> str:
        """The compose text as it may be printed: the job secret masked."""
        from nodekit.job.secret import masked

        return masked(self.text, self.job_secret)


def compose_path(settings: Settings, rank: int, out_dir: Path | None = None) -> Path:
    return (out_dir or settings.resolve(settings.compose_dir)) / compose_filename(rank)


def plan(
    settings: Settings, world: NodeWorld, *, debug: bool = False, out_dir: Path | None = None
) -> BackendPlan[NodePlan]:
    """Pure: the node ``world`` decided (:attr:`~nodekit.job.gather.NodeWorld.node`), its container
    (:func:`nodekit.job.plan.plan_container`) and its compose file, in the shape every backend returns (``nodekit
    compose`` and ``up`` print it on ``--dry-run``; ``write_compose`` and ``up`` carry out its ``detail``; the fleet
    plans each rank with it). Reads no file, environment, network or engine, and decides nothing the world's node
    holds again: gathering refused what the settings and the world contradict."""
    node = world.node
    # Written as one step down: the file is rendered from the container that the node's plan makes.
    return as_plan(
        _compose_file(
            settings,
            world,
            plan_container(
                node,
                world.facts,
                image=world.image,
                output_dir=output_dir_of(settings, node.rank, world.cwd),
                debug=debug,
                image_id=world.image_id,
                job_secret=bool(world.job_secret),
            ),
            out_dir,
        )
    )


def _compose_file(settings: Settings, world: NodeWorld, container: ContainerSpec, out_dir: Path | None) -> NodePlan:
    """Pure: the compose file of ``world``'s node that runs ``container``, with what the user should know."""
    node = world.node
    notes = _notes(node, world.facts)
    if world.image_note:
        notes = (*notes, f"image {world.image}: {world.image_note}")
    if world.main_note:
        notes = (world.main_note, *notes)
    path = compose_path(settings, node.rank, out_dir)
    hint = os.path.relpath(path, world.cwd) if path.is_absolute() else str(path)
    doc = render_compose(container, secrets={Env.JOB_SECRET: world.job_secret} if world.job_secret else {})
    return NodePlan(
        node=node,
        image=world.image,
        facts=world.facts,
        container=container,
        compose_path=path,
        project_dir=settings.project_dir,
        project=project_name(node.launch.name, node.rank),
        text=to_yaml(doc, rank=node.rank, nnodes=node.launch.nnodes, path_hint=hint),
        notes=notes,
        image_id=world.image_id,
        warnings=unset_pass_env(node.launch.pass_env, world.env_set),
        job_secret=world.job_secret,
        main_note=world.main_note,
    )


def as_plan(p: NodePlan) -> BackendPlan[NodePlan]:
    """``p`` as the one backend shape: its compose file (the job secret masked when shown), notes and warnings."""
    file = PlannedFile(p.compose_path, p.text, secret=p.job_secret, about=f"project {p.project}")
    return BackendPlan("compose", p, files=(file,), notes=p.notes, warnings=p.warnings)


def _notes(node: NodeSpec, facts: HostFacts) -> tuple[str, ...]:
    """What the user should know about decisions taken from this host's facts."""
    notes = []
    if not node.infiniband:
        why = 'switched off (ib = "off")' if facts.infiniband else "no InfiniBand devices"
        notes.append(f"{why}: NCCL_IB_DISABLE=1 (NCCL uses TCP sockets)")
    if facts.memlock_hard is not None:
        notes.append(f"memlock hard limit is {facts.memlock_hard // 1024} KiB on this host: left at the default")
    if node.network == "bridge" and node.is_main:
        ports = f"{node.launch.master_port} and {node.launch.preflight_port}"
        notes.append(f"bridge network: node 0 publishes ports {ports} on {node.main_addr}")
    return tuple(notes)


def image_id_here(rank: int) -> Callable[[str], str]:
    """The image-id lookup ``nodekit up`` plans with: the image must be on this host (ImageError otherwise). The id
    is the image's identity (:attr:`nodekit.system.docker.ImageInfo.identity`), which the preflight compares across
    nodes: the engine's own id differs between image stores for one image."""

    def lookup(ref: str) -> str:
        # No separate engine check first (docker version + docker compose version: 0.7 s here): a missing engine
        # fails this inspect, a missing Compose plugin fails `compose up`, each with its own message and fix.
        return docker.require_image(ref, node=f"node {rank}").identity

    return lookup


def write_compose(plan: NodePlan) -> Path:
    # 0600 when it carries the job secret: another user on this host must not read it and join the job.
    write_atomic(plan.compose_path, plan.text, mode=0o600 if plan.job_secret else 0o644, within=plan.project_dir)
    return plan.compose_path


def check_master_port(plan: NodePlan) -> None:
    """On main, the rendezvous ports must be free before the container starts (host networking shares them)."""
    if not plan.node.is_main:
        return
    for port in (plan.node.launch.master_port, plan.node.launch.preflight_port):
        if net.port_in_use(port):
            holder = net.port_holder(port)
            who = f" by {holder}" if holder else ""
            raise NetworkError(
                f"port {port} on main is already in use{who}",
                fix=f"stop that process (nodekit down --node-rank 0 if it is an earlier run), or pass --master-port "
                f"{plan.node.launch.master_port + 10}",
                node="node 0",
            )


def up(
    plan: NodePlan,
    reporter: Reporter,
    *,
    detach: bool,
    on_line: Callable[[str], None],
    debug: bool = False,
    events: RunEvents = NO_EVENTS,
) -> int:
    """Write the compose file, start the node's container, and unless ``detach`` follow it to its end. ``events``
    hears the image, the container's start and the node's end (nodekit/runs/).

    One node per rank and project per host (engine): under :func:`one_up_here` a second ``up`` of the same node is
    refused at once, naming the first (its pid while it starts or follows, its container once it runs), and the
    first goes on untouched. Before, the second force-recreated the first's container ("No such container") or
    both failed, and the other nodes waited out the rendezvous.

    Returns the job's exit code (0 when detached). Ctrl-C, or SIGTERM/SIGHUP under :func:`nodekit.system.proc.stopping`
    (the CLI's), stops and removes the container (with ``debug``: stops it and keeps it for inspection), then the
    interrupt goes on (the CLI exits 128 + the signal). ``compose up`` runs in a process group of its own, which
    the signal ended before this ``down``: nothing can create the container after it.
    """
    for warning in plan.warnings:
        reporter.warn(warning)
    if plan.main_note:
        reporter.step(plan.main_note)
    with one_up_here(plan):
        return _up(plan, reporter, detach=detach, on_line=on_line, debug=debug, events=events)


def up_lock_name(project: str, endpoint: str | None) -> str:
    """The host lock of one node: its compose project on one Docker engine (two virtual hosts on one machine, or
    one host's two engines, do not exclude each other)."""
    return hostlock.key_name(project, endpoint or "unix:///var/run/docker.sock", socket.gethostname())


@contextlib.contextmanager
def one_up_here(plan: NodePlan) -> Iterator[None]:
    """Hold this node's host lock while ``up`` starts and follows it, and refuse (UsageError) when another ``up``
    holds it or the node's container already runs. A crash releases the lock (flock); a detached node is found by
    its running container."""
    rank = plan.node.rank
    about = f"pid {os.getpid()} (nodekit up -r {rank} in {Path.cwd()}, since {time.strftime('%H:%M:%S')})"
    stop = f"nodekit down --node-rank {rank}"
    try:
        with hostlock.exclusive(up_lock_name(plan.project, proc.environ().get("DOCKER_HOST")), about):
            here = docker.running(plan.project)
            if here:
                raise UsageError(
                    f"node {rank} of this project already runs on this host: container {', '.join(here)}",
                    fix=f"nodekit logs --node-rank {rank} -f to follow it, or {stop} first",
                )
            yield
    except hostlock.Held as e:
        raise UsageError(
            f"node {rank} of this project is already being started or run on this host by {e.holder}",
            fix=f"wait for it, or stop it ({stop})",
        ) from None
    except hostlock.NoLockDir as e:
        raise UsageError(f"cannot lock node {rank} on this host: {e}", fix="remove it, or set XDG_RUNTIME_DIR") from (
            None
        )


def _up(
    plan: NodePlan,
    reporter: Reporter,
    *,
    detach: bool,
    on_line: Callable[[str], None],
    debug: bool,
    events: RunEvents,
) -> int:
    rank = plan.node.rank
    if not plan.image_id:  # planning did not look the image up here
        info = docker.require_image(plan.image, node=f"node {rank}")
        events.image(plan.image, info.identity, info.labels)
    else:
        events.image(plan.image, plan.image_id, {})
    events.phase(rank, "image")
    check_master_port(plan)
    path = write_compose(plan)
    reporter.step(f"starting node {plan.node.rank} ({plan.project}) from {path}")
    try:
        docker.compose_up(path, plan.project)
        events.phase(rank, "started")
        if detach:
            reporter.done(
                f"node {plan.node.rank} started in the background: nodekit logs --node-rank {plan.node.rank} -f"
            )
            return 0
        causes = Causes()  # the first traceback's exception, for the last line
        for line in follow(path, plan.project):
            on_line(line)
            causes.feed(rank, line)
        code = docker.compose_wait(path, plan.project, service=SERVICE)
        events.exited(rank, code)
    except KeyboardInterrupt as e:
        what = f"{e.name} received" if isinstance(e, proc.Interrupted) else "interrupted"
        if debug:
            # --debug keeps the container for inspection; stop it so it holds no ports or GPUs.
            reporter.warn(f"{what}: stopping node {plan.node.rank}, container kept (--debug)")
            docker.compose_stop(path, plan.project, timeout=30)
        else:
            reporter.warn(f"{what}: stopping and removing node {plan.node.rank}")
            docker.compose_down(path, plan.project, timeout=30)
        raise
    if code != 0:
        stopped = STOPPED_BY.get(code)
        # On 19 another node failed first: the quote is what the watchdog said of it, not this node's gloo error.
        said = causes.quote(rank, code) if not stopped else None
        what = f"the job exited with code {code}" + (f": {said}" if said else "")
        if stopped:
            what = f"the job was stopped from outside by {stopped} (exit {code}: {SIGNAL_FROM.split(': ', 1)[1]})"
        raise JobFailed(
            what,
            exit_code=code,
            node=f"node {plan.node.rank}",
            fix=f"nodekit logs --node-rank {plan.node.rank} (full output); nodekit up --debug for NCCL/gloo detail",
        )
    return 0


def follow(path: Path, project: str) -> Iterator[str]:
    return docker.compose_logs(path, project, follow=True)


def project_for(settings: Settings, rank: int) -> str:
    return project_name(settings.image_name, rank)


def ranks_here(settings: Settings) -> list[int]:
    """The ranks of this project's nodes whose compose project is on this host's engine (running or stopped)."""
    prefix = project_for(settings, 0).removesuffix("0")
    found = (p.removeprefix(prefix) for p in docker.compose_projects(prefix))
    return sorted(int(r) for r in found if r.isdecimal())
