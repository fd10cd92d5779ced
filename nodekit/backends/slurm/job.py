"""What a Slurm job of the project is, decided before anything is written or submitted.

:func:`plan_job` is pure but for whether the training script exists (and the working directory, for a comment it
drops): it takes the settings and the facts gathered beforehand (the image's configuration, the job secret, the
path of the converted image) and returns a frozen :class:`SlurmJob`, which ``render`` turns into the sbatch script.
Each rank's container is what ``nodekit up`` would run on that node: the same node world
(:func:`nodekit.job.gather.gather_node`, here from given values only) and planning
(:func:`nodekit.backends.compose.node.plan_node`),
parsed back into a typed :class:`NodeRun`. Main's address and the rank are left to the job (only Slurm knows which
hosts it gets): the script fills them in per task.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from nodekit.backends.compose.render import SERVICE, map_strings
from nodekit.config.settings import Settings
from nodekit.errors import UsageError
from nodekit.system.host.facts import HostFacts

Mode = Literal["docker", "charliecloud", "pyxis"]
MODES: tuple[str, ...] = get_args(Mode)
# Stands for main's address while planning (TEST-NET-1, RFC 5737: never a real host). The job resolves the first
# host of its allocation and each task puts that address where this one was.
PLACEHOLDER_MAIN = "192.0.2.1"
# Variables whose value each task decides at run time (render.py maps them to the task's shell variables).
RANK_ENV = "NODE_RANK"
MAIN_ENV = "MASTER_ADDR"
IMAGE_ID_ENV = "NODEKIT_IMAGE_ID"
RANK_LABEL = "org.nodekit.rank"
LOG_NAME = "slurm-%j.out"


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool
    create: bool  # the host directory is made when missing (the outputs directory), as compose does


@dataclass(frozen=True)
class NodeRun:
    """One rank's container, as nodekit's compose rendering describes it for ``nodekit up``."""

    rank: int
    image: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...]  # None: passed by name from the job's environment (pass_env)
    labels: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    ulimits: tuple[tuple[str, int, int], ...]
    gpus: int | Literal["all"] | None
    devices: tuple[str, ...]
    cap_add: tuple[str, ...]
    network: str
    ipc: str
    init: bool
    workdir: str
    stop_grace_s: int | None


@dataclass(frozen=True)
class ImageFacts:
    """What the image says of itself (``docker image inspect``), gathered before planning."""

    ref: str
    id: str
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] = ()
    workdir: str = ""

    @classmethod
    def of(cls, ref: str, inspected: Mapping[str, Any]) -> ImageFacts:
        config = inspected.get("Config") or {}
        pairs = [str(e).partition("=") for e in config.get("Env") or ()]
        env = tuple((k, v) for k, sep, v in pairs if sep)
        return cls(
            ref=ref,
            id=str(inspected.get("Id", "")),
            env=env,
            entrypoint=tuple(config.get("Entrypoint") or ()),
            workdir=str(config.get("WorkingDir") or ""),
        )


@dataclass(frozen=True)
class Sbatch:
    """The job's ``#SBATCH`` options."""

    job_name: str
    nodes: int
    output: str
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmJob:
    name: str
    mode: Mode
    image: ImageFacts
    image_path: str  # charliecloud, pyxis: the SquashFS on a shared path; docker: ""
    sbatch: Sbatch
    nodes: tuple[NodeRun, ...]
    output_dir: str
    docker_host: str | None = None
    job_secret: str = ""
    notes: tuple[str, ...] = ()


def check_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise UsageError(
            f"unknown Slurm container mode {mode!r} (one of {', '.join(MODES)})",
            fix='set [slurm] container = "docker" (or "charliecloud", "pyxis") in nodekit.toml, or pass --container',
        )
    return mode  # type: ignore[return-value]


