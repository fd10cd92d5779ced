"""Where a planned job can run: one registration per backend, the one place a new backend is named outside its own
folder (``nodekit/backends/<name>/``) and its CLI module (``nodekit/cli/<topic>.py``), in the spirit of torchx's
``get_scheduler_factories``.

Derived from :data:`BACKENDS`, never kept by hand: the CLI's topic modules and their order in ``--help``
(``nodekit.cli.common.TOPICS``, imported by ``nodekit.cli.app``), the nodekit.toml tables (:class:`BackendTables`,
which ``Settings`` extends; the reference page is generated from the settings model), how an error names a key of a
backend's table (``[slurm] time``: ``nodekit.config.file.shown_key``), and the commands whose runs are recorded
(``nodekit.runs.model.Command``). A backend's table model is defined here, beside its registration (not in
``nodekit/backends/<name>/``: ``Settings`` is read on the configuration floor, below every backend, and a floor never
imports one above it). ``tests/unit/config/test_backends.py`` adds a throwaway backend to a copy of the package
touching only its folder, its CLI module and this file.

This module sits on the configuration floor so that every floor above (runs, backends, cli) may read it; it names
the CLI modules and backend folders only as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nodekit.config.inputs import docker_host_problem, image_ref_problem, sbatch_option_problem
from nodekit.config.tables import checked


@dataclass(frozen=True)
class Backend:
    """One backend: ``name`` is its folder under ``nodekit/backends/`` and the ``backend`` of the plans it returns
    (``nodekit.backends.shape.BackendPlan``); ``topic`` its CLI module under ``nodekit/cli/``; ``commands`` the
    commands there that plan a job and print that plan on ``--dry-run``; ``records`` those of them whose runs go to
    ``.nodekit/runs``; ``table`` its nodekit.toml table, a field of :class:`BackendTables` (None: it has none)."""

    name: str
    topic: str
    commands: tuple[str, ...]
    records: tuple[str, ...] = ()
    table: str | None = None


BACKENDS: tuple[Backend, ...] = (
    Backend("compose", topic="nodes", commands=("compose", "up"), records=("up",)),
    Backend("fleet", topic="fleet", commands=("run",), records=("run",)),
    Backend("slurm", topic="slurm", commands=("slurm",), records=("slurm",), table="slurm"),
    Backend("k8s", topic="k8s", commands=("k8s",), table="k8s"),
)


class SlurmSettings(BaseModel):
    """``[slurm]``: how ``nodekit slurm`` hands the job to Slurm (sbatch options, container mode, shared paths)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    container: Literal["docker", "charliecloud", "pyxis"] = Field(
        "docker",
        description="docker: each node's Docker engine; charliecloud: ch-run of a SquashFS made here; pyxis: "
        "srun --container-image (enroot)",
    )
    partition: str | None = Field(None, description="sbatch --partition (default: the cluster's default)")
    account: str | None = Field(None, description="sbatch --account")
    time: str | None = Field(None, description='sbatch --time, e.g. "2:00:00"')
    gpus_per_node: int = Field(0, ge=0, description="sbatch --gpus-per-node, and the GPUs each node's container gets")
    sbatch_args: tuple[str, ...] = Field(
        (),
        description='more sbatch options, one per item, e.g. ["--qos=high", "--exclusive", "--cpus-per-task=16"] '
        "(not --nodes, --ntasks-per-node or --output: nodekit sets those)",
    )
    image_dir: Path = Field(
        Path(".nodekit/slurm"),
        description="charliecloud and pyxis: where the image's SquashFS goes; must be a path every node reads",
    )
    push_to: tuple[str, ...] = Field(
        (), description='docker: engines to push the image to before submitting, e.g. ["ssh://me@n1", "ssh://me@n2"]'
    )
    docker_host: str | None = Field(None, description="docker: the nodes' engine (default: each node's own default)")

    @field_validator("docker_host")
    @classmethod
    def _docker_host(cls, v: str | None) -> str | None:
        return checked(v, docker_host_problem, 'docker_host = "unix:///var/run/docker.sock" (or tcp://host:2376)')

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for item in v:
            checked(item, sbatch_option_problem, 'write each option as one item, "--name=value" or "--flag"')
        return v

    @field_validator("push_to")
    @classmethod
    def _push_to(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            checked(url, docker_host_problem, 'push_to = ["ssh://me@node1", "ssh://me@node2"]')
        return v


class K8sSettings(BaseModel):
    """``[k8s]``: what ``nodekit k8s`` needs beyond the job itself (nodekit/backends/k8s/render.py); names are checked
    there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = Field(None, description="Job, Service and TrainJob name (default: the project's name)")
    namespace: str | None = Field(None, description="namespace of every manifest (default: none: kubectl's own)")
    image: str | None = Field(
        None,
        description="the image as the cluster pulls it, e.g. registry.example.com/team/demo:<tag> "
        "(default: the last image built here, which only nodes that have it preloaded can run)",
    )
    image_pull_secret: str | None = Field(None, description="Secret with the registry's credentials")

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return checked(v, image_ref_problem, 'image = "registry.example.com/team/demo:1.0"')

    gpus: int | None = Field(
        None, ge=0, le=64, description="nvidia.com/gpu per pod (default: [nodes.R] gpus when every node agrees, else 0)"
    )
    host_network: bool = Field(False, description="pods on the nodes' network (hostNetwork), e.g. for RDMA NICs")
    shm_size: str | None = Field(None, description="size limit of the memory-backed /dev/shm, e.g. 16Gi")
    claims: dict[str, str] = Field(
        default_factory=dict,
        description="container path -> PersistentVolumeClaim for [[mounts]] and /outputs; other mounts are hostPath",
    )
    backoff_limit: int = Field(0, ge=0, description="Job retries of a failed pod (exit codes 2, 17, 19 never retry)")
    runtime: str = Field("torch-distributed", description="--trainjob: the Kubeflow Trainer runtime it references")
    out_dir: Path = Field(Path("k8s"), description="where nodekit k8s writes its manifests")


class BackendTables(BaseModel):
    """The backends' nodekit.toml tables, one field each (its name is a registration's ``table``)."""

    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="nodekit slurm ([slurm])")
    k8s: K8sSettings = Field(default_factory=K8sSettings, description="nodekit k8s: the Kubernetes manifests ([k8s])")


def backend(name: str) -> Backend:
    """The registration called ``name`` (KeyError for none)."""
    found = {b.name: b for b in BACKENDS}
    return found[name]


def topics() -> tuple[str, ...]:
    """The backends' CLI modules, in registration order (each once)."""
    return tuple(dict.fromkeys(b.topic for b in BACKENDS))


def tables() -> tuple[str, ...]:
    """The backends' nodekit.toml tables."""
    return tuple(b.table for b in BACKENDS if b.table is not None)


def recorded() -> tuple[str, ...]:
    """The commands whose runs are recorded in ``.nodekit/runs``."""
    return tuple(c for b in BACKENDS for c in b.records)
