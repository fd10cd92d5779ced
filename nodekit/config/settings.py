"""The only reader of ``nodekit.toml`` and ``NODEKIT_*`` variables.

One precedence, highest first: command-line flags > ``NODEKIT_*`` environment variables > ``nodekit.toml`` >
defaults. Flags arrive as keyword arguments of :func:`load`; a flag the user did not give is simply absent.
The file is found at ``--config``/``NODEKIT_CONFIG``, else ``./nodekit.toml``; its directory is the project root.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from nodekit.config import across, inputs
from nodekit.config import file as config_file
from nodekit.config.across import FABRIC_SETTINGS as FABRIC_SETTINGS
from nodekit.config.across import node_rank_problem as node_rank_problem
from nodekit.config.across import reserved_env as reserved_env
from nodekit.config.backends import BackendTables
from nodekit.config.backends import K8sSettings as K8sSettings
from nodekit.config.backends import SlurmSettings as SlurmSettings
from nodekit.config.file import CONFIG_FILE, config_path
from nodekit.config.inputs import ENV_NAME, MAX_NODES, MAX_TIMEOUT_S, MIN_PEER_TIMEOUT, MIN_STALL_TIMEOUT
from nodekit.config.tables import (
    Bad,
    HealthSettings,
    Mount,
    NodeOverride,
    NotifySettings,
    NProc,
    checked,
)
from nodekit.errors import ConfigError
from nodekit.launcher.contract import DEFAULT_LAUNCH_MODE, EXIT_STALLED, LAUNCH_MODES
from nodekit.launcher.plan import styles_text

__all__ = ["CONFIG_FILE", "ENV_NAME", "Mount", "NodeOverride", "Settings", "config_path", "load", "reserved_env"]

DEFAULT_TORCH = "torch==2.13.0"
_IMAGE_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
# What the lock hands pip (--python-version X.Y, --platform TAG) and makes the ABI tag from (cp + digits).
_TARGET = {
    "python_version": (r"3\.[0-9]{1,2}", "3.11"),
    "wheel_platform": (r"[a-z0-9_]{1,64}", "manylinux_2_36_x86_64"),
}


class _Keys(BaseSettings):
    """The keys of nodekit.toml but the backends' tables; :class:`Settings` adds those and checks the whole."""

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
    launcher: str = Field(
        DEFAULT_LAUNCH_MODE,
        description=f"how each node starts the script; one of {styles_text()}",
    )
    accelerator: str | None = Field(
        None, description="launcher fabric: --accelerator (default: cuda on a node with GPUs, else cpu)"
    )
    strategy: str | None = Field(None, description="launcher fabric: --strategy (default ddp)")
    precision: str | None = Field(None, description="launcher fabric: --precision (default: Fabric's own)")
    nnodes: int = Field(1, ge=1, description="number of nodes (machines)")
    nproc_per_node: NProc = Field("auto", description="processes per node; auto = GPUs, or 1")
    master_port: int = Field(
        29500, ge=1, le=65534, description="TCP port of the rendezvous on main (preflight uses the next one)"
    )
    max_restarts: int = Field(0, ge=0, description="torchrun --max-restarts")
    rdzv_timeout: int = Field(180, ge=1, description="seconds to wait for every node before giving up")
    peer_timeout: int = Field(
        15,
        ge=0,
        description="seconds without a node's heartbeat before the others stop, naming it; 0: never",
    )
    stall_timeout: int = Field(
        300,
        ge=0,
        description="seconds in which no rank issues a collective and no rank's main thread moves before nodekit "
        "prints every rank's stack grouped by where it waits (and stops the job, see stall_action); 0: never",
    )
    stall_action: Literal["stop", "warn"] = Field(
        "stop",
        description=f"after stall_timeout: stop ends every node with exit code {EXIT_STALLED}; warn only prints",
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
    replicate_outputs: bool = Field(
        True,
        description="nodekit run, when a restart may go on without a lost host (restarts, min_nodes): the head "
        "copies each host's new output files every few seconds and, before such a restart, hands every host left "
        "the newest of each it lacks, so a checkpoint saved on rank 0 only survives the loss of rank 0's host",
    )
    relay: Literal["auto", "always", "never"] = Field(
        "auto",
        description="nodekit run, push and data push: ssh:// nodes pass the image (or a dataset's contents) on to "
        "each other (a key per push and hop, no agent forwarded, host keys pinned by the head) so the head sends it "
        "once; auto = an image when 64 MiB or more travels, a dataset when (hosts - 1) x what travels is 108 MiB or "
        "more",
    )
    keep_containers: bool = Field(
        False,
        description="nodekit run: when the job ends, stop every node's container but keep it (nodekit exec and logs "
        "still reach it; nodekit down removes it)",
    )
    mounts: tuple[Mount, ...] = Field((), description="host directories mounted into the job ([[mounts]])")
    # records and alerts
    runs_keep: int = Field(
        50, ge=1, le=100_000, description="how many run records .nodekit/runs keeps (the oldest go as a run starts)"
    )
    notify: NotifySettings = Field(
        default_factory=NotifySettings, description="a webhook told of each run's start, failure and finish ([notify])"
    )
    health: HealthSettings = Field(
        default_factory=HealthSettings, description="the link and GPU checks before any worker starts ([health])"
    )

    # Set by load(): where the file was found. Not a user setting.
    project_dir: Path = Field(default_factory=Path.cwd, exclude=True)


class Settings(BackendTables, _Keys):
    """Everything a user configures. Field docs double as the reference in ``nodekit init``'s starter file. The
    backends' tables (``[slurm]``, ``[k8s]``) come from their registrations (:mod:`nodekit.config.backends`), after
    the other keys (``BackendTables`` comes first among the bases, so its fields come last)."""

    model_config = SettingsConfigDict(env_prefix="NODEKIT_", frozen=True, extra="forbid", env_parse_none_str="")

    @field_validator("name")
    @classmethod
    def _docker_name(cls, v: str | None) -> str | None:
        if v is not None and not (_IMAGE_NAME.match(v) and len(v) <= inputs.MAX_NAME):
            raise Bad(
                f"{v[:40]!r} is not a valid image name (lowercase letters, digits, '.', '_', '-'; "
                f"at most {inputs.MAX_NAME} characters)",
                fix='name = "my-job"',
            )
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, v: str) -> str:
        # The modes are the launcher's (nodekit/launcher/contract.py): a new one is known here without an edit.
        if v not in LAUNCH_MODES:
            raise Bad(
                f"{v[:40]!r} is not a launcher ({', '.join(LAUNCH_MODES)})", fix=f'launcher = "{DEFAULT_LAUNCH_MODE}"'
            )
        return v

    @field_validator("base_image")
    @classmethod
    def _base_image(cls, v: str) -> str:
        checked(v, inputs.image_ref_problem, 'base_image = "nvcr.io/nvidia/pytorch:24.05-py3" (pin it by digest)')
        return v

    @field_validator("python_version", "wheel_platform")
    @classmethod
    def _target(cls, v: str | None, info: ValidationInfo) -> str | None:
        pattern, example = _TARGET[info.field_name or ""]
        if v is not None and not re.fullmatch(pattern, v):
            raise Bad(f"{v[:40]!r} is not a {info.field_name} like {example}", fix=f'{info.field_name} = "{example}"')
        return v

    @field_validator("script")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        return checked(
            v,
            lambda s: inputs.script_problem(s) or inputs.text_problem(s),
            'script = "train.py", a path inside the project directory',
        )

    @field_validator("module")
    @classmethod
    def _module(cls, v: str | None) -> str | None:
        return checked(v, inputs.module_problem, 'module = "pkg.train"')

    @field_validator("main")
    @classmethod
    def _main(cls, v: str | None) -> str | None:
        return checked(v, inputs.hostname_problem, 'main = "10.0.0.5", main\'s address as the other nodes reach it')

    @model_validator(mode="after")
    def _across_fields(self) -> Settings:
        # The checks that read more than one field: nodekit/config/across.py
        across.check(self, type(self).model_fields)
        return self

    @field_validator("pass_env")
    @classmethod
    def _once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v))

    @field_validator("nnodes")
    @classmethod
    def _nodes(cls, v: int) -> int:
        if v > MAX_NODES:  # why this bound: nodekit/config/inputs.py
            raise Bad(
                f"{v} is more than the {MAX_NODES} nodes one job's rendezvous and environment can hold",
                fix=f"nnodes between 1 and {MAX_NODES}",
            )
        return v

    @field_validator("rdzv_timeout", "peer_timeout", "stall_timeout")
    @classmethod
    def _week(cls, v: int) -> int:
        if v > MAX_TIMEOUT_S:  # why this bound: nodekit/config/inputs.py
            raise Bad(f"{v} s is more than {MAX_TIMEOUT_S} s (7 days)", fix="a timeout in seconds, such as 180")
        return v

    @field_validator("peer_timeout")
    @classmethod
    def _beats(cls, v: int) -> int:
        if 0 < v < MIN_PEER_TIMEOUT:  # nodes beat once a second; the launcher refuses less (launcher/config.py)
            raise Bad(
                f"must be 0 (no peer watchdog) or at least {MIN_PEER_TIMEOUT:g} seconds, not {v}",
                fix="peer_timeout = 15",
            )
        return v

    @field_validator("stall_timeout")
    @classmethod
    def _stall(cls, v: int) -> int:
        if 0 < v < MIN_STALL_TIMEOUT:  # progress is read once a second; the launcher refuses less (launcher/config.py)
            raise Bad(
                f"must be 0 (no stall watch) or at least {MIN_STALL_TIMEOUT:g} seconds, not {v}",
                fix="stall_timeout = 300",
            )
        return v

    @field_validator("packages")
    @classmethod
    def _need_packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise Bad("at least one package is needed (torch)", fix=f'packages = ["{DEFAULT_TORCH}"]')
        if any(not p.strip() for p in v):
            raise Bad("has an empty entry", fix="remove the empty string from packages")
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
        return (init_settings, env_settings, config_file.TomlSource(settings_cls, config_file.current.get()))

    @property
    def image_name(self) -> str:
        """The configured name, else the project directory's name made valid for Docker."""
        if self.name:
            return self.name
        cleaned = re.sub(r"[^a-z0-9._-]+", "-", self.project_dir.resolve().name.lower()).strip("._-")
        return cleaned[: inputs.MAX_NAME].rstrip("._-") or "app"

    def resolve(self, path: Path) -> Path:
        """A configured path, relative to the project root."""
        return path if path.is_absolute() else self.project_dir / path


