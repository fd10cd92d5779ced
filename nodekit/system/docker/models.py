"""What Docker answers, as plain frozen models: parsed from its JSON (``docker image inspect``, ``docker info``) or
from what python-on-whales parsed, and from ``docker load``'s report. Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineInfo:
    host: str
    server_version: str
    compose_version: str
    buildx_version: str


@dataclass(frozen=True)
class ImageInfo:
    id: str
    """The engine's own id: the config digest on the classic store, the manifest (or index) digest on the
    containerd store. Two engines with different stores give one image two ids: compare :attr:`identity`."""
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    size: int
    env: Mapping[str, str] = field(default_factory=dict)
    identity: str = ""
    """What both image stores agree on (:func:`image_identity`): equal for the same image on any engine."""
    layers: tuple[str, ...] = ()
    """The rootfs diff ids, base first."""


IDENTITY_KEYS = ("User", "Env", "Entrypoint", "Cmd", "WorkingDir", "Labels", "StopSignal", "ExposedPorts", "Volumes")
"""The parts of an image's runtime configuration that both image stores report alike in ``docker image inspect``."""


def image_identity(layers: Sequence[str], config: Mapping[str, Any], os: str, architecture: str, variant: str) -> str:
    """Pure: ``sha256:`` of a canonical encoding of an image's layers (rootfs diff ids, which name every byte of its
    file system) and runtime configuration (:data:`IDENTITY_KEYS`, empty values left out). Both image stores report
    these the same way for one image, whereas their ids differ (the classic store names an image by its config
    digest, the containerd store by its manifest digest, which also depends on how the layers are compressed)."""
    kept = {k: v for k in IDENTITY_KEYS if (v := config.get(k)) not in (None, "", [], {}, False)}
    doc = {"layers": list(layers), "config": kept, "os": os or "linux", "architecture": architecture or "amd64",
           "variant": variant or ""}  # fmt: skip
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
    rootfs = inspected.get("RootFS")
    layers = tuple(str(d) for d in ((rootfs.get("Layers") if isinstance(rootfs, dict) else None) or []))
    return ImageInfo(
        id=str(inspected.get("Id", "")),
        tags=tuple(str(t) for t in (inspected.get("RepoTags") or [])),  # type: ignore[attr-defined]
        labels={str(k): str(v) for k, v in (config.get("Labels") or {}).items()},
        size=int(inspected.get("Size") or 0),  # type: ignore[call-overload]
        env=dict(e.split("=", 1) for e in env),
        identity=image_identity(layers, config, str(inspected.get("Os") or ""),
                                str(inspected.get("Architecture") or ""), str(inspected.get("Variant") or "")),
        layers=layers,
    )  # fmt: skip
