"""The only reader of ``nodekit.toml`` and ``NODEKIT_*`` variables.

One precedence, highest first: command-line flags > ``NODEKIT_*`` environment variables > ``nodekit.toml`` >
defaults. Flags arrive as keyword arguments of :func:`load`; a flag the user did not give is simply absent.
The file is found at ``--config``/``NODEKIT_CONFIG``, else ``./nodekit.toml``; its directory is the project root.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from nodekit.errors import ConfigError

CONFIG_FILE = "nodekit.toml"
DEFAULT_TORCH = "torch==2.13.0"
FABRIC_SETTINGS = ("accelerator", "strategy", "precision")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the launcher and torchrun own: a user value would silently break the rendezvous or the stack check.
_RESERVED_ENV = frozenset(
    {"WORLD_SIZE", "NODE_RANK", "NNODES", "NPROC_PER_NODE", "RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"}
)
# nodekit variables that are the user's switches, documented for the env table.
_USER_SWITCHES = frozenset({"NODEKIT_EXIT_GUARD"})


def reserved_env(key: str) -> bool:
    """Whether ``key`` is one of nodekit's own variables, which the ``env`` table may not set."""
    if key in _USER_SWITCHES:
        return False
    return key.startswith(("NODEKIT_", "MASTER_")) or key in _RESERVED_ENV


_IMAGE_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")


class Mount(BaseModel):
    """One ``[[mounts]]`` entry: a host directory (or file) in the job, read-only unless ``writable``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(description="absolute path on the host (per node: [nodes.R] mounts)")
    container: str = Field(description="absolute path in the container")
    writable: bool = Field(False, description="mount read-write (default read-only)")
    check: Literal["none", "sizes", "hashes"] = Field(
        "none", description="same data on every node: compare relative paths and sizes, or also content hashes"
    )

    @field_validator("host", "container")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"mount path {v!r} is not absolute")
        return v.rstrip("/") or "/"


class NodeOverride(BaseModel):
    """Per-node settings under ``[nodes.<rank>]``; anything unset is detected on that node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iface: str | None = Field(None, description="network interface toward main (GLOO/NCCL_SOCKET_IFNAME)")
    addr: str | None = Field(None, description="this node's own address toward main")
    nproc_per_node: int | Literal["auto"] | None = Field(
        None, description="this node's processes (heterogeneous nodes)"
    )
    gpus: int | None = Field(None, ge=0, description="this node's GPU count, where nodes differ")
    mounts: dict[str, str] = Field(default_factory=dict, description="container path -> this node's host path")

    @field_validator("mounts")
    @classmethod
    def _absolute(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [p for kv in v.items() for p in kv if not p.startswith("/")]
        if bad:
            raise ValueError(f"mount path {bad[0]!r} is not absolute")
        return {k.rstrip("/") or "/": p for k, p in v.items()}


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
        (), description='more sbatch options, e.g. ["--qos=high", "--exclusive", "--cpus-per-task=16"]'
    )
    image_dir: Path = Field(
        Path(".nodekit/slurm"),
        description="charliecloud and pyxis: where the image's SquashFS goes; must be a path every node reads",
    )
    push_to: tuple[str, ...] = Field(
        (), description='docker: engines to push the image to before submitting, e.g. ["ssh://me@n1", "ssh://me@n2"]'
    )
    docker_host: str | None = Field(None, description="docker: the nodes' engine (default: each node's own default)")