def plan_job(
    settings: Settings,
    image: ImageFacts,
    *,
    mode: Mode,
    job_secret: str,
    image_path: str = "",
    debug: bool = False,
    environ: Mapping[str, str] | None = None,
) -> SlurmJob:
    """The job, every rank planned as ``nodekit up`` plans a node. Raises UsageError; reads nothing itself but
    whether the training script exists.

    ``environ`` is the submitting shell's environment, only to warn about unset ``pass_env`` variables (Slurm
    passes that environment on to the job)."""
    from nodekit.backends.compose.node import plan_node
    from nodekit.job.gather import gather_node

    check_mode(mode)
    if settings.network != "host":
        raise UsageError(
            f'network = "{settings.network}" cannot span Slurm nodes (NCCL and gloo need the hosts\' addresses)',
            fix="remove network from nodekit.toml (host networking) for nodekit slurm",
        )
    slurm = settings.slurm
    facts = HostFacts(gpu_count=slurm.gpus_per_node)
    runs, notes = [], []
    for rank in range(settings.nnodes):
        # Gathered with everything given (facts, image, id, secret, environment): no host or engine is asked; the
        # training script's presence is the one thing read (as nodekit up refuses a missing one).
        world = gather_node(
            settings, rank, PLACEHOLDER_MAIN, image=image.ref, facts=facts, mounts_checked=True,
            image_id=lambda _ref: image.id, job_secret=lambda: job_secret, environ=environ or {},
        )  # fmt: skip
        plan = plan_node(settings, rank, world, debug=debug)
        runs.append(node_run(yaml.safe_load(plan.text), rank))
        notes += [w for w in plan.warnings if w not in notes]
    if mode == "pyxis" and len({r.mounts for r in runs}) > 1:
        raise UsageError(
            'container = "pyxis" mounts the same paths on every node (one srun --container-mounts), but '
            "[nodes.R] mounts gives nodes different ones",
            fix='remove the per-node mounts, or use container = "docker" or "charliecloud"',
        )
    output_dir = settings.resolve(settings.output_dir).absolute()
    sbatch = Sbatch(
        job_name=settings.image_name,
        nodes=settings.nnodes,
        output=str(output_dir / LOG_NAME),
        gpus_per_node=slurm.gpus_per_node,
        partition=slurm.partition,
        account=slurm.account,
        time=slurm.time,
        extra=slurm.sbatch_args,
    )
    return SlurmJob(
        name=settings.image_name,
        mode=mode,
        image=image,
        image_path=image_path,
        sbatch=sbatch,
        nodes=tuple(runs),
        output_dir=str(output_dir),
        docker_host=slurm.docker_host,
        job_secret=job_secret,
        notes=tuple(notes),
    )


_KNOWN = {
    "image", "command", "environment", "labels", "volumes", "ulimits", "deploy", "devices", "cap_add",
    "network_mode", "ipc", "restart", "stop_grace_period", "init", "working_dir", "pull_policy",
}  # fmt: skip


def node_run(doc: Mapping[str, Any], rank: int) -> NodeRun:
    """The typed container of one rank from its compose document. A key nodekit's compose rendering gained and
    this does not know is an error, not a silently different container."""
    svc: dict[str, Any] = _read_back(doc["services"][SERVICE])
    unknown = sorted(set(svc) - _KNOWN)
    if unknown:
        raise ValueError(f"compose keys {unknown} have no translation for Slurm (nodekit/backends/slurm/job.py)")
    if svc.get("restart", "no") != "no":
        raise ValueError(f"restart {svc['restart']!r} has no translation for Slurm")
    if svc.get("pull_policy", "never") != "never":
        # every mode runs the image the job script made reachable (docker run --pull=never, a squashfs file)
        raise ValueError(f"pull_policy {svc['pull_policy']!r} has no translation for Slurm")
    return NodeRun(
        rank=rank,
        image=svc["image"],
        command=tuple(svc.get("command") or ()),
        env=tuple((k, None if v is None else str(v)) for k, v in (svc.get("environment") or {}).items()),
        labels=tuple((k, str(v)) for k, v in (svc.get("labels") or {}).items()),
        mounts=tuple(_mount(v) for v in svc.get("volumes") or ()),
        ulimits=tuple((k, int(v["soft"]), int(v["hard"])) for k, v in (svc.get("ulimits") or {}).items()),
        gpus=_gpus(svc.get("deploy")),
        devices=tuple(svc.get("devices") or ()),
        cap_add=tuple(svc.get("cap_add") or ()),
        network=str(svc.get("network_mode", "")),
        ipc=str(svc.get("ipc", "")),
        init=bool(svc.get("init", False)),
        workdir=str(svc.get("working_dir", "")),
        stop_grace_s=_seconds(svc["stop_grace_period"]) if "stop_grace_period" in svc else None,
    )


def _read_back(value: Any) -> Any:
    """A compose value as Compose reads it: the rendering writes every ``$`` of a value as ``$$`` (literal values,
    no interpolation from the runner's shell); the script says each value exactly once more, shell-quoted."""
    return map_strings(value, lambda s: s.replace("$$", "$"))


def _mount(v: Mapping[str, Any]) -> Mount:
    if v.get("type") != "bind":
        raise ValueError(f"volume {v} is not a bind mount")
    return Mount(
        source=str(v["source"]),
        target=str(v["target"]),
        read_only=bool(v.get("read_only", False)),
        create=bool((v.get("bind") or {}).get("create_host_path", False)),
    )


def _gpus(deploy: Mapping[str, Any] | None) -> int | Literal["all"] | None:
    if not deploy:
        return None
    (device,) = deploy["resources"]["reservations"]["devices"]
    count = device["count"]
    return "all" if count == "all" else int(count)


def _seconds(value: object) -> int:
    found = re.fullmatch(r"(\d+)s", str(value))
    if not found:
        raise ValueError(f"stop_grace_period {value!r} is not in seconds")
    return int(found.group(1))


def squash_name(name: str, image_id: str) -> str:
    """The converted image's file name: one per image id, so a shared cache never serves another image."""
    return f"{name}-{image_id.removeprefix('sha256:')[:16]}.sqsh"


def image_path(settings: Settings, image_id: str) -> Path:
    return settings.resolve(settings.slurm.image_dir).absolute() / squash_name(settings.image_name, image_id)
