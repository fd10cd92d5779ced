"""The nested tables of nodekit.toml (``[[mounts]]``, ``[nodes.<rank>]``) and the field types they share with
``Settings``. Every check is in ``nodekit/config/inputs.py``; a refusal is a :class:`Bad` naming the fix."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from nodekit.config.inputs import (
    MAX_PROCS,
    env_name_problem,
    iface_problem,
    ip_problem,
    path_problem,
    target_problem,
    text_problem,
)
from nodekit.launcher.contract import LINK_SECONDS_DEFAULT, LINK_SECONDS_MAX, LINK_SECONDS_MIN


class Bad(ValueError):
    """A refused setting: the message says what is wrong; ``fix`` what to write instead; ``key`` the setting when a
    check across fields raises it (pydantic then knows no location)."""

    def __init__(self, message: str, *, fix: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix
        self.key = key


def checked(v: str | None, problem_of: Callable[[str], str | None], fix: str) -> str | None:
    """``v`` when it is None or ``problem_of`` finds nothing wrong with it; else :class:`Bad` with ``fix``."""
    problem = None if v is None else problem_of(v)
    if problem is not None:
        raise Bad(problem, fix=fix)
    return v


def _nproc(v: Any) -> Any:
    if v is None or v == "auto":
        return v
    if isinstance(v, str) and v.strip().isdecimal():  # NODEKIT_NPROC_PER_NODE=4
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_PROCS:
        raise Bad(
            f'must be "auto" or 1 to {MAX_PROCS} processes, not {v!r}',
            fix='nproc_per_node = "auto" (one per GPU, or 1 without GPUs), or a count such as 8',
        )
    return v


# Processes on a node: a count, or "auto" (the node's GPUs, or 1). Zero is refused, in [nodes.R] too.
NProc = Annotated[int | Literal["auto"], BeforeValidator(_nproc)]


def plain_path(v: str) -> str:
    """``v`` if it is an absolute path written plainly, without a trailing slash; else :class:`Bad`."""
    problem = path_problem(v)
    if problem is not None:
        raise Bad(problem, fix="write an absolute path such as /data/set (no '..', '.' or '//')")
    return v.rstrip("/") or "/"


def host_path(v: str) -> str:
    """A mount's host path: absolute (:func:`plain_path`), or relative to the project directory (``data``,
    ``./data/train``, ``../datasets/x``; kept normalized), which :func:`nodekit.job.spec.host_path`
    resolves. The project itself (``.``) is refused: it would put the code, .nodekit and its secret in the job."""
    if v.startswith("/"):
        return plain_path(v)
    plain = posixpath.normpath(v) if v.strip() else "."
    if text_problem(v) is not None or plain == "." or len(v.encode()) > 4095:
        raise Bad(
            f"mount path {v!r} is neither absolute nor a path relative to the project",
            fix='write an absolute path such as /data/set, or one relative to the project such as "data"',
        )
    return plain


class Mount(BaseModel):
    """One ``[[mounts]]`` entry: a host directory (or file) in the job, read-only unless ``writable``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(
        description="path on the host: absolute, or relative to the project directory (per node: [nodes.R] mounts)"
    )
    container: str = Field(description="absolute path in the container")
    writable: bool = Field(False, description="mount read-write (default read-only)")
    check: Literal["none", "sizes", "hashes"] = Field(
        "none", description="same data on every node: compare relative paths and sizes, or also content hashes"
    )
    source: str | None = Field(
        None,
        description="a directory (or one file) on the machine that runs nodekit (relative to the project, or "
        "absolute) that `nodekit run` and `nodekit data push` make every host's host path equal to; never part of "
        "the image",
    )

    @field_validator("source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or text_problem(v) is not None):
            raise Bad(f"source {v!r} is empty or holds control characters", fix='source = "data" (a directory)')
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return host_path(v)

    @field_validator("container")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return plain_path(v)

    @model_validator(mode="after")
    def _target(self) -> Mount:
        problem = target_problem(self.container, self.check != "none")
        if problem is not None:
            raise Bad(problem, fix='mount it elsewhere, e.g. container = "/data"')
        if self.source is not None and self.writable:
            # Every push makes the host path equal the source again: what a job wrote there would be undone, and a
            # file it added would make the next push refuse the host.
            raise Bad(
                f"[[mounts]] {self.container} has a source and writable = true",
                fix="remove writable (a dataset is read-only in the job); write results to /outputs",
                key="mounts",
            )
        return self


class NodeOverride(BaseModel):
    """Per-node settings under ``[nodes.<rank>]``; anything unset is detected on that node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iface: str | None = Field(None, description="network interface toward main (GLOO/NCCL_SOCKET_IFNAME)")
    addr: str | None = Field(
        None, description="this node's own IP address toward main (checked against main: loopback or not)"
    )
    nproc_per_node: Annotated[int | Literal["auto"] | None, BeforeValidator(_nproc)] = Field(
        None, description="this node's processes (heterogeneous nodes)"
    )
    gpus: int | None = Field(None, ge=0, le=MAX_PROCS, description="this node's GPU count, where nodes differ")
    mounts: dict[str, str] = Field(
        default_factory=dict,
        description="container path -> this node's host path (absolute, or relative to the project)",
    )
    output_dir: str | None = Field(
        None, description="this node's host directory at /outputs (absolute), where it differs from output_dir"
    )

    @field_validator("iface")
    @classmethod
    def _iface(cls, v: str | None) -> str | None:
        return checked(
            v, iface_problem, "use a name `ip -br link` shows on that node (eth0, ens5, ib0), or remove iface"
        )

    @field_validator("addr")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return checked(v, ip_problem, "write that node's IP address (10.0.0.6), or remove addr: nodekit detects it")

    @field_validator("mounts")
    @classmethod
    def _absolute(cls, v: dict[str, str]) -> dict[str, str]:
        return {plain_path(k): host_path(p) for k, p in v.items()}

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, v: str | None) -> str | None:
        return None if v is None else plain_path(v)


class HealthSettings(BaseModel):
    """``[health]``: the checks every node runs after the preflight, before any worker starts (the launcher's
    ``nodekit/launcher/checks.py``). Each is ``warn`` (print what is wrong, then train), ``refuse`` (stop every
    node) or ``off``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    links: Literal["warn", "refuse", "off"] = Field(
        "warn",
        description="every pair of nodes measured (throughput both ways, round trip) on the training interface: "
        "a pair far below the others is named; refuse stops the job (exit 20)",
    )
    min_link_gbit: float | None = Field(
        None, gt=0, le=1e6, description="a pair below this many Gbit/s (either way) stops the job (exit 20)"
    )
    link_seconds: float = Field(
        LINK_SECONDS_DEFAULT,
        ge=LINK_SECONDS_MIN,
        le=LINK_SECONDS_MAX,
        description="most seconds of bulk transfer per pair and direction (it ends once its figure settles)",
    )
    gpus: Literal["warn", "refuse", "off"] = Field(
        "warn",
        description="each node's GPUs (nvidia-smi -q, the kernel log's Xids, dcgmi diag -r 1): a sick GPU is named "
        "with its index and the fix; refuse stops the job (exit 21)",
    )
    dcgm: bool = Field(True, description="run dcgmi diag -r 1 where DCGM is installed in the image (seconds)")


NotifyEvent = Literal["start", "failure", "finish"]


class NotifySettings(BaseModel):
    """``[notify]``: a webhook told when a run starts, fails and finishes (nodekit/runs/notify.py). The URL is a
    secret (a Slack webhook URL lets anyone post): it is named here, never written here; it is never printed, never
    put in a compose file or a process's arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url_env: str | None = Field(
        None, description="the environment variable that holds the webhook URL on the machine that starts the run"
    )
    url_file: Path | None = Field(
        None, description="or a file (chmod 600) whose first line is the webhook URL, e.g. ~/.config/nodekit/webhook"
    )
    format: Literal["slack", "json"] = Field(
        "slack", description='slack: {"text": ...} (Slack, Mattermost, Rocket.Chat, Teams workflows); json: every field'
    )
    on: tuple[NotifyEvent, ...] = Field(("start", "failure", "finish"), description="which events send a message")
    timeout_s: float = Field(5.0, gt=0, le=60, description="seconds one attempt may take")
    retries: int = Field(3, ge=0, le=10, description="attempts after the first (on errors, timeouts, 429 and 5xx)")
    deadline_s: float = Field(
        15.0,
        gt=0,
        le=300,
        description="seconds a message may take in all; the command waits at most this long for it after the job",
    )

    @field_validator("url_env")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        fix = 'url_env = "SLACK_WEBHOOK_URL" (the variable\'s name; export the URL in it)'
        if v is not None and ("://" in v or "/" in v):  # a pasted URL: never repeat it back (it is a secret)
            raise Bad("holds a URL, not the name of the variable that holds it", fix=fix)
        return checked(v, env_name_problem, fix)

    @property
    def configured(self) -> bool:
        return self.url_env is not None or self.url_file is not None
