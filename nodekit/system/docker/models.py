"""What Docker answers, as plain frozen models: parsed from its JSON (``docker image inspect``, ``docker info``) or
from what python-on-whales parsed, and from ``docker load``'s report. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineInfo:
    host: str
    server_version: str
    compose_version: str
    buildx_version: str


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    size: int
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerState:
    name: str
    status: str
    running: bool
    exit_code: int | None
    image: str = ""
    started_at: str = ""
    finished_at: str = ""


@dataclass(frozen=True)
class EngineFacts:
    """What shipping needs to know about one engine."""

    engine_id: str
    server_version: str
    root_dir: str
    free_bytes: int | None
    """Free space under the engine's data root; None when the engine is not on this machine."""
    containerd_store: bool = False
    """Images are kept in containerd's store (snapshotters), not the classic graphdriver layer store."""


@dataclass(frozen=True)
class Loaded:
    """What one ``docker load`` reported: the references (``name:tag``) and the untagged image ids it loaded."""

    refs: tuple[str, ...]
    ids: tuple[str, ...]


def image_info_of(inspected: Mapping[str, object]) -> ImageInfo:
    """An ImageInfo from one entry of ``docker image inspect``'s JSON."""
    config = inspected.get("Config")
    config = config if isinstance(config, dict) else {}
    env = [e for e in (config.get("Env") or []) if isinstance(e, str) and "=" in e]
    return ImageInfo(
        id=str(inspected.get("Id", "")),
        tags=tuple(str(t) for t in (inspected.get("RepoTags") or [])),  # type: ignore[attr-defined]
        labels={str(k): str(v) for k, v in (config.get("Labels") or {}).items()},
        size=int(inspected.get("Size") or 0),  # type: ignore[call-overload]
        env=dict(e.split("=", 1) for e in env),
    )
