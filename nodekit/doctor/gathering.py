"""Gathering the doctor's facts: the only part of a worker's or main's check that runs commands, opens sockets or
talks to Docker.

:func:`gather` collects everything :func:`nodekit.doctor.checks.rows` looks at into one :class:`DoctorFacts` and keeps
the whole run under ten seconds by doing the slow parts (Docker, the TCP probes toward main, the firewall) side by side
with bounded waits. What it finds wrong (no engine, no image, no route to main) lands in the facts as data. The host
facts come from :mod:`nodekit.system.host`, the TCP probe from :mod:`nodekit.doctor.handshake`; the containers are run
through :mod:`nodekit.system.docker`. :func:`parse_container_probe` is the pure reader of :data:`CONTAINER_SCRIPT`'s
output."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

from nodekit.config.settings import Settings
from nodekit.doctor import handshake
from nodekit.doctor.handshake import Probe
from nodekit.doctor.model import ContainerCheck, ContainerView, DoctorFacts, EngineCheck, ImageCheck, is_main_node
from nodekit.errors import NodekitError, UsageError
from nodekit.job.container import ulimits
from nodekit.launcher.contract import preflight_port_for
from nodekit.system.host import facts as host_facts
from nodekit.system.host import net
from nodekit.system.host.facts import HostFacts

CONTAINER_WAIT_S = 7.0

CONTAINER_SCRIPT = (
    'echo "memlock $(ulimit -S -l)"; echo "stack $(ulimit -S -s)"; echo "nofile $(ulimit -S -n)"; '
    'echo "shm $(df -kP /dev/shm | tail -n 1)"'
)


def parse_container_probe(image: str, text: str) -> ContainerView:
    """CONTAINER_SCRIPT's output: ulimit values in KiB (memlock, stack) or counts (nofile), df -kP, nvidia-smi -L."""
    values: dict[str, int | None] = {}
    gpus = []
    shm = None
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("memlock", "stack", "nofile"):
            rest = rest.strip()
            scale = 1 if key == "nofile" else 1024
            with contextlib.suppress(ValueError):
                values[key] = None if rest == "unlimited" else int(rest) * scale
        elif key == "shm":
            cols = rest.split()
            with contextlib.suppress(IndexError, ValueError):
                shm = int(cols[1]) * 1024
        elif line.startswith("GPU "):
            gpus.append(line)
    return ContainerView(
        image=image,
        memlock=values.get("memlock"),
        stack=values.get("stack"),
        nofile=values.get("nofile"),
        shm=shm,
        gpus=tuple(gpus),
    )


def gather(settings: Settings, *, main: str | None, rank: int | None, probe_timeout: float = 3.0) -> DoctorFacts:
    """Collect every fact the checks need, in parallel, in well under ten seconds."""
    main_ip: str | None = None
    main_error = None
    if main is not None:
        try:
            main_ip = net.resolve(main)
        except UsageError as e:
            main_error = e
    ports = (settings.master_port, preflight_port_for(settings.master_port))
    with ThreadPoolExecutor(max_workers=6) as pool:
        engine_f = pool.submit(_engine)
        firewall_f = pool.submit(host_facts.firewall)
        name_f = pool.submit(host_facts.hostname_addrs)
        route_f = pool.submit(net.route_to, main_ip) if main_ip is not None else None
        # The route toward main is asked once, here; the host facts need not repeat it.
        host = host_facts.gather(None)
        route = route_f.result() if route_f is not None else None
        here = main_ip is not None and (net.is_loopback(main_ip) or (route is not None and route.local))
        mtu = net.mtu(route.iface) if route else None
        probes: tuple[Probe, ...] = ()
        holders: tuple[tuple[int, str | None], ...] = ()
        if is_main_node(rank, here):
            holders = tuple((p, net.port_holder(p)) for p in ports if net.port_in_use(p))
        elif main_ip is not None and route is not None:
            about = {"rank": str(rank), "host": name_f.result()[0], "iface": route.iface, "mtu": str(mtu or "")}
            hello = handshake.hello_line(about)
            futures = [
                pool.submit(handshake.probe, main_ip, p, hello=hello, connect_timeout=probe_timeout) for p in ports
            ]
            probes = tuple(fut.result() for fut in futures)
        engine = engine_f.result()
        image, containers = _image_and_container(settings, engine, host)
        hostname, addrs = name_f.result()
        firewall = firewall_f.result()
    return DoctorFacts(
        settings=settings,
        rank=rank,
        main=main,
        main_ip=main_ip,
        main_error=main_error,
        main_is_here=here,
        host=host,
        route=route,
        mtu=mtu,
        probes=probes,
        holders=holders,
        port_range=net.local_port_range(),
        reserved=net.reserved_ports(),
        firewall=firewall,
        hostname=hostname,
        hostname_addrs=addrs,
        engine=engine,
        image=image,
        containers=containers,
        toolkit=host_facts.nvidia_container_toolkit(),
        host_shm=host_facts.shm_bytes(),
        host_nofile=host.nofile_hard,
    )


