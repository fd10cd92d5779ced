"""The build record and result: what :func:`nodekit.image.builder.build` did, and ``.nodekit/last-build.json``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nodekit.config.settings import Settings
from nodekit.image.archive import Image
from nodekit.image.plan import BuildPlan
from nodekit.system import docker
from nodekit.system.files import write_atomic
from nodekit.system.frozen import FROZEN

LAST_BUILD = Path(".nodekit") / "last-build.json"


class BuildResult(BaseModel):
    """What :func:`build` did. ``skipped``: the image existed already; ``dry_run``: nothing was changed."""

    model_config = FROZEN

    tag: str
    image_id: str
    fingerprint: str
    size: int
    seconds: float
    skipped: bool
    dry_run: bool = False
    lock_created: bool = False
    plan: BuildPlan

    def summary(self) -> str:
        if self.dry_run:
            return f"would build {self.tag}"
        verb = "up to date" if self.skipped else "built"
        return f"{verb}: {self.tag}  {human_size(self.size)}  in {self.seconds:.1f} s"

    def __str__(self) -> str:
        return self.plan.describe() if self.dry_run else self.summary()

    def __rich__(self) -> str:
        # rich would otherwise pretty-print the model's fields (pydantic defines __rich_repr__).
        return str(self)


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def build_result(
    plan: BuildPlan,
    info: docker.ImageInfo | None,
    t0: float,
    *,
    skipped: bool,
    dry_run: bool = False,
    created: bool = False,
) -> BuildResult:
    return BuildResult(
        tag=plan.tag,
        image_id=info.id if info else "",
        fingerprint=plan.fingerprint,
        size=info.size if info else 0,
        seconds=round(time.monotonic() - t0, 3),
        skipped=skipped,
        dry_run=dry_run,
        lock_created=created,
        plan=plan,
    )


def write_record(settings: Settings, result: BuildResult, image: Image | None = None) -> None:
    """``.nodekit/last-build.json``: the image this project's last build made, with both of its ids (the config
    digest a classic-store engine names it by, the manifest digest of the containerd store) when nodekit wrote it,
    and the build's inputs (code tree, lock) so a later check can say what changed since."""
    path = settings.project_dir / LAST_BUILD
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {
        "tag": result.tag,
        "image_id": result.image_id,
        "fingerprint": result.fingerprint,
        "size": result.size,
        "seconds": result.seconds,
        "skipped": result.skipped,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if image is not None:
        doc["config_digest"] = image.config_digest
        doc["manifest_digest"] = image.manifest_digest
    from nodekit.image.builder.staleness import current_inputs

    inputs = current_inputs(settings, base=result.plan.base_id)
    if inputs is not None:
        doc["inputs"] = inputs.model_dump()
    write_atomic(path, json.dumps(doc, indent=2) + "\n", within=settings.project_dir)


def last_build(settings: Settings) -> dict[str, Any] | None:
    """The record of the last build in this project, or None."""
    try:
        data = json.loads((settings.project_dir / LAST_BUILD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