class K8sSettings(BaseModel):
    """``[k8s]``: what ``nodekit k8s`` needs beyond the job itself (nodekit/render/k8s.py); names are checked there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = Field(None, description="Job, Service and TrainJob name (default: the project's name)")
    namespace: str | None = Field(None, description="namespace of every manifest (default: none: kubectl's own)")
    image: str | None = Field(
        None,
        description="the image as the cluster pulls it, e.g. registry.example.com/team/demo:<tag> "
        "(default: the last image built here, which only nodes that have it preloaded can run)",
    )
    image_pull_secret: str | None = Field(None, description="Secret with the registry's credentials")
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


class Settings(BaseSettings):
    """Everything a user configures. Field docs double as the reference in ``nodekit init``'s starter file."""

    model_config = SettingsConfigDict(env_prefix="NODEKIT_", frozen=True, extra="forbid", env_parse_none_str="")

    # image
    name: str | None = Field(None, description="image name; the image is tagged nodekit/<name>:<fingerprint>")
    base_image: str = Field("nodekit/base:bookworm", description="base image (pin by digest on a real cluster)")
    python_version: str | None = Field(
        None, description="the base image's Python (wheels are resolved for it); default: probed from the base"
    )
    wheel_platform: str | None = Field(
        None, description="the image's wheel platform tag (manylinux_2_36_x86_64); default: probed from the base"
    )
    index_url: str | None = Field(None, description="package index for lock and wheelhouse (pip --index-url)")
    extra_index_urls: tuple[str, ...] = Field(
        (), description="more indexes, e.g. https://download.pytorch.org/whl/cu124 for a +cu124 torch"
    )
    find_links: tuple[str, ...] = Field((), description="directories or pages of wheels (pip --find-links)")
    packages: tuple[str, ...] = Field((DEFAULT_TORCH,), description="Python requirements installed in the image")
    # launch
    script: str | None = Field(None, description="training script, relative to the project root")
    module: str | None = Field(None, description="or a module to run with -m")
    args: tuple[str, ...] = Field((), description="arguments passed to the script or module")
    launcher: Literal["torchrun", "fabric", "env", "torch.distributed.launch"] = Field(
        "torchrun",
        description="torchrun; fabric (what `fabric run` does); env for frameworks that start their own workers "
        "(Lightning Trainer); torch.distributed.launch for scripts that take --local-rank/--local_rank",
    )
    accelerator: str | None = Field(
        None, description="launcher fabric: --accelerator (default: cuda on a node with GPUs, else cpu)"
    )
    strategy: str | None = Field(None, description="launcher fabric: --strategy (default ddp)")
    precision: str | None = Field(None, description="launcher fabric: --precision (default: Fabric's own)")
    nnodes: int = Field(1, ge=1, description="number of nodes (machines)")
    nproc_per_node: int | Literal["auto"] = Field("auto", description="processes per node; auto = GPUs, or 1")
    master_port: int = Field(
        29500, ge=1, le=65534, description="TCP port of the rendezvous on main (preflight uses the next one)"
    )
    max_restarts: int = Field(0, ge=0, description="torchrun --max-restarts")
    rdzv_timeout: int = Field(180, ge=1, description="seconds to wait for every node before giving up")
    peer_timeout: int = Field(
        15, ge=0, description="seconds without a node's heartbeat before the others stop, naming it; 0: never"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the job")
    pass_env: tuple[str, ...] = Field(
        (), description="variables passed by name from the shell that runs nodekit up (secrets: no value is written)"
    )
    # network
    network: Literal["host", "bridge"] = Field(
        "host", description="host (needed across machines), or bridge for runs with every node on this machine"
    )
    ib: Literal["auto", "on", "off"] = Field(
        "auto", description="InfiniBand: auto = use /dev/infiniband when present, on = require it, off = never"
    )
    # where things go on the host
    compose_dir: Path = Field(Path("compose"), description="where compose/node-<rank>.yaml files are written")
    output_dir: Path = Field(Path("outputs"), description="host directory mounted at /outputs in the job")
    nodes: dict[int, NodeOverride] = Field(default_factory=dict, description="per-node overrides")
    # fleet: `nodekit run` on the head node
    hosts: tuple[str, ...] = Field(
        (), description='the nodes\' Docker endpoints, rank = position: ["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"]'
    )
    main: str | None = Field(None, description="main's address as the other nodes reach it (default: host 0's)")
    restarts: int = Field(0, ge=0, description="nodekit run: restart the whole job on every node this many times")
    min_nodes: int | None = Field(None, ge=1, description="nodekit run: go on without lost hosts down to this many")
    relay: Literal["auto", "always", "never"] = Field(
        "auto",
        description="nodekit run and push: ssh:// nodes pass the image on to each other (agent forwarding, host keys "
        "pinned by the head) so the head sends it once; auto = when 64 MiB or more travels",
    )
    mounts: tuple[Mount, ...] = Field((), description="host directories mounted into the job ([[mounts]])")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="nodekit slurm ([slurm])")
    k8s: K8sSettings = Field(default_factory=K8sSettings, description="nodekit k8s: the Kubernetes manifests ([k8s])")

    # Set by load(): where the file was found. Not a user setting.
    project_dir: Path = Field(default_factory=Path.cwd, exclude=True)

    @field_validator("name")
    @classmethod
    def _docker_name(cls, v: str | None) -> str | None:
        if v is not None and not _IMAGE_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid image name (lowercase letters, digits, '.', '_', '-')")
        return v

    @model_validator(mode="after")
    def _node_ranks(self) -> Settings:
        outside = sorted(r for r in self.nodes if not 0 <= r < self.nnodes)
        if outside:
            raise ValueError(
                f"[nodes.{outside[0]}] is outside node ranks 0..{self.nnodes - 1} (nnodes = {self.nnodes})"
            )
        return self

    @model_validator(mode="after")
    def _mount_targets(self) -> Settings:
        targets = [m.container for m in self.mounts]
        reserved = {"/outputs", "/workspace", "/opt/venv", "/opt/nodekit"}
        clash = next((t for t in targets if targets.count(t) > 1 or t in reserved or t == "/"), None)
        if clash is not None:
            raise ValueError(
                f"mount target {clash!r} is used twice or is one of nodekit's own ({', '.join(sorted(reserved))})"
            )
        for r, o in self.nodes.items():
            unknown = next((t for t in o.mounts if t not in targets), None)
            if unknown is not None:
                raise ValueError(f"[nodes.{r}] mounts {unknown!r}, which no [[mounts]] entry mounts")
        return self

    @model_validator(mode="after")
    def _fabric_only(self) -> Settings:
        given = [k for k in FABRIC_SETTINGS if getattr(self, k) is not None]
        if given and self.launcher != "fabric":
            raise ValueError(f'{", ".join(given)} only apply to launcher = "fabric" (launcher is {self.launcher!r})')
        return self

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in v if not ENV_NAME.match(n)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a valid environment variable name (letters, digits, _)")
        return tuple(dict.fromkeys(v))

    @field_validator("peer_timeout")
    @classmethod
    def _beats(cls, v: int) -> int:
        if 0 < v < 3:  # nodes beat once a second; the launcher refuses less than 3 (nodekit/launcher/config.py)
            raise ValueError("must be 0 (no peer watchdog) or at least 3 seconds")
        return v

    @field_validator("env")
    @classmethod
    def _not_ours(cls, v: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in v if reserved_env(k))
        if taken:
            raise ValueError(
                f"{', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by nodekit itself "
                "(NODEKIT_*, MASTER_*, ranks and sizes); use the matching setting or flag instead"
            )
        return v

    @field_validator("packages")
    @classmethod
    def _need_packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one package is needed (torch)")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls, _config_file.get()))

    @property
    def image_name(self) -> str:
        """The configured name, else the project directory's name made valid for Docker."""
        if self.name:
            return self.name
        cleaned = re.sub(r"[^a-z0-9._-]+", "-", self.project_dir.resolve().name.lower()).strip("._-")
        return cleaned or "app"

    def resolve(self, path: Path) -> Path:
        """A configured path, relative to the project root."""
        return path if path.is_absolute() else self.project_dir / path