def _engine() -> EngineCheck:
    from nodekit.system import docker

    try:
        info = docker.check_engine()
    except NodekitError as e:
        failed = "compose" if "Compose" in e.message else "buildx" if "Buildx" in e.message else "engine"
        return EngineCheck(error=e.message, fix=e.fix, failed=failed)
    return EngineCheck(server=info.server_version, compose=info.compose_version, buildx=info.buildx_version)


def _image_and_container(settings: Settings, engine: EngineCheck, host: HostFacts) -> tuple[ImageCheck, ContainerCheck]:
    if engine.failed is not None:
        unchecked = ImageCheck(error="not checked: no usable Docker engine", fix=engine.fix)
        return unchecked, ContainerCheck(note="no engine")
    image = _image(settings)
    if not image.present or image.ref is None:
        return image, ContainerCheck(note="no image built")
    return image, _run_containers(image.ref, host)


def _image(settings: Settings) -> ImageCheck:
    from nodekit.system import docker

    try:
        from nodekit.image.builder import current_image
        from nodekit.image.plan import LABEL_FINGERPRINT
    except ImportError:
        return ImageCheck(error="this nodekit has no build module to find the image", fix="nodekit build")
    try:
        ref = current_image(settings)
        info = docker.image_info(ref)
    except NodekitError as e:
        return ImageCheck(error=e.message, fix=e.fix)
    if info is None:
        return ImageCheck(ref=ref, present=False)
    return ImageCheck(ref=ref, present=True, fingerprint=info.labels.get(LABEL_FINGERPRINT))


def _run_containers(ref: str, host: HostFacts) -> ContainerCheck:
    """Start ``ref`` as the job's container starts (limits, IPC), and on a GPU node also with every GPU.

    Two containers side by side rather than one: a missing NVIDIA runtime must not hide the limits.
    """
    from nodekit.system import docker

    limits = [f"{u.name}={u.soft}:{u.hard}" for u in ulimits(host)]

    def run(script: str, gpus: bool) -> tuple[str | None, str | None]:
        try:
            return docker.run_as_job(ref, script, ulimits=limits, gpus=gpus, timeout=CONTAINER_WAIT_S), None
        except NodekitError as e:
            return None, e.message

    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = pool.submit(run, CONTAINER_SCRIPT, False)
        with_gpus = pool.submit(run, "nvidia-smi -L", True) if host.gpu_count > 0 else None
        out, error = plain.result()
        gpu_out, gpu_error = with_gpus.result() if with_gpus is not None else (None, None)
    view = parse_container_probe(ref, (out or "") + (gpu_out or "")) if out is not None else None
    if view is None and gpu_out is not None:
        view = parse_container_probe(ref, gpu_out)
    return ContainerCheck(view=view, error=error if view is None else None, gpu_error=gpu_error)