def _source(top: str, given: dict[str, Any]) -> str:
    """Where the top-level setting ``top`` came from, by the precedence: "flag", "env" or "file"."""
    if top in given:
        return "flag"
    if f"NODEKIT_{top.upper()}" in {k.upper() for k in os.environ}:
        return "env"
    return "file"


def load(config: Path | None = None, **flags: Any) -> Settings:
    """Settings from flags (keyword arguments; None means "not given"), environment, file, defaults.

    Raises ConfigError naming the offending setting and its fix when validation fails, or when a path nodekit
    writes to (``compose_dir``, ``.nodekit``) cannot be one; nothing is written before that.
    """
    path = config_path(config, os.environ).absolute()
    from_env = config is None and bool(os.environ.get("NODEKIT_CONFIG"))
    if (config is not None or from_env) and not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(
            f"NODEKIT_CONFIG names {path}, which {what}" if from_env else f"config file {path} {what}",
            fix="unset NODEKIT_CONFIG or point it at the file"
            if from_env
            else "nodekit init, or pass the right --config",
        )
    given = {k: v for k, v in flags.items() if v is not None}
    token = config_file.current.set(path)
    try:
        settings = Settings(project_dir=path.parent, **given)
    except SettingsError as e:  # a NODEKIT_* value for a list or table field that is not JSON
        found = re.search(r'field "(\w+)"', str(e))
        where = found.group(1) if found else "config"
        raise ConfigError(
            f"invalid setting {where}: NODEKIT_{where.upper()} is not valid JSON",
            fix=f'write NODEKIT_{where.upper()} as JSON (e.g. \'["a", "b"]\' or \'{{"KEY": "value"}}\'), or unset it',
        ) from None
    except ValidationError as e:
        raise config_file.refusal(e, path, Settings, lambda top: _source(top, given)) from None
    except RecursionError:  # the file's own depth is read_toml's refusal; this is json.loads on a NODEKIT_* value
        raise ConfigError(
            "a NODEKIT_* value nests lists or tables deeper than nodekit reads (hundreds of levels)",
            fix="write that NODEKIT_* value as flat JSON, or unset it",
        ) from None
    finally:
        config_file.current.reset(token)
    config_file.check_paths(
        settings.project_dir,
        settings.resolve(settings.compose_dir),
        settings.resolve(settings.output_dir),
        output_key=config_file.output_dir_key(_source("output_dir", given), path),
    )
    return settings