_config_file: ContextVar[Path | None] = ContextVar("nodekit_config_file", default=None)


class _TomlSource(PydanticBaseSettingsSource):
    """nodekit.toml, read once; an absent file contributes nothing."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        if path is not None and path.is_file():
            try:
                self._data = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{path} is not valid TOML: {e}", fix=f"edit {path}") from e

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def config_path(explicit: Path | None, environ: Mapping[str, str]) -> Path:
    """Where the configuration file is: the flag, else NODEKIT_CONFIG, else ./nodekit.toml."""
    if explicit is not None:
        return explicit
    if environ.get("NODEKIT_CONFIG"):
        return Path(environ["NODEKIT_CONFIG"])
    return Path(CONFIG_FILE)


def load(config: Path | None = None, **flags: Any) -> Settings:
    """Settings from flags (keyword arguments; None means "not given"), environment, file, defaults.

    Raises ConfigError with the offending field and source when validation fails.
    """
    path = config_path(config, os.environ).absolute()
    if config is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist", fix="nodekit init, or pass the right --config")
    if config is None and os.environ.get("NODEKIT_CONFIG") and not path.is_file():
        raise ConfigError(
            f"NODEKIT_CONFIG names {path}, which does not exist", fix="unset NODEKIT_CONFIG or point it at the file"
        )
    given = {k: v for k, v in flags.items() if v is not None}
    token = _config_file.set(path)
    try:
        return Settings(project_dir=path.parent, **given)
    except SettingsError as e:  # a NODEKIT_* value for a list or table field that is not JSON
        found = re.search(r'field "(\w+)"', str(e))
        where = found.group(1) if found else "config"
        raise ConfigError(
            f"invalid setting {where}: NODEKIT_{where.upper()} is not valid JSON",
            fix=f'write NODEKIT_{where.upper()} as JSON (e.g. \'["a", "b"]\' or \'{{"KEY": "value"}}\'), or unset it',
        ) from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "config"
        raise ConfigError(
            f"invalid setting {where}: {err['msg']}",
            fix=f"fix {where} in {path.name}, NODEKIT_{where.upper()} or the flag",
        ) from None
    finally:
        _config_file.reset(token)
