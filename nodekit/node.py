"""One node of a job: plan its compose file (pure decisions on gathered facts), write it, run it.

``plan_node`` validates everything the user gave and gathers this host's facts; nothing is written until
``write_compose`` and nothing runs until ``up``. A plan that fails leaves no file behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodekit import docker, proc
from nodekit.errors import JobFailed, NetworkError, UsageError
from nodekit.fsutil import write_atomic
from nodekit.host import facts as host_facts
from nodekit.host import net
from nodekit.progress import Reporter
from nodekit.render.compose import compose_filename, project_name, render_compose, to_yaml
from nodekit.settings import Settings
from nodekit.spec import HostFacts, LaunchSpec, NodeSpec, check_rank, launch_spec, node_facts, node_spec


@dataclass(frozen=True)
class NodePlan:
    """Everything ``nodekit up`` will do on this node, printable by ``--dry-run``."""

    node: NodeSpec
    image: str
    facts: HostFacts
    compose_path: Path
    project: str
    text: str
    notes: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    job_secret: str = ""
    image_id: str = ""  # the image's id on this host when planning looked it up ("" for compose and dry runs)

    @property
    def shown(self) -> str:
        """The compose text as it may be printed: the job secret masked."""
        from nodekit.secret import masked

        return masked(self.text, self.job_secret)


def compose_path(settings: Settings, rank: int, out_dir: Path | None = None) -> Path:
    return (out_dir or settings.resolve(settings.compose_dir)) / compose_filename(rank)


def plan_node(
    settings: Settings,
    rank: int,
    main: str,
    *,
    image: str | None = None,
    debug: bool = False,
    out_dir: Path | None = None,
    facts: HostFacts | None = None,
    resolve_image: Callable[[Settings], str] | None = None,
    mounts_checked: bool = False,
    environ: Mapping[str, str] | None = None,
    image_id: Callable[[str], str] | None = None,
    job_secret: Callable[[], str] | None = None,
) -> NodePlan:
    """Validate the node and decide its compose file. Raises UsageError/ImageError; writes nothing.

    ``image_id`` looks up the chosen image's id on this host (``nodekit up`` passes one; ``compose`` and dry runs
    do not, so they never need an engine): it is rendered as NODEKIT_IMAGE_ID for preflight to compare.
    ``job_secret`` is asked for last, once everything else validated (it may create the project's secret file)."""
    launch = check_command(settings)
    check_rank(launch, rank)  # before anything slower: the most likely typo is the rank
    main_ip = net.resolve(main)
    if facts is None:
        facts = host_facts.gather(main_ip)
        if facts.iface is None:
            raise NetworkError(
                f"this host has no route to main address {main_ip}",
                fix="check the address (ip route get " + main_ip + "), or pass the address main has on this network",
                node=f"node {rank}",
            )
        if rank == 0 and settings.network == "host":
            check_main_is_here(main_ip, [a for link in net.links_here() for a in link.addrs])
    facts = node_facts(settings, rank, facts)
    node = node_spec(settings, launch, rank, main_ip, facts)
    # With facts gathered on the node itself (nodekit run), its mounts were checked there, not on this machine.
    absent = None if mounts_checked else next((m for m in node.mounts if not Path(m.host).exists()), None)
    if absent is not None:
        raise UsageError(
            f"mount {absent.host} (for {absent.container}) does not exist on node {rank}",
            fix=f"create or mount it here, or set this node's path: [nodes.{rank}] mounts = "
            f'{{ "{absent.container}" = "/its/path" }} in nodekit.toml',
        )
    notes = _notes(node, facts)
    known_id = ""  # the chosen image's id when choosing it already inspected it
    if image or resolve_image:
        ref = image or (resolve_image or _current_image)(settings)
    else:
        from nodekit.build import choose

        ref, why, known_id = choose(settings)
        notes = (*notes, f"image {ref}: {why}")
    path = compose_path(settings, rank, out_dir)
    secret = job_secret() if job_secret else ""
    found = (known_id or image_id(ref)) if image_id else ""
    doc = render_compose(
        node,
        ref,
        facts,
        output_dir=settings.resolve(settings.output_dir).absolute(),
        debug=debug,
        image_id=found,
        job_secret=secret,
    )
    hint = os.path.relpath(path, Path.cwd()) if path.is_absolute() else str(path)
    text = to_yaml(doc, rank=rank, nnodes=launch.nnodes, path_hint=hint)
    return NodePlan(
        node=node,
        image=ref,
        facts=facts,
        compose_path=path,
        project=project_name(launch.name, rank),
        text=text,
        notes=notes,
        image_id=found,
        warnings=unset_pass_env(launch.pass_env, os.environ if environ is None else environ),
        job_secret=secret,
    )


def check_command(settings: Settings) -> LaunchSpec:
    """The job's launch spec, once its training command is known to run: exactly one of script and module, and the
    script present in the project (it travels in the image). ``nodekit run`` asks this before anything is checked,
    shipped or started on any host; UsageError otherwise."""
    launch = launch_spec(settings)
    if launch.command.script is not None and not settings.resolve(Path(launch.command.script)).is_file():
        raise UsageError(
            f"training script {launch.command.script} not found in {settings.project_dir}",
            fix=f"create it, or set script in {settings.project_dir / 'nodekit.toml'} to an existing file",
        )
    return launch


def unset_pass_env(names: tuple[str, ...], environ: Mapping[str, str]) -> tuple[str, ...]:
    """A warning for each pass_env variable this shell lacks (the job would run without it)."""
    return tuple(
        f"pass_env {n} is not set in this shell: the job runs without it (export {n}=... before nodekit up)"
        for n in names
        if n not in environ
    )


def check_main_is_here(main_ip: str, addrs: list[str]) -> None:
    """Node 0 hosts the rendezvous at the main address, so that address must be this machine's (loopback is: an
    all-local run). Otherwise every other node would wait for a main that is not there until its timeout."""
    if net.is_loopback(main_ip) or any(_same_ip(main_ip, a) for a in addrs):
        return
    here = ", ".join(a for a in addrs if not net.is_loopback(a.split("%", 1)[0])) or "none but loopback"
    raise UsageError(
        f"node rank 0 is main, but main address {main_ip} is not one of this machine's addresses ({here})",
        fix="run node 0 on the machine that has that address, or pass --main with one of the addresses above",
        node="node 0",
    )


def _same_ip(a: str, b: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b.split("%", 1)[0])
    except ValueError:
        return False


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


def _current_image(settings: Settings) -> str:
    from nodekit.build import current_image

    return current_image(settings)


def image_id_here(rank: int) -> Callable[[str], str]:
    """The image-id lookup ``nodekit up`` plans with: the image must be on this host (ImageError otherwise)."""

    def lookup(ref: str) -> str:
        # No separate engine check first (docker version + docker compose version: 0.7 s here): a missing engine
        # fails this inspect, a missing Compose plugin fails `compose up`, each with its own message and fix.
        return docker.require_image(ref, node=f"node {rank}").id

    return lookup


def write_compose(plan: NodePlan) -> Path:
    # 0600 when it carries the job secret: another user on this host must not read it and join the job.
    write_atomic(plan.compose_path, plan.text, mode=0o600 if plan.job_secret else 0o644)
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


def up(plan: NodePlan, reporter: Reporter, *, detach: bool, on_line: Callable[[str], None], debug: bool = False) -> int:
    """Write the compose file, start the node's container, and unless ``detach`` follow it to its end.

    Returns the job's exit code (0 when detached). Ctrl-C, or SIGTERM/SIGHUP under :func:`nodekit.proc.stopping`
    (the CLI's), stops and removes the container (with ``debug``: stops it and keeps it for inspection), then the
    interrupt goes on (the CLI exits 128 + the signal). ``compose up`` runs in a process group of its own, which
    the signal ended before this ``down``: nothing can create the container after it.
    """
    for warning in plan.warnings:
        reporter.warn(warning)
    if not plan.image_id:  # planning did not look the image up here
        docker.require_image(plan.image, node=f"node {plan.node.rank}")
    check_master_port(plan)
    path = write_compose(plan)
    reporter.step(f"starting node {plan.node.rank} ({plan.project}) from {path}")
    try:
        docker.compose_up(path, plan.project)
        if detach:
            reporter.done(
                f"node {plan.node.rank} started in the background: nodekit logs --node-rank {plan.node.rank} -f"
            )
            return 0
        for line in follow(path, plan.project):
            on_line(line)
        code = docker.compose_wait(path, plan.project)
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
        raise JobFailed(
            f"the job exited with code {code}",
            exit_code=code,
            node=f"node {plan.node.rank}",
            fix=f"nodekit logs --node-rank {plan.node.rank} (full output); nodekit up --debug for NCCL/gloo detail",
        )
    return 0


def follow(path: Path, project: str) -> Iterator[str]:
    return docker.compose_logs(path, project, follow=True)


def project_for(settings: Settings, rank: int) -> str:
    return project_name(settings.image_name, rank)
